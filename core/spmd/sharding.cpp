// Meshes, partition specs, NamedSharding, device_put and visualize_array_sharding.
#include "cjax/sharding.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
// libstdc++ 12's <regex> trips -Wmaybe-uninitialized under -O1 with ASan (a false positive inside
// std::function's move in the NFA builder); the rest of this file keeps the warning.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <set>

#include "core/array/array_impl.h"
#include "core/backend/backend.h"
#include "core/distributed/runtime.h"
#include "core/spmd/reshard_hook.h"

namespace cjax {

namespace {
size_t hash_combine(size_t seed, size_t v) { return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2)); }
std::string quoted_list(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const auto& n : names) q.push_back("'" + n + "'");
  return fmt::format("({}{})", fmt::join(q, ", "), q.size() == 1 ? "," : "");  // a Python tuple
}
std::string platform_label(Platform p) { return p == Platform::cpu ? "CPU" : "GPU"; }
}  // namespace

// ---------------------------------------------------------------------------------------------
// Mesh

Mesh::Mesh(std::vector<Device> devices, Shape shape, std::vector<std::string> axis_names)
    : devices_(std::move(devices)), shape_(std::move(shape)), axis_names_(std::move(axis_names)) {
  if (shape_.size() != axis_names_.size())
    throw ShardingError(fmt::format("Mesh: shape {} has {} axes but {} axis names {} were given", shape_str(shape_),
                                    shape_.size(), axis_names_.size(), quoted_list(axis_names_)));
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] < 1)
      throw ShardingError(
          fmt::format("Mesh: axis '{}' has size {}; mesh axis sizes must be >= 1", axis_names_[i], shape_[i]));
    for (size_t j = 0; j < i; ++j)
      if (axis_names_[i] == axis_names_[j])
        throw ShardingError(fmt::format("Mesh: axis name '{}' appears twice in {}; axis names must be unique",
                                        axis_names_[i], quoted_list(axis_names_)));
  }
  if (int64_t(devices_.size()) != shape_size(shape_))
    throw ShardingError(fmt::format("Mesh: shape {} needs {} devices but {} were given", shape_str(shape_),
                                    shape_size(shape_), devices_.size()));
  for (size_t i = 0; i < devices_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (devices_[i] == devices_[j])
        throw ShardingError(
            fmt::format("Mesh: device {} appears twice; each device may be used once", devices_[i].repr()));
}

int Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axis_names_.size(); ++i)
    if (axis_names_[i] == name) return int(i);
  return -1;
}
int64_t Mesh::axis_size(std::string_view name) const {
  int i = axis_index(name);
  if (i < 0)
    throw ShardingError(fmt::format("mesh axis '{}' not found; {} has axes {}", name, str(), quoted_list(axis_names_)));
  return shape_[size_t(i)];
}
std::vector<int64_t> Mesh::coords(int64_t flat) const {
  std::vector<int64_t> c(shape_.size());
  for (size_t i = shape_.size(); i-- > 0;) {
    c[i] = flat % shape_[i];
    flat /= shape_[i];
  }
  return c;
}
std::string Mesh::str() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < shape_.size(); ++i) parts.push_back(fmt::format("'{}': {}", axis_names_[i], shape_[i]));
  return fmt::format("Mesh({})", fmt::join(parts, ", "));
}
size_t Mesh::hash() const {
  size_t h = 0;
  for (const Device& d : devices_) h = hash_combine(h, size_t(d.id()) * 2 + size_t(d.platform()));
  for (int64_t s : shape_) h = hash_combine(h, std::hash<int64_t>{}(s));
  for (const auto& n : axis_names_) h = hash_combine(h, std::hash<std::string>{}(n));
  return h;
}

