// dot_general: JAX's general tensor contraction, and the CPU GEMM driver behind it (and conv).
//
// The eager kernel maps any dot_general onto a batched GEMM [B, M, K] x [B, K, N] -> [B, M, N]:
// batch dims collapse to B, lhs free dims to M, rhs free dims to N, contracting dims to K. An
// operand whose dims already form a strided row-major matrix in either orientation is handed to
// BLAS as is (transpose flag + leading dimension); only operands whose dim groups interleave in
// memory are copied into canonical order first.
#include "core/lax/linalg.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/array/visit_dtype.h"
#include "core/lax/scalar_fns.h"

namespace cjax {

// ---- parameter objects ----
namespace {
std::string list_str(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
}  // namespace

std::string DotDimsParam::str() const {
  return fmt::format("(({}, {}), ({}, {}))", list_str(lhs_contracting), list_str(rhs_contracting), list_str(lhs_batch),
                     list_str(rhs_batch));
}
size_t DotDimsParam::hash() const { return absl::HashOf(lhs_contracting, rhs_contracting, lhs_batch, rhs_batch); }
bool DotDimsParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const DotDimsParam*>(&other);
  return o && o->lhs_contracting == lhs_contracting && o->rhs_contracting == rhs_contracting &&
         o->lhs_batch == lhs_batch && o->rhs_batch == rhs_batch;
}

namespace {

// ---- strided layout analysis ----

// Collapses `dims` (in this logical order) of a row-major array into one strided dim. Size-1
// dims are ignored. Returns false when the dims do not form one arithmetic progression in
// memory; `stride` is 0 when the group has size 1.
bool collapse(const Shape& shape, const std::vector<int64_t>& strides, const std::vector<int64_t>& dims,
              int64_t& stride) {
  stride = 0;
  int64_t expect = -1;
  for (size_t i = dims.size(); i-- > 0;) {
    int64_t d = dims[i];
    if (shape[size_t(d)] == 1) continue;
    if (expect < 0) {
      stride = strides[size_t(d)];
    } else if (strides[size_t(d)] != expect) {
      return false;
    }
    expect = strides[size_t(d)] * shape[size_t(d)];
  }
  return true;
}

int64_t group_size(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[size_t(d)];
  return n;
}

// Tries to view an operand as a batch of matrices whose rows are `outer` dims and columns `inner`
// dims (stored orientation). On success fills ld and batch_stride.
bool try_view(const Shape& shape, const std::vector<int64_t>& batch, const std::vector<int64_t>& outer,
              const std::vector<int64_t>& inner, GemmOperand& op) {
  auto strides = row_major_strides(shape);
  int64_t si, so, sb;
  if (!collapse(shape, strides, inner, si) || !collapse(shape, strides, outer, so)) return false;
  int64_t ninner = group_size(shape, inner);
  if (si != 0 && si != 1) return false;
  int64_t ld = so == 0 ? std::max<int64_t>(1, ninner) : so;
  if (ld < std::max<int64_t>(1, ninner)) return false;
  op.ld = ld;
  op.batch_dims.clear();
  if (collapse(shape, strides, batch, sb)) {
    op.batch_stride = sb;
  } else {  // batch dims interleaved with the matrix dims: one (extent, stride) per batch dim
    op.batch_stride = 0;
    for (int64_t d : batch) op.batch_dims.emplace_back(shape[size_t(d)], strides[size_t(d)]);
  }
  return true;
}

std::vector<int64_t> free_dims(int64_t ndim, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < ndim; ++d)
    if (std::find(a.begin(), a.end(), d) == a.end() && std::find(b.begin(), b.end(), d) == b.end()) out.push_back(d);
  return out;
}

Shape take(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d : dims) out.push_back(s[size_t(d)]);
  return out;
}

void check_dims(const char* which, const char* kind, const std::vector<int64_t>& dims, int64_t ndim) {
  for (int64_t d : dims)
    if (d < 0 || d >= ndim)
      throw ValueError(
          fmt::format("dot_general: {} {} dimension {} is out of range for an operand of rank {} "
                      "(dimension numbers must be in 0..{}; lax does not accept negative dims)",
                      which, kind, d, ndim, ndim - 1));
}

void check_distinct(const char* which, const std::vector<int64_t>& c, const std::vector<int64_t>& b) {
  std::vector<int64_t> all = c;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end())
    throw ValueError(
        fmt::format("dot_general: {} contracting dimensions {} and batch dimensions {} must be "
                    "distinct (no dimension listed twice)",
                    which, list_str(c), list_str(b)));
}

