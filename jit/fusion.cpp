#include "jit/fusion.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

namespace cjax {
namespace {

using VarId = const void*;

}  // namespace

EqnClass classify(const JaxprEqn& e) {
  const PrimitiveDef& p = *e.primitive;
  if (p.scalar_op) {
    ScalarOp op = *p.scalar_op;
    return op == ScalarOp::ErfInv || op == ScalarOp::Lgamma ? EqnClass::Library : EqnClass::Elementwise;
  }
  const std::string& n = p.name;
  if (n == "convert_element_type")
    return atom_aval(e.inputs[0]).dtype == e.outputs[0].aval().dtype ? EqnClass::Alias : EqnClass::Elementwise;
  if (n == "select_n" || n == "integer_pow" || n == "add_any") return EqnClass::Elementwise;
  // pvary only changes the type (invariant -> varying over mesh axes); the value is the same.
  if (n == "stop_gradient" || n == "pvary") return EqnClass::Alias;
  if (n == "broadcast_in_dim") return EqnClass::Broadcast;
  if (n == "reshape" || n == "squeeze") return EqnClass::Reshape;
  if (n == "reduce_sum" || n == "reduce_max" || n == "reduce_min" || n == "reduce_prod") return EqnClass::Reduce;
  return EqnClass::Library;
}

namespace {

KernelReduce reduce_kind(const std::string& n) {
  if (n == "reduce_sum") return KernelReduce::Sum;
  if (n == "reduce_prod") return KernelReduce::Prod;
  if (n == "reduce_max") return KernelReduce::Max;
  return KernelReduce::Min;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 0);
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = s[i] == 1 ? 0 : acc;
    acc *= s[i];
  }
  return st;
}

// Strides over `target` of a value of shape `src` broadcast by broadcast_in_dim(dims).
std::vector<int64_t> broadcast_strides(const Shape& src, const Shape& target, const std::vector<int64_t>& dims) {
  std::vector<int64_t> ss = contiguous_strides(src), out(target.size(), 0);
  for (size_t j = 0; j < src.size(); ++j)
    if (src[j] != 1) out[size_t(dims[j])] = ss[j];
  return out;
}

// Over axes [first, rank): 0 when every stride is 0, 1 when they are row-major contiguous
// (extent-1 axes ignored), -1 otherwise.
int block_kind(const std::vector<int64_t>& strides, const Shape& d, size_t first) {
  bool zero = true, contiguous = true;
  int64_t expect = 1;
  for (size_t i = d.size(); i-- > first;) {
    if (d[i] == 1) continue;
    zero = zero && strides[i] == 0;
    contiguous = contiguous && strides[i] == expect;
    expect *= d[i];
  }
  return zero ? 0 : contiguous ? 1 : -1;
}

struct Group {
  Shape domain;
  std::vector<int64_t> reduce_axes;  // trailing axes of the domain; empty: no reduction yet
  Shape row_shape, keep_shape;
  std::vector<JaxprEqn> eqns;
  std::vector<KernelNode> nodes;
  std::vector<Var> input_vars;
  std::vector<std::vector<int64_t>> input_strides;  // over the domain
  std::unordered_map<VarId, int> value;             // produced values (aliases included) -> node
  std::unordered_map<VarId, bool> is_row;
  std::vector<Var> produced;
  bool sealed = false;

  bool reduces() const { return !reduce_axes.empty(); }
  size_t first_inner() const { return domain.size() - reduce_axes.size(); }
  bool is_row_shape(const Shape& s) const { return reduces() && s != domain && (s == row_shape || s == keep_shape); }
  // Strides over the domain of a value of shape `s` laid out with `strides` over `s`.
  std::optional<std::vector<int64_t>> lift(const Shape& s, const std::vector<int64_t>& strides) const {
    if (s.empty()) return std::vector<int64_t>(domain.size(), 0);
    if (s == domain) return strides;
    if (!reduces()) return std::nullopt;
    if (s == keep_shape) {
      std::vector<int64_t> out = strides;
      for (size_t i = first_inner(); i < out.size(); ++i) out[i] = 0;
      return out;
    }
    if (s == row_shape) {
      std::vector<int64_t> out = strides;
      out.resize(domain.size(), 0);
      return out;
    }
    return std::nullopt;
  }
  bool block_ok(const std::vector<int64_t>& strides) const {
    return !reduces() || block_kind(strides, domain, first_inner()) >= 0;
  }
  int add_node(KernelNode n) {
    nodes.push_back(std::move(n));
    return int(nodes.size()) - 1;
  }
  int load(const Var& v, std::vector<int64_t> strides) {
    for (size_t i = 0; i < input_vars.size(); ++i)
      if (input_vars[i] == v && input_strides[i] == strides)
        for (size_t k = 0; k < nodes.size(); ++k)
          if (nodes[k].op == KernelNode::Op::Load && nodes[k].input == int(i)) return int(k);
    input_vars.push_back(v);
    input_strides.push_back(std::move(strides));
    KernelNode n{KernelNode::Op::Load, v.aval().dtype};
    n.input = int(input_vars.size()) - 1;
    return add_node(std::move(n));
  }
  void define(const Var& out, int node, bool row) {
    value[out.id()] = node;
    is_row[out.id()] = row;
    produced.push_back(out);
  }
};

