// Sharding rules of the primitive families (jit/partition/partitioner.h, docs/sharding.md §2):
// how each runs on blocks. Dimensions a primitive maps one to one (elementwise, broadcast,
// transpose, reshape on major factors, kept dimensions of reductions, batch and free dimensions
// of dot_general) stay split; contracted and summed split dimensions leave a pending sum; the
// dimensions a primitive needs whole (sorted, scanned, sliced, padded, concatenated) are gathered.
#include <fmt/format.h>

#include <algorithm>

#include "cjax/collectives.h"
#include "cjax/sharding.h"
#include "core/lax/gather_scatter.h"
#include "core/lax/linalg.h"
#include "jit/partition/partitioner.h"
#include "trace/sharding_constraint.h"

namespace cjax::partition {
namespace {

using Axes = std::vector<std::string>;

bool starts_with(const Axes& a, const Axes& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}
bool contains(const Axes& a, const std::string& x) { return std::find(a.begin(), a.end(), x) != a.end(); }
Axes union_in_mesh_order(const Mesh& mesh, const Axes& a, const Axes& b) {
  Axes r;
  for (const std::string& n : mesh.axis_names())
    if (contains(a, n) || contains(b, n)) r.push_back(n);
  return r;
}
bool layout_uses_any(const Layout& l, const Axes& axes) {
  return std::any_of(axes.begin(), axes.end(), [&](const std::string& a) { return l.uses(a); });
}
int64_t local_bytes(const Value& v) { return v.local.aval().size() * int64_t(itemsize(v.local.dtype())); }

std::vector<Array> locals(const std::vector<Value>& vs) {
  std::vector<Array> r;
  for (const Value& v : vs) r.push_back(v.local);
  return r;
}
std::vector<Value> with_layout(const std::vector<Array>& outs, const Layout& l) {
  std::vector<Value> r;
  for (const Array& o : outs) r.push_back(Value{o, l});
  return r;
}

// `target` widened by `other`'s split where `other` splits a dimension further along the same
// axes (a local slice of target's blocks) with axes target does not use elsewhere.
void merge_into(Partitioner& p, Layout& target, const Layout& other, const Shape& global) {
  for (size_t d = 0; d < target.dims.size(); ++d) {
    const Axes& o = other.dims[d];
    if (o.size() <= target.dims[d].size() || !starts_with(o, target.dims[d])) continue;
    Axes extra(o.begin() + long(target.dims[d].size()), o.end());
    if (layout_uses_any(target, extra) || global[d] % p.size_of(o) != 0) continue;
    target.dims[d] = o;
  }
}

// ---- elementwise ----

// Whether the pending operands may stay pending sums through this primitive (else they are reduced first).
bool linear_in_pending(const JaxprEqn& eqn, const std::vector<Value>& ins) {
  const std::string& n = eqn.primitive->name;
  auto pending = [&](size_t i) { return !ins[i].layout.unreduced.empty(); };
  for (size_t i = 0; i < ins.size(); ++i)
    if (pending(i) && !elementwise_linear_in(eqn, i)) return false;
  if (n == "add" || n == "sub" || n == "add_any") {
    for (const Value& v : ins)
      if (v.layout.unreduced != ins[0].layout.unreduced) return false;
    return true;
  }
  if (n == "mul" || n == "div") {  // one pending operand (a div's numerator), the other splitting none of its axes
    if (pending(0) == pending(1)) return false;
    size_t u = pending(0) ? 0 : 1;
    return !layout_uses_any(ins[1 - u].layout, ins[u].layout.unreduced);
  }
  return true;  // neg, stop_gradient, float converts
}

std::vector<Value> elementwise_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const AbstractValue& out = eqn.outputs[0].aval();
  const size_t rank = out.shape.size();
  bool any_pending = std::any_of(ins.begin(), ins.end(), [](const Value& v) { return !v.layout.unreduced.empty(); });
  Axes pending;
  bool reduced_anyway = false;  // an operand some other equation needs reduced: one psum serves both
  for (size_t i = 0; i < ins.size(); ++i)
    if (auto* v = std::get_if<Var>(&eqn.inputs[i]); v && !ins[i].layout.unreduced.empty())
      reduced_anyway = reduced_anyway || p.reduced_anyway.count(v->id()) > 0;
  if (any_pending && !reduced_anyway && linear_in_pending(eqn, ins)) {
    for (const Value& v : ins)
      if (!v.layout.unreduced.empty()) pending = v.layout.unreduced;
  } else if (any_pending) {
    for (size_t i = 0; i < ins.size(); ++i) {
      auto* var = std::get_if<Var>(&eqn.inputs[i]);
      ins[i] = p.reduced_for(ins[i], var ? var->id() : nullptr);
    }
  }
  // The most split operand leads; the others are resharded to it (widened where they split more).
  const Value* lead = nullptr;
  for (const Value& v : ins)
    if (v.local.ndim() == int64_t(rank) && rank > 0 && (!lead || v.local.aval().size() < lead->local.aval().size()))
      lead = &v;
  Layout target = lead ? lead->layout.without_pending() : Layout::replicated(rank);
  for (const Value& v : ins)
    if (v.local.ndim() == int64_t(rank) && rank > 0) merge_into(p, target, v.layout, out.shape);
  for (Value& v : ins) {
    if (v.local.ndim() == 0) continue;
    Layout t = target;
    t.unreduced = v.layout.unreduced;
    v = p.reshard(v, t);
  }
  target.unreduced = pending;
  return with_layout(cjax::bind(*eqn.primitive, locals(ins), eqn.params), target);
}

// ---- shape ----

std::vector<Value> broadcast_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  Value& x = ins[0];
  const Shape& global = eqn.params.ints("shape");
  const auto& bdims = eqn.params.ints("broadcast_dimensions");
  const Shape& in_global = atom_aval(eqn.inputs[0]).shape;
  Layout out = Layout::replicated(global.size());
  out.unreduced = x.layout.unreduced;
  for (size_t i = 0; i < bdims.size(); ++i)
    if (in_global[i] == global[size_t(bdims[i])]) out.dims[size_t(bdims[i])] = x.layout.dims[i];
  Params params = eqn.params;
  params.set("shape", p.local_shape(global, out));
  Array r = bind1(*eqn.primitive, {x.local}, params);
  p.remember_broadcast(r, x, eqn.params);
  return {Value{r, out}};
}

