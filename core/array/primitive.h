// PrimitiveDef: everything about one primitive, found from one definition (docs/design.md §2).
// A family file (elementwise.cpp, shape.cpp, ...) defines its primitives and registers them;
// later layers (autodiff, batching, sharding, codegen) find their rules through the same def.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "cjax/array.h"
#include "core/backend/scalar_ops.h"

namespace cjax {

// Structured parameter values (gather dimension numbers, sub-jaxprs) implement this.
struct ParamObject {
  virtual ~ParamObject() = default;
  virtual std::string str() const = 0;  // as JAX prints it in a jaxpr
  virtual size_t hash() const = 0;
  virtual bool equals(const ParamObject& other) const = 0;
};

using ParamValue = std::variant<std::monostate, bool, int64_t, double, std::string, DType, std::vector<int64_t>,
                                std::vector<std::vector<int64_t>>, std::shared_ptr<const ParamObject>>;

// Sorted name -> value map (sorted because jaxprs print params sorted).
class Params {
 public:
  Params() = default;
  Params(std::initializer_list<std::pair<std::string, ParamValue>> items);
  void set(std::string name, ParamValue v);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  const ParamValue& at(std::string_view name) const;  // raises Error naming a missing param
  template <class T>
  const T& get(std::string_view name) const {
    const ParamValue& v = at(name);
    if (auto* p = std::get_if<T>(&v)) return *p;
    bad_type(name);
  }
  template <class T>
  std::shared_ptr<const T> object(std::string_view name) const {
    auto p = std::dynamic_pointer_cast<const T>(get<std::shared_ptr<const ParamObject>>(name));
    if (!p) bad_type(name);
    return p;
  }
  int64_t i(std::string_view name) const { return get<int64_t>(name); }
  const std::vector<int64_t>& ints(std::string_view name) const { return get<std::vector<int64_t>>(name); }
  const auto& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  bool operator==(const Params& o) const;
  size_t hash() const;

 private:
  const ParamValue* find(std::string_view name) const;
  [[noreturn]] void bad_type(std::string_view name) const;
  std::vector<std::pair<std::string, ParamValue>> items_;
};
std::string param_value_str(const ParamValue& v);  // JAX's text: (0, 1), True, float32

enum class PrimKind : uint8_t {
  Elementwise,
  Broadcast,
  Reduction,
  Shape,
  Indexing,
  Linalg,
  Collective,
  HigherOrder,
  Opaque
};

// How many operands a primitive takes. register_primitive requires one and checks it before
// every abstract_eval, so no rule reads past its operands (the jaxpr parser and custom rules can
// bind any operand list).
struct Arity {
  static constexpr size_t kUnbounded = SIZE_MAX;
  size_t min = 0;
  size_t max = kUnbounded;
  static constexpr Arity exactly(size_t n) { return {n, n}; }
  static constexpr Arity at_least(size_t n) { return {n, kUnbounded}; }
  static constexpr Arity any() { return {0, kUnbounded}; }
};

struct PrimitiveDef {
  using AbstractEvalFn = std::function<std::vector<AbstractValue>(std::span<const Array>, const Params&)>;
  // An eager implementation: inputs are concrete; out_avals come from abstract_eval.
  using ImplFn = std::function<std::vector<Array>(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                                  const Params&)>;

  std::string name;
  PrimKind kind = PrimKind::Opaque;
  std::optional<Arity> arity;  // required
  AbstractEvalFn abstract_eval;
  // The platform-independent eager implementation, for primitives that compute nothing themselves:
  // higher-order ones (they bind their body's primitives), views, collectives (they exchange blocks
  // through the SPMD communicator), placement and printing. Primitives that compute have no impl:
  // each backend registers their kernels per platform (register_kernel in core/array/kernel_table.h, the CPU's
  // in backends/cpu/kernels/).
  ImplFn impl;
  std::optional<ScalarOp> scalar_op;        // elementwise primitives: the row of the scalar-op table
  std::vector<std::string> leading_params;  // printed first, in this order (others follow sorted)
  // Has an effect besides its outputs (printing, I/O): never removed, merged or constant-folded by
  // the jit passes. Collectives are treated the same way through their kind.
  bool effectful = false;
  // Takes operands sharded over several devices as they are (shard_map, which splits them into
  // its blocks); every other primitive then runs once per shard (core/array/trace.h).
  bool takes_sharded_operands = false;
  // Rules of later layers (jvp, transpose, batching, sharding, codegen) are attached to the def
  // by those layers through rule tables keyed by the def (autodiff/, jit/), so this struct
  // does not depend on them.
};

// Registers a primitive under its name (unique) and returns the stable definition; its
// abstract_eval is wrapped so that a wrong operand count raises ValueError naming the primitive.
const PrimitiveDef& register_primitive(PrimitiveDef def);
// Raises ValueError ("sin takes 1 operand, got 2") unless `n` operands fit the def's arity.
void check_operand_count(const PrimitiveDef& def, size_t n);
const PrimitiveDef* find_primitive(std::string_view name);
std::vector<const PrimitiveDef*> all_primitives();

// abstract_eval plus the varying-manual-axes rule (docs/shard_map.md §2.2): collectives and
// higher-order primitives compute their own; every other primitive requires its operands' sets to
// be equal (VmaError otherwise: the traces insert pvary first) and gives every output that set.
std::vector<AbstractValue> infer_avals(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params);
// True for primitives that follow that standard rule (the ones the traces auto-pvary for).
inline bool has_standard_vma_rule(const PrimitiveDef& def) {
  return def.kind != PrimKind::Collective && def.kind != PrimKind::HigherOrder;
}

// Hands a primitive to the current trace (core/array/trace.h). Eagerly: checks shapes/dtypes with
// abstract_eval and runs the kernel synchronously on the caller's thread.
std::vector<Array> bind(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params = {});
std::vector<Array> bind(const PrimitiveDef& def, std::initializer_list<Array> inputs, const Params& params = {});
Array bind1(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params = {});
Array bind1(const PrimitiveDef& def, std::initializer_list<Array> inputs, const Params& params = {});

}  // namespace cjax
