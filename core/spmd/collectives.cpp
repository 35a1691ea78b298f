// Collective primitives: abstract evaluation with the varying-axes rules of docs/shard_map.md
// §2.2, the per-group math (§1.6), the SPMD kernels that exchange blocks through the
// communicator of the running shard_map, and the lax front end (auto-pvary, §2.3).
#include "core/spmd/collectives.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/array/visit_dtype.h"
#include "core/backend/parallel.h"
#include "core/lax/scalar_fns.h"

namespace cjax {

std::string AxisNames::str() const {
  std::vector<std::string> q;
  for (const std::string& n : names) q.push_back("'" + n + "'");
  return q.size() == 1 ? "(" + q[0] + ",)" : fmt::format("({})", fmt::join(q, ", "));
}

std::string AxesParam::str() const { return AxisNames(names).str(); }
size_t AxesParam::hash() const { return absl::HashOf(names); }
bool AxesParam::equals(const ParamObject& o) const {
  auto* p = dynamic_cast<const AxesParam*>(&o);
  return p && p->names == names;
}
std::shared_ptr<const ParamObject> axes_param(std::vector<std::string> names) {
  return std::make_shared<AxesParam>(std::move(names));
}
const std::vector<std::string>& collective_axes(const Params& p) { return p.object<AxesParam>("axes")->names; }

namespace {

// Which elements of the members' operands a combination reads: output element i comes from
// element (i / run) * stride + offset + i % run of every operand (a psum reads all of them; a
// reduce_scatter member, its chunk of each row).
struct Chunking {
  int64_t run, stride, offset;
};

// Elements [lo, hi) of the member-ordered combination of `xs`: out = ((x0 op x1) op x2) ..., a
// block of elements at a time (it stays in cache across the members), with the operation chosen
// outside the loops so that they vectorize.
void combine_range(ReduceOp op, std::span<const Array> xs, const Array& out, int64_t lo, int64_t hi, Chunking c) {
  constexpr int64_t kBlock = 2048;
  visit_dtype(xs[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto with_op = [&](auto combine) {
      T* first = data_ptr<T>(out);
      std::vector<const T*> in(xs.size());
      for (size_t j = 0; j < xs.size(); ++j) in[j] = data_ptr<const T>(xs[j]);
      for (int64_t b = lo; b < hi;) {
        int64_t within = b % c.run;
        if (within == 0 && c.run < kBlock / 2 && hi - b >= 2 * c.run) {
          // Short runs (a reduce_scatter along a minor dimension): whole rows per block, so each
          // member's pass covers a block, not one run.
          int64_t rows = std::min((hi - b) / c.run, kBlock / c.run), row0 = b / c.run;
          T* o = first + b;
          for (size_t j = 0; j < in.size(); ++j)
            for (int64_t r = 0; r < rows; ++r) {
              const T* x = in[j] + (row0 + r) * c.stride + c.offset;
              T* orow = o + r * c.run;
              if (j == 0)
                for (int64_t i = 0; i < c.run; ++i) orow[i] = x[i];
              else
                for (int64_t i = 0; i < c.run; ++i) orow[i] = combine(orow[i], x[i]);
            }
          b += rows * c.run;
          continue;
        }
        int64_t e = std::min({hi, b + kBlock, b - within + c.run});
        int64_t src = (b / c.run) * c.stride + c.offset + within, len = e - b;
        T* o = first + b;
        std::copy(in[0] + src, in[0] + src + len, o);
        for (size_t j = 1; j < in.size(); ++j) {
          const T* x = in[j] + src;
          for (int64_t i = 0; i < len; ++i) o[i] = combine(o[i], x[i]);
        }
        b = e;
      }
    };
    switch (op) {
      case ReduceOp::Sum: return with_op([](T a, T b) { return scalar::reduce_combine<T>(a, b, ReduceOp::Sum); });
      case ReduceOp::Prod: return with_op([](T a, T b) { return scalar::reduce_combine<T>(a, b, ReduceOp::Prod); });
      case ReduceOp::Max: return with_op([](T a, T b) { return scalar::reduce_combine<T>(a, b, ReduceOp::Max); });
      case ReduceOp::Min: return with_op([](T a, T b) { return scalar::reduce_combine<T>(a, b, ReduceOp::Min); });
    }
  });
}
void combine_range(ReduceOp op, std::span<const Array> xs, const Array& out, int64_t lo, int64_t hi) {
  combine_range(op, xs, out, lo, hi, Chunking{std::max<int64_t>(out.size(), 1), 0, 0});
}

AbstractValue local_aval(AbstractValue a) {
  a.vma.clear();
  return a;
}

Array combine_members(ReduceOp op, std::span<const Array> xs) {
  Array out = make_uninitialized(local_aval(xs[0].aval()), concrete(xs[0])->device());
  combine_range(op, xs, out, 0, out.size());
  return out;
}

ReduceOp reduce_op_of(const PrimitiveDef& def) {
  if (&def == &g_pmax) return ReduceOp::Max;
  if (&def == &g_pmin) return ReduceOp::Min;
  return ReduceOp::Sum;
}
bool is_reduction(const PrimitiveDef& def) {
  return &def == &g_psum_invariant || &def == &g_psum || &def == &g_pmax || &def == &g_pmin;
}

Array chunk(const Array& x, int64_t dim, int64_t k, int64_t n) {
  int64_t size = x.shape()[size_t(dim)] / n;
  return lax::slice_in_dim(x, k * size, (k + 1) * size, 1, dim);
}

Array stack_along(std::span<const Array> xs, int64_t axis) {
  std::vector<Array> parts;
  for (const Array& x : xs) parts.push_back(lax::expand_dims(x, {axis}));
  return lax::concatenate(parts, axis);
}

std::string what_of(const PrimitiveDef& def, const Params& p, const Array& x) {
  return fmt::format("{} over {} of {}", def.name, AxisNames(collective_axes(p)).str(), local_aval(x.aval()).str());
}

// ---- abstract evaluation ----

// The axes must be bound; when varying axes are checked, the operand must vary over them.
void require_varying(std::string_view name, const Array& x, const std::vector<std::string>& axes) {
  if (vma_checked(axes) && !vma_subset(axes, x.aval().vma))
    throw VmaError(
        fmt::format("{} over {} needs an operand that varies over those axes, but its type is {}; the lax front end "
                    "inserts "
                    "pvary for this (bind through cjax::lax::{})",
                    name, AxisNames(axes).str(), x.aval().str(), name));
}

std::vector<AbstractValue> reduction_eval(const PrimitiveDef& def, std::span<const Array> in, const Params& p,
                                          bool invariant_out) {
  const auto& axes = collective_axes(p);
  bound_group_size(axes, def.name);
  AbstractValue out = in[0].aval();
  if (invariant_out) {
    require_varying(def.name, in[0], axes);
    out.vma = vma_minus(out.vma, axes);
  }
  if (&def != &g_pmax && &def != &g_pmin && in[0].dtype() == DType::bool_)
    throw DTypeError(fmt::format("{} does not accept bool operands; convert to an integer dtype first", def.name));
  return {out};
}

int64_t group_size_param(const Params& p) { return p.i("axis_size"); }

PrimitiveDef collective_def(const char* name, Arity arity = Arity::exactly(1)) {
  PrimitiveDef def;
  def.name = name;
  def.kind = PrimKind::Collective;
  def.arity = arity;
  return def;
}

std::vector<Array> spmd_kernel(const PrimitiveDef& def, std::span<const Array> in,
                               std::span<const AbstractValue> out_avals, const Params& p);

PrimitiveDef make_reduction(const char* name, bool invariant_out) {
  PrimitiveDef def = collective_def(name);
  def.abstract_eval = [name, invariant_out](std::span<const Array> in, const Params& p) {
    return reduction_eval(*find_primitive(name), in, p, invariant_out);
  };
  def.impl = [name](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(*find_primitive(name), in, outs, p);
  };
  return def;
}

PrimitiveDef make_pvary() {
  PrimitiveDef def = collective_def("pvary");
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    bound_group_size(axes, "pvary");
    AbstractValue out = in[0].aval();
    for (const std::string& a : axes)
      if (std::find(out.vma.begin(), out.vma.end(), a) != out.vma.end())
        throw VmaError(
            fmt::format("pvary is an invariant->varying cast, so the axes passed to it must not be among the operand's "
                        "varying "
                        "axes, but axis '{}' is (operand type {}). Drop '{}' from the axes passed to pvary.",
                        a, out.str(), a));
    out.vma = vma_union(out.vma, sorted_axes(axes));
    return {out};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
    return std::vector<Array>{in[0]};
  };
  return def;
}

PrimitiveDef make_gather_like(const char* name) {
  PrimitiveDef def = collective_def(name);
  bool invariant = std::string_view(name) == "all_gather_invariant";
  def.abstract_eval = [name, invariant](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    bound_group_size(axes, name);
    require_varying(name, in[0], axes);
    AbstractValue out = in[0].aval();
    int64_t n = group_size_param(p), d = p.i("all_gather_dimension");
    bool tiled = p.get<bool>("tiled");
    if (d < 0 || d > out.ndim() - (tiled ? 1 : 0))
      throw ValueError(fmt::format("{}: axis {} is out of bounds for an operand of type {}", name, d, out.str()));
    if (tiled)
      out.shape[size_t(d)] *= n;
    else
      out.shape.insert(out.shape.begin() + d, n);
    if (invariant) out.vma = vma_minus(out.vma, axes);
    return {out};
  };
  def.impl = [name](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(*find_primitive(name), in, outs, p);
  };
  return def;
}

PrimitiveDef make_reduce_scatter() {
  PrimitiveDef def = collective_def("reduce_scatter");
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    bound_group_size(axes, "psum_scatter");
    require_varying("psum_scatter", in[0], axes);
    AbstractValue out = in[0].aval();
    int64_t n = group_size_param(p), d = p.i("scatter_dimension");
    if (d < 0 || d >= out.ndim())
      throw ValueError(
          fmt::format("psum_scatter: scatter_dimension {} is out of bounds for an operand of type {}", d, out.str()));
    int64_t s = out.shape[size_t(d)];
    if (p.get<bool>("tiled")) {
      if (s % n != 0)
        throw ValueError(
            fmt::format("tiled reduce_scatter operand scatter dimension size {} must be divisible by shard_count {}", s,
                        n));
      out.shape[size_t(d)] = s / n;
    } else {
      if (s != n)
        throw ValueError(
            fmt::format("reduce_scatter operand scatter dimension size {} must match shard count {}", s, n));
      out.shape.erase(out.shape.begin() + d);
    }
    return {out};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(g_reduce_scatter, in, outs, p);
  };
  return def;
}