std::vector<Value> transpose_rule(Partitioner&, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const auto& perm = eqn.params.ints("permutation");
  Layout out = ins[0].layout;
  for (size_t i = 0; i < perm.size(); ++i) out.dims[i] = ins[0].layout.dims[size_t(perm[i])];
  return with_layout(cjax::bind(*eqn.primitive, {ins[0].local}, eqn.params), out);
}

std::vector<Value> squeeze_rule(Partitioner&, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const auto& dims = eqn.params.ints("dimensions");
  Layout out = ins[0].layout;
  out.dims.clear();
  for (size_t d = 0; d < ins[0].layout.dims.size(); ++d)
    if (std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) out.dims.push_back(ins[0].layout.dims[d]);
  return with_layout(cjax::bind(*eqn.primitive, {ins[0].local}, eqn.params), out);
}

// Reshape keeps a split where it lives on the major factor of a group of dimensions that
// reshape merges or splits (the blocks stay contiguous runs of the group); any other split of
// the group is gathered first.
std::vector<Value> reshape_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  Value x = ins[0];
  const Shape& a = atom_aval(eqn.inputs[0]).shape;
  const Shape& b = eqn.params.ints("new_sizes");
  if (eqn.params.has("dimensions") && std::holds_alternative<std::vector<int64_t>>(eqn.params.at("dimensions")) &&
      !eqn.params.ints("dimensions").empty()) {
    std::vector<int64_t> all(a.size());
    for (size_t d = 0; d < a.size(); ++d) all[d] = int64_t(d);
    x = p.gathered_along(x, all);
  }
  Layout out = Layout::replicated(b.size());
  out.unreduced = x.layout.unreduced;
  Layout keep = x.layout;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    std::vector<size_t> ga, gb;
    int64_t pa = 1, pb = 1;
    if (i < a.size()) pa *= a[i], ga.push_back(i++);
    if (j < b.size()) pb *= b[j], gb.push_back(j++);
    while (pa != pb) {
      if (pa < pb && i < a.size())
        pa *= a[i], ga.push_back(i++);
      else if (j < b.size())
        pb *= b[j], gb.push_back(j++);
      else
        break;
    }
    auto major = [](const std::vector<size_t>& g, const Shape& s) -> std::optional<size_t> {
      for (size_t d : g)
        if (s[d] > 1) return d;
      return std::nullopt;
    };
    std::optional<size_t> ma = major(ga, a), mb = major(gb, b);
    for (size_t d : ga) {
      const Axes& axes = x.layout.dims[d];
      if (axes.empty()) continue;
      if (ma && d == *ma && mb && b[*mb] % p.size_of(axes) == 0)
        out.dims[*mb] = axes;
      else
        keep.dims[d].clear();
    }
  }
  if (!(keep == x.layout)) {
    x = p.reshard(x, keep);
    // Axes dropped from one group's major dimension are no longer split in the output.
    for (auto& axes : out.dims) {
      bool still = false;
      for (const auto& k : keep.dims) still = still || (!axes.empty() && k == axes);
      if (!still) axes.clear();
    }
  }
  Params params = eqn.params;
  params.set("new_sizes", p.local_shape(b, out));
  return with_layout(cjax::bind(*eqn.primitive, {x.local}, params), out);
}

