// Shared by jit's passes: variable substitution, use counts and broadcast equations.
#pragma once
#include <optional>
#include <unordered_map>
#include <vector>

#include "trace/jaxpr.h"

namespace cjax::passes_detail {

// Variable renaming applied to equation inputs and outvars.
struct Subst {
  std::unordered_map<const void*, Atom> map;
  Atom operator()(const Atom& a) const {
    if (auto* v = std::get_if<Var>(&a)) {
      auto it = map.find(v->id());
      if (it != map.end()) return it->second;
    }
    return a;
  }
  std::vector<Atom> all(const std::vector<Atom>& as) const {
    std::vector<Atom> out;
    out.reserve(as.size());
    for (const Atom& a : as) out.push_back((*this)(a));
    return out;
  }
};

// How many times each variable (by id) is read by an equation or an output.
std::unordered_map<const void*, int> count_uses(const Jaxpr& jaxpr);
// out = broadcast_in_dim(src) with broadcast_dimensions `dims`.
JaxprEqn broadcast_eqn(const Atom& src, const Var& out, const std::vector<int64_t>& dims);
// Whether `e` is broadcast_in_dim of a variable (not of a literal).
bool broadcasts_a_var(const JaxprEqn& e);
// `out` = broadcast_in_dim of the scalar literal `value` to out's shape.
JaxprEqn splat_eqn(const Literal& value, const Var& out);
// Records in `splat_of` the vars that broadcast a scalar literal (through pvary too).
void track_splat(const JaxprEqn& e, std::unordered_map<const void*, Literal>& splat_of);

// The elementwise chain that computes `v`: the single-output elementwise equations (indices into
// `eqns`, in program order; at most `max_eqns`) on values of v's shape, and its roots, the
// variables it reads that none of them makes: of v's shape, or scalars. A scalar made by pvary of
// a literal (a shard_map body's constant) is a root too, or with `with_scalar_constants` an
// equation of the chain. nullopt where v is no such chain of at least one equation. `def_of` maps
// an output variable to the index of its equation.
struct ElementwiseChain {
  std::vector<size_t> eqns;
  std::vector<Var> roots;
};
std::optional<ElementwiseChain> elementwise_chain(const std::vector<JaxprEqn>& eqns,
                                                  const std::unordered_map<const void*, size_t>& def_of, const Var& v,
                                                  size_t max_eqns, bool with_scalar_constants);

}  // namespace cjax::passes_detail
