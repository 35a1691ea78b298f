// concatenate_pads: a sum of zero pads that tile one axis becomes concatenate (jit/passes/passes.h).
#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>

#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"

namespace cjax {
using namespace passes_detail;

namespace {

bool is_sum(const JaxprEqn& e) {
  const std::string& n = e.primitive->name;
  return (n == "add" || n == "add_any") && e.inputs.size() == 2 && e.outputs.size() == 1;
}

using Definitions = std::unordered_map<const void*, const JaxprEqn*>;

// A zero literal, or pvary of one (a shard_map body's padding value).
bool is_zero(const Atom& a, const Definitions& def_of) {
  if (auto* l = std::get_if<Literal>(&a)) return l->value().item<double>() == 0.0;
  auto it = def_of.find(std::get<Var>(a).id());
  return it != def_of.end() && it->second->primitive->name == "pvary" && it->second->inputs.size() == 1 &&
         is_zero(it->second->inputs[0], def_of);
}

// A pad by zeros along one axis only: (axis, lo), else nullopt.
std::optional<std::pair<int64_t, int64_t>> zero_pad_along_one_axis(const JaxprEqn& e, const Definitions& def_of) {
  if (e.primitive->name != "pad" || !is_zero(e.inputs[1], def_of)) return std::nullopt;
  std::optional<std::pair<int64_t, int64_t>> found;
  const auto& cfg = e.params.get<std::vector<std::vector<int64_t>>>("padding_config");
  for (size_t d = 0; d < cfg.size(); ++d) {
    if (cfg[d][2] != 0 || cfg[d][0] < 0 || cfg[d][1] < 0) return std::nullopt;
    if (cfg[d][0] == 0 && cfg[d][1] == 0) continue;
    if (found) return std::nullopt;
    found = std::pair{int64_t(d), cfg[d][0]};
  }
  return found;
}

}  // namespace

std::shared_ptr<const Jaxpr> concatenate_pads(const Jaxpr& jaxpr) {
  Definitions def_of;
  for (const JaxprEqn& e : jaxpr.eqns())
    for (const Var& v : e.outputs) def_of[v.id()] = &e;
  std::vector<JaxprEqn> eqns;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    if (!is_sum(e)) {
      eqns.push_back(e);
      continue;
    }
    // The leaves of the sum tree rooted here; every one must be a zero pad along the same axis.
    struct Leaf {
      int64_t lo;
      const JaxprEqn* pad;  // its operand is the piece
    };
    std::vector<Leaf> leaves;
    int64_t axis = -1;
    std::function<bool(const Atom&)> collect = [&](const Atom& a) {
      auto* v = std::get_if<Var>(&a);
      if (!v) return false;
      auto it = def_of.find(v->id());
      if (it == def_of.end()) return false;
      const JaxprEqn& d = *it->second;
      if (is_sum(d)) return collect(d.inputs[0]) && collect(d.inputs[1]);
      auto pad = zero_pad_along_one_axis(d, def_of);
      if (!pad || (axis >= 0 && pad->first != axis)) return false;
      axis = pad->first;
      leaves.push_back({pad->second, &d});
      return true;
    };
    const AbstractValue& out = e.outputs[0].aval();
    bool tiles = collect(e.inputs[0]) && collect(e.inputs[1]);
    // Sorted by position; two leaves at the same place (a piece used twice) are summed first, as
    // the sum tree would (a + b is exact in either order; three could round differently).
    std::vector<std::vector<const JaxprEqn*>> pieces;
    if (tiles) {
      std::stable_sort(leaves.begin(), leaves.end(), [](const Leaf& a, const Leaf& b) { return a.lo < b.lo; });
      int64_t next = 0;
      for (size_t i = 0; i < leaves.size() && tiles; ++i) {
        const AbstractValue& in = atom_aval(leaves[i].pad->inputs[0]);
        if (!pieces.empty() && leaves[i].lo == leaves[i - 1].lo) {
          tiles = pieces.back().size() < 2 && in.shape == atom_aval(pieces.back()[0]->inputs[0]).shape;
          pieces.back().push_back(leaves[i].pad);
          continue;
        }
        tiles = leaves[i].lo == next && in.dtype == out.dtype;
        next += in.shape[size_t(axis)];
        pieces.push_back({leaves[i].pad});
      }
      tiles = tiles && next == out.shape[size_t(axis)];
    }
    if (!tiles) {
      eqns.push_back(e);
      continue;
    }
    // Each element is one leaf's plus zeros: the same value (up to the sign of a zero).
    JaxprEqn c;
    c.primitive = find_primitive("concatenate");
    for (const auto& piece : pieces) {
      if (piece.size() == 1) {
        c.inputs.push_back(piece[0]->inputs[0]);
        continue;
      }
      JaxprEqn sum;
      sum.primitive = find_primitive("add_any");
      sum.inputs = {piece[0]->inputs[0], piece[1]->inputs[0]};
      sum.outputs = {Var(atom_aval(piece[0]->inputs[0]))};
      c.inputs.push_back(sum.outputs[0]);
      eqns.push_back(std::move(sum));
    }
    c.outputs = e.outputs;
    c.params = Params{{"dimension", axis}};
    c.source_info = e.source_info;
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

}  // namespace cjax