// Dimensions the primitive needs whole: gathered; the others keep their split. `dims` of the
// operand(s); outputs keep the operand layout (`drop` removes reduced dimensions from it).
std::vector<Value> whole_along(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins,
                               const std::vector<int64_t>& dims, bool drop, const Params& params) {
  Layout target = p.gathered_along(ins[0], dims).layout;
  for (size_t k = 1; k < ins.size(); ++k)
    if (ins[k].local.ndim() == int64_t(target.dims.size()))
      merge_into(p, target, p.gathered_along(ins[k], dims).layout, atom_aval(eqn.inputs[0]).shape);
  for (Value& v : ins) {
    v = p.reduced(v);
    if (v.local.ndim() == int64_t(target.dims.size())) v = p.reshard(v, target);
  }
  Layout out = target;
  if (drop) {
    out.dims.clear();
    for (size_t d = 0; d < target.dims.size(); ++d)
      if (std::find(dims.begin(), dims.end(), int64_t(d)) == dims.end()) out.dims.push_back(target.dims[d]);
  }
  return with_layout(cjax::bind(*eqn.primitive, locals(ins), params), out);
}

// A slice (static or dynamic): the `cut` dimensions are gathered; whole ones keep their split, and
// the parameter `extent` (their limit or size) becomes the block's extent. Indices are replicated.
std::vector<Value> slice_of_blocks(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins,
                                   const std::vector<int64_t>& cut, const char* extent) {
  auto extents = eqn.params.ints(extent);
  Value x = p.gathered_along(ins[0], cut);
  Shape local = p.local_shape(atom_aval(eqn.inputs[0]).shape, x.layout);
  for (size_t d = 0; d < local.size(); ++d)
    if (!x.layout.dims[d].empty()) extents[d] = local[d];
  Params params = eqn.params;
  params.set(extent, extents);
  std::vector<Array> args{x.local};
  for (size_t k = 1; k < ins.size(); ++k) args.push_back(p.reduced(ins[k]).local);
  return with_layout({bind1(*eqn.primitive, args, params)}, x.layout);
}

std::vector<Value> slice_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const Shape& s = atom_aval(eqn.inputs[0]).shape;
  auto start = eqn.params.ints("start_indices");
  auto limit = eqn.params.ints("limit_indices");
  std::vector<int64_t> strides(s.size(), 1);
  if (!std::holds_alternative<std::monostate>(eqn.params.at("strides"))) strides = eqn.params.ints("strides");
  std::vector<int64_t> sliced;
  for (size_t d = 0; d < s.size(); ++d)
    if (start[d] != 0 || limit[d] != s[d] || strides[d] != 1) sliced.push_back(int64_t(d));
  return slice_of_blocks(p, eqn, ins, sliced, "limit_indices");
}

// Whole dimensions' starts clamp to 0, so their blocks are sliced whole.
std::vector<Value> dynamic_slice_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const Shape& s = atom_aval(eqn.inputs[0]).shape;
  const auto& sizes = eqn.params.ints("slice_sizes");
  std::vector<int64_t> cut;
  for (size_t d = 0; d < s.size(); ++d)
    if (sizes[d] != s[d]) cut.push_back(int64_t(d));
  return slice_of_blocks(p, eqn, ins, cut, "slice_sizes");
}

