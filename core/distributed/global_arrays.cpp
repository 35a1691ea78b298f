// Global arrays of a multi-process run (include/cjax/distributed.h): built from each process's
// blocks, and gathered back to every process.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <optional>

#include "cjax/distributed.h"
#include "cjax/errors.h"
#include "cjax/lax.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/distributed/runtime.h"

namespace cjax {
namespace {
const NamedSharding& named(const Sharding& s, std::string_view what) {
  auto* ns = dynamic_cast<const NamedSharding*>(&s);
  if (!ns)
    throw ShardingError(
        fmt::format("{}: the sharding must be a NamedSharding (got {}); a single-device array is "
                    "built with device_put",
                    what, s.str()));
  return *ns;
}
}  // namespace

bool is_fully_addressable(const Array& x) {
  ConcreteArray& c = require_concrete(x, "is_fully_addressable");
  for (const auto& b : c.buffers)
    if (!b->addressable()) return false;
  return true;
}

Array make_array_from_callback(const Shape& shape, const Sharding& sharding,
                               const std::function<Array(const std::vector<Slice>& index)>& cb) {
  const NamedSharding& s = named(sharding, "make_array_from_callback");
  s.check_shape(shape);
  Shape block = s.shard_shape(shape);
  std::vector<std::vector<Slice>> indices = s.devices_indices(shape);
  const std::vector<Device>& devs = s.mesh().devices();
  std::vector<Array> blocks(devs.size());
  std::optional<DType> dtype;
  for (size_t k = 0; k < devs.size(); ++k) {
    if (!distributed::is_local(devs[k])) continue;
    Array b = cb(indices[k]);
    if (b.shape() != block)
      throw ShapeError(
          fmt::format("make_array_from_callback: the callback returned {} for the block of {}; the "
                      "sharding's blocks are {}",
                      b.aval().str(), devs[k].str(), shape_str(block)));
    if (dtype && b.dtype() != *dtype)
      throw DTypeError(fmt::format("make_array_from_callback: the callback returned {} and {} blocks",
                                   dtype_name(*dtype), dtype_name(b.dtype())));
    dtype = b.dtype();
    blocks[k] = device_put(b, SingleDeviceSharding(devs[k]));
  }
  if (!dtype)
    throw ShardingError(fmt::format("make_array_from_callback: the mesh {} has no device of process {}", s.mesh().str(),
                                    process_index()));
  size_t nbytes = size_t(shape_size(block)) * itemsize(*dtype);
  std::vector<std::shared_ptr<Buffer>> buffers;
  for (size_t k = 0; k < devs.size(); ++k)
    buffers.push_back(blocks[k].defined() ? concrete(blocks[k])->buffer()
                                          : std::make_shared<Buffer>(Buffer::Remote{}, devs[k], nbytes));
  auto out = std::make_shared<ConcreteArray>(AbstractValue{shape, *dtype, false, {}}, buffers[0]);
  out->buffers = std::move(buffers);
  out->sharding = std::make_shared<NamedSharding>(s);
  out->committed = true;
  return Array(std::move(out));
}

Array make_array_from_process_local_data(const Sharding& sharding, const Array& local) {
  const NamedSharding& s = named(sharding, "make_array_from_process_local_data");
  const std::vector<Device>& devs = s.mesh().devices();
  size_t rank = size_t(local.ndim());
  if (s.spec().size() > rank)
    throw ShardingError(
        fmt::format("make_array_from_process_local_data: the spec {} is longer than the local "
                    "data's rank {}",
                    s.spec().str(), rank));
  // Along each dimension, this process's blocks form a run [lo, hi) of the num_blocks(d) blocks.
  Shape probe(rank, 0);
  for (size_t d = 0; d < rank; ++d) probe[d] = s.num_blocks(int(d));
  std::vector<int64_t> lo(rank, INT64_MAX), hi(rank, -1);
  bool any_local = false;
  for (size_t k = 0; k < devs.size(); ++k) {
    if (!distributed::is_local(devs[k])) continue;
    any_local = true;
    std::vector<int64_t> bc = s.block_coords(probe, int64_t(k));
    for (size_t d = 0; d < rank; ++d) {
      lo[d] = std::min(lo[d], bc[d]);
      hi[d] = std::max(hi[d], bc[d] + 1);
    }
  }
  if (!any_local)
    throw ShardingError(fmt::format("make_array_from_process_local_data: the mesh {} has no device of process {}",
                                    s.mesh().str(), process_index()));
  Shape global = local.shape(), block = local.shape();
  for (size_t d = 0; d < rank; ++d) {
    int64_t mine = hi[d] - lo[d];
    if (local.shape()[d] % mine != 0)
      throw ShapeError(
          fmt::format("make_array_from_process_local_data: dimension {} of the local data ({}) does not "
                      "split into this process's {} blocks of the sharding {}",
                      d, local.shape()[d], mine, s.str()));
    block[d] = local.shape()[d] / mine;
    global[d] = block[d] * s.num_blocks(int(d));
  }
  return make_array_from_callback(global, sharding, [&](const std::vector<Slice>& index) {
    std::vector<int64_t> start(rank), limit(rank);
    for (size_t d = 0; d < rank; ++d) {
      int64_t first = index[d].start.value_or(0);
      start[d] = first - lo[d] * block[d];
      limit[d] = start[d] + block[d];
    }
    return lax::slice(local, start, limit);
  });
}

Array process_allgather(const Array& x) {
  ConcreteArray& c = require_concrete(x, "process_allgather");
  if (is_fully_addressable(x)) return x;
  const NamedSharding& s = named(*c.sharding, "process_allgather");
  Array replicated = device_put(x, NamedSharding(s.mesh(), PartitionSpec()));
  ConcreteArray& r = *concrete(replicated);
  auto out = std::make_shared<ConcreteArray>(r.aval, r.buffer());  // this process's copy
  return Array(std::move(out));
}

}  // namespace cjax
