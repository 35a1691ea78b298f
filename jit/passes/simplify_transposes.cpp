// simplify_transposes: identity transposes go; result transposes fold into dot_general; slices of a
// transpose and the transpose of a concatenate move to the other side where that leaves only
// reshapes (jit/passes/passes.h).
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/array/trace.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;

namespace {

// Whether transposing an array of shape `s` by `perm` moves only dimensions of size 1: its
// elements then keep their order, and the transpose is a reshape.
bool moves_only_unit_dims(const Shape& s, const std::vector<int64_t>& perm) {
  int64_t last = -1;
  for (int64_t p : perm) {
    if (s[size_t(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

Shape permuted(const Shape& s, const std::vector<int64_t>& perm) {
  Shape out;
  for (int64_t p : perm) out.push_back(s[size_t(p)]);
  return out;
}

AbstractValue with_shape(AbstractValue a, Shape shape) {
  a.shape = std::move(shape);
  return a;
}

JaxprEqn reshape_eqn(const Atom& x, const Var& out, const std::shared_ptr<const SourceInfo>& where) {
  JaxprEqn r;
  r.primitive = find_primitive("reshape");
  r.inputs = {x};
  r.outputs = {out};
  r.params = Params{{"new_sizes", out.aval().shape}, {"dimensions", std::monostate{}}, {"sharding", std::monostate{}}};
  r.source_info = where;
  return r;
}

bool unit_strides(const Params& slice) {
  if (std::holds_alternative<std::monostate>(slice.at("strides"))) return true;
  const std::vector<int64_t>& st = slice.ints("strides");
  return std::all_of(st.begin(), st.end(), [](int64_t v) { return v == 1; });
}

}  // namespace

std::shared_ptr<const Jaxpr> simplify_transposes(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::vector<JaxprEqn> eqns;
  // An equation's output -> the equation's index in `eqns`; `defined_by(a, name)` is that
  // equation where `a` is the output of a `name` equation.
  std::unordered_map<const void*, size_t> defined_at;
  auto defined_by = [&](const Atom& a, std::string_view name) -> std::optional<size_t> {
    auto* v = std::get_if<Var>(&a);
    auto it = v ? defined_at.find(v->id()) : defined_at.end();
    if (it == defined_at.end() || eqns[it->second].primitive->name != name) return std::nullopt;
    return it->second;
  };
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    if (c.primitive->name == "slice" && unit_strides(c.params)) {
      // slice(transpose(x)) = transpose(slice(x)), a reshape where the slice leaves the moved
      // dimensions of size 1: the three [b, s, n, h] pieces of a fused q/k/v projection's
      // [3, b, s, n, h] come straight from its [b, s, 3, n, h] result, without a transposed copy.
      if (std::optional<size_t> t = defined_by(c.inputs[0], "transpose")) {
        const std::vector<int64_t> perm = eqns[*t].params.ints("permutation");
        const Atom x = eqns[*t].inputs[0];
        const std::vector<int64_t>& start = c.params.ints("start_indices");
        const std::vector<int64_t>& limit = c.params.ints("limit_indices");
        std::vector<int64_t> from(perm.size()), to(perm.size());
        Shape piece(perm.size());
        for (size_t d = 0; d < perm.size(); ++d) {
          from[size_t(perm[d])] = start[d];
          to[size_t(perm[d])] = limit[d];
        }
        for (size_t d = 0; d < perm.size(); ++d) piece[d] = to[d] - from[d];
        if (moves_only_unit_dims(piece, perm)) {
          Var sliced_x(with_shape(c.outputs[0].aval(), piece));
          JaxprEqn sliced = c;
          sliced.inputs = {x};
          sliced.params.set("start_indices", from);
          sliced.params.set("limit_indices", to);
          sliced.outputs = {sliced_x};
          eqns.push_back(std::move(sliced));
          eqns.push_back(reshape_eqn(sliced_x, c.outputs[0], c.source_info));
          continue;
        }
      }
    }
    if (c.primitive->name == "transpose") {
      const std::vector<int64_t>& perm = c.params.ints("permutation");
      bool identity = true;
      for (size_t d = 0; d < perm.size(); ++d) identity = identity && perm[d] == int64_t(d);
      if (identity) {
        s.map[c.outputs[0].id()] = c.inputs[0];
        continue;
      }
      auto* v = std::get_if<Var>(&c.inputs[0]);
      std::optional<size_t> cat = defined_by(c.inputs[0], "concatenate");
      if (cat && uses[v->id()] == 1) {
        // transpose(concatenate(xs)) = concatenate(transpose(x) for x in xs), reshapes where each
        // transpose moves only dimensions of size 1: the q, k, v gradients are concatenated into
        // the layout the projection's gradients read, without a transposed copy.
        JaxprEqn joined = eqns[*cat];
        bool reshapes = std::all_of(joined.inputs.begin(), joined.inputs.end(),
                                    [&](const Atom& x) { return moves_only_unit_dims(atom_aval(x).shape, perm); });
        if (reshapes) {
          const int64_t k = joined.params.get<int64_t>("dimension");
          std::vector<Atom> pieces;
          for (const Atom& x : joined.inputs) {
            Shape shape = permuted(atom_aval(x).shape, perm);
            if (shape == atom_aval(x).shape) {
              pieces.push_back(x);
              continue;
            }
            Var piece(with_shape(atom_aval(x), shape));
            eqns.push_back(reshape_eqn(x, piece, c.source_info));
            pieces.push_back(piece);
          }
          joined.inputs = std::move(pieces);
          joined.params.set("dimension", int64_t(std::find(perm.begin(), perm.end(), k) - perm.begin()));
          joined.outputs = c.outputs;
          eqns.push_back(std::move(joined));
          continue;
        }
      }
      std::optional<size_t> product = defined_by(c.inputs[0], "dot_general");
      if (product && uses[v->id()] == 1) {
        // dot_general's result is (batch..., lhs free..., rhs free...): a transpose that swaps the
        // two free groups is the dot_general with its operands swapped.
        JaxprEqn& dot = eqns[*product];
        auto dn = dot.params.object<DotDimsParam>("dimension_numbers");
        int64_t nb = int64_t(dn->lhs_batch.size());
        int64_t fl = atom_aval(dot.inputs[0]).ndim() - nb - int64_t(dn->lhs_contracting.size());
        int64_t fr = atom_aval(dot.inputs[1]).ndim() - nb - int64_t(dn->rhs_contracting.size());
        std::vector<int64_t> swap;
        for (int64_t d = 0; d < nb; ++d) swap.push_back(d);
        for (int64_t d = 0; d < fr; ++d) swap.push_back(nb + fl + d);
        for (int64_t d = 0; d < fl; ++d) swap.push_back(nb + d);
        if (swap == perm) {
          auto swapped = std::make_shared<DotDimsParam>();
          swapped->lhs_contracting = dn->rhs_contracting;
          swapped->rhs_contracting = dn->lhs_contracting;
          swapped->lhs_batch = dn->rhs_batch;
          swapped->rhs_batch = dn->lhs_batch;
          dot.params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(swapped)));
          std::swap(dot.inputs[0], dot.inputs[1]);
          dot.outputs = c.outputs;
          defined_at.erase(v->id());
          continue;
        }
      }
    }
    for (const Var& out : c.outputs) defined_at[out.id()] = eqns.size();
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

}  // namespace cjax
