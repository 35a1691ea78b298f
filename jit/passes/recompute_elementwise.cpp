// recompute_elementwise: elementwise values read again after a barrier are computed again there
// (jit/passes/passes.h).
//
// A gradient program keeps the forward's elementwise intermediates for the backward (GELU's
// tanh(...), 1 - tanh, 0.5 (1 + tanh), 3 x^2): the forward kernel writes each one out and a
// backward kernel reads it back, several arrays of the activation's size. Where the values are
// short elementwise chains of fewer variables (x, the GEMM output, which the backward often reads
// anyway), computing the chains again in the later kernel costs a few arithmetic operations per
// element and saves a write and a read of each value, less a read of each root not read there
// already. XLA makes the same trade when it duplicates
// cheap producers into their consumers.
#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "jit/fusion.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"

namespace cjax {
using namespace passes_detail;

namespace {

constexpr size_t kMaxChain = 12;  // equations recomputed for one value

bool is_elementwise(const JaxprEqn& e) { return e.outputs.size() == 1 && classify(e) == EqnClass::Elementwise; }

// What fusion joins into one kernel; anything else (a GEMM, a gather, a library call) ends one.
bool fusible(const JaxprEqn& e) { return classify(e) != EqnClass::Library; }

}  // namespace

std::shared_ptr<const Jaxpr> recompute_elementwise(const Jaxpr& jaxpr) {
  const std::vector<JaxprEqn>& in = jaxpr.eqns();
  const size_t n = in.size();
  std::unordered_map<const void*, size_t> def_of;
  std::unordered_map<const void*, size_t> last_use;
  for (size_t i = 0; i < n; ++i) {
    for (const Atom& a : in[i].inputs)
      if (auto* v = std::get_if<Var>(&a)) last_use[v->id()] = i;
    for (const Var& v : in[i].outputs) def_of[v.id()] = i;
  }
  for (const Atom& a : jaxpr.outvars())
    if (auto* v = std::get_if<Var>(&a)) last_use[v->id()] = n;
  // Barriers before each equation: barriers_before[j] - barriers_before[i] > 0 when one lies
  // strictly between i and j.
  std::vector<int> barriers_before(n + 1, 0);
  // The first equation of the run of fusible equations (between two barriers) that i is in.
  std::vector<size_t> region_start(n, 0);
  for (size_t i = 0; i < n; ++i) {
    barriers_before[i + 1] = barriers_before[i] + (fusible(in[i]) ? 0 : 1);
    region_start[i] = i > 0 && fusible(in[i - 1]) ? region_start[i - 1] : i;
  }

  // The equations that recompute `v` (in program order) and its roots, or false where v does not
  // qualify: an elementwise chain of at most kMaxChain equations over variables of v's shape
  // defined by something else, scalar literals and scalar variables (in a shard_map body the
  // constants of a chain on varying values are pvary(literal): without them every GELU there
  // kept writing its residuals).
  std::unordered_map<const void*, size_t> nbytes;  // of roots and candidate values
  auto bytes_of = [](const Var& v) { return size_t(v.aval().size()) * itemsize(v.aval().dtype); };
  auto chain_of = [&](const Var& v, std::vector<size_t>& eqns, std::vector<const void*>& roots) {
    std::optional<ElementwiseChain> chain = elementwise_chain(in, def_of, v, kMaxChain, false);
    if (!chain) return false;
    eqns = std::move(chain->eqns);
    for (const Var& r : chain->roots) {
      roots.push_back(r.id());
      nbytes[r.id()] = bytes_of(r);
    }
    return true;
  };

  // Candidates by run of fusible equations: (j, v) where equation j reads v, an elementwise value
  // made before the last barrier, that a chain can recompute.
  std::unordered_map<const void*, std::vector<size_t>> chains;
  std::unordered_map<const void*, std::vector<const void*>> roots_of;
  std::map<size_t, std::vector<std::pair<size_t, Var>>> by_region;
  for (size_t j = 0; j < n; ++j) {
    if (!fusible(in[j])) continue;  // a library step would read a recomputed copy from memory anyway
    for (const Atom& a : in[j].inputs) {
      auto* v = std::get_if<Var>(&a);
      if (!v) continue;
      auto d = def_of.find(v->id());
      if (d == def_of.end() || !is_elementwise(in[d->second]) || barriers_before[j] == barriers_before[d->second + 1])
        continue;
      if (!chains.count(v->id())) {
        std::vector<size_t> eqns;
        std::vector<const void*> roots;
        if (!chain_of(*v, eqns, roots)) continue;
        chains[v->id()] = std::move(eqns);
        roots_of[v->id()] = std::move(roots);
        nbytes[v->id()] = bytes_of(*v);
      }
      by_region[region_start[j]].push_back({j, *v});
    }
  }
  // A run recomputes its candidates in groups: candidates that read a root the run would not read
  // anyway (by its own equations or later ones) are grouped with every other candidate reading
  // it (GELU's tanh, 1 - tanh and 3 h^2 all start from h), and a group is recomputed where its
  // values are more bytes than those roots. Deciding the whole run at once let a row value whose
  // chain needs its reduction's result kept (RMSNorm's rsqrt) keep a full-size value written
  // out beside it.
  std::unordered_map<size_t, std::vector<Var>> recompute_at;
  for (const auto& [start, uses] : by_region) {
    std::vector<const void*> values;
    for (const auto& [j, v] : uses)
      if (std::find(values.begin(), values.end(), v.id()) == values.end()) values.push_back(v.id());
    std::vector<size_t> group(values.size());
    for (size_t i = 0; i < group.size(); ++i) group[i] = i;
    auto find = [&](size_t i) {
      while (group[i] != i) i = group[i] = group[group[i]];
      return i;
    };
    std::unordered_map<const void*, size_t> reader_of;  // an extra root -> a candidate reading it
    for (size_t i = 0; i < values.size(); ++i)
      for (const void* r : roots_of.at(values[i]))
        if (last_use[r] < start)
          if (auto [it, fresh] = reader_of.emplace(r, i); !fresh) group[find(i)] = find(it->second);
    std::unordered_map<size_t, size_t> saved, added;  // per group
    for (size_t i = 0; i < values.size(); ++i) saved[find(i)] += nbytes.at(values[i]);
    for (const auto& [r, i] : reader_of) added[find(i)] += nbytes.at(r);
    std::unordered_set<const void*> taken;
    for (size_t i = 0; i < values.size(); ++i)
      if (added[find(i)] < saved[find(i)]) taken.insert(values[i]);
    for (const auto& [j, v] : uses)
      if (taken.count(v.id())) recompute_at[j].push_back(v);
  }
  if (recompute_at.empty()) return std::make_shared<const Jaxpr>(jaxpr);

  std::vector<JaxprEqn> out;
  out.reserve(n + recompute_at.size() * 4);
  // Recomputed copies by original variable, shared by the uses within one run of fusible
  // equations (a barrier starts a new run).
  std::unordered_map<const void*, Atom> copies;
  int region = -1;
  for (size_t j = 0; j < n; ++j) {
    if (barriers_before[j] != region) {
      copies.clear();
      region = barriers_before[j];
    }
    JaxprEqn e = in[j];
    if (auto it = recompute_at.find(j); it != recompute_at.end()) {
      Subst local;
      for (const Var& v : it->second) {
        for (size_t k : chains.at(v.id())) {
          const Var& orig = in[k].outputs[0];
          if (copies.count(orig.id())) continue;
          JaxprEqn c = in[k];
          for (Atom& x : c.inputs)
            if (auto* w = std::get_if<Var>(&x))
              if (auto found = copies.find(w->id()); found != copies.end()) x = found->second;
          c.outputs = {Var(orig.aval())};
          copies.emplace(orig.id(), c.outputs[0]);
          out.push_back(std::move(c));
        }
        local.map.emplace(v.id(), copies.at(v.id()));
      }
      e.inputs = local.all(e.inputs);
    }
    out.push_back(std::move(e));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(out), jaxpr.outvars());
}

}  // namespace cjax