Mesh make_mesh(Shape axis_shapes, std::vector<std::string> axis_names) {
  std::vector<Device> all = devices();
  int64_t need = shape_size(axis_shapes);
  if (need > int64_t(all.size()))
    throw ShardingError(
        fmt::format("make_mesh: a mesh of shape {} needs {} devices but only {} are available; set "
                    "CJAX_NUM_CPU_DEVICES (or "
                    "config::set_num_cpu_devices) to at least {}",
                    shape_str(axis_shapes), need, all.size(), need));
  all.resize(size_t(std::max<int64_t>(need, 0)));
  return Mesh(std::move(all), std::move(axis_shapes), std::move(axis_names));
}

// ---------------------------------------------------------------------------------------------
// PartitionSpec

std::vector<std::string> PartitionSpec::mentioned_axes() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.insert(out.end(), e.names.begin(), e.names.end());
  return out;
}
std::string PartitionSpec::str() const {
  std::vector<std::string> parts;
  for (const Entry& e : entries_) {
    if (e.names.empty())
      parts.push_back("None");
    else if (!e.is_tuple)
      parts.push_back("'" + e.names[0] + "'");
    else if (e.names.size() == 1)
      parts.push_back("('" + e.names[0] + "',)");
    else
      parts.push_back(quoted_list(e.names));
  }
  return fmt::format("P({}{})", fmt::join(parts, ", "), parts.size() == 1 ? "," : "");
}
size_t PartitionSpec::hash() const {
  size_t h = entries_.size();
  for (const Entry& e : entries_) {
    h = hash_combine(h, e.names.size());
    for (const auto& n : e.names) h = hash_combine(h, std::hash<std::string>{}(n));
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// NamedSharding

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec) : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  std::set<std::string> seen;
  for (const std::string& name : spec_.mentioned_axes()) {
    if (mesh_.axis_index(name) < 0)
      throw SpecError(fmt::format("NamedSharding: spec {} names axis '{}', which is not in {} (mesh axes: {})",
                                  spec_.str(), name, mesh_.str(), quoted_list(mesh_.axis_names())));
    if (!seen.insert(name).second)
      throw SpecError(
          fmt::format("NamedSharding: spec {} uses mesh axis '{}' more than once; each mesh axis may "
                      "split at most one dimension",
                      spec_.str(), name));
  }
}

std::string NamedSharding::str() const {
  return fmt::format("NamedSharding(mesh={}, spec={}, memory_kind=device)", mesh_.str(), spec_.str());
}
bool NamedSharding::is_fully_replicated() const {
  for (const std::string& name : spec_.mentioned_axes())
    if (mesh_.axis_size(name) > 1) return false;
  return true;
}
int64_t NamedSharding::num_blocks(int dim) const {
  if (dim >= int(spec_.size())) return 1;
  int64_t n = 1;
  for (const auto& name : spec_.entries()[size_t(dim)].names) n *= mesh_.axis_size(name);
  return n;
}
void NamedSharding::check_shape(const Shape& global_shape) const {
  if (spec_.size() > global_shape.size())
    throw ShardingError(
        fmt::format("{}: spec {} has {} entries but the array of shape {} has rank {}; the spec "
                    "may have at most one entry per dimension",
                    str(), spec_.str(), spec_.size(), shape_str(global_shape), global_shape.size()));
  for (size_t d = 0; d < spec_.size(); ++d) {
    int64_t n = num_blocks(int(d));
    if (global_shape[d] % n != 0)
      throw ShardingError(
          fmt::format("{}: dimension {} of the array of shape {} has size {}, which is not divisible by {} (the "
                      "product of "
                      "mesh axes {} splitting it); pad the array or choose a spec whose axes divide it",
                      str(), d, shape_str(global_shape), global_shape[d], n, quoted_list(spec_.entries()[d].names)));
  }
}
Shape NamedSharding::shard_shape(const Shape& global_shape) const {
  check_shape(global_shape);
  Shape out = global_shape;
  for (size_t d = 0; d < out.size(); ++d) out[d] /= num_blocks(int(d));
  return out;
}
std::vector<int64_t> NamedSharding::block_coords(const Shape& global_shape, int64_t flat_device_index) const {
  std::vector<int64_t> mc = mesh_.coords(flat_device_index);
  std::vector<int64_t> out(global_shape.size(), 0);
  for (size_t d = 0; d < spec_.size() && d < out.size(); ++d) {
    int64_t b = 0;  // row-major over the entry's axes, first name major
    for (const auto& name : spec_.entries()[d].names) {
      int ax = mesh_.axis_index(name);
      b = b * mesh_.shape()[size_t(ax)] + mc[size_t(ax)];
    }
    out[d] = b;
  }
  return out;
}
std::vector<std::vector<Slice>> NamedSharding::devices_indices(const Shape& global_shape) const {
  Shape ss = shard_shape(global_shape);
  std::vector<std::vector<Slice>> out;
  for (int64_t k = 0; k < mesh_.size(); ++k) {
    std::vector<int64_t> bc = block_coords(global_shape, k);
    std::vector<Slice> idx;
    for (size_t d = 0; d < global_shape.size(); ++d) {
      if (num_blocks(int(d)) == 1)
        idx.push_back(Slice());
      else
        idx.push_back(Slice(bc[d] * ss[d], (bc[d] + 1) * ss[d]));
    }
    out.push_back(std::move(idx));
  }
  return out;
}
size_t NamedSharding::hash() const { return hash_combine(mesh_.hash(), spec_.hash()); }

