// pack_attention: flash attention over q, k and v sliced from one value reads that value in place
// (jit/passes/passes.h).
//
// A fused q/k/v projection gives x = [rows..., 3 N H] (or [B, T, 3, N, H]); q, k and v are three
// slices of x along one axis, reshaped to [B, T, N, H]. Unrewritten, each slice is a copy (3 of
// x's bytes written and read again before the forward kernel), and the backward's dq, dk and dv are
// concatenated into the layout of dx (as many again). Here
//   flash_attention(q, k, v)              -> flash_attention_packed(x)
//   concatenate(reshape(dq), reshape(dk), reshape(dv)) of flash_attention_backward(q, k, v, o, lse, do)
//   (reshapes: none or several, as on the way in)
//                                         -> flash_attention_backward_packed(x, o, lse, do)
// where x's axes before the slicing axis hold the B x T rows (so each of q, k, v is a range of
// columns of x's rows), the slices take the whole of every other axis, and, for the backward, the
// concatenate is along that axis, of exactly the three gradients, in the order their ranges tile
// it, each gradient read by that concatenate alone. The slices left without readers go with dce.
#include <fmt/format.h>

#include <array>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/errors.h"
#include "core/array/primitive.h"
#include "core/lax/attention.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"

namespace cjax {
using namespace passes_detail;
namespace {

struct Piece {
  Var x;
  int64_t axis, start, limit;
};
struct Packed {
  Var x;
  attention::Packing k;
};

class Packer {
 public:
  explicit Packer(const Jaxpr& j) : jaxpr_(j), uses_(count_uses(j)) {
    for (size_t i = 0; i < j.eqns().size(); ++i)
      for (const Var& v : j.eqns()[i].outputs) def_[v.id()] = i;
  }

  std::shared_ptr<const Jaxpr> run() {
    const auto& eqns = jaxpr_.eqns();
    std::vector<std::optional<JaxprEqn>> replaced(eqns.size());
    std::unordered_set<size_t> dropped;
    for (size_t i = 0; i < eqns.size(); ++i) {
      const JaxprEqn& e = eqns[i];
      const std::string& name = e.primitive->name;
      if (name == "flash_attention") {
        if (auto p = packing(e)) replaced[i] = packed_forward(e, *p);
      } else if (name == "flash_attention_backward") {
        if (auto p = packing(e)) packed_backward(i, *p, replaced, dropped);
      }
    }
    std::vector<JaxprEqn> out;
    for (size_t i = 0; i < eqns.size(); ++i) {
      if (dropped.count(i)) continue;
      out.push_back(replaced[i] ? std::move(*replaced[i]) : eqns[i]);
    }
    return std::make_shared<const Jaxpr>(jaxpr_.constvars(), jaxpr_.invars(), std::move(out), jaxpr_.outvars());
  }

 private:
  const JaxprEqn* producer(const Atom& a) const {
    auto* v = std::get_if<Var>(&a);
    auto it = v ? def_.find(v->id()) : def_.end();
    return it == def_.end() ? nullptr : &jaxpr_.eqns()[it->second];
  }
  int uses_of(const Var& v) const {
    auto it = uses_.find(v.id());
    return it == uses_.end() ? 0 : it->second;
  }

  // `a` as reshapes of slice(x) (or slice(x)): a unit-stride slice along one axis of x.
  std::optional<Piece> piece_of(const Atom& a) const {
    const JaxprEqn* e = producer(a);
    while (e && e->primitive->name == "reshape") e = producer(e->inputs[0]);
    if (!e || e->primitive->name != "slice") return std::nullopt;
    const Var* x = std::get_if<Var>(&e->inputs[0]);
    if (!x) return std::nullopt;
    const Params& p = e->params;
    if (auto* s = std::get_if<std::vector<int64_t>>(&p.at("strides")))
      for (int64_t st : *s)
        if (st != 1) return std::nullopt;
    const auto &start = p.ints("start_indices"), &limit = p.ints("limit_indices");
    const Shape& xs = x->aval().shape;
    std::optional<Piece> r;
    for (size_t d = 0; d < xs.size(); ++d) {
      if (start[d] == 0 && limit[d] == xs[d]) continue;
      if (r) return std::nullopt;  // sliced along two axes
      r = Piece{*x, int64_t(d), start[d], limit[d]};
    }
    return r;
  }