PrimitiveDef make_ppermute() {
  PrimitiveDef def = collective_def("ppermute");
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    int64_t n = bound_group_size(axes, "ppermute");
    require_varying("ppermute", in[0], axes);
    const auto& perm = p.get<std::vector<std::vector<int64_t>>>("perm");
    std::vector<int64_t> srcs, dsts;
    for (const auto& pr : perm) {
      if (pr.size() != 2 || pr[0] < 0 || pr[0] >= n || pr[1] < 0 || pr[1] >= n)
        throw ValueError(
            fmt::format("ppermute: every pair of perm must be (source, destination) with indices in "
                        "[0, {}) (the size of {}), got {}",
                        n, AxisNames(axes).str(), param_value_str(ParamValue(perm))));
      srcs.push_back(pr[0]);
      dsts.push_back(pr[1]);
    }
    auto unique = [](std::vector<int64_t> v) {
      std::sort(v.begin(), v.end());
      return std::adjacent_find(v.begin(), v.end()) == v.end();
    };
    if (!unique(srcs) || !unique(dsts))
      throw ValueError(
          fmt::format("ppermute sources and destinations must be unique, got {}.", param_value_str(ParamValue(perm))));
    return {in[0].aval()};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(g_ppermute, in, outs, p);
  };
  return def;
}

