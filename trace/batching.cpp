#include "trace/batching.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/lax/rule_support.h"
#include "core/spmd/collectives.h"
#include "trace/jaxpr.h"

namespace cjax {

bool uses_axis_name(const PrimitiveDef& def, const Params& params, const std::string& name) {
  if (def.kind == PrimKind::Collective) {
    const auto& axes = collective_axes(params);
    return std::find(axes.begin(), axes.end(), name) != axes.end();
  }
  if (def.kind != PrimKind::HigherOrder) return false;
  for (const Jaxpr* j : jaxprs_in_params(params))
    for (const JaxprEqn& e : j->eqns())
      if (uses_axis_name(*e.primitive, e.params, name)) return true;
  return false;
}

namespace {
AbstractValue unbatched_aval(const Array& v, int bdim) {
  AbstractValue a = v.aval();
  if (bdim < 0 || bdim >= a.ndim())
    throw Error(fmt::format("internal: batch dimension {} out of range for {}", bdim, a.str()));
  a.shape.erase(a.shape.begin() + bdim);
  return a;
}
}  // namespace

BatchTracer::BatchTracer(Array v, int bdim_, Trace* trace, std::shared_ptr<const bool> ended)
    : Tracer(unbatched_aval(v, bdim_), trace), val(std::move(v)), bdim(bdim_), ended_(std::move(ended)) {}

std::string BatchTracer::provenance() const {
  std::string s = "under vmap: it is a batched value (one per example) of type " + aval.str();
  if (auto* t = dynamic_cast<const Tracer*>(val.impl()))
    if (std::string p = t->provenance(); !p.empty()) s += "; " + p;
  return s;
}

std::string BatchTracer::created_at() const {
  auto* t = dynamic_cast<const Tracer*>(val.impl());
  return t ? t->created_at() : "";
}

BatchTrace::BatchTrace(BatchAxis axis) : Trace(current_trace()), axis_(std::move(axis)) {}

Array BatchTrace::make_tracer(Array val, int bdim) {
  if (bdim == kNotMapped) return val;
  return Array(std::make_shared<BatchTracer>(std::move(val), bdim, this, ended_));
}

std::pair<Array, int> BatchTrace::unpack(const Array& x, const PrimitiveDef* def) const {
  if (auto* t = dynamic_cast<BatchTracer*>(x.impl()); t && t->trace == this && t->is_live()) return {t->val, t->bdim};
  if (auto* t = dynamic_cast<Tracer*>(x.impl()); t && !is_ancestor_of(*t, *this)) {
    if (def) raise_escaped_tracer(x, *def);
    throw EscapedTracerError(
        fmt::format("vmap: the function returned a value of type {} from a finished transformation; a tracer escaped "
                    "its trace (for example it was stored in a global or captured by a lambda that outlived it).{}",
                    x.aval().str(), tracer_origin(x)));
  }
  return {x, kNotMapped};
}

std::vector<Array> BatchTrace::process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                                 const Params& params) {
  std::vector<Array> vals;
  std::vector<int> bdims;
  bool any = false;
  for (const Array& x : inputs) {
    if (!x.defined()) throw ValueError(fmt::format("'{}' received an empty Array handle", def.name));
    auto [v, d] = unpack(x, &def);
    any = any || d != kNotMapped;
    vals.push_back(std::move(v));
    bdims.push_back(d);
  }
  TraceScope scope(parent());
  if (!any) {
    if (axis_.name.empty() || !uses_axis_name(def, params, axis_.name)) return cjax::bind(def, vals, params);
    // A higher-order rule sees one batched operand (collectives' rules take unbatched ones).
    if (def.kind == PrimKind::HigherOrder && !vals.empty()) {
      vals[0] = move_bdim(vals[0], kNotMapped, 0, axis_.size);
      bdims[0] = 0;
    }
  }
  const PrimitiveRules* rules = find_rules(def);
  if (!rules || !rules->batch)
    throw ValueError(fmt::format("vmap: the batching rule for primitive '{}' is not implemented", def.name));
  BatchOut out = rules->batch(vals, bdims, axis_, params);
  if (out.outs.size() != out.bdims.size())
    throw Error(fmt::format("internal: batching rule of '{}' returned {} outputs and {} batch dims", def.name,
                            out.outs.size(), out.bdims.size()));
  std::vector<Array> result;
  for (size_t i = 0; i < out.outs.size(); ++i) result.push_back(make_tracer(std::move(out.outs[i]), out.bdims[i]));
  return result;
}

std::vector<Array> vmap_flat(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                             std::span<const Array> args, std::span<const int> in_axes,
                             const std::function<int(size_t, int)>& out_axis, const BatchAxis& axis) {
  // A named vmap binds its axis_name for collectives while `f` is traced (inner bindings shadow).
  std::optional<AxisEnvScope> env;
  if (!axis.name.empty()) env.emplace(std::vector<ManualAxis>{{axis.name, axis.size, false, true}});
  BatchTrace trace(axis);
  std::vector<Array> in;
  for (size_t i = 0; i < args.size(); ++i) in.push_back(trace.make_tracer(args[i], in_axes[i]));
  std::vector<Array> outs;
  {
    TraceScope scope(&trace);
    outs = f(in);
  }
  std::vector<Array> result;
  for (size_t j = 0; j < outs.size(); ++j) {
    auto [v, d] = trace.unpack(outs[j], nullptr);
    int rank = v.ndim() - (d == kNotMapped ? 0 : 1);
    int to = out_axis(j, rank);
    if (to == kNotMapped) {
      if (d != kNotMapped)
        throw ValueError(
            fmt::format("vmap has mapped output {} (of type {} per example) but out_axes is None for "
                        "it; give it an out axis, or make it independent of the mapped inputs",
                        j, outs[j].aval().str()));
      result.push_back(v);
      continue;
    }
    result.push_back(move_bdim(v, d, to, axis.size));
  }
  return result;
}

}  // namespace cjax
