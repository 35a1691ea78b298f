// conv_general_dilated: JAX's general convolution (strides, explicit padding, lhs dilation for
// transposed convolutions, rhs dilation, feature groups, any dimension layout).
//
// The CPU kernel (im2col + GEMM) is in backends/cpu/kernels/conv.cpp.
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/visit_dtype.h"
#include "core/lax/elementwise.h"
#include "core/lax/linalg.h"

namespace cjax {

std::string ConvDimsParam::str() const {
  return fmt::format("ConvDimensionNumbers(lhs_spec=({}), rhs_spec=({}), out_spec=({}))", fmt::join(lhs_spec, ", "),
                     fmt::join(rhs_spec, ", "), fmt::join(out_spec, ", "));
}
size_t ConvDimsParam::hash() const { return absl::HashOf(lhs_spec, rhs_spec, out_spec); }
bool ConvDimsParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const ConvDimsParam*>(&other);
  return o && o->lhs_spec == lhs_spec && o->rhs_spec == rhs_spec && o->out_spec == out_spec;
}

namespace {
int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t lo, int64_t hi, int64_t ld, int64_t rd) {
  int64_t din = in == 0 ? 0 : (in - 1) * ld + 1;
  int64_t dk = k == 0 ? 0 : (k - 1) * rd + 1;
  int64_t padded = din + lo + hi;
  if (padded < dk) return 0;
  return (padded - dk) / s + 1;
}

}  // namespace

ConvGeom conv_geometry(const Array& lhs, const Array& rhs, const Params& p) {
  auto dn = p.object<ConvDimsParam>("dimension_numbers");
  const Shape &ls = lhs.shape(), &rs = rhs.shape();
  ConvGeom g;
  g.nsp = int64_t(dn->lhs_spec.size()) - 2;
  g.N = ls[size_t(dn->lhs_spec[0])];
  g.C = ls[size_t(dn->lhs_spec[1])];
  g.O = rs[size_t(dn->rhs_spec[0])];
  g.I = rs[size_t(dn->rhs_spec[1])];
  g.G = p.i("feature_group_count");
  auto& ws = p.ints("window_strides");
  auto& ld = p.ints("lhs_dilation");
  auto& rd = p.ints("rhs_dilation");
  auto& pad = p.get<std::vector<std::vector<int64_t>>>("padding");
  for (int64_t i = 0; i < g.nsp; ++i) {
    size_t si = size_t(i);
    g.in_sp.push_back(ls[size_t(dn->lhs_spec[si + 2])]);
    g.k_sp.push_back(rs[size_t(dn->rhs_spec[si + 2])]);
    g.out_sp.push_back(out_size(g.in_sp[si], g.k_sp[si], ws[si], pad[si][0], pad[si][1], ld[si], rd[si]));
  }
  return g;
}