// Dimensions the update covers whole keep the operand's split (the update is split alike).
std::vector<Value> dynamic_update_slice_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const Shape& s = atom_aval(eqn.inputs[0]).shape;
  const Shape& u = atom_aval(eqn.inputs[1]).shape;
  std::vector<int64_t> cut;
  for (size_t d = 0; d < s.size(); ++d)
    if (u[d] != s[d]) cut.push_back(int64_t(d));
  return whole_along(p, eqn, ins, cut, false, eqn.params);
}

std::vector<Value> pad_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const auto& cfg = eqn.params.get<std::vector<std::vector<int64_t>>>("padding_config");
  std::vector<int64_t> padded;
  for (size_t d = 0; d < cfg.size(); ++d)
    if (cfg[d][0] != 0 || cfg[d][1] != 0 || cfg[d][2] != 0) padded.push_back(int64_t(d));
  return whole_along(p, eqn, ins, padded, false, eqn.params);
}

// ---- reductions ----

// A reduction's result layout (the kept dimensions' splits) and the axes splitting reduced ones.
std::pair<Layout, Axes> reduce_layout(const Layout& in, const std::vector<int64_t>& axes) {
  Layout out;
  Axes across;
  for (size_t d = 0; d < in.dims.size(); ++d) {
    if (std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end())
      across.insert(across.end(), in.dims[d].begin(), in.dims[d].end());
    else
      out.dims.push_back(in.dims[d]);
  }
  return {out, across};
}

std::vector<Value> reduce_sum_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const Value& x = ins[0];
  auto [out, summed] = reduce_layout(x.layout, eqn.params.ints("axes"));
  out.unreduced = union_in_mesh_order(p.mesh(), x.layout.unreduced, summed);
  return with_layout(cjax::bind(*eqn.primitive, {x.local}, eqn.params), out);
}

// reduce_max / reduce_min: the local reduction, then pmax / pmin over the axes that split
// reduced dimensions (an all-reduce of the reduced, small value).
std::vector<Value> reduce_extremum_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  Value x = p.reduced(ins[0]);
  auto [out, across] = reduce_layout(x.layout, eqn.params.ints("axes"));
  Array r = bind1(*eqn.primitive, {x.local}, eqn.params);
  if (!across.empty()) {
    bool max = eqn.primitive->name == "reduce_max";
    r = p.emit(max ? "pmax" : "pmin", across, r, "reduction over split dimensions",
               [&] { return max ? lax::pmax(r, across) : lax::pmin(r, across); });
  }
  return {Value{r, out}};
}

std::vector<Value> reduce_whole_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  return whole_along(p, eqn, ins, eqn.params.ints("axes"), true, eqn.params);
}
std::vector<Value> along_axis_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  return whole_along(p, eqn, ins, {eqn.params.i("axis")}, false, eqn.params);
}
std::vector<Value> along_last_dimension_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  return whole_along(p, eqn, ins, {ins[0].local.ndim() - 1}, false, eqn.params);
}
std::vector<Value> rev_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  return whole_along(p, eqn, ins, eqn.params.ints("dimensions"), false, eqn.params);
}
std::vector<Value> along_dimension_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  return whole_along(p, eqn, ins, {eqn.params.i("dimension")}, false, eqn.params);
}

// ---- dot_general ----

enum class Role { Batch, Contract, Free };

struct Operand {
  Value v;
  Layout target;
  std::vector<Role> role;
  std::vector<int64_t> partner;  // batch / contracting dims: the other operand's dim
};

// Where `axis` splits a dimension of `o`'s target, or -1.
int64_t dim_of(const Operand& o, const std::string& axis) {
  for (size_t d = 0; d < o.target.dims.size(); ++d)
    if (contains(o.target.dims[d], axis)) return int64_t(d);
  return -1;
}
void drop_axis(Operand& o, const std::string& axis) {
  for (auto& axes : o.target.dims) {
    auto it = std::find(axes.begin(), axes.end(), axis);
    if (it != axes.end()) axes.erase(it, axes.end());  // an axis leaves with the ones minor to it
  }
}
// Splits `other`'s dimension `d` like `o`'s dimension `od` if that only slices `other` locally.
bool can_follow(const Partitioner& p, const Operand& o, int64_t od, const Operand& other, int64_t d,
                const Shape& other_global) {
  const Axes& want = o.target.dims[size_t(od)];
  const Axes& have = other.target.dims[size_t(d)];
  if (!starts_with(want, have)) return false;
  Axes extra(want.begin() + long(have.size()), want.end());
  return !layout_uses_any(other.target, extra) && !layout_uses_any(other.v.layout.without_pending(), extra) &&
         other_global[size_t(d)] % p.size_of(want) == 0;
}