  // The packing of an attention equation's q, k and v (its first three operands), if they are
  // pieces of one x along one axis as the packed primitives take them.
  std::optional<Packed> packing(const JaxprEqn& e) const {
    std::optional<Piece> p[3];
    for (size_t i = 0; i < 3; ++i)
      if (!(p[i] = piece_of(e.inputs[i]))) return std::nullopt;
    for (size_t i = 1; i < 3; ++i)
      if (!(p[i]->x == p[0]->x) || p[i]->axis != p[0]->axis) return std::nullopt;
    attention::Packing k{p[0]->axis,
                         {p[0]->start, p[1]->start, p[2]->start},
                         {p[0]->limit, p[1]->limit, p[2]->limit},
                         atom_aval(e.inputs[0]).shape,
                         atom_aval(e.inputs[1]).shape};
    try {
      attention::check_packing(e.primitive->name, p[0]->x.aval().shape, k, false);
    } catch (const ShapeError&) {
      return std::nullopt;  // not a packing the kernels read (S != T, ranges not whole rows, ...)
    }
    return Packed{p[0]->x, std::move(k)};
  }

  JaxprEqn packed_forward(const JaxprEqn& e, const Packed& p) const {
    JaxprEqn r;
    r.primitive = &prims::flash_attention_packed();
    r.inputs = {p.x};
    r.outputs = e.outputs;
    r.params = attention::packed_params_of(attention::options_of(e.params), p.k);
    r.source_info = e.source_info;
    return r;
  }

  // The single equation reading `v`, if any.
  std::optional<size_t> only_reader(const Var& v, size_t after) const {
    if (uses_of(v) != 1) return std::nullopt;
    const auto& eqns = jaxpr_.eqns();
    for (size_t i = after + 1; i < eqns.size(); ++i)
      for (const Atom& a : eqns[i].inputs)
        if (auto* u = std::get_if<Var>(&a); u && *u == v) return i;
    return std::nullopt;  // read by an output of the program
  }

  void packed_backward(size_t at, const Packed& p, std::vector<std::optional<JaxprEqn>>& replaced,
                       std::unordered_set<size_t>& dropped) const {
    const auto& eqns = jaxpr_.eqns();
    const JaxprEqn& e = eqns[at];
    const Var& x = p.x;
    const attention::Packing& k = p.k;
    // Each gradient, through reshapes of it or directly, into one concatenate along the axis.
    std::optional<size_t> concat;
    std::vector<size_t> reshapes;
    Atom piece[3];
    for (size_t i = 0; i < 3; ++i) {
      Var g = e.outputs[i];
      std::optional<size_t> r = only_reader(g, at);
      if (!r) return;
      while (eqns[*r].primitive->name == "reshape") {
        reshapes.push_back(*r);
        g = eqns[*r].outputs[0];
        r = only_reader(g, *r);
        if (!r) return;
      }
      if (eqns[*r].primitive->name != "concatenate" || (concat && *concat != *r)) return;
      concat = *r;
      piece[i] = g;
    }
    const JaxprEqn& c = eqns[*concat];
    const AbstractValue &ca = c.outputs[0].aval(), &xa = x.aval();
    if (c.params.i("dimension") != k.axis || c.inputs.size() != 3 || ca.shape != xa.shape || ca.dtype != xa.dtype)
      return;
    try {
      attention::check_packing(e.primitive->name, x.aval().shape, k, true);
    } catch (const ShapeError&) {
      return;
    }
    // The concatenate's operands in the order of the ranges along the axis.
    const std::array<size_t, 3> order = k.axis_order();
    for (size_t j = 0; j < 3; ++j) {
      auto* v = std::get_if<Var>(&c.inputs[j]);
      if (!v || !(*v == std::get<Var>(piece[order[j]]))) return;
      Shape s = x.aval().shape;
      s[size_t(k.axis)] = k.limits[order[j]] - k.starts[order[j]];
      if (v->aval().shape != s) return;
    }
    JaxprEqn r;
    r.primitive = &prims::flash_attention_backward_packed();
    r.inputs = {x, e.inputs[3], e.inputs[4], e.inputs[5]};
    r.outputs = {c.outputs[0]};
    r.params = attention::packed_params_of(attention::options_of(e.params), k);
    r.source_info = e.source_info;
    replaced[at] = std::move(r);
    dropped.insert(*concat);
    for (size_t i : reshapes) dropped.insert(i);
  }

  const Jaxpr& jaxpr_;
  std::unordered_map<const void*, int> uses_;
  std::unordered_map<const void*, size_t> def_;
};

}  // namespace

// After dce: the passes before leave equations behind that read a gradient but are dead.
std::shared_ptr<const Jaxpr> pack_attention(const Jaxpr& jaxpr) {
  std::shared_ptr<const Jaxpr> live = dce(jaxpr);
  return Packer(*live).run();
}

}  // namespace cjax