namespace {

std::string spec_str(const std::vector<int64_t>& v) { return fmt::format("({})", fmt::join(v, ", ")); }

std::vector<AbstractValue> conv_abstract_eval(std::span<const Array> in, const Params& p) {
  const Array &lhs = in[0], &rhs = in[1];
  auto dn = p.object<ConvDimsParam>("dimension_numbers");
  if (lhs.dtype() != rhs.dtype())
    throw DTypeError(
        fmt::format("conv_general_dilated requires lhs and rhs to have the same dtype, got {} and {} "
                    "(convert one with lax::convert_element_type)",
                    dtype_name(lhs.dtype()), dtype_name(rhs.dtype())));
  if (lhs.dtype() == DType::bool_)
    throw DTypeError("conv_general_dilated does not accept bool operands; convert them to a numeric dtype first");
  size_t nd = dn->lhs_spec.size();
  if (lhs.ndim() != int(nd) || rhs.ndim() != int(nd))
    throw ShapeError(
        fmt::format("conv_general_dilated: lhs {} and rhs {} must both have rank {} (the length of the "
                    "dimension numbers {}); they need the same number of spatial dimensions",
                    shape_str(lhs.shape()), shape_str(rhs.shape()), nd, dn->str()));
  if (nd < 3)
    throw ShapeError(
        fmt::format("conv_general_dilated needs at least one spatial dimension, got operands of rank {}", nd));
  size_t nsp = nd - 2;
  auto check_len = [&](const char* name, size_t len) {
    if (len != nsp)
      throw ValueError(
          fmt::format("conv_general_dilated: {} has {} entries but the operands have {} spatial "
                      "dimensions",
                      name, len, nsp));
  };
  auto& ws = p.ints("window_strides");
  auto& ld = p.ints("lhs_dilation");
  auto& rd = p.ints("rhs_dilation");
  auto& pad = p.get<std::vector<std::vector<int64_t>>>("padding");
  check_len("window_strides", ws.size());
  check_len("lhs_dilation", ld.size());
  check_len("rhs_dilation", rd.size());
  check_len("padding", pad.size());
  for (size_t i = 0; i < nsp; ++i) {
    if (ws[i] <= 0)
      throw ValueError(fmt::format("conv_general_dilated: window_strides must be positive, got {}", spec_str(ws)));
    if (ld[i] <= 0 || rd[i] <= 0)
      throw ValueError(
          fmt::format("conv_general_dilated: dilations must be positive, got lhs_dilation {} and "
                      "rhs_dilation {}",
                      spec_str(ld), spec_str(rd)));
    if (pad[i].size() != 2) throw ValueError("conv_general_dilated: each padding entry must be a (low, high) pair");
  }
  if (p.i("batch_group_count") != 1)
    throw ValueError(fmt::format("conv_general_dilated: batch_group_count={} is not supported by cjax (only 1)",
                                 p.i("batch_group_count")));
  ConvGeom g = conv_geometry(lhs, rhs, p);
  if (g.G < 1) throw ValueError(fmt::format("conv_general_dilated: feature_group_count must be >= 1, got {}", g.G));
  if (g.C != g.I * g.G)
    throw ShapeError(
        fmt::format("conv_general_dilated: lhs feature dimension (size {}) must equal the rhs input "
                    "feature dimension (size {}) times feature_group_count ({}); lhs {} rhs {}",
                    g.C, g.I, g.G, shape_str(lhs.shape()), shape_str(rhs.shape())));
  if (g.O % g.G != 0)
    throw ShapeError(
        fmt::format("conv_general_dilated: rhs output feature dimension (size {}) must be a multiple of "
                    "feature_group_count ({})",
                    g.O, g.G));
  Shape out(nd);
  out[size_t(dn->out_spec[0])] = g.N;
  out[size_t(dn->out_spec[1])] = g.O;
  for (size_t i = 0; i < nsp; ++i) out[size_t(dn->out_spec[i + 2])] = g.out_sp[i];
  DType dt = lhs.dtype();
  bool weak = lhs.weak_type() && rhs.weak_type();
  if (auto* pet = std::get_if<DType>(&p.at("preferred_element_type"))) {
    if (is_floating(dt) && !is_floating(*pet))
      throw DTypeError(fmt::format("conv_general_dilated: preferred_element_type {} is incompatible with input type {}",
                                   dtype_name(*pet), dtype_name(dt)));
    dt = *pet;
    weak = false;
  }
  return {AbstractValue{out, dt, weak, {}}};
}

// Input index tables: tab[i][k * P_i + p] = source index along spatial dim i for kernel offset k
// and output position p, or -1 where the tap falls in padding or a dilation hole.
const PrimitiveDef& g_conv = register_primitive([] {
  PrimitiveDef def;
  def.name = "conv_general_dilated";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(2);
  def.abstract_eval = conv_abstract_eval;
  return def;
}());

// JAX's conv_general_permutations: (batch, feature, spatial...) positions of each spec, the
// spatial order being the order of the spatial characters in the rhs spec.
std::vector<int64_t> spec_perm(const std::string& spec, const std::string& rhs_spec, char a, char b, int which) {
  static const char* names[] = {"lhs_spec", "rhs_spec", "out_spec"};
  if (std::count(spec.begin(), spec.end(), a) != 1 || std::count(spec.begin(), spec.end(), b) != 1)
    throw ValueError(
        fmt::format("conv_general_dilated: dimension_numbers.{} \"{}\" must contain the characters '{}' "
                    "and '{}' exactly once (e.g. \"{}\")",
                    names[which], spec, a, b, which == 1 ? "OIHW" : "NCHW"));
  for (size_t i = 0; i < spec.size(); ++i)
    if (spec.find(spec[i], i + 1) != std::string::npos)
      throw ValueError(fmt::format("conv_general_dilated: dimension_numbers.{} \"{}\" has the character '{}' twice",
                                   names[which], spec, spec[i]));
  std::vector<int64_t> perm{int64_t(spec.find(a)), int64_t(spec.find(b))};
  std::vector<std::pair<size_t, int64_t>> spatial;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == a || spec[i] == b) continue;
    size_t pos = rhs_spec.find(spec[i]);
    spatial.push_back({pos, int64_t(i)});
  }
  std::sort(spatial.begin(), spatial.end());
  for (auto& [pos, i] : spatial) perm.push_back(i);
  return perm;
}