std::vector<Value> dot_general_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  auto dn = eqn.params.object<DotDimsParam>("dimension_numbers");
  const Shape& lg = atom_aval(eqn.inputs[0]).shape;
  const Shape& rg = atom_aval(eqn.inputs[1]).shape;
  // A pending sum survives in one operand if the other does not use its axes (dot is linear in each).
  if (!ins[0].layout.unreduced.empty() && !ins[1].layout.unreduced.empty()) {
    ins[0] = p.reduced(ins[0]);
    ins[1] = p.reduced(ins[1]);
  }
  for (int k = 0; k < 2; ++k)
    if (layout_uses_any(ins[1 - k].layout, ins[k].layout.unreduced)) ins[k] = p.reduced(ins[k]);

  Operand ops[2];
  for (int k = 0; k < 2; ++k) {
    ops[k].v = ins[k];
    ops[k].target = ins[k].layout;
    ops[k].role.assign(ins[k].layout.dims.size(), Role::Free);
    ops[k].partner.assign(ins[k].layout.dims.size(), -1);
  }
  for (size_t i = 0; i < dn->lhs_batch.size(); ++i) {
    ops[0].role[size_t(dn->lhs_batch[i])] = ops[1].role[size_t(dn->rhs_batch[i])] = Role::Batch;
    ops[0].partner[size_t(dn->lhs_batch[i])] = dn->rhs_batch[i];
    ops[1].partner[size_t(dn->rhs_batch[i])] = dn->lhs_batch[i];
  }
  for (size_t i = 0; i < dn->lhs_contracting.size(); ++i) {
    ops[0].role[size_t(dn->lhs_contracting[i])] = ops[1].role[size_t(dn->rhs_contracting[i])] = Role::Contract;
    ops[0].partner[size_t(dn->lhs_contracting[i])] = dn->rhs_contracting[i];
    ops[1].partner[size_t(dn->rhs_contracting[i])] = dn->lhs_contracting[i];
  }
  const Shape* global[2] = {&lg, &rg};
  const AbstractValue& out_aval = eqn.outputs[0].aval();
  int64_t out_bytes = out_aval.size() * int64_t(itemsize(out_aval.dtype));

  for (const std::string& axis : p.mesh().axis_names()) {
    int64_t d0 = dim_of(ops[0], axis), d1 = dim_of(ops[1], axis);
    if (d0 < 0 && d1 < 0) continue;
    if (d0 >= 0 && d1 >= 0) {
      bool paired = ops[0].role[size_t(d0)] != Role::Free && ops[0].partner[size_t(d0)] == d1;
      if (paired) continue;
      // Conflict (the axis would split the result twice, or split unpaired dimensions). As JAX's
      // explicit sharding does, a contracting dimension gives the axis up first (the FSDP
      // pattern: the weight is gathered, the batch stays split), then a free one, then a batch
      // one; between equals, the operand with fewer bytes.
      auto rank_of = [](Role r) { return r == Role::Contract ? 0 : r == Role::Free ? 1 : 2; };
      int r0 = rank_of(ops[0].role[size_t(d0)]), r1 = rank_of(ops[1].role[size_t(d1)]);
      int k = r0 != r1 ? (r0 < r1 ? 0 : 1) : (local_bytes(ops[0].v) <= local_bytes(ops[1].v) ? 0 : 1);
      drop_axis(ops[k], axis);
      (k == 0 ? d0 : d1) = -1;
    }
    int k = d0 >= 0 ? 0 : 1;
    int64_t d = k == 0 ? d0 : d1;
    Operand &o = ops[k], &other = ops[1 - k];
    Role role = o.role[size_t(d)];
    if (role == Role::Free) continue;
    int64_t pd = o.partner[size_t(d)];
    bool follow = can_follow(p, o, d, other, pd, *global[1 - k]);
    if (role == Role::Batch) {
      if (follow)
        other.target.dims[size_t(pd)] = o.target.dims[size_t(d)];
      else
        drop_axis(o, axis);
      continue;
    }
    // A contracting dimension split on one side: gather it there, or split the other side the
    // same way (a local slice) and leave a pending sum. By bytes moved: the gather moves
    // (n-1) x the block; the pending sum costs at most an all-reduce of the result block.
    int64_t n = p.mesh().axis_size(axis);
    double gather_cost = double(n - 1) * double(local_bytes(o.v));
    int64_t split = 1;
    for (const auto& axes : ops[0].target.dims) split *= p.size_of(axes);
    double reduce_cost = 2.0 * double(n - 1) / double(n) * double(out_bytes) / double(std::max<int64_t>(split, 1));
    if (follow && reduce_cost < gather_cost)
      other.target.dims[size_t(pd)] = o.target.dims[size_t(d)];
    else
      drop_axis(o, axis);
  }
  // Paired dimensions end split alike: their common major axes.
  for (size_t d = 0; d < ops[0].role.size(); ++d) {
    if (ops[0].role[d] == Role::Free) continue;
    Axes& a = ops[0].target.dims[d];
    Axes& b = ops[1].target.dims[size_t(ops[0].partner[d])];
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    a.resize(k);
    b.resize(k);
  }
  Layout out;
  Axes contracted;
  for (size_t i = 0; i < dn->lhs_batch.size(); ++i) out.dims.push_back(ops[0].target.dims[size_t(dn->lhs_batch[i])]);
  for (int k = 0; k < 2; ++k)
    for (size_t d = 0; d < ops[k].role.size(); ++d) {
      if (ops[k].role[d] == Role::Free) out.dims.push_back(ops[k].target.dims[d]);
      if (k == 0 && ops[k].role[d] == Role::Contract)
        contracted.insert(contracted.end(), ops[k].target.dims[d].begin(), ops[k].target.dims[d].end());
    }
  out.unreduced =
      union_in_mesh_order(p.mesh(), union_in_mesh_order(p.mesh(), ins[0].layout.unreduced, ins[1].layout.unreduced),
                          contracted);
  std::vector<Array> blocks;
  for (Operand& o : ops) blocks.push_back(p.reshard(o.v, o.target).local);
  return with_layout(cjax::bind(*eqn.primitive, blocks, eqn.params), out);
}