PrimitiveDef make_all_to_all() {
  PrimitiveDef def = collective_def("all_to_all");
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    bound_group_size(axes, "all_to_all");
    require_varying("all_to_all", in[0], axes);
    AbstractValue out = in[0].aval();
    int64_t n = group_size_param(p), s = p.i("split_axis"), c = p.i("concat_axis");
    bool tiled = p.get<bool>("tiled");
    if (s < 0 || s >= out.ndim() || c < 0 || c >= out.ndim())
      throw ValueError(
          fmt::format("all_to_all: split_axis {} and concat_axis {} must be axes of the operand {}", s, c, out.str()));
    int64_t size = out.shape[size_t(s)];
    std::string axis_text = axes.size() == 1 ? axes[0] : AxisNames(axes).str();
    if (tiled) {
      if (size % n != 0)
        throw ValueError(
            fmt::format("The size of all_to_all split_axis ({}) has to be divisible by the size of the named axis {} "
                        "({})",
                        size, axis_text, n));
      out.shape[size_t(s)] = size / n;
      out.shape[size_t(c)] *= n;
    } else {
      if (size != n)
        throw ValueError(
            fmt::format("all_to_all requires the size of the mapped axis {} to equal x.shape[split_axis], "
                        "but they are {} and {} respectively.",
                        axis_text, n, size));
      out.shape.erase(out.shape.begin() + s);
      out.shape.insert(out.shape.begin() + c, n);
    }
    return {out};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(g_all_to_all, in, outs, p);
  };
  return def;
}

PrimitiveDef make_axis_index() {
  PrimitiveDef def = collective_def("axis_index", Arity::exactly(0));
  def.abstract_eval = [](std::span<const Array>, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    bound_group_size(axes, "axis_index");
    AbstractValue out{{}, DType::int32, false, {}};
    if (vma_checked(axes)) out.vma = sorted_axes(axes);
    return {out};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(g_axis_index, in, outs, p);
  };
  return def;
}