KernelNode const_node(const Literal& lit) {
  KernelNode n{KernelNode::Op::Const, lit.aval().dtype};
  if (is_integer(n.dtype))
    n.ivalue = lit.value().item<int64_t>();
  else
    n.fvalue = lit.value().item<double>();
  return n;
}

class Planner {
 public:
  explicit Planner(const Jaxpr& j) : jaxpr_(j) {}

  FusionPlan run() {
    for (const JaxprEqn& e : jaxpr_.eqns()) plan(e);
    for (const Atom& a : jaxpr_.outvars())
      if (auto* v = std::get_if<Var>(&a)) materialize(*v);
    return build();
  }

 private:
  struct Virtual {  // a broadcast_in_dim not computed (yet)
    Atom source;
    JaxprEqn eqn;
  };
  struct StepRef {
    int group;  // -1: library
    JaxprEqn eqn;
  };

  const Jaxpr& jaxpr_;
  std::vector<Group> groups_;
  std::vector<StepRef> steps_;
  std::unordered_map<VarId, int> producer_group_;
  std::unordered_map<VarId, Virtual> virtual_;

  Group* group_of(const Atom& a) {
    auto* v = std::get_if<Var>(&a);
    if (!v) return nullptr;
    auto it = producer_group_.find(v->id());
    return it == producer_group_.end() ? nullptr : &groups_[size_t(it->second)];
  }
  void seal_producer(const Var& v) {
    if (Group* g = group_of(v)) g->sealed = true;
  }
  void move_to_end(int g) {
    auto it = std::find_if(steps_.begin(), steps_.end(), [&](const StepRef& s) { return s.group == g; });
    std::rotate(it, it + 1, steps_.end());
  }
  int new_group(const Shape& domain) {
    groups_.emplace_back();
    groups_.back().domain = domain;
    steps_.push_back({int(groups_.size()) - 1, {}});
    return int(groups_.size()) - 1;
  }
  void define(int g, const Var& out, int node, bool row) {
    groups_[size_t(g)].define(out, node, row);
    producer_group_[out.id()] = g;
  }

  // Computes a deferred broadcast as a library step (something needs it in memory).
  void materialize(const Var& v) {
    auto it = virtual_.find(v.id());
    if (it == virtual_.end()) return;
    Virtual vb = std::move(it->second);
    virtual_.erase(it);
    if (Group* g = group_of(v)) {  // an alias in its group (try_alias): the group writes it
      g->sealed = true;
      return;
    }
    if (auto* src = std::get_if<Var>(&vb.source)) {
      materialize(*src);
      seal_producer(*src);
    }
    steps_.push_back({-1, std::move(vb.eqn)});
  }
  void library(const JaxprEqn& e) {
    for (const Atom& a : e.inputs)
      if (auto* v = std::get_if<Var>(&a)) {
        materialize(*v);
        seal_producer(*v);
      }
    steps_.push_back({-1, e});
  }

