#include "jit/jit_primitive.h"

#include <fmt/format.h>

#include "autodiff/ad.h"
#include "autodiff/partial_eval.h"
#include "core/array/rules.h"
#include "jit/partition/partitioner.h"
#include "trace/batching.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax {
namespace {

std::shared_ptr<const Jaxpr> jaxpr_of(const Params& p) { return p.object<JaxprParam>("jaxpr")->jaxpr; }
const std::string& name_of(const Params& p) { return p.get<std::string>("name"); }

const PrimitiveDef& g_jit = register_primitive([] {
  PrimitiveDef def;
  def.name = "jit";
  def.kind = PrimKind::HigherOrder;
  def.arity = Arity::any();  // checked against the jaxpr
  def.leading_params = {"name"};
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    auto j = jaxpr_of(p);
    if (in.size() != j->invars().size())
      throw Error(fmt::format("internal: jit '{}' called with {} inputs for {} invars", name_of(p), in.size(),
                              j->invars().size()));
    return j->out_avals();
  };
  // Eagerly (under EvalTrace) a jit equation runs its jaxpr with the eager kernels, or as one
  // partitioned program where inputs are split over a mesh (sharded jit, docs/sharding.md §2).
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    if (auto split = partition::run_split(jaxpr_of(p), in, name_of(p))) return std::move(*split);
    return eval_jaxpr(*jaxpr_of(p), {}, in);
  };
  return def;
}());

std::vector<AbstractValue> avals_of(std::span<const Array> xs) {
  std::vector<AbstractValue> out;
  for (const Array& x : xs) out.push_back(x.aval());
  return out;
}

JvpOut jit_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  auto j = jaxpr_of(p);
  size_t n = primals.size();
  std::vector<size_t> nz;  // inputs with a tangent
  for (size_t i = 0; i < n; ++i)
    if (tangents[i].defined()) nz.push_back(i);
  std::vector<AbstractValue> in_avals = avals_of(primals);
  for (size_t i : nz) in_avals.push_back(tangents[i].aval());
  TracedCall call = trace_to_call(
      [&](const std::vector<Array>& xs) {
        std::vector<Array> ps(xs.begin(), xs.begin() + std::ptrdiff_t(n)), ts(n);
        for (size_t k = 0; k < nz.size(); ++k) ts[nz[k]] = xs[n + k];
        JvpResult r = jvp_flat([&](const std::vector<Array>& a) { return eval_jaxpr(*j, {}, a); }, ps, ts);
        std::vector<Array> out = r.primals_out;
        out.insert(out.end(), r.tangents_out.begin(), r.tangents_out.end());
        return out;
      },
      in_avals);
  std::vector<Array> args = call.consts;
  args.insert(args.end(), primals.begin(), primals.end());
  for (size_t i : nz) args.push_back(tangents[i]);
  std::vector<Array> outs = bind_jit(call.jaxpr, name_of(p), args);
  size_t m = outs.size() / 2;
  return JvpOut{std::vector<Array>(outs.begin(), outs.begin() + std::ptrdiff_t(m)),
                std::vector<Array>(outs.begin() + std::ptrdiff_t(m), outs.end())};
}

// Under linearize: known inputs are values of the parent trace, unknown ones tracers of the
// current (staging) trace. The known part runs under the parent; the unknown part is staged.
std::vector<Array> jit_partial_eval(std::span<const Array> inputs, std::span<const bool> known, const Params& p) {
  auto* staging = dynamic_cast<JaxprTrace*>(current_trace());
  if (!staging) throw Error("internal: jit partial eval outside a JaxprTrace");
  auto j = jaxpr_of(p);
  std::vector<bool> unknown(known.size());
  for (size_t i = 0; i < known.size(); ++i) unknown[i] = !known[i];
  PartialEvalResult pe = partial_eval_jaxpr(*j, unknown);
  std::vector<Array> known_in, unknown_in;
  for (size_t i = 0; i < inputs.size(); ++i) (known[i] ? known_in : unknown_in).push_back(inputs[i]);
  std::vector<Array> known_out;
  {
    TraceScope scope(staging->parent());
    known_out = bind_jit(pe.known, name_of(p), known_in);
  }
  size_t num_known_outs = known_out.size() - pe.num_residuals;
  std::vector<Array> staged_in(known_out.begin() + std::ptrdiff_t(num_known_outs), known_out.end());
  staged_in.insert(staged_in.end(), unknown_in.begin(), unknown_in.end());
  Params up;
  up.set("jaxpr", std::make_shared<const JaxprParam>(pe.unknown));
  up.set("name", name_of(p));
  std::vector<Array> unknown_out = staging->stage(g_jit, staged_in, up, pe.unknown->out_avals());
  std::vector<Array> out;
  size_t ki = 0, ui = 0;
  for (bool u : pe.out_unknown) out.push_back(u ? unknown_out[ui++] : known_out[ki++]);
  return out;
}

std::vector<Array> jit_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  TransposedCall t = transpose_call(*jaxpr_of(p), cts, args);
  std::vector<Array> outs = bind_jit(t.call.jaxpr, name_of(p), t.call_args);
  std::vector<Array> result(args.size());
  for (size_t k = 0; k < t.linear.size(); ++k) result[t.linear[k]] = outs[k];
  return result;
}

BatchOut jit_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  auto j = jaxpr_of(p);
  std::vector<int> in_bdims(bdims.begin(), bdims.end());
  TracedCall call = trace_to_call(
      [&](const std::vector<Array>& xs) {
        return vmap_flat([&](const std::vector<Array>& a) { return eval_jaxpr(*j, {}, a); }, xs, in_bdims,
                         [](size_t, int) { return 0; }, axis);
      },
      avals_of(args));
  std::vector<Array> call_args = call.consts;
  call_args.insert(call_args.end(), args.begin(), args.end());
  std::vector<Array> outs = bind_jit(call.jaxpr, name_of(p), call_args);
  return BatchOut{outs, std::vector<int>(outs.size(), 0)};
}

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("jit");
  r.jvp = jit_jvp;
  r.partial_eval = jit_partial_eval;
  r.transpose = jit_transpose;
  r.batch = jit_batch;
});

}  // namespace

const PrimitiveDef& jit_primitive() { return g_jit; }

std::vector<Array> bind_jit(std::shared_ptr<const Jaxpr> jaxpr, const std::string& name, std::span<const Array> args) {
  Params p;
  p.set("jaxpr", std::make_shared<const JaxprParam>(std::move(jaxpr)));
  p.set("name", name);
  return cjax::bind(g_jit, args, p);
}

std::vector<Array> bind_jit(const ClosedJaxpr& jaxpr, const std::string& name, std::span<const Array> args) {
  std::vector<Array> all = jaxpr.consts;
  all.insert(all.end(), args.begin(), args.end());
  return bind_jit(convert_constvars_to_invars(*jaxpr), name, all);
}

}  // namespace cjax