PrimitiveDef make_pbroadcast() {
  PrimitiveDef def = collective_def("pbroadcast");
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& axes = collective_axes(p);
    int64_t n = bound_group_size(axes, "pbroadcast");
    require_varying("pbroadcast", in[0], axes);
    int64_t src = p.i("source");
    if (src < 0 || src >= n)
      throw ValueError(
          fmt::format("pbroadcast: source {} is not an index of {} (size {})", src, AxisNames(axes).str(), n));
    return {in[0].aval()};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> outs, const Params& p) {
    return spmd_kernel(g_pbroadcast, in, outs, p);
  };
  return def;
}

}  // namespace

namespace {
std::atomic<CollectiveObserver> g_observer{nullptr};
}  // namespace

void set_collective_observer(CollectiveObserver observer) { g_observer.store(observer); }
bool collective_observer_set() { return g_observer.load() != nullptr; }

namespace {
// ---- SPMD kernels ----

// x with axis `from` moved to position `to`.
Array move_axis(const Array& x, int64_t from, int64_t to) {
  if (from == to) return x;
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < int64_t(x.ndim()); ++i)
    if (i != from) perm.push_back(i);
  perm.insert(perm.begin() + to, from);
  return lax::transpose(x, perm);
}

// x with dimension d cut into n equal chunks, stacked on a new leading axis: block k, contiguous,
// is chunk k along d.
Array blocks_along(const Array& x, int64_t d, int64_t n) {
  Shape s = x.shape(), split(s.begin(), s.begin() + d);
  split.push_back(n);
  split.push_back(s[size_t(d)] / n);
  split.insert(split.end(), s.begin() + d + 1, s.end());
  return move_axis(lax::reshape(x, split), d, 0);
}

// The inverse layout: x's leading axis (the blocks) moved to position d and, when `merge`,
// merged with the axis after it (the blocks laid end to end along d).
Array unblock(const Array& x, int64_t d, bool merge) {
  Array y = move_axis(x, 0, d);
  if (!merge) return y;
  Shape s = y.shape();
  s[size_t(d)] *= s[size_t(d) + 1];
  s.erase(s.begin() + d + 1);
  return lax::reshape(y, s);
}

// One device's part of collective `def` over its group: the blocks move through the group's
// buffer communicator (rank = position in the group), laid out by local shape ops before and
// after so that every block is contiguous.
Array run_on_group(const PrimitiveDef& def, const Params& p, const Array& x, const AbstractValue& out_aval,
                   const Device& device, BufferCommunicator& comm, int rank) {
  int64_t n = comm.size();
  auto allocate = [&](Shape shape) {
    AbstractValue a = local_aval(x.aval());
    a.shape = std::move(shape);
    return make_uninitialized(a, device);
  };
  size_t bytes = size_t(x.size()) * itemsize(x.dtype());
  if (is_reduction(def)) {
    Array out = make_uninitialized(local_aval(out_aval), device);
    comm.all_reduce(rank, raw_ptr(x), raw_ptr(out), size_t(x.size()), x.dtype(), reduce_op_of(def));
    return out;
  }
  if (&def == &g_all_gather || &def == &g_all_gather_invariant) {
    Shape s = x.shape();
    s.insert(s.begin(), n);
    Array gathered = allocate(s);
    comm.all_gather(rank, raw_ptr(x), raw_ptr(gathered), bytes);
    return unblock(gathered, p.i("all_gather_dimension"), p.get<bool>("tiled"));
  }
  if (&def == &g_reduce_scatter) {
    int64_t d = p.i("scatter_dimension");
    Array blocks = blocks_along(x, d, n);
    Shape s = blocks.shape();
    s.erase(s.begin());
    Array out = allocate(s);
    comm.reduce_scatter(rank, raw_ptr(blocks), raw_ptr(out), size_t(out.size()), x.dtype(), ReduceOp::Sum);
    return p.get<bool>("tiled") ? out : lax::squeeze(out, {d});
  }
  if (&def == &g_all_to_all) {
    int64_t split = p.i("split_axis"), concat = p.i("concat_axis");
    Array blocks = blocks_along(x, split, n);
    Array received = allocate(blocks.shape());  // block r: chunk `rank` of member r's operand
    comm.all_to_all(rank, raw_ptr(blocks), raw_ptr(received), bytes / size_t(n));
    if (p.get<bool>("tiled")) return unblock(received, concat, true);
    Shape s = received.shape();
    s.erase(s.begin() + 1 + split);  // the chunk's split axis has size 1
    return unblock(lax::reshape(received, s), concat, false);
  }
  if (&def == &g_ppermute || &def == &g_pbroadcast) {
    std::vector<std::pair<int, int>> pairs;
    if (&def == &g_ppermute) {
      for (const auto& pr : p.get<std::vector<std::vector<int64_t>>>("perm"))
        pairs.emplace_back(int(pr[0]), int(pr[1]));
    } else {
      for (int k = 0; k < int(n); ++k) pairs.emplace_back(int(p.i("source")), k);
    }
    Array out = allocate(x.shape());
    comm.permute(rank, raw_ptr(x), raw_ptr(out), bytes, pairs);
    return out;
  }
  throw Error(fmt::format("internal: '{}' has no buffer collective", def.name));
}