  // The node of `a` inside group g at the required level, adding loads as needed; nullopt when
  // the group cannot read it. Groups whose outputs are read are recorded in `seals`.
  std::optional<int> resolve(int gi, const Atom& a, bool need_row, std::vector<Var>& seals,
                             std::vector<JaxprEqn>& fused_broadcasts) {
    Group& g = groups_[size_t(gi)];
    if (auto* lit = std::get_if<Literal>(&a)) return g.add_node(const_node(*lit));
    const Var& v = std::get<Var>(a);
    if (auto it = g.value.find(v.id()); it != g.value.end()) {
      if (need_row && !g.is_row.at(v.id())) return std::nullopt;
      return it->second;
    }
    if (auto it = virtual_.find(v.id()); it != virtual_.end()) {
      const Virtual& vb = it->second;
      if (auto* lit = std::get_if<Literal>(&vb.source)) {
        fused_broadcasts.push_back(vb.eqn);
        KernelNode n = const_node(*lit);
        n.dtype = v.aval().dtype;
        if (n.dtype != lit->aval().dtype) {  // broadcast_in_dim keeps the dtype; be safe anyway
          KernelNode c{KernelNode::Op::Convert, v.aval().dtype};
          c.args = {g.add_node(const_node(*lit))};
          return g.add_node(std::move(c));
        }
        return g.add_node(std::move(n));
      }
      const Var& src = std::get<Var>(vb.source);
      if (group_of(src) == &g) return std::nullopt;  // reading it would seal this very group
      auto strides = g.lift(v.aval().shape, broadcast_strides(src.aval().shape, v.aval().shape,
                                                              vb.eqn.params.ints("broadcast_dimensions")));
      if (strides && g.block_ok(*strides) && !virtual_.count(src.id())) {
        seals.push_back(src);
        fused_broadcasts.push_back(vb.eqn);
        return g.load(src, std::move(*strides));
      }
      materialize(v);
    }
    if (group_of(v) == &g) return std::nullopt;
    auto strides = g.lift(v.aval().shape, contiguous_strides(v.aval().shape));
    if (!strides || !g.block_ok(*strides)) return std::nullopt;
    seals.push_back(v);
    return g.load(v, std::move(*strides));
  }

  // Deferred broadcasts read through strided loads become members of the group (for the plan's
  // description and the per-equation path of sharded inputs).
  static void add_broadcasts(Group& g, const std::vector<JaxprEqn>& eqns) {
    for (const JaxprEqn& b : eqns) {
      bool seen = false;
      for (const JaxprEqn& m : g.eqns) seen = seen || m.outputs[0] == b.outputs[0];
      if (!seen) g.eqns.push_back(b);
    }
  }

  bool try_elementwise(int gi, const JaxprEqn& e) {
    Group& g = groups_[size_t(gi)];
    if (g.sealed) return false;
    const Var& out = e.outputs[0];
    bool row;
    if (out.aval().shape == g.domain)
      row = false;
    else if (g.is_row_shape(out.aval().shape))
      row = true;
    else
      return false;
    size_t nodes0 = g.nodes.size(), inputs0 = g.input_vars.size();
    std::vector<Var> seals;
    std::vector<JaxprEqn> broadcasts;
    std::vector<int> args;
    for (const Atom& a : e.inputs) {
      std::optional<int> n = resolve(gi, a, row, seals, broadcasts);
      if (!n) {
        Group& gg = groups_[size_t(gi)];
        gg.nodes.erase(gg.nodes.begin() + int64_t(nodes0), gg.nodes.end());
        gg.input_vars.resize(inputs0);
        gg.input_strides.resize(inputs0);
        return false;
      }
      args.push_back(*n);
    }
    Group& gg = groups_[size_t(gi)];
    const std::string& name = e.primitive->name;
    KernelNode n{KernelNode::Op::Scalar, out.aval().dtype};
    n.args = std::move(args);
    if (e.primitive->scalar_op) {
      n.scalar_op = *e.primitive->scalar_op;
    } else if (name == "add_any") {  // cotangent accumulation: an add of two values of one type
      n.scalar_op = ScalarOp::Add;
    } else if (name == "convert_element_type") {
      n.op = KernelNode::Op::Convert;
    } else if (name == "select_n") {
      n.op = KernelNode::Op::Select;
    } else {  // integer_pow
      n.op = KernelNode::Op::IntegerPow;
      n.ivalue = e.params.i("y");
    }
    int node = gg.add_node(std::move(n));
    for (const Var& s : seals) seal_producer(s);
    add_broadcasts(gg, broadcasts);
    gg.eqns.push_back(e);
    define(gi, out, node, row);
    return true;
  }

