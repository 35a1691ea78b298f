// Reduction primitives (reduce_sum/max/min/prod/and/or, argmax/argmin) and cumulative primitives
// (cumsum/cumprod/cummax/cummin/cumlogsumexp): definitions, shape rules and lax wrappers. The CPU
// kernels, with their numerics and determinism rules, are in backends/cpu/kernels/reduce.cpp.
#include "core/lax/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/lax/scalar_fns.h"

namespace cjax {
namespace {

std::string axes_str(const std::vector<int64_t>& a) {
  if (a.size() == 1) return fmt::format("({},)", a[0]);
  return fmt::format("({})", fmt::join(a, ", "));
}

// ---- primitive definitions ----
struct RedInfo {
  const char* name;
  RedOp op;
};

bool red_accepts(RedOp op, DType d) {
  switch (op) {
    case RedOp::Sum:
    case RedOp::Prod: return d != DType::bool_;
    case RedOp::Max:
    case RedOp::Min: return true;
    case RedOp::And:
    case RedOp::Or: return d == DType::bool_ || is_integer(d);
    case RedOp::LogAddExp: return is_floating(d);
  }
  return false;
}
std::string red_accepts_desc(RedOp op) {
  switch (op) {
    case RedOp::Sum:
    case RedOp::Prod: return "a numeric dtype (integer or floating-point; cast bool with astype(int32) first)";
    case RedOp::And:
    case RedOp::Or: return "a bool or integer dtype";
    case RedOp::LogAddExp: return "a floating-point dtype";
    default: return "any dtype";
  }
}

// Validates already-canonical axes (JAX's reduce shape rule).
void check_axes(std::string_view name, const Shape& shape, const std::vector<int64_t>& axes) {
  int64_t nd = int64_t(shape.size());
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = axes[k];
    if (a < 0 || a >= nd)
      throw ValueError(
          fmt::format("{}: reduction axis {} is out of bounds for an array of rank {} and shape {} "
                      "(valid axes: 0..{}; lax wrappers also accept -{}..-1)",
                      name, a, nd, shape_str(shape), nd - 1, nd));
    for (size_t m = 0; m < k; ++m)
      if (axes[m] == a)
        throw ValueError(fmt::format("{}: duplicate axis {} in axes {}; name each axis once", name, a, axes_str(axes)));
  }
}

template <RedOp op>
PrimitiveDef make_reduce_def(const char* name) {
  PrimitiveDef def;
  def.name = name;
  def.kind = PrimKind::Reduction;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [name](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Array& x = in[0];
    if (!red_accepts(op, x.dtype()))
      throw DTypeError(
          fmt::format("{} does not accept dtype {}: it needs {}", name, dtype_name(x.dtype()), red_accepts_desc(op)));
    const auto& axes = p.ints("axes");
    check_axes(name, x.shape(), axes);
    Shape out;
    for (int64_t d = 0; d < x.ndim(); ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) out.push_back(x.shape()[size_t(d)]);
    return {AbstractValue{out, x.dtype(), x.weak_type(), x.aval().vma}};
  };
  return def;
}

template <bool is_max>
PrimitiveDef make_arg_def(const char* name) {
  PrimitiveDef def;
  def.name = name;
  def.kind = PrimKind::Reduction;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [name](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Array& x = in[0];
    const auto& axes = p.ints("axes");
    if (axes.size() != 1) throw ValueError(fmt::format("{} takes exactly one axis, got axes {}", name, axes_str(axes)));
    check_axes(name, x.shape(), axes);
    DType idt = p.get<DType>("index_dtype");
    if (!is_integer(idt))
      throw DTypeError(fmt::format("{}: index_dtype must be an integer type, got {}", name, dtype_name(idt)));
    int64_t axis = axes[0];
    if (x.shape()[size_t(axis)] == 0)
      throw ValueError(fmt::format("{} requires a non-empty reduced dimension: operand shape {}, axis {} has size 0",
                                   name, shape_str(x.shape()), axis));
    Shape out = x.shape();
    out.erase(out.begin() + axis);
    return {AbstractValue{out, idt, false, x.aval().vma}};
  };
  return def;
}

template <RedOp op>
PrimitiveDef make_cum_def(const char* name) {
  PrimitiveDef def;
  def.name = name;
  def.kind = PrimKind::Reduction;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [name](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Array& x = in[0];
    bool ok = op == RedOp::LogAddExp ? is_floating(x.dtype()) : x.dtype() != DType::bool_;
    if (!ok)
      throw DTypeError(fmt::format("{} does not accept dtype {}: it needs {}", name, dtype_name(x.dtype()),
                                   op == RedOp::LogAddExp ? "a floating-point dtype"
                                                          : "a numeric dtype (cast bool to an integer first)"));
    int64_t axis = p.i("axis");
    if (axis < 0 || axis >= x.ndim())
      throw ValueError(fmt::format("{}: axis {} is out of bounds for an array of rank {} and shape {}", name, axis,
                                   x.ndim(), shape_str(x.shape())));
    return {x.aval()};
  };
  return def;
}

const PrimitiveDef& g_reduce_sum = register_primitive(make_reduce_def<RedOp::Sum>("reduce_sum"));
const PrimitiveDef& g_reduce_max = register_primitive(make_reduce_def<RedOp::Max>("reduce_max"));
const PrimitiveDef& g_reduce_min = register_primitive(make_reduce_def<RedOp::Min>("reduce_min"));
const PrimitiveDef& g_reduce_prod = register_primitive(make_reduce_def<RedOp::Prod>("reduce_prod"));
const PrimitiveDef& g_reduce_and = register_primitive(make_reduce_def<RedOp::And>("reduce_and"));
const PrimitiveDef& g_reduce_or = register_primitive(make_reduce_def<RedOp::Or>("reduce_or"));
const PrimitiveDef& g_argmax = register_primitive(make_arg_def<true>("argmax"));
const PrimitiveDef& g_argmin = register_primitive(make_arg_def<false>("argmin"));
const PrimitiveDef& g_cumsum = register_primitive(make_cum_def<RedOp::Sum>("cumsum"));
const PrimitiveDef& g_cumprod = register_primitive(make_cum_def<RedOp::Prod>("cumprod"));
const PrimitiveDef& g_cummax = register_primitive(make_cum_def<RedOp::Max>("cummax"));
const PrimitiveDef& g_cummin = register_primitive(make_cum_def<RedOp::Min>("cummin"));
const PrimitiveDef& g_cumlogsumexp = register_primitive(make_cum_def<RedOp::LogAddExp>("cumlogsumexp"));

}  // namespace