std::vector<Array> spmd_kernel(const PrimitiveDef& def, std::span<const Array> in,
                               std::span<const AbstractValue> out_avals, const Params& p) {
  const SpmdContext* ctx = current_spmd();
  if (!ctx)
    throw AxisNameError(
        fmt::format("'{}' ran outside a shard_map body: collectives exchange blocks between the devices of a "
                    "shard_map; call it "
                    "inside shard_map",
                    def.name));
  if (CollectiveObserver observe = g_observer.load(std::memory_order_relaxed)) observe(def, p, in, out_avals, *ctx);
  const auto& axes = collective_axes(p);
  int64_t pos = 0;
  std::vector<int64_t> members = axis_group(*ctx->mesh, axes, ctx->device, &pos);
  if (&def == &g_axis_index) return {make_scalar(double(pos), DType::int32)};
  if (!ctx->comm)  // a lockstep segment runs each device alone; its collectives run between segments
    throw CollectiveError(fmt::format(
        "'{}' over {} was reached while one device of a shard_map body ran on its own, without a communicator: "
        "the body runs its devices in lockstep, and an equation that exchanges blocks between devices must be "
        "classified by needs_communicator (trace/shard_map.h) so that the body runs on one thread per device. "
        "As a workaround, set CJAX_SPMD_THREADS=1",
        def.name, AxisNames(axes).str()));
  ctx->comm->arrive(ctx->device, what_of(def, p, in[0]));
  if (&def == &g_pvary) return {in[0]};
  Device device = ctx->mesh->devices()[size_t(ctx->device)];
  Array x = concrete(in[0])->device() == device ? in[0] : device_put(in[0], SingleDeviceSharding(device));
  return {run_on_group(def, p, x, out_avals[0], device, ctx->comm->group(members), int(pos))};
}

}  // namespace

const PrimitiveDef& g_psum_invariant = register_primitive(make_reduction("psum_invariant", true));
const PrimitiveDef& g_psum = register_primitive(make_reduction("psum", false));
const PrimitiveDef& g_pmax = register_primitive(make_reduction("pmax", true));
const PrimitiveDef& g_pmin = register_primitive(make_reduction("pmin", true));
const PrimitiveDef& g_pvary = register_primitive(make_pvary());
const PrimitiveDef& g_all_gather = register_primitive(make_gather_like("all_gather"));
const PrimitiveDef& g_all_gather_invariant = register_primitive(make_gather_like("all_gather_invariant"));
const PrimitiveDef& g_reduce_scatter = register_primitive(make_reduce_scatter());
const PrimitiveDef& g_ppermute = register_primitive(make_ppermute());
const PrimitiveDef& g_all_to_all = register_primitive(make_all_to_all());
const PrimitiveDef& g_axis_index = register_primitive(make_axis_index());
const PrimitiveDef& g_pbroadcast = register_primitive(make_pbroadcast());

Array collective_result(const PrimitiveDef& def, const Params& p, std::span<const Array> group, int64_t k) {
  int64_t n = int64_t(group.size());
  if (&def == &g_axis_index) return make_scalar(double(k), DType::int32);
  if (&def == &g_pvary) return group[size_t(k)];
  if (is_reduction(def)) return combine_members(reduce_op_of(def), group);
  if (&def == &g_all_gather || &def == &g_all_gather_invariant) {
    int64_t d = p.i("all_gather_dimension");
    return p.get<bool>("tiled") ? lax::concatenate(std::vector<Array>(group.begin(), group.end()), d)
                                : stack_along(group, d);
  }
  if (&def == &g_reduce_scatter) {  // sum only this member's chunk of every operand
    int64_t d = p.i("scatter_dimension");
    const Array& x0 = group[0];
    AbstractValue piece_aval = local_aval(x0.aval());
    piece_aval.shape[size_t(d)] /= n;
    int64_t inner = 1;
    for (size_t a = size_t(d) + 1; a < x0.shape().size(); ++a) inner *= x0.shape()[a];
    int64_t run = piece_aval.shape[size_t(d)] * inner;
    Array piece = make_uninitialized(piece_aval, concrete(x0)->device());
    if (piece.size() > 0) combine_range(ReduceOp::Sum, group, piece, 0, piece.size(), Chunking{run, run * n, run * k});
    return p.get<bool>("tiled") ? piece : lax::squeeze(piece, {d});
  }
  if (&def == &g_ppermute) {
    for (const auto& pr : p.get<std::vector<std::vector<int64_t>>>("perm"))
      if (pr[1] == k) return group[size_t(pr[0])];
    const Array& x = group[size_t(k)];
    return lax::broadcast_in_dim(make_scalar(0.0, x.dtype()), x.shape(), {});
  }
  if (&def == &g_all_to_all) {
    int64_t s = p.i("split_axis"), c = p.i("concat_axis");
    std::vector<Array> parts;
    for (const Array& x : group) parts.push_back(chunk(x, s, k, n));
    if (p.get<bool>("tiled")) return lax::concatenate(parts, c);
    for (Array& part : parts) part = lax::squeeze(part, {s});
    return stack_along(parts, c);
  }
  if (&def == &g_pbroadcast) return group[size_t(p.i("source"))];
  throw Error(fmt::format("internal: '{}' is not a collective", def.name));
}