std::shared_ptr<const ParamObject> conv_dims(const lax::ConvDimensionNumbers& dn, int ndim) {
  auto out = std::make_shared<ConvDimsParam>();
  lax::ConvDimensionNumbers def;
  if (dn.lhs_spec == def.lhs_spec && dn.rhs_spec == def.rhs_spec && dn.out_spec == def.out_spec && ndim != 4) {
    // The default layout for any rank, as JAX's dimension_numbers=None: (N, C, spatial...).
    for (int i = 0; i < ndim; ++i) out->lhs_spec.push_back(i);
    out->rhs_spec = out->out_spec = out->lhs_spec;
    return out;
  }
  if (dn.lhs_spec.size() != dn.rhs_spec.size() || dn.lhs_spec.size() != dn.out_spec.size())
    throw ValueError(
        fmt::format("conv_general_dilated: dimension_numbers (\"{}\", \"{}\", \"{}\") must have equal "
                    "lengths",
                    dn.lhs_spec, dn.rhs_spec, dn.out_spec));
  out->lhs_spec = spec_perm(dn.lhs_spec, dn.rhs_spec, 'N', 'C', 0);
  out->rhs_spec = spec_perm(dn.rhs_spec, dn.rhs_spec, 'O', 'I', 1);
  out->out_spec = spec_perm(dn.out_spec, dn.rhs_spec, 'N', 'C', 2);
  auto spatial = [](const std::string& s, char a, char b) {
    std::string r;
    for (char c : s)
      if (c != a && c != b) r += c;
    std::sort(r.begin(), r.end());
    return r;
  };
  if (spatial(dn.lhs_spec, 'N', 'C') != spatial(dn.rhs_spec, 'O', 'I') ||
      spatial(dn.out_spec, 'N', 'C') != spatial(dn.rhs_spec, 'O', 'I'))
    throw ValueError(
        fmt::format("conv_general_dilated: dimension_numbers (\"{}\", \"{}\", \"{}\") must each have "
                    "the same set of spatial characters",
                    dn.lhs_spec, dn.rhs_spec, dn.out_spec));
  return out;
}

}  // namespace

namespace prims {
const PrimitiveDef& conv_general_dilated() { return g_conv; }
}  // namespace prims

