// Transformation rules of a primitive (docs/design.md §2): JVP, transpose, batching and partial
// evaluation. They live in one table keyed by the primitive's name, filled by the rule files
// (autodiff/rules_<family>.cpp) at static-initialization time, so a PrimitiveDef in core does not
// depend on the layers that transform it and registration order between files does not matter.
//
// Conventions shared by all rules:
//  * A symbolic zero tangent or cotangent is an undefined Array handle (`!t.defined()`), as JAX's
//    ad.Zero: rules skip work for it and return undefined handles for outputs with zero tangent.
//  * JVP rules run with the current trace set to where tangent work belongs; primal-only work
//    they do is forwarded to the parent trace by the linearize trace automatically.
//  * Transpose rules receive one defined cotangent per output and the primitive's inputs, where
//    the linear inputs are undefined primals (is_undefined_primal(x), carrying only the aval);
//    they return one cotangent per input (undefined for non-linear inputs or zero cotangents).
//  * Batching rules receive each input with its batch dimension (kNotMapped if the input is not
//    batched) and return outputs with theirs.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/array/primitive.h"
#include "core/array/spmd.h"

namespace cjax {

struct JvpOut {
  std::vector<Array> primals, tangents;
};
using JvpRule = std::function<JvpOut(std::span<const Array> primals, std::span<const Array> tangents, const Params&)>;

using TransposeRule =
    std::function<std::vector<Array>(std::span<const Array> cts, std::span<const Array> args, const Params&)>;

inline constexpr int kNotMapped = -1;
struct BatchAxis {
  int64_t size = 0;
  std::string name;  // the vmap's axis_name ("" when unnamed)
  // A mesh axis the batch dimension is split over inside shard_maps (vmap's spmd_axis_name).
  std::string spmd_axis_name = "";
};
struct BatchOut {
  std::vector<Array> outs;
  std::vector<int> bdims;
};
using BatchRule = std::function<BatchOut(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis,
                                         const Params&)>;

// Partial evaluation of a higher-order primitive under linearize: `known[i]` says whether input
// i is known (a value of the parent trace) or unknown (a tracer of the current, staging trace).
// The rule binds the known part under the parent trace and stages the rest under the current one.
using PartialEvalRule =
    std::function<std::vector<Array>(std::span<const Array> inputs, std::span<const bool> known, const Params&)>;

struct PrimitiveRules {
  JvpRule jvp;
  TransposeRule transpose;
  BatchRule batch;
  PartialEvalRule partial_eval;
  // For a primitive whose body jaxprs run with manual mesh axes bound (shard_map): those axes, so
  // that check_jaxpr can type the body's collectives.
  std::function<std::vector<ManualAxis>(const Params&)> body_manual_axes;
};

// Rule files register an initializer at static-init time (`const bool r = add_rule_initializer(...)`);
// all initializers run once, on the first find_rules call, when every primitive is registered.
bool add_rule_initializer(std::function<void()> init);
// The rules of `name`, created empty on first use; called from rule initializers.
PrimitiveRules& define_rules(std::string_view name);
// The rules of `def`, or null if no rule file defined any.
const PrimitiveRules* find_rules(const PrimitiveDef& def);

// ---- undefined primals (JAX's ad.UndefinedPrimal) ----
Array make_undefined_primal(const AbstractValue& aval);
bool is_undefined_primal(const Array& x);

}  // namespace cjax