// ---- gather / scatter-add (embedding lookups and their gradients) ----

bool in(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
void remove_axes(Layout& l, const Layout& used) {
  for (auto& axes : l.dims)
    for (size_t k = 0; k < axes.size(); ++k)
      if (used.uses(axes[k])) {
        axes.resize(k);
        break;
      }
}

// gather: the operand's dimensions taken whole by every slice (not indexed) keep their split and
// become the output's offset dimensions; the indices' batch dimensions keep theirs; indexed
// dimensions are gathered. An axis on both sides stays with the indices.
std::vector<Value> gather_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const lax::GatherDimensionNumbers& dn = gather_dimension_numbers(eqn.params);
  if (!dn.operand_batching_dims.empty()) return run_replicated(p, eqn, ins);
  const Shape& og = atom_aval(eqn.inputs[0]).shape;
  const Shape& out = eqn.outputs[0].aval().shape;
  std::vector<int64_t> sizes = eqn.params.ints("slice_sizes");
  Value op = p.reduced(ins[0]), idx = p.reduced(ins[1]);
  Layout it = idx.layout;
  if (!it.dims.empty()) it.dims.back().clear();
  Layout ot = op.layout;
  for (size_t d = 0; d < og.size(); ++d)
    if (sizes[d] != og[d] || in(dn.start_index_map, int64_t(d)) || in(dn.collapsed_slice_dims, int64_t(d)))
      ot.dims[d].clear();
  remove_axes(ot, it);
  op = p.reshard(op, ot);
  idx = p.reshard(idx, it);
  Layout ol = Layout::replicated(out.size());
  size_t k = 0, b = 0;
  for (size_t d = 0; d < og.size(); ++d) {
    if (in(dn.collapsed_slice_dims, int64_t(d))) continue;
    ol.dims[size_t(dn.offset_dims[k++])] = ot.dims[d];
    if (!ot.dims[d].empty()) sizes[d] = og[d] / p.size_of(ot.dims[d]);
  }
  for (size_t d = 0; d < out.size(); ++d)
    if (!in(dn.offset_dims, int64_t(d))) ol.dims[d] = it.dims[b++];
  Params params = eqn.params;
  params.set("slice_sizes", sizes);
  return {Value{bind1(*eqn.primitive, {op.local, idx.local}, params), ol}};
}