  bool try_reduce(int gi, const JaxprEqn& e) {
    Group& g = groups_[size_t(gi)];
    const Var* in = std::get_if<Var>(&e.inputs[0]);
    if (g.sealed || !in || !g.value.count(in->id()) || g.is_row.at(in->id())) return false;
    std::vector<int64_t> axes = e.params.ints("axes");
    std::sort(axes.begin(), axes.end());
    size_t k = g.domain.size(), m = axes.size();
    if (m == 0 || m > k) return false;
    for (size_t i = 0; i < m; ++i)
      if (axes[i] != int64_t(k - m + i)) return false;  // only trailing axes fuse
    if (g.reduces()) {
      if (g.reduce_axes != axes) return false;
    } else {
      for (const auto& st : g.input_strides)
        if (block_kind(st, g.domain, k - m) < 0) return false;
      g.reduce_axes = axes;
      g.row_shape.assign(g.domain.begin(), g.domain.begin() + int64_t(k - m));
      g.keep_shape = g.domain;
      for (size_t i = k - m; i < k; ++i) g.keep_shape[i] = 1;
    }
    KernelNode n{KernelNode::Op::Reduce, e.outputs[0].aval().dtype};
    n.reduce = reduce_kind(e.primitive->name);
    n.args = {g.value.at(in->id())};
    int node = g.add_node(std::move(n));
    g.eqns.push_back(e);
    define(gi, e.outputs[0], node, true);
    return true;
  }

  // Groups that produce an operand of `e`, most recently extended first.
  std::vector<int> candidates(const JaxprEqn& e) {
    std::vector<int> out;
    for (size_t s = steps_.size(); s-- > 0;) {
      int g = steps_[s].group;
      if (g < 0 || groups_[size_t(g)].sealed) continue;
      for (const Atom& a : e.inputs)
        if (group_of(a) == &groups_[size_t(g)]) {
          out.push_back(g);
          break;
        }
    }
    return out;
  }

  // Two open elementwise groups over one domain that both produce operands of `e` become one
  // (at the later one's step), so `e` reads neither from memory: an optimizer written as three
  // tree maps (all m, then all v, then all parameter updates) gets one kernel per parameter.
  // Legal because an open group's values have no reader outside it yet (a reader seals it), and
  // the later step comes after the earlier group's inputs.
  void merge_producers(const JaxprEqn& e) {
    std::vector<int> open = candidates(e);  // latest step first
    const Shape& d = e.outputs[0].aval().shape;
    auto mergeable = [&](int g) { return groups_[size_t(g)].domain == d && !groups_[size_t(g)].reduces(); };
    if (open.size() < 2 || !mergeable(open[0])) return;
    for (size_t k = 1; k < open.size(); ++k)
      if (mergeable(open[k])) merge_group(open[0], open[k]);
  }
  void merge_group(int into, int from) {
    Group& src = groups_[size_t(from)];
    Group& dst = groups_[size_t(into)];
    std::vector<int> node_map(src.nodes.size());
    for (size_t i = 0; i < src.nodes.size(); ++i) {
      KernelNode n = src.nodes[i];
      if (n.op == KernelNode::Op::Load) {
        node_map[i] = dst.load(src.input_vars[size_t(n.input)], src.input_strides[size_t(n.input)]);
        continue;
      }
      for (int& a : n.args) a = node_map[size_t(a)];
      node_map[i] = dst.add_node(std::move(n));
    }
    for (const Var& v : src.produced) {
      dst.define(v, node_map[size_t(src.value.at(v.id()))], src.is_row.at(v.id()));
      producer_group_[v.id()] = into;
    }
    dst.eqns.insert(dst.eqns.begin(), src.eqns.begin(), src.eqns.end());
    steps_.erase(std::find_if(steps_.begin(), steps_.end(), [&](const StepRef& s) { return s.group == from; }));
    src = Group{};
    src.sealed = true;  // gone: its values live in `into`
  }