bool needs_all_devices(const PrimitiveDef& def) { return def.kind == PrimKind::Collective && &def != &g_pvary; }

namespace {
// A collective over blocks in device memory (virtual GPU devices): each device's part runs on its
// worker thread through the platform's buffer communicator, as in a threaded SPMD run.
std::vector<std::vector<Array>> run_on_device_threads(const PrimitiveDef& def, const Params& p,
                                                      const std::vector<std::vector<Array>>& inputs,
                                                      std::span<const AbstractValue> out_avals, const Mesh& mesh,
                                                      bool backward) {
  size_t n = inputs.size();
  std::lock_guard turn(device_mesh_run_mutex());
  Communicator comm(mesh.devices());
  std::vector<std::vector<Array>> outs(n);
  run_on_device_workers(mesh, comm, backward,
                        [&](int64_t d) { outs[size_t(d)] = spmd_kernel(def, inputs[size_t(d)], out_avals, p); });
  return outs;
}
}  // namespace

std::vector<std::vector<Array>> run_collective_on_all_devices(const PrimitiveDef& def, const Params& p,
                                                              const std::vector<std::vector<Array>>& inputs,
                                                              std::span<const AbstractValue> out_avals,
                                                              const Mesh& mesh, bool record_it, bool backward) {
  size_t n = inputs.size();
  bool device_memory = in_device_memory(mesh);
  if (device_memory && n > 0 && !inputs[0].empty())
    return run_on_device_threads(def, p, inputs, out_avals, mesh, backward);
  if (CollectiveObserver observe = g_observer.load(std::memory_order_relaxed); observe && record_it && !inputs.empty())
    observe(def, p, inputs[0], out_avals, SpmdContext{&mesh, 0, nullptr, backward});
  const auto& axes = collective_axes(p);
  std::vector<std::vector<Array>> outs(n);
  if (n == 0) return outs;
  // A reduction's or an all_gather's result is the same for every member of a group: computed
  // once, on the group's first device, which the other members' results share (CPU devices of
  // one host: one memory).
  std::vector<int64_t> first(n);
  for (size_t d = 0; d < n; ++d) first[d] = axis_group(mesh, axes, int64_t(d))[0];
  bool same_for_group =
      !inputs[0].empty() && (is_reduction(def) || &def == &g_all_gather || &def == &g_all_gather_invariant);
  if (same_for_group && is_reduction(def)) {
    // Each group is combined once, in member order, element ranges of every group in parallel
    // (the groups of a psum over 'tensor' under FSDP are small, but there are several): the same
    // values, bit for bit, as one thread per device, without each member summing the whole group
    // again.
    struct Piece {
      size_t group;
      int64_t lo, hi;
    };
    constexpr int64_t kPiece = int64_t(1) << 13;
    std::vector<std::vector<Array>> members;
    std::vector<Array> results;
    std::vector<Piece> pieces;
    for (size_t d = 0; d < n; ++d) {
      if (first[d] != int64_t(d)) continue;
      std::vector<Array> xs;
      for (int64_t m : axis_group(mesh, axes, int64_t(d))) xs.push_back(inputs[size_t(m)][0]);
      Array out = make_uninitialized(local_aval(xs[0].aval()), concrete(xs[0])->device());
      for (int64_t lo = 0; lo < out.size(); lo += kPiece)
        pieces.push_back({results.size(), lo, std::min(out.size(), lo + kPiece)});
      members.push_back(std::move(xs));
      results.push_back(out);
      outs[d] = {out};
    }
    parallel_for(int64_t(pieces.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const Piece& pc = pieces[size_t(k)];
        combine_range(reduce_op_of(def), members[pc.group], results[pc.group], pc.lo, pc.hi);
      }
    });
  } else {
    parallel_for(int64_t(n), 1, [&](int64_t b, int64_t e) {
      for (int64_t d = b; d < e; ++d) {
        if (same_for_group && first[size_t(d)] != d) continue;
        SpmdScope on_device({&mesh, d, nullptr, backward});  // results are allocated on device d
        int64_t pos = 0;
        std::vector<int64_t> members = axis_group(mesh, axes, d, &pos);
        std::vector<Array> group;
        if (!inputs[size_t(d)].empty())
          for (int64_t m : members) group.push_back(inputs[size_t(m)][0]);
        outs[size_t(d)] = {collective_result(def, p, group, pos)};
      }
    });
  }
  if (same_for_group)
    for (size_t d = 0; d < n; ++d)
      if (first[d] != int64_t(d)) outs[d] = {shared_on_device(outs[size_t(first[d])][0], mesh.devices()[d])};
  return outs;
}