// scatter, scatter-add/mul/min/max: updates' window dimensions keep the split of the operand
// dimensions they land in; the scatter (batch) dimensions of indices and updates are gathered,
// except for scatter-add into zeros: each device adds its updates into its copy of the zero
// operand, leaving a pending sum (the embedding gradient: a reduce-scatter or psum where used).
std::vector<Value> scatter_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const lax::ScatterDimensionNumbers& dn = scatter_dimension_numbers(eqn.params);
  if (!dn.operand_batching_dims.empty() || ins.size() != 3) return run_replicated(p, eqn, ins);
  const Shape& og = atom_aval(eqn.inputs[0]).shape;
  Value op = ins[0], idx = p.reduced(ins[1]), upd = p.reduced(ins[2]);
  bool zeros = eqn.primitive->name == "scatter-add" && p.is_zeros(op);
  Layout ut = upd.layout, ot = Layout::replicated(og.size());
  std::vector<size_t> window_operand_dims;
  for (size_t d = 0; d < og.size(); ++d)
    if (!in(dn.inserted_window_dims, int64_t(d))) window_operand_dims.push_back(d);
  Layout it = Layout::replicated(idx.layout.dims.size());
  Axes pending;
  size_t w = 0, b = 0;
  for (size_t d = 0; d < ut.dims.size(); ++d) {
    if (in(dn.update_window_dims, int64_t(d))) {
      size_t od = window_operand_dims[w++];
      if (in(dn.scatter_dims_to_operand_dims, int64_t(od)) || upd.local.shape()[d] * p.size_of(ut.dims[d]) != og[od])
        ut.dims[d].clear();
      ot.dims[od] = ut.dims[d];
    } else {
      if (!zeros) ut.dims[d].clear();
      it.dims[b++] = ut.dims[d];
      pending.insert(pending.end(), ut.dims[d].begin(), ut.dims[d].end());
    }
  }
  op = zeros ? Value{op.local, op.layout.without_pending()} : p.reduced(op);
  op = p.reshard(op, ot);
  upd = p.reshard(upd, ut);
  idx = p.reshard(idx, it);
  ot.unreduced = union_in_mesh_order(p.mesh(), pending, {});  // in mesh order
  return {Value{bind1(*eqn.primitive, {op.local, idx.local, upd.local}, eqn.params), ot}};
}

// ---- convolution ----

// conv_general_dilated: the lhs batch dimension and (without feature groups) the rhs output-feature
// dimension keep their split, which the result takes; input features and spatial dimensions are
// gathered (no halo exchange). An axis splitting both batch and features stays with the batch.
std::vector<Value> conv_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  auto dn = eqn.params.object<ConvDimsParam>("dimension_numbers");
  Value lhs = p.reduced(ins[0]), rhs = p.reduced(ins[1]);
  size_t rank = lhs.layout.dims.size(), n = size_t(dn->lhs_spec[0]), o = size_t(dn->rhs_spec[0]);
  Layout lt = Layout::replicated(rank), rt = Layout::replicated(rank), out = Layout::replicated(rank);
  lt.dims[n] = lhs.layout.dims[n];
  if (eqn.params.i("feature_group_count") == 1) {
    rt.dims[o] = rhs.layout.dims[o];
    remove_axes(rt, lt);
  }
  lhs = p.reshard(lhs, lt);
  rhs = p.reshard(rhs, rt);
  out.dims[size_t(dn->out_spec[0])] = lt.dims[n];
  out.dims[size_t(dn->out_spec[1])] = rt.dims[o];
  return {Value{bind1(*eqn.primitive, {lhs.local, rhs.local}, eqn.params), out}};
}

// ---- fused attention ----