  // An alias of a row-level value of its group (keepdims broadcast/reshape, or the broadcast of
  // a row value back over the domain): no computation, the same node.
  bool try_alias(const JaxprEqn& e, bool any_level) {
    Group* g = group_of(e.inputs[0]);
    if (!g) return false;
    const Var& in = std::get<Var>(e.inputs[0]);
    const Shape& s = e.outputs[0].aval().shape;
    bool row_in = g->is_row.at(in.id());
    bool ok;
    if (any_level)
      ok = true;  // stop_gradient, same-dtype convert: the value itself
    else if (!row_in)
      ok = false;
    else if (g->is_row_shape(s))
      ok = true;
    else if (s == g->domain && e.primitive->name == "broadcast_in_dim") {
      // The operand's non-1 dims must land on the domain's outer axes, unchanged.
      const Shape& src = in.aval().shape;
      const auto& dims = e.params.ints("broadcast_dimensions");
      ok = true;
      for (size_t j = 0; j < src.size(); ++j)
        if (src[j] != 1 && (size_t(dims[j]) >= g->first_inner() || src[j] != s[size_t(dims[j])])) ok = false;
    } else {
      ok = false;
    }
    if (!ok) return false;
    int gi = int(g - groups_.data());
    bool row = any_level ? row_in : s != g->domain;
    define(gi, e.outputs[0], g->value.at(in.id()), row);
    g->eqns.push_back(e);
    // A row value broadcast back over the domain: other groups read the row value through a
    // strided index map (as any deferred broadcast) instead of a full-size copy written here
    // (softmax's row sums, kept for the backward pass, were written once per element).
    if (row_in && !row) virtual_[e.outputs[0].id()] = Virtual{e.inputs[0], e};
    return true;
  }

  void plan(const JaxprEqn& e) {
    switch (classify(e)) {
      case EqnClass::Broadcast:
        if (try_alias(e, false)) return;
        if (auto* v = std::get_if<Var>(&e.inputs[0]); v && virtual_.count(v->id())) materialize(*v);
        virtual_[e.outputs[0].id()] = Virtual{e.inputs[0], e};
        return;
      case EqnClass::Alias:
        if (try_alias(e, true)) return;
        if (auto* v = std::get_if<Var>(&e.inputs[0]);
            v && virtual_.count(v->id()) && (e.primitive->name == "stop_gradient" || e.primitive->name == "pvary")) {
          Virtual vb = virtual_.at(v->id());
          vb.eqn.outputs = e.outputs;  // the same broadcast, deferred, defining this equation's output
          virtual_[e.outputs[0].id()] = vb;
          return;
        }
        if (std::holds_alternative<Literal>(e.inputs[0])) {  // pvary of a constant (an optimizer's betas)
          virtual_[e.outputs[0].id()] = Virtual{e.inputs[0], e};
          return;
        }
        library(e);
        return;
      case EqnClass::Reshape:
        if (try_alias(e, false)) return;
        library(e);
        return;
      case EqnClass::Elementwise: {
        merge_producers(e);
        for (int g : candidates(e))
          if (try_elementwise(g, e)) {
            move_to_end(g);
            return;
          }
        // No producer to join: a sibling. The group just before, over the same domain, takes it
        // (an optimizer's m, v and parameter updates become one kernel with three outputs).
        if (!steps_.empty() && steps_.back().group >= 0) {
          int g = steps_.back().group;
          if (groups_[size_t(g)].domain == e.outputs[0].aval().shape && try_elementwise(g, e)) return;
        }
        int g = new_group(e.outputs[0].aval().shape);
        if (!try_elementwise(g, e))
          throw Error(fmt::format("internal: fusion could not start a group at {}", e.primitive->name));
        return;
      }
      case EqnClass::Reduce: {
        if (Group* g = group_of(e.inputs[0]); g && !g->sealed) {
          int gi = int(g - groups_.data());
          if (try_reduce(gi, e)) {
            move_to_end(gi);
            return;
          }
        }
        // A new group reading the operand (from memory, or strided if it is a deferred broadcast).
        const Var* in = std::get_if<Var>(&e.inputs[0]);
        if (in) {
          int gi = new_group(in->aval().shape);
          std::vector<Var> seals;
          std::vector<JaxprEqn> broadcasts;
          std::optional<int> n = resolve(gi, *in, false, seals, broadcasts);
          if (n) {
            Group& g = groups_[size_t(gi)];
            g.define(*in, *n, false);  // a load: local to the group, not an output of it
            g.produced.pop_back();
            add_broadcasts(g, broadcasts);
            if (try_reduce(gi, e)) {
              for (const Var& s : seals) seal_producer(s);
              return;
            }
          }
          // Undo the empty group.
          steps_.pop_back();
          groups_.pop_back();
        }
        library(e);
        return;
      }
      case EqnClass::Library: library(e); return;
    }
  }