// ---- front end ----

namespace {
bool is_traced(const Array& x) { return x.defined() && !x.impl()->is_concrete(); }

std::vector<std::string> checked_axes(const AxisNames& a, std::string_view op) {
  std::vector<std::string> names = a.names;
  if (names.empty()) throw ValueError(fmt::format("{}: no axis names given", op));
  std::vector<std::string> s = names;
  std::sort(s.begin(), s.end());
  if (std::adjacent_find(s.begin(), s.end()) != s.end())
    throw ValueError(fmt::format("{}: axis names {} repeat an axis", op, a.str()));
  bound_group_size(names, op);
  return names;
}

// `names` split into the axis names of enclosing vmaps (batch axes) and the mesh axes, each in
// the order written.
std::pair<std::vector<std::string>, std::vector<std::string>> split_batch_axes(const std::vector<std::string>& names) {
  std::pair<std::vector<std::string>, std::vector<std::string>> out;
  for (const std::string& n : names) (is_batch_axis(n) ? out.first : out.second).push_back(n);
  return out;
}

// The data-moving collectives' batching rules handle a vmapped axis named alone (as JAX's do).
void require_batch_axis_alone(const std::vector<std::string>& names, std::string_view op) {
  auto [batch, mesh] = split_batch_axes(names);
  if (batch.empty() || (batch.size() == 1 && mesh.empty())) return;
  throw ValueError(
      fmt::format("{} over {} names the vmapped axis '{}' together with other axes; over a vmap's axis_name it "
                  "supports one "
                  "vmapped axis alone (as JAX's batching rule does): apply it over each axis in turn",
                  op, AxisNames(names).str(), batch[0]));
}
}  // namespace

std::vector<std::string> common_vma(std::span<const Array> xs) {
  std::vector<std::string> all;
  for (const Array& x : xs) all = vma_union(all, x.aval().vma);
  return all;
}
bool vmas_differ(std::span<const Array> xs) {
  for (const Array& x : xs)
    if (x.aval().vma != xs[0].aval().vma) return true;
  return false;
}
Params pvary_params(std::vector<std::string> axes) { return {{"axes", axes_param(std::move(axes))}}; }

Array pvary_missing(const Array& x, const std::vector<std::string>& axes) {
  if (!vma_checked(axes)) return x;
  std::vector<std::string> missing;
  for (const std::string& a : axes)
    if (!std::binary_search(x.aval().vma.begin(), x.aval().vma.end(), a)) missing.push_back(a);
  if (missing.empty()) return x;
  return bind1(g_pvary, {x}, {{"axes", axes_param(std::move(missing))}});
}