bool is_fully_replicated(const Sharding& s) {
  if (auto* ns = dynamic_cast<const NamedSharding*>(&s)) return ns->is_fully_replicated();
  return dynamic_cast<const SingleDeviceSharding*>(&s) != nullptr;
}

void require_one_copy(const Array& x, std::string_view what) {
  auto* c = concrete(x);
  if (!c || c->buffers.size() <= 1 || (c->sharding && is_fully_replicated(*c->sharding))) return;
  throw ShardingError(
      fmt::format("{}: eager ops on sharded arrays are not supported yet (an array of shape {} with sharding {}): "
                  "device_put "
                  "it to one device first, or use shard_map/jit",
                  what, shape_str(x.shape()), c->sharding ? c->sharding->str() : "<none>"));
}

// ---------------------------------------------------------------------------------------------
// device_put

namespace {
// Copies the block of shape `block` between a contiguous global array of shape `global` (starting
// at element offsets `start`) and a contiguous block buffer; `to_block` picks the direction.
void copy_block(std::byte* global, const Shape& global_shape, std::byte* block, const Shape& block_shape,
                const std::vector<int64_t>& start, size_t itemsz, bool to_block) {
  if (shape_size(block_shape) == 0) return;
  size_t rank = global_shape.size();
  if (rank == 0) {
    to_block ? std::memcpy(block, global, itemsz) : std::memcpy(global, block, itemsz);
    return;
  }
  std::vector<int64_t> gstrides = row_major_strides(global_shape);
  size_t row_bytes = size_t(block_shape[rank - 1]) * itemsz;
  int64_t rows = shape_size(block_shape) / block_shape[rank - 1];
  std::vector<int64_t> pos(rank, 0);  // position within the block, last dim fixed at 0
  for (int64_t r = 0; r < rows; ++r) {
    int64_t goff = 0;
    for (size_t d = 0; d < rank; ++d) goff += (start[d] + pos[d]) * gstrides[d];
    std::byte* g = global + size_t(goff) * itemsz;
    std::byte* b = block + size_t(r) * row_bytes;
    to_block ? std::memcpy(b, g, row_bytes) : std::memcpy(g, b, row_bytes);
    for (size_t d = rank - 1; d-- > 0;) {
      if (++pos[d] < block_shape[d]) break;
      pos[d] = 0;
    }
  }
}

std::vector<int64_t> block_start(const NamedSharding& s, const Shape& global, const Shape& block, int64_t k) {
  std::vector<int64_t> bc = s.block_coords(global, k);
  for (size_t d = 0; d < bc.size(); ++d) bc[d] *= block[d];
  return bc;
}

// The bytes of a buffer where the host can read them: the buffer itself, or a copy in `staging`.
std::byte* host_bytes(const Buffer& b, std::vector<std::byte>& staging) {
  if (host_accessible(b.device())) return static_cast<std::byte*>(b.data());
  staging.resize(b.nbytes());
  backend_for(b.device().platform()).copy_to_host(b.device(), b.data(), staging.data(), b.nbytes());
  return staging.data();
}

// The global value of a sharded concrete array, assembled into one buffer on `device` (through
// host memory where the shards or the target are device memory).
Array assemble(const ConcreteArray& c, const NamedSharding& s, Device device) {
  // As in JAX, a fully replicated array reads from this process's copy; any other needs all blocks here.
  if (!s.is_fully_replicated()) require_fully_addressable(c, "reading its value");
  bool on_host = host_accessible(device);
  Array out = make_uninitialized(c.aval, on_host ? device : host_device());
  Shape block = s.shard_shape(c.aval.shape);
  size_t isz = itemsize(c.aval.dtype);
  std::set<std::vector<int64_t>> done;
  std::vector<std::byte> staging;
  for (int64_t k = 0; k < s.mesh().size(); ++k) {
    if (!c.buffers[size_t(k)]->addressable()) continue;                  // another process's replica
    if (!done.insert(s.block_coords(c.aval.shape, k)).second) continue;  // a replica of a copied block
    copy_block(static_cast<std::byte*>(raw_ptr(out)), c.aval.shape, host_bytes(*c.buffers[size_t(k)], staging), block,
               block_start(s, c.aval.shape, block, k), isz, false);
  }
  return on_host ? out : make_from_host(raw_ptr(out), c.aval, device);
}

const NamedSharding* named_sharding_of(const ConcreteArray& c) {
  auto* ns = dynamic_cast<const NamedSharding*>(c.sharding.get());
  return ns && int64_t(c.buffers.size()) == ns->mesh().size() ? ns : nullptr;
}
}  // namespace