namespace lax {
Array conv_general_dilated(const Array& lhs, const Array& rhs, const std::vector<int64_t>& window_strides,
                           const Padding& padding, const std::vector<int64_t>& lhs_dilation,
                           const std::vector<int64_t>& rhs_dilation, const ConvDimensionNumbers& dn,
                           int64_t feature_group_count, std::optional<DType> preferred_element_type) {
  auto dims = conv_dims(dn, lhs.ndim());
  auto& cd = static_cast<const ConvDimsParam&>(*dims);
  if (lhs.ndim() != int(cd.lhs_spec.size()) || rhs.ndim() != int(cd.rhs_spec.size()))
    throw ShapeError(
        fmt::format("conv_general_dilated: lhs {} and rhs {} must have rank {} to match the dimension "
                    "numbers (\"{}\", \"{}\", \"{}\")",
                    shape_str(lhs.shape()), shape_str(rhs.shape()), cd.lhs_spec.size(), dn.lhs_spec, dn.rhs_spec,
                    dn.out_spec));
  size_t nsp = cd.lhs_spec.size() - 2;
  std::vector<int64_t> ld = lhs_dilation.empty() ? std::vector<int64_t>(nsp, 1) : lhs_dilation;
  std::vector<int64_t> rd = rhs_dilation.empty() ? std::vector<int64_t>(nsp, 1) : rhs_dilation;
  if (window_strides.size() != nsp || ld.size() != nsp || rd.size() != nsp)
    throw ValueError(
        fmt::format("conv_general_dilated: window_strides {}, lhs_dilation {} and rhs_dilation {} need "
                    "one entry per spatial dimension ({})",
                    spec_str(window_strides), spec_str(ld), spec_str(rd), nsp));
  std::vector<std::vector<int64_t>> pads;
  if (padding.mode.empty()) {
    if (padding.explicit_.size() != nsp)
      throw ValueError(
          fmt::format("conv_general_dilated: explicit padding has {} (low, high) pairs but the operands "
                      "have {} spatial dimensions",
                      padding.explicit_.size(), nsp));
    for (auto& [lo, hi] : padding.explicit_) pads.push_back({lo, hi});
  } else if (padding.mode == "VALID") {
    pads.assign(nsp, {0, 0});
  } else if (padding.mode == "SAME" || padding.mode == "SAME_LOWER") {
    // JAX's padtype_to_pads on the undilated input and the dilated kernel.
    for (size_t i = 0; i < nsp; ++i) {
      int64_t in = lhs.shape()[size_t(cd.lhs_spec[i + 2])];
      int64_t k = rhs.shape()[size_t(cd.rhs_spec[i + 2])];
      int64_t s = window_strides[i];
      if (s <= 0)
        throw ValueError(
            fmt::format("conv_general_dilated: window_strides must be positive, got {}", spec_str(window_strides)));
      int64_t dk = k == 0 ? 0 : (k - 1) * rd[i] + 1;
      int64_t outn = (in + s - 1) / s;
      int64_t total = std::max<int64_t>(0, (outn - 1) * s + dk - in);
      int64_t lo = padding.mode == "SAME" ? total / 2 : total - total / 2;
      pads.push_back({lo, total - lo});
    }
  } else {
    throw ValueError(
        fmt::format("conv_general_dilated: unknown padding \"{}\"; use \"SAME\", \"SAME_LOWER\", "
                    "\"VALID\" or explicit (low, high) pairs",
                    padding.mode));
  }
  Params params{{"batch_group_count", int64_t(1)},
                {"dimension_numbers", dims},
                {"feature_group_count", feature_group_count},
                {"lhs_dilation", ld},
                {"padding", pads},
                {"precision", std::monostate{}},
                {"preferred_element_type",
                 preferred_element_type ? ParamValue(*preferred_element_type) : ParamValue(std::monostate{})},
                {"rhs_dilation", rd},
                {"window_strides", window_strides}};
  return bind1(prims::conv_general_dilated(), {lhs, rhs}, params);
}

Array conv(const Array& lhs, const Array& rhs, const std::vector<int64_t>& window_strides, const Padding& padding) {
  return conv_general_dilated(lhs, rhs, window_strides, padding);
}
}  // namespace lax

}  // namespace cjax