std::vector<AbstractValue> dot_general_abstract_eval(std::span<const Array> in, const Params& p) {
  const Array &lhs = in[0], &rhs = in[1];
  auto dn = p.object<DotDimsParam>("dimension_numbers");
  if (lhs.dtype() != rhs.dtype())
    throw DTypeError(
        fmt::format("dot_general requires lhs and rhs to have the same dtype, got {} and {} "
                    "(convert one with lax::convert_element_type, or use jnp.matmul / jnp.dot, which "
                    "promote)",
                    dtype_name(lhs.dtype()), dtype_name(rhs.dtype())));
  check_dims("lhs", "contracting", dn->lhs_contracting, lhs.ndim());
  check_dims("rhs", "contracting", dn->rhs_contracting, rhs.ndim());
  check_dims("lhs", "batch", dn->lhs_batch, lhs.ndim());
  check_dims("rhs", "batch", dn->rhs_batch, rhs.ndim());
  check_distinct("lhs", dn->lhs_contracting, dn->lhs_batch);
  check_distinct("rhs", dn->rhs_contracting, dn->rhs_batch);
  if (dn->lhs_batch.size() != dn->rhs_batch.size())
    throw ShapeError(
        fmt::format("dot_general requires equal numbers of lhs and rhs batch dimensions, got lhs batch "
                    "{} and rhs batch {}",
                    list_str(dn->lhs_batch), list_str(dn->rhs_batch)));
  if (dn->lhs_contracting.size() != dn->rhs_contracting.size())
    throw ShapeError(
        fmt::format("dot_general requires equal numbers of lhs and rhs contracting dimensions, got "
                    "lhs contracting {} and rhs contracting {}",
                    list_str(dn->lhs_contracting), list_str(dn->rhs_contracting)));
  Shape lb = take(lhs.shape(), dn->lhs_batch), rb = take(rhs.shape(), dn->rhs_batch);
  if (lb != rb)
    throw ShapeError(
        fmt::format("dot_general requires lhs batch dimensions and rhs batch dimensions to have the "
                    "same shape, got {} (lhs dims {} of {}) and {} (rhs dims {} of {})",
                    shape_str(lb), list_str(dn->lhs_batch), shape_str(lhs.shape()), shape_str(rb),
                    list_str(dn->rhs_batch), shape_str(rhs.shape())));
  Shape lc = take(lhs.shape(), dn->lhs_contracting), rc = take(rhs.shape(), dn->rhs_contracting);
  if (lc != rc)
    throw ShapeError(
        fmt::format("dot_general requires contracting dimensions to have the same shape, got {} (lhs "
                    "dims {} of {}) and {} (rhs dims {} of {})",
                    shape_str(lc), list_str(dn->lhs_contracting), shape_str(lhs.shape()), shape_str(rc),
                    list_str(dn->rhs_contracting), shape_str(rhs.shape())));
  DType in_dt = lhs.dtype(), out_dt = in_dt;
  bool weak = lhs.weak_type() && rhs.weak_type();
  if (auto* pet = std::get_if<DType>(&p.at("preferred_element_type"))) {
    out_dt = *pet;
    weak = weak && out_dt == in_dt;  // jnp passes the input dtype: jnp.dot(2., 3.) stays weak
    bool in_f = is_floating(in_dt), out_f = is_floating(out_dt);
    if (in_f && !out_f)
      throw DTypeError(
          fmt::format("dot_general: input type {} is incompatible with preferred_element_type {}; "
                      "compatible combinations are (integral, integral), (integral, floating) and "
                      "(floating, floating)",
                      dtype_name(in_dt), dtype_name(out_dt)));
    if ((in_f == out_f) && in_dt != DType::bool_ && itemsize(out_dt) < itemsize(in_dt))
      throw DTypeError(
          fmt::format("dot_general: preferred_element_type {} must not be narrower than the input "
                      "type {}",
                      dtype_name(out_dt), dtype_name(in_dt)));
  }
  auto lf = free_dims(lhs.ndim(), dn->lhs_contracting, dn->lhs_batch);
  auto rf = free_dims(rhs.ndim(), dn->rhs_contracting, dn->rhs_batch);
  Shape out = lb;
  for (int64_t d : lf) out.push_back(lhs.shape()[size_t(d)]);
  for (int64_t d : rf) out.push_back(rhs.shape()[size_t(d)]);
  return {AbstractValue{out, out_dt, weak, {}}};
}

