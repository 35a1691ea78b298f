// sort (multi-operand, lexicographic over the first num_keys operands) and top_k: definitions,
// shape rules and lax wrappers. Their CPU kernels (and the order they sort by) are in
// backends/cpu/kernels/sort.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/lax/reduce.h"

namespace cjax {
namespace {

const PrimitiveDef& g_sort = register_primitive([] {
  PrimitiveDef def;
  def.name = "sort";
  def.kind = PrimKind::Opaque;
  def.arity = Arity::at_least(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& shape = in[0].shape();
    for (size_t k = 1; k < in.size(); ++k)
      if (in[k].shape() != shape)
        throw ShapeError(
            fmt::format("sort: all operands must have the same shape; operand 0 has shape {} but "
                        "operand {} has shape {}",
                        shape_str(shape), k, shape_str(in[k].shape())));
    if (shape.empty())
      throw ShapeError("sort: operands must have at least one dimension, got a scalar (shape ()); reshape it to (1,)");
    int64_t dim = p.i("dimension"), nd = int64_t(shape.size());
    if (dim < 0 || dim >= nd)
      throw ValueError(
          fmt::format("sort: dimension {} is out of bounds for operands of rank {} and shape {} "
                      "(valid: 0..{}; lax::sort also accepts negative dimensions)",
                      dim, nd, shape_str(shape), nd - 1));
    int64_t nk = p.i("num_keys");
    if (nk < 1 || nk > int64_t(in.size()))
      throw ValueError(
          fmt::format("sort: num_keys={} must be between 1 and the number of operands ({})", nk, in.size()));
    std::vector<AbstractValue> out;
    for (auto& a : in) out.push_back(a.aval());
    return out;
  };
  return def;
}());

// ---- top_k: the k largest entries along the last axis, in descending order; ties -> lower index ----
const PrimitiveDef& g_top_k = register_primitive([] {
  PrimitiveDef def;
  def.name = "top_k";
  def.kind = PrimKind::Opaque;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Array& x = in[0];
    int64_t k = p.i("k");
    if (x.ndim() == 0) throw ShapeError("top_k: operand must have at least one dimension, got a scalar (shape ())");
    if (k < 0) throw ValueError(fmt::format("top_k: k must be nonnegative, got k={}", k));
    int64_t last = x.shape().back();
    if (k > last)
      throw ValueError(
          fmt::format("top_k: k={} is larger than the last dimension ({}) of the operand of shape {}; "
                      "k must be at most {}",
                      k, last, shape_str(x.shape()), last));
    if (x.dtype() == DType::bool_)
      throw DTypeError("top_k does not accept dtype bool: it needs a numeric dtype (cast with astype first)");
    Shape s = x.shape();
    s.back() = k;
    return {AbstractValue{s, x.dtype(), x.weak_type(), x.aval().vma},
            AbstractValue{s, DType::int32, false, x.aval().vma}};
  };
  return def;
}());

}  // namespace

namespace prims {
const PrimitiveDef& sort() { return g_sort; }
const PrimitiveDef& top_k() { return g_top_k; }
}  // namespace prims

namespace lax {
std::vector<Array> sort(const std::vector<Array>& operands, int64_t dimension, bool is_stable, int num_keys) {
  if (operands.empty()) throw ValueError("lax.sort needs at least one operand");
  int64_t nd = operands[0].ndim();
  if (nd == 0)
    throw ShapeError(
        "lax.sort: operands must have at least one dimension, got a scalar (shape ()); reshape it to (1,)");
  int64_t dim = canonicalize_axis(dimension, nd, "lax.sort");
  return cjax::bind(prims::sort(), std::span<const Array>(operands),
                    Params{{"dimension", dim}, {"is_stable", is_stable}, {"num_keys", int64_t(num_keys)}});
}
Array sort(const Array& x, int64_t dimension, bool is_stable) {
  return sort(std::vector<Array>{x}, dimension, is_stable, 1)[0];
}
std::pair<Array, Array> top_k(const Array& x, int64_t k) {
  auto outs = cjax::bind(prims::top_k(), {x}, Params{{"k", k}});
  return {outs[0], outs[1]};
}
}  // namespace lax

}  // namespace cjax
