#include "jit/cost_analysis.h"

#include <algorithm>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/lax/linalg.h"
#include "trace/shard_map.h"

namespace cjax {

namespace {

double elements(const AbstractValue& a) { return double(a.size()); }
double nbytes(const AbstractValue& a) { return double(a.size()) * double(itemsize(a.dtype)); }

CostAnalysis& operator+=(CostAnalysis& a, const CostAnalysis& b) {
  a.flops += b.flops;
  a.transcendentals += b.transcendentals;
  a.bytes_accessed += b.bytes_accessed;
  return a;
}
CostAnalysis scaled(CostAnalysis c, double k) {
  c.flops *= k;
  c.transcendentals *= k;
  c.bytes_accessed *= k;
  return c;
}

bool is_transcendental(const std::string& n) {
  static const std::set<std::string> names = {"exp",  "exp2",  "log",     "log1p",  "expm1", "tanh",  "logistic",
                                              "sin",  "cos",   "tan",     "asin",   "acos",  "atan",  "sinh",
                                              "cosh", "asinh", "acosh",   "atanh",  "sqrt",  "rsqrt", "cbrt",
                                              "erf",  "erfc",  "erf_inv", "lgamma", "pow",   "atan2"};
  return names.count(n) > 0;
}

// Flops and transcendentals of one first-order equation (see CostAnalysis in cjax/jit.h).
CostAnalysis first_order_cost(const JaxprEqn& e) {
  CostAnalysis c;
  const std::string& n = e.primitive->name;
  double out = 0, in = 0;
  for (const Var& v : e.outputs) out += elements(v.aval());
  for (const Atom& a : e.inputs) in += elements(atom_aval(a));
  if (n == "dot_general" || n == "dot_general_accumulate") {
    const Shape& lhs = atom_aval(e.inputs[0]).shape;
    double k = 1;
    for (int64_t d : e.params.object<DotDimsParam>("dimension_numbers")->lhs_contracting) k *= double(lhs[size_t(d)]);
    c.flops = 2 * out * k + (n == "dot_general_accumulate" ? 2 * out : 0);
  } else if (n.rfind("flash_attention", 0) == 0) {
    // 2 T S H multiply-adds per (batch, head) for each product: 2 forward, 2 more for the tangent,
    // 5 backward (QK^T recomputed, dO V^T, dV, dK, dQ); causal attention computes about half.
    // The packed forms (jit's pack_attention) name q's and k's shapes in their params.
    const bool packed = n.ends_with("_packed");
    const Shape q = packed ? Shape(e.params.ints("q_shape")) : atom_aval(e.inputs[0]).shape;
    const int64_t keys = packed ? e.params.ints("kv_shape")[1] : atom_aval(e.inputs[1]).shape[1];
    double products = n.rfind("flash_attention_backward", 0) == 0 ? 5 : n == "flash_attention_tangent" ? 4 : 2;
    double pairs = double(q[0]) * double(q[2]) * double(q[1]) * double(keys);
    if (e.params.get<bool>("is_causal")) pairs /= 2;
    c.flops = 2 * products * pairs * double(q[3]);
    c.transcendentals = pairs;
  } else if (n == "conv_general_dilated") {
    const AbstractValue& rhs = atom_aval(e.inputs[1]);
    double out_features = double(rhs.shape[size_t(e.params.object<ConvDimsParam>("dimension_numbers")->rhs_spec[0])]);
    c.flops = out_features > 0 ? 2 * out * elements(rhs) / out_features : 0;
  } else if (n.rfind("scatter-", 0) == 0) {
    c.flops = e.inputs.size() > 2 ? elements(atom_aval(e.inputs[2])) : 0;
  } else if (e.primitive->kind == PrimKind::Elementwise) {
    if (n != "stop_gradient" && n != "bitcast_convert_type") c.flops = out;
    if (is_transcendental(n)) c.transcendentals = out;
  } else if (e.primitive->kind == PrimKind::Reduction || n.rfind("reduce_", 0) == 0 || n.rfind("arg", 0) == 0 ||
             n.rfind("cum", 0) == 0) {
    c.flops = in;
  } else if (e.primitive->kind == PrimKind::Collective) {
    if (n == "psum" || n == "pmax" || n == "pmin" || n == "psum_scatter" || n == "reduce_scatter") c.flops = in;
  } else if (e.primitive->kind == PrimKind::Opaque) {
    c.flops = out;  // sort, top_k, ...: one per output element
  }
  return c;
}

double io_bytes(const JaxprEqn& e) {
  double b = 0;
  for (const Atom& a : e.inputs) b += nbytes(atom_aval(a));
  for (const Var& v : e.outputs) b += nbytes(v.aval());
  return b;
}

CostAnalysis jaxpr_cost(const Jaxpr& j);

// One equation run by itself (its library kernel, or a body for higher-order primitives).
CostAnalysis eqn_cost(const JaxprEqn& e) {
  if (e.primitive->kind != PrimKind::HigherOrder) {
    CostAnalysis c = first_order_cost(e);
    c.bytes_accessed = io_bytes(e);
    return c;
  }
  const std::string& n = e.primitive->name;
  std::vector<const Jaxpr*> subs = jaxprs_in_params(e.params);
  CostAnalysis c;
  if (n == "cond") {  // the costliest branch
    for (const Jaxpr* b : subs) {
      CostAnalysis bc = jaxpr_cost(*b);
      if (bc.flops > c.flops || (bc.flops == c.flops && bc.bytes_accessed > c.bytes_accessed)) c = bc;
    }
    return c;
  }
  for (const Jaxpr* b : subs) c += jaxpr_cost(*b);
  if (n == "scan" && e.params.has("length")) return scaled(c, double(e.params.i("length")));
  if (n == "shard_map" && e.params.has("mesh"))
    return scaled(c, double(e.params.object<MeshParam>("mesh")->mesh.size()));
  return c;  // calls once; while: body and condition once
}

CostAnalysis jaxpr_cost(const Jaxpr& j) {
  CostAnalysis c;
  for (const JaxprEqn& e : j.eqns()) c += eqn_cost(e);
  return c;
}

}  // namespace

CostAnalysis program_cost(const Executable& exe) {
  const FusionPlan& plan = exe.plan();
  CostAnalysis c;
  for (const PlanStep& s : plan.steps) {
    if (s.kernel < 0) {
      c += eqn_cost(s.eqn);
      continue;
    }
    const FusedKernel& k = plan.kernels[size_t(s.kernel)];
    for (const JaxprEqn& e : k.eqns) {
      CostAnalysis ec = first_order_cost(e);
      c.flops += ec.flops;
      c.transcendentals += ec.transcendentals;
    }
    for (const Var& v : k.inputs) c.bytes_accessed += nbytes(v.aval());
    for (const Var& v : k.outputs) c.bytes_accessed += nbytes(v.aval());
  }
  return c;
}

MemoryAnalysis program_memory(const Executable& exe, const ClosedJaxpr& traced,
                              const std::vector<size_t>& donated_args) {
  MemoryAnalysis m;
  const Jaxpr& j = exe.jaxpr();
  std::vector<AbstractValue> in = traced.in_avals();
  for (const AbstractValue& a : in) m.argument_size_in_bytes += int64_t(nbytes(a));
  for (size_t i : donated_args)
    if (i < in.size()) m.alias_size_in_bytes += int64_t(nbytes(in[i]));
  for (const AbstractValue& a : j.out_avals()) m.output_size_in_bytes += int64_t(nbytes(a));
  for (const Array& c : traced.consts) m.constant_size_in_bytes += int64_t(nbytes(c.aval()));

  // Intermediates: values produced by a step that are not program outputs, alive from their
  // step to their last reader.
  const FusionPlan& plan = exe.plan();
  auto step_inputs = [&](const PlanStep& s) {
    std::vector<const void*> ids;
    if (s.kernel >= 0) {
      for (const Var& v : plan.kernels[size_t(s.kernel)].inputs) ids.push_back(v.id());
    } else {
      for (const Atom& a : s.eqn.inputs)
        if (auto* v = std::get_if<Var>(&a)) ids.push_back(v->id());
    }
    return ids;
  };
  auto step_outputs = [&](const PlanStep& s) -> const std::vector<Var>& {
    return s.kernel >= 0 ? plan.kernels[size_t(s.kernel)].outputs : s.eqn.outputs;
  };
  std::unordered_set<const void*> program_outputs;
  for (const Atom& a : j.outvars())
    if (auto* v = std::get_if<Var>(&a)) program_outputs.insert(v->id());
  std::unordered_map<const void*, size_t> last_use;
  for (size_t i = 0; i < plan.steps.size(); ++i)
    for (const void* id : step_inputs(plan.steps[i])) last_use[id] = i;
  std::unordered_map<const void*, int64_t> live;
  int64_t live_bytes = 0, peak = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    for (const Var& v : step_outputs(plan.steps[i])) {
      if (program_outputs.count(v.id()) || !last_use.count(v.id())) continue;
      int64_t b = int64_t(nbytes(v.aval()));
      live.emplace(v.id(), b);
      live_bytes += b;
    }
    peak = std::max(peak, live_bytes);
    for (const void* id : step_inputs(plan.steps[i])) {
      auto it = live.find(id);
      if (it != live.end() && last_use[id] == i) {
        live_bytes -= it->second;
        live.erase(it);
      }
    }
  }
  m.temp_size_in_bytes = peak;
  return m;
}

}  // namespace cjax