const PrimitiveDef& g_dot_general = register_primitive([] {
  PrimitiveDef def;
  def.name = "dot_general";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(2);
  def.abstract_eval = dot_general_abstract_eval;
  return def;
}());

}  // namespace

GemmDims gemm_dims(const Shape& ls, const Shape& rs, const DotDimsParam& dn) {
  GemmDims g;
  g.lhs_free = free_dims(int64_t(ls.size()), dn.lhs_contracting, dn.lhs_batch);
  g.rhs_free = free_dims(int64_t(rs.size()), dn.rhs_contracting, dn.rhs_batch);
  g.B = group_size(ls, dn.lhs_batch), g.M = group_size(ls, g.lhs_free), g.N = group_size(rs, g.rhs_free);
  g.K = group_size(ls, dn.lhs_contracting);
  return g;
}

std::optional<GemmOperand> gemm_operand_view(const Shape& shape, const std::vector<int64_t>& batch,
                                             const std::vector<int64_t>& rows, const std::vector<int64_t>& cols) {
  GemmOperand op;
  if (try_view(shape, batch, rows, cols, op))
    op.trans = false;
  else if (try_view(shape, batch, cols, rows, op))
    op.trans = true;
  else
    return std::nullopt;
  return op;
}

std::optional<GemmViews> gemm_views(const Shape& ls, const Shape& rs, const DotDimsParam& dn) {
  GemmDims d = gemm_dims(ls, rs, dn);
  std::optional<GemmOperand> a = gemm_operand_view(ls, dn.lhs_batch, d.lhs_free, dn.lhs_contracting);
  std::optional<GemmOperand> b = gemm_operand_view(rs, dn.rhs_batch, dn.rhs_contracting, d.rhs_free);
  if (!a || !b) return std::nullopt;
  GemmViews g;
  g.B = d.B, g.M = d.M, g.N = d.N, g.K = d.K;
  g.A = *a;
  g.Bop = *b;
  return g;
}

namespace {
// acc + alpha * dot_general(lhs, rhs): introduced by jit's pass fuse_gemm_updates (an SGD step
// `w - lr * dw` whose dw is a dot_general), never traced by users. The executable runs it in
// place over a dying or donated acc; this impl, used otherwise, accumulates into a copy.
const PrimitiveDef& g_dot_general_accumulate = register_primitive([] {
  PrimitiveDef def;
  def.name = "dot_general_accumulate";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(3);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    Params dp{{"dimension_numbers", p.at("dimension_numbers")}, {"preferred_element_type", std::monostate{}}};
    AbstractValue dot = dot_general_abstract_eval(in.first(2), dp)[0];
    AbstractValue out = in[2].aval();
    if (dot.shape != out.shape || dot.dtype != out.dtype)
      throw ShapeError(
          fmt::format("dot_general_accumulate: the product is {} but the accumulator is {}", dot.str(), out.str()));
    for (const Array& x : in) out.vma = vma_union(out.vma, x.aval().vma);  // the standard vma rule
    out.weak_type = false;
    return std::vector<AbstractValue>{out};
  };
  return def;
}());
}  // namespace

namespace prims {
const PrimitiveDef& dot_general() { return g_dot_general; }
}  // namespace prims

namespace lax {
Array dot_general(const Array& lhs, const Array& rhs, const DotDimensionNumbers& dimension_numbers,
                  std::optional<DType> preferred_element_type) {
  auto dn = std::make_shared<DotDimsParam>();
  dn->lhs_contracting = dimension_numbers.contracting.first;
  dn->rhs_contracting = dimension_numbers.contracting.second;
  dn->lhs_batch = dimension_numbers.batch.first;
  dn->rhs_batch = dimension_numbers.batch.second;
  Params params{{"dimension_numbers", std::shared_ptr<const ParamObject>(std::move(dn))},
                {"out_sharding", std::monostate{}},
                {"precision", std::monostate{}},
                {"preferred_element_type",
                 preferred_element_type ? ParamValue(*preferred_element_type) : ParamValue(std::monostate{})}};
  return bind1(prims::dot_general(), {lhs, rhs}, params);
}
}  // namespace lax

}  // namespace cjax