namespace lax {

namespace {
Array reduce_front(const PrimitiveDef& checked, const Array& x_in, const AxisNames& axes, std::string_view op) {
  std::vector<std::string> names = checked_axes(axes, op);
  const PrimitiveDef& plain = &checked == &g_psum_invariant ? g_psum : checked;
  Array x = x_in;
  if (auto [batch, mesh] = split_batch_axes(names); !batch.empty()) {
    // Over vmapped axes first (the vmap's batching rule reduces its batch dimension; no
    // varying-axes types there), then over the mesh axes as below.
    if (is_traced(x))
      x = bind1(plain, {x}, {{"axes", axes_param(batch)}});
    else if (&checked == &g_psum_invariant)
      x = numpy::multiply(x, Array(int(bound_group_size(batch, op))));
    if (mesh.empty()) return x;
    names = mesh;
  }
  int64_t n = bound_group_size(names, op);
  if (!is_traced(x) && &checked == &g_psum_invariant)  // a constant: n * x, no communication
    return numpy::multiply(x, Array(int(n)));
  if (!is_traced(x) && &checked != &g_psum_invariant) return x;  // max/min of identical copies
  if (vma_checked(names)) return bind1(checked, {pvary_missing(x, names)}, {{"axes", axes_param(names)}});
  return bind1(plain, {x}, {{"axes", axes_param(names)}});
}
}  // namespace

Array psum(const Array& x, const AxisNames& axes) { return reduce_front(g_psum_invariant, x, axes, "psum"); }
Array pmax(const Array& x, const AxisNames& axes) { return reduce_front(g_pmax, x, axes, "pmax"); }
Array pmin(const Array& x, const AxisNames& axes) { return reduce_front(g_pmin, x, axes, "pmin"); }
Array pmean(const Array& x, const AxisNames& axes) {
  int n = axis_size(axes);
  return numpy::divide(psum(x, axes), Array(n));
}

Array pvary(const Array& x, const AxisNames& axes) {
  bool any_batch =
      std::any_of(axes.names.begin(), axes.names.end(), [](const std::string& a) { return is_batch_axis(a); });
  if (manual_axes_in_scope().empty() && !any_batch) throw ValueError("pvary should be called under shard_map.");
  std::vector<std::string> names =
      split_batch_axes(checked_axes(axes, "pvary")).second;  // the identity over vmapped axes
  if (names.empty() || !vma_checked(names)) return x;
  return bind1(g_pvary, {x}, {{"axes", axes_param(names)}});
}

Array all_gather(const Array& x, const AxisNames& axes, AllGatherOpts o) {
  std::vector<std::string> names = checked_axes(axes, "all_gather");
  require_batch_axis_alone(names, "all_gather");
  int64_t n = bound_group_size(names, "all_gather");
  int64_t d = o.axis < 0 ? o.axis + x.ndim() + (o.tiled ? 0 : 1) : o.axis;
  const PrimitiveDef& def = o.to_invariant && vma_checked(names) ? g_all_gather_invariant : g_all_gather;
  return bind1(def, {pvary_missing(x, names)},
               {{"axes", axes_param(names)}, {"all_gather_dimension", d}, {"axis_size", n}, {"tiled", o.tiled}});
}

Array psum_scatter(const Array& x, const AxisNames& axes, PsumScatterOpts o) {
  std::vector<std::string> names = checked_axes(axes, "psum_scatter");
  require_batch_axis_alone(names, "psum_scatter");
  int64_t n = bound_group_size(names, "psum_scatter");
  int64_t d = o.scatter_dimension < 0 ? o.scatter_dimension + x.ndim() : o.scatter_dimension;
  return bind1(g_reduce_scatter, {pvary_missing(x, names)},
               {{"axes", axes_param(names)}, {"scatter_dimension", d}, {"axis_size", n}, {"tiled", o.tiled}});
}

Array ppermute(const Array& x, const AxisNames& axes, std::vector<std::pair<int, int>> perm) {
  std::vector<std::string> names = checked_axes(axes, "ppermute");
  require_batch_axis_alone(names, "ppermute");
  std::vector<std::vector<int64_t>> pairs;
  for (auto [s, d] : perm) pairs.push_back({s, d});
  return bind1(g_ppermute, {pvary_missing(x, names)}, {{"axes", axes_param(names)}, {"perm", pairs}});
}

Array all_to_all(const Array& x, const AxisNames& axes, int split_axis, int concat_axis, AllToAllOpts o) {
  std::vector<std::string> names = checked_axes(axes, "all_to_all");
  require_batch_axis_alone(names, "all_to_all");
  int64_t n = bound_group_size(names, "all_to_all");
  int64_t s = split_axis < 0 ? split_axis + x.ndim() : split_axis;
  int64_t c = concat_axis < 0 ? concat_axis + x.ndim() : concat_axis;
  return bind1(g_all_to_all, {pvary_missing(x, names)},
               {{"axes", axes_param(names)},
                {"axis_size", n},
                {"concat_axis", c},
                {"split_axis", s},
                {"tiled", o.tiled}});
}

Array axis_index(const AxisNames& axes) {
  std::vector<std::string> names = checked_axes(axes, "axis_index");
  if (names.size() > 1 && !split_batch_axes(names).first.empty()) {
    // Several axes with a vmapped one: the row-major index composed from each axis's own.
    Array idx;
    for (const std::string& a : names) {
      Array k = axis_index(a);
      idx = idx.defined() ? numpy::add(numpy::multiply(idx, Array(int(bound_group_size({a}, "axis_index")))), k) : k;
    }
    return idx;
  }
  return bind1(g_axis_index, std::span<const Array>(), {{"axes", axes_param(names)}});
}

int axis_size(const AxisNames& axes) { return int(bound_group_size(checked_axes(axes, "axis_size"), "axis_size")); }

Array pbroadcast(const Array& x, const AxisNames& axes, int source) {
  std::vector<std::string> names = checked_axes(axes, "pbroadcast");
  require_batch_axis_alone(names, "pbroadcast");
  return bind1(g_pbroadcast, {pvary_missing(x, names)}, {{"axes", axes_param(names)}, {"source", int64_t(source)}});
}

}  // namespace lax
}  // namespace cjax