namespace prims {
const PrimitiveDef& reduce_sum() { return g_reduce_sum; }
const PrimitiveDef& reduce_max() { return g_reduce_max; }
const PrimitiveDef& reduce_min() { return g_reduce_min; }
const PrimitiveDef& reduce_prod() { return g_reduce_prod; }
const PrimitiveDef& reduce_and() { return g_reduce_and; }
const PrimitiveDef& reduce_or() { return g_reduce_or; }
const PrimitiveDef& argmax() { return g_argmax; }
const PrimitiveDef& argmin() { return g_argmin; }
const PrimitiveDef& cumsum() { return g_cumsum; }
const PrimitiveDef& cumprod() { return g_cumprod; }
const PrimitiveDef& cummax() { return g_cummax; }
const PrimitiveDef& cummin() { return g_cummin; }
const PrimitiveDef& cumlogsumexp() { return g_cumlogsumexp; }
}  // namespace prims

// ---- lax wrappers: negative axes allowed, axes sorted (JAX prints them as a sorted tuple) ----
namespace lax {
namespace {
Array reduce_with(const PrimitiveDef& def, const Array& x, const std::vector<int64_t>& axes) {
  std::vector<int64_t> a = canonicalize_axes(axes, x.ndim(), "lax." + def.name);
  std::sort(a.begin(), a.end());
  // JAX's sum/prod/max/min reductions carry out_sharding (None unless sharded jit sets it);
  // reduce_and/reduce_or do not.
  if (def.name == "reduce_and" || def.name == "reduce_or") return bind1(def, {x}, Params{{"axes", a}});
  return bind1(def, {x}, Params{{"axes", a}, {"out_sharding", std::monostate{}}});
}
Array arg_with(const PrimitiveDef& def, const Array& x, int64_t axis, DType index_dtype) {
  int64_t a = canonicalize_axis(axis, x.ndim(), "lax." + def.name);
  (void)itemsize(index_dtype);  // validates (DTypeError "invalid dtype value N")
  return bind1(def, {x}, Params{{"axes", std::vector<int64_t>{a}}, {"index_dtype", index_dtype}});
}
Array cum_with(const PrimitiveDef& def, const Array& x, int64_t axis, bool reverse) {
  int64_t a = canonicalize_axis(axis, x.ndim(), "lax." + def.name);
  return bind1(def, {x}, Params{{"axis", a}, {"reverse", reverse}});
}
}  // namespace
Array reduce_sum(const Array& x, const std::vector<int64_t>& axes) { return reduce_with(prims::reduce_sum(), x, axes); }
Array reduce_max(const Array& x, const std::vector<int64_t>& axes) { return reduce_with(prims::reduce_max(), x, axes); }
Array reduce_min(const Array& x, const std::vector<int64_t>& axes) { return reduce_with(prims::reduce_min(), x, axes); }
Array reduce_prod(const Array& x, const std::vector<int64_t>& axes) {
  return reduce_with(prims::reduce_prod(), x, axes);
}
Array reduce_and(const Array& x, const std::vector<int64_t>& axes) { return reduce_with(prims::reduce_and(), x, axes); }
Array reduce_or(const Array& x, const std::vector<int64_t>& axes) { return reduce_with(prims::reduce_or(), x, axes); }
Array argmax(const Array& x, int64_t axis, DType index_dtype) {
  return arg_with(prims::argmax(), x, axis, index_dtype);
}
Array argmin(const Array& x, int64_t axis, DType index_dtype) {
  return arg_with(prims::argmin(), x, axis, index_dtype);
}
Array cumsum(const Array& x, int64_t axis, bool reverse) { return cum_with(prims::cumsum(), x, axis, reverse); }
Array cumprod(const Array& x, int64_t axis, bool reverse) { return cum_with(prims::cumprod(), x, axis, reverse); }
Array cummax(const Array& x, int64_t axis, bool reverse) { return cum_with(prims::cummax(), x, axis, reverse); }
Array cummin(const Array& x, int64_t axis, bool reverse) { return cum_with(prims::cummin(), x, axis, reverse); }
Array cumlogsumexp(const Array& x, int64_t axis, bool reverse) {
  return cum_with(prims::cumlogsumexp(), x, axis, reverse);
}
}  // namespace lax

}  // namespace cjax