  FusionPlan build() {
    std::unordered_set<VarId> used;
    for (const StepRef& s : steps_) {
      if (s.group >= 0) {
        for (const Var& v : groups_[size_t(s.group)].input_vars) used.insert(v.id());
      } else {
        for (const Atom& a : s.eqn.inputs)
          if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());
      }
    }
    for (const Atom& a : jaxpr_.outvars())
      if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());

    FusionPlan plan;
    std::vector<int> kernel_of(groups_.size(), -1);
    for (const StepRef& s : steps_) {
      if (s.group < 0) {
        plan.steps.push_back({-1, s.eqn});
        continue;
      }
      Group& g = groups_[size_t(s.group)];
      FusedKernel k;
      k.eqns = g.eqns;
      k.inputs = g.input_vars;
      for (const Var& v : g.produced)
        if (used.count(v.id()) && std::find(k.outputs.begin(), k.outputs.end(), v) == k.outputs.end()) {
          k.outputs.push_back(v);
          k.spec.outputs.push_back({g.value.at(v.id()), v.aval().dtype, v.aval().shape == g.domain});
        }
      if (k.outputs.empty()) continue;  // nothing reads it (DCE ran before; kept for safety)
      k.spec.nodes = g.nodes;
      shape_domain(g, k.spec);
      k.spec.name = fmt::format("cjax_k{}", plan.kernels.size());
      k.spec.finalize();
      plan.steps.push_back({int(plan.kernels.size()), {}});
      plan.kernels.push_back(std::move(k));
    }
    return plan;
  }

  // Chooses rows x columns and coalesces axes (kernel_spec.h).
  static void shape_domain(const Group& g, KernelSpec& spec) {
    const Shape& d = g.domain;
    size_t k = d.size(), first = k;
    if (g.reduces()) {
      first = g.first_inner();
    } else {
      while (first > 0) {
        bool ok = true;
        for (const auto& st : g.input_strides) ok = ok && block_kind(st, d, first - 1) >= 0;
        if (!ok) break;
        --first;
      }
    }
    spec.cols = 1;
    for (size_t i = first; i < k; ++i) spec.cols *= d[i];
    for (const auto& st : g.input_strides) {
      KernelInput in;
      in.col_stride = spec.cols > 1 && block_kind(st, d, first) == 1 ? 1 : 0;
      spec.inputs.push_back(in);
    }
    for (size_t i = 0; i < g.input_vars.size(); ++i) spec.inputs[i].dtype = g.input_vars[i].aval().dtype;
    // Outer axes: drop extent-1 axes, merge neighbours every input walks through contiguously.
    std::vector<int64_t> ext;
    std::vector<std::vector<int64_t>> strides(g.input_strides.size());
    for (size_t a = 0; a < first; ++a) {
      if (d[a] == 1) continue;
      bool merge = !ext.empty();
      for (size_t i = 0; merge && i < strides.size(); ++i) merge = strides[i].back() == g.input_strides[i][a] * d[a];
      if (merge) {
        ext.back() *= d[a];
        for (size_t i = 0; i < strides.size(); ++i) strides[i].back() = g.input_strides[i][a];
      } else {
        ext.push_back(d[a]);
        for (size_t i = 0; i < strides.size(); ++i) strides[i].push_back(g.input_strides[i][a]);
      }
    }
    spec.outer = ext;
    for (size_t i = 0; i < strides.size(); ++i) spec.inputs[i].outer_strides = strides[i];
  }
};

}  // namespace

FusionPlan plan_fusion(const Jaxpr& jaxpr) { return Planner(jaxpr).run(); }

std::string FusionPlan::describe() const {
  std::string s;
  for (const PlanStep& st : steps) {
    if (st.kernel < 0) {
      s += st.eqn.primitive->name + "\n";
      continue;
    }
    const FusedKernel& k = kernels[size_t(st.kernel)];
    std::vector<std::string> names;
    for (const JaxprEqn& e : k.eqns) names.push_back(e.primitive->name);
    s += fmt::format("kernel {} [{}] rows={} cols={} passes={} in={} out={}\n", k.spec.name, fmt::join(names, " "),
                     k.spec.rows(), k.spec.cols, k.spec.num_passes, k.inputs.size(), k.outputs.size());
  }
  return s;
}

}  // namespace cjax