namespace sharding {
std::vector<PartitionSpec> match_rules(const std::vector<std::string>& paths, const std::vector<Shape>& shapes,
                                       const Mesh& mesh, const std::vector<Rule>& rules, RuleOptions opts) {
  std::vector<std::regex> compiled;
  for (const Rule& r : rules) {
    try {
      compiled.emplace_back(r.pattern);
    } catch (const std::regex_error& e) {
      throw ValueError(fmt::format("sharding rule '{}' is not a valid regular expression: {}", r.pattern, e.what()));
    }
  }
  std::vector<PartitionSpec> out;
  std::vector<std::string> unmatched;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (shapes[i].empty()) {
      out.push_back(P());
      continue;
    }
    size_t k = 0;
    while (k < rules.size() && !std::regex_search(paths[i], compiled[k])) ++k;
    if (k == rules.size()) {
      unmatched.push_back(fmt::format("'{}' {}", paths[i], shape_str(shapes[i])));
      out.push_back(P());
      continue;
    }
    NamedSharding s(mesh, rules[k].spec);
    try {
      s.check_shape(shapes[i]);
    } catch (const ShardingError& e) {
      throw ShardingError(fmt::format("sharding rule '{}' -> {} does not fit leaf '{}' of shape {}: {}",
                                      rules[k].pattern, rules[k].spec.str(), paths[i], shape_str(shapes[i]), e.what()));
    }
    out.push_back(rules[k].spec);
  }
  if (opts.strict && !unmatched.empty())
    throw ShardingError(
        fmt::format("no sharding rule matches {} leaf(s): {}; add a rule for them (a last rule "
                    "{{\".*\", P()}} replicates whatever is left)",
                    unmatched.size(), fmt::join(unmatched, ", ")));
  return out;
}
}  // namespace sharding