// flash_attention and its tangent / backward (core/lax/attention.h): batch and head dimensions
// stay split (a head block maps to its key/value heads when K divides alike), the sequence and
// head-size dimensions are needed whole. Operands and results are [B, T, N, H] or lse [B, N, T].
std::vector<Value> attention_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  Axes batch = ins[0].layout.dims[0], heads = ins[0].layout.dims[2];
  for (const Value& v : ins) {  // a key/value head count the head split does not divide: gather it
    int64_t n = atom_aval(eqn.inputs[&v - ins.data()]).shape[v.layout.dims.size() == 4 ? 2 : 1];
    if (n % p.size_of(heads) != 0) heads.clear();
  }
  auto layout_for = [&](size_t rank) {
    Layout l = Layout::replicated(rank);
    l.dims[0] = batch;
    l.dims[rank == 4 ? 2 : 1] = heads;
    return l;
  };
  for (Value& v : ins) v = p.reshard(p.reduced(v), layout_for(v.layout.dims.size()));
  std::vector<Array> outs = cjax::bind(*eqn.primitive, locals(ins), eqn.params);
  std::vector<Value> r;
  for (const Array& o : outs) r.push_back(Value{o, layout_for(size_t(o.ndim()))});
  return r;
}

// ---- placement ----

std::vector<Value> sharding_constraint_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  const Sharding& s = sharding_constraint_target(eqn.params);
  size_t rank = size_t(ins[0].local.ndim());
  Layout target = Layout::replicated(rank);
  if (auto* n = dynamic_cast<const NamedSharding*>(&s)) {
    if (!(n->mesh() == p.mesh()))
      p.fail(fmt::format("with_sharding_constraint names {}, but the program is partitioned over {}; use one mesh",
                         n->mesh().str(), p.mesh().str()));
    target = p.layout(n->spec(), rank);
  }
  return {p.reshard(p.reduced(ins[0]), target)};
}

const bool g_rules = [] {
  define_sharding_rule("<elementwise>", elementwise_rule);
  define_sharding_rule("broadcast_in_dim", broadcast_rule);
  define_sharding_rule("transpose", transpose_rule);
  define_sharding_rule("squeeze", squeeze_rule);
  define_sharding_rule("reshape", reshape_rule);
  define_sharding_rule("slice", slice_rule);
  define_sharding_rule("pad", pad_rule);
  define_sharding_rule("dynamic_slice", dynamic_slice_rule);
  define_sharding_rule("dynamic_update_slice", dynamic_update_slice_rule);
  define_sharding_rule("rev", rev_rule);
  define_sharding_rule("concatenate", along_dimension_rule);
  define_sharding_rule("sort", along_dimension_rule);
  define_sharding_rule("top_k", along_last_dimension_rule);
  define_sharding_rule("reduce_sum", reduce_sum_rule);
  define_sharding_rule("reduce_max", reduce_extremum_rule);
  define_sharding_rule("reduce_min", reduce_extremum_rule);
  for (const char* n : {"reduce_prod", "reduce_and", "reduce_or", "argmax", "argmin"})
    define_sharding_rule(n, reduce_whole_rule);
  for (const char* n : {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
    define_sharding_rule(n, along_axis_rule);
  define_sharding_rule("dot_general", dot_general_rule);
  define_sharding_rule("gather", gather_rule);
  for (const char* n : {"scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max"})
    define_sharding_rule(n, scatter_rule);
  define_sharding_rule("conv_general_dilated", conv_rule);
  for (const char* n : {"flash_attention", "flash_attention_tangent", "flash_attention_backward"})
    define_sharding_rule(n, attention_rule);
  define_sharding_rule("sharding_constraint", sharding_constraint_rule);
  return true;
}();

}  // namespace

bool elementwise_linear_in(const JaxprEqn& eqn, size_t i) {
  const std::string& n = eqn.primitive->name;
  if (n == "add" || n == "sub" || n == "add_any" || n == "neg" || n == "stop_gradient") return true;
  if (n == "convert_element_type")
    return is_floating(atom_aval(eqn.inputs[0]).dtype) && is_floating(eqn.params.get<DType>("new_dtype"));
  if ((n == "mul" || n == "div") && eqn.inputs.size() == 2) {
    const Var* a = std::get_if<Var>(&eqn.inputs[0]);
    const Var* b = std::get_if<Var>(&eqn.inputs[1]);
    bool squared = a && b && a->id() == b->id();
    return !squared && (n == "mul" || i == 0);
  }
  return false;
}

}  // namespace cjax::partition