MeshReshardFn& mesh_reshard_slot() {
  static MeshReshardFn fn;
  return fn;
}
bool set_mesh_reshard(MeshReshardFn fn) {
  mesh_reshard_slot() = std::move(fn);
  return true;
}
const MeshReshardFn& mesh_reshard() { return mesh_reshard_slot(); }

namespace {
// Whether two specs over one mesh give every device the same block: per dimension the same axes
// once axes of size 1 are left out.
bool same_blocks(const NamedSharding& a, const NamedSharding& b) {
  const Mesh& mesh = a.mesh();
  auto dims = [&](const PartitionSpec& spec) {
    std::vector<std::vector<std::string>> r;
    for (const auto& e : spec.entries()) {
      r.emplace_back();
      for (const std::string& n : e.names)
        if (mesh.axis_size(n) > 1) r.back().push_back(n);
    }
    while (!r.empty() && r.back().empty()) r.pop_back();
    return r;
  };
  return dims(a.spec()) == dims(b.spec());
}
}  // namespace

Array device_put(const Array& x, const Sharding& sharding) {
  ConcreteArray& c = require_concrete(x, "device_put");
  x.block_until_ready();
  const NamedSharding* src = named_sharding_of(c);
  if (auto* single = dynamic_cast<const SingleDeviceSharding*>(&sharding)) {
    if (src) return assemble(c, *src, single->device());
    if (c.buffers.size() != 1)
      throw ShardingError(
          fmt::format("device_put: the source array holds {} buffers but its sharding {} is not a "
                      "NamedSharding over that many devices",
                      c.buffers.size(), x.sharding().str()));
    Array placed;
    if (c.device() == single->device()) {
      placed = make_view(x, c.aval);
    } else if (const Device& to = single->device(); to.platform() == c.device().platform()) {
      check_device(to);
      placed = make_uninitialized(c.aval, to);
      if (size_t n = c.buffer()->nbytes())
        backend_for(to.platform()).copy_between_devices(c.device(), c.buffer()->data(), to, raw_ptr(placed), n);
    } else {
      check_device(to);
      Array host = to_host(x);
      placed = make_from_host(raw_ptr(host), c.aval, to);
    }
    concrete(placed)->committed = true;
    return placed;
  }
  auto* dst = dynamic_cast<const NamedSharding*>(&sharding);
  if (!dst) throw ShardingError(fmt::format("device_put: unsupported sharding {}", sharding.str()));
  if (src && *src == *dst) return x;  // arrays are immutable: already placed
  if (src && src->mesh() == dst->mesh() && same_blocks(*src, *dst)) {
    // The same block on every device (the specs differ only in axes of size 1): relabel.
    auto out = std::make_shared<ConcreteArray>(c.aval, c.buffers[0]);
    out->buffers = c.buffers;
    out->sharding = std::make_shared<NamedSharding>(*dst);
    out->committed = true;
    return Array(out);
  }
  if (src && src->mesh() == dst->mesh() && mesh_reshard()) return mesh_reshard()(x, *dst);
  if (!src && !host_accessible(c.device())) return device_put(to_host(x), sharding);
  Shape block = dst->shard_shape(x.shape());
  Array global = src ? assemble(c, *src, host_device()) : x;
  auto* g = static_cast<std::byte*>(concrete(global)->buffer()->data());
  size_t isz = itemsize(x.dtype());
  std::vector<std::shared_ptr<Buffer>> buffers;
  const auto& mesh_devices = dst->mesh().devices();
  std::vector<std::byte> staging;  // a block bound for device memory
  for (int64_t k = 0; k < dst->mesh().size(); ++k) {
    const Device& d = mesh_devices[size_t(k)];
    size_t nbytes = size_t(shape_size(block)) * isz;
    if (!distributed::is_local(d)) {  // the process that drives d places its own block
      buffers.push_back(std::make_shared<Buffer>(Buffer::Remote{}, d, nbytes));
      continue;
    }
    auto buf = std::make_shared<Buffer>(d, nbytes);
    bool direct = host_accessible(d);
    if (!direct) staging.resize(nbytes);
    auto* to = direct ? static_cast<std::byte*>(buf->data()) : staging.data();
    copy_block(g, x.shape(), to, block, block_start(*dst, x.shape(), block, k), isz, true);
    if (!direct && nbytes > 0) backend_for(d.platform()).copy_from_host(d, buf->data(), to, nbytes);
    buffers.push_back(std::move(buf));
  }
  auto out = std::make_shared<ConcreteArray>(x.aval(), buffers[0]);
  out->buffers = std::move(buffers);
  out->aval.vma.clear();
  out->sharding = std::make_shared<NamedSharding>(*dst);
  out->committed = true;
  return Array(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// visualize_array_sharding

namespace debug {
namespace {
std::string repeat(std::string_view s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}
std::string center(const std::string& s, size_t width) {
  size_t left = (width - s.size()) / 2;
  return std::string(left, ' ') + s + std::string(width - s.size() - left, ' ');
}
}  // namespace

std::string visualize_array_sharding(const Array& x) {
  ConcreteArray& c = require_concrete(x, "visualize_array_sharding");
  if (x.ndim() > 2)
    throw ShardingError(fmt::format("visualize_array_sharding: only 0-D, 1-D and 2-D arrays can be shown, got shape {}",
                                    shape_str(x.shape())));
  int64_t rows = 1, cols = 1;
  std::vector<std::vector<std::set<int>>> ids;
  Platform platform = c.device().platform();
  if (const NamedSharding* ns = named_sharding_of(c)) {
    if (x.ndim() == 1) cols = ns->num_blocks(0);
    if (x.ndim() == 2) rows = ns->num_blocks(0), cols = ns->num_blocks(1);
    ids.assign(size_t(rows), std::vector<std::set<int>>(size_t(cols)));
    for (int64_t k = 0; k < ns->mesh().size(); ++k) {
      std::vector<int64_t> bc = ns->block_coords(x.shape(), k);
      int64_t r = x.ndim() == 2 ? bc[0] : 0, col = x.ndim() == 2 ? bc[1] : x.ndim() == 1 ? bc[0] : 0;
      ids[size_t(r)][size_t(col)].insert(ns->mesh().devices()[size_t(k)].id());
    }
  } else {
    ids.assign(1, std::vector<std::set<int>>(1, std::set<int>{c.device().id()}));
  }
  std::vector<std::vector<std::string>> labels(static_cast<size_t>(rows),
                                               std::vector<std::string>(static_cast<size_t>(cols)));
  size_t width = 0;
  for (size_t r = 0; r < size_t(rows); ++r)
    for (size_t col = 0; col < size_t(cols); ++col) {
      labels[r][col] = fmt::format("{} {}", platform_label(platform), fmt::join(ids[r][col], ","));
      width = std::max(width, labels[r][col].size() + 2);
    }
  auto rule = [&](std::string_view l, std::string_view m, std::string_view r) {
    std::string s(l);
    for (int64_t col = 0; col < cols; ++col) s += repeat("─", width) + std::string(col + 1 < cols ? m : r);
    return s + "\n";
  };
  std::string out = rule("┌", "┬", "┐");
  for (size_t r = 0; r < size_t(rows); ++r) {
    if (r > 0) out += rule("├", "┼", "┤");
    out += "│";
    for (size_t col = 0; col < size_t(cols); ++col) out += center(labels[r][col], width) + "│";
    out += "\n";
  }
  return out + rule("└", "┴", "┘");
}
}  // namespace debug

}  // namespace cjax
