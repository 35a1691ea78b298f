// flash_attention, flash_attention_tangent, flash_attention_backward: definitions, shape rules and
// the unfused composite (see attention.h). Their JVP, transpose and batching rules are in
// autodiff/rules_attention.cpp, their CPU kernels in backends/cpu/kernels/attention.cpp.
#include "core/lax/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "cjax/lax.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"

namespace cjax {
namespace attention {
namespace {

struct Dims {
  int64_t B, T, N, H, S, K, G;
};

void expect_aval(std::string_view prim, std::string_view what, const Array& x, const Shape& shape, DType dtype) {
  if (x.shape() != shape || x.dtype() != dtype)
    throw ShapeError(fmt::format("{}: {} must be {}[{}], got {}", prim, what, dtype_name(dtype), fmt::join(shape, ","),
                                 x.aval().str()));
}

// Checks q [B,T,N,H], k and v [B,S,K,H] (N a multiple of K, one floating dtype f16/bf16/f32).
Dims check_qkv(std::string_view prim, const Array& q, const Array& k, const Array& v) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    throw ShapeError(fmt::format("{}: query, key and value must be [B, T, N, H] and [B, S, K, H], got {}, {} and {}",
                                 prim, q.aval().str(), k.aval().str(), v.aval().str()));
  Dims d{q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3], k.shape()[1], k.shape()[2], 0};
  if (k.shape()[0] != d.B || k.shape()[3] != d.H || v.shape() != k.shape())
    throw ShapeError(
        fmt::format("{}: key and value must be [B, S, K, H] with query's B and H, got query {}, key {}, "
                    "value {}",
                    prim, q.aval().str(), k.aval().str(), v.aval().str()));
  if (d.K == 0 || d.N % d.K != 0)
    throw ShapeError(
        fmt::format("{}: the query heads ({}) must be a multiple of the key/value heads ({})", prim, d.N, d.K));
  d.G = d.N / d.K;
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype() || !fused_dtype(q.dtype()))
    throw DTypeError(
        fmt::format("{}: query, key and value must share one dtype among float16, bfloat16 and float32, "
                    "got {}, {} and {} (nn::dot_product_attention runs other dtypes unfused)",
                    prim, dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype())));
  return d;
}

AbstractValue like(const Array& x) { return AbstractValue{x.shape(), x.dtype(), false, x.aval().vma}; }

// The tangent's and backward's leading operands: q, k, v, then the forward's out and lse.
Dims check_residuals(std::string_view prim, std::span<const Array> in) {
  Dims d = check_qkv(prim, in[0], in[1], in[2]);
  expect_aval(prim, "out", in[3], in[0].shape(), in[0].dtype());
  expect_aval(prim, "lse", in[4], {d.B, d.N, d.T}, DType::float32);
  return d;
}

const PrimitiveDef& g_forward = register_primitive([] {
  PrimitiveDef def;
  def.name = "flash_attention";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(3);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    options_of(p);  // raises on a missing or mistyped param
    Dims d = check_qkv("flash_attention", in[0], in[1], in[2]);
    return std::vector<AbstractValue>{like(in[0]),
                                      AbstractValue{{d.B, d.N, d.T}, DType::float32, false, in[0].aval().vma}};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return composite_forward(in[0], in[1], in[2], options_of(p));
  };
  return def;
}());

const PrimitiveDef& g_tangent = register_primitive([] {
  PrimitiveDef def;
  def.name = "flash_attention_tangent";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(8);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    options_of(p);
    const char* prim = "flash_attention_tangent";
    check_residuals(prim, in);
    expect_aval(prim, "the query tangent", in[5], in[0].shape(), in[0].dtype());
    expect_aval(prim, "the key tangent", in[6], in[1].shape(), in[1].dtype());
    expect_aval(prim, "the value tangent", in[7], in[2].shape(), in[2].dtype());
    return std::vector<AbstractValue>{like(in[0])};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return std::vector<Array>{composite_tangent(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], options_of(p))};
  };
  return def;
}());

const PrimitiveDef& g_backward = register_primitive([] {
  PrimitiveDef def;
  def.name = "flash_attention_backward";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(6);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    options_of(p);
    const char* prim = "flash_attention_backward";
    check_residuals(prim, in);
    expect_aval(prim, "the output cotangent", in[5], in[0].shape(), in[0].dtype());
    return std::vector<AbstractValue>{like(in[0]), like(in[1]), like(in[2])};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return composite_backward(in[0], in[1], in[2], in[3], in[4], in[5], options_of(p));
  };
  return def;
}());

// ---- the packed primitives: q, k and v sliced from one x (attention.h) ----

int64_t product(const Shape& s, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < to && i < s.size(); ++i) n *= s[i];
  return n;
}

void check_packed_dtype(std::string_view prim, const Array& x) {
  if (!fused_dtype(x.dtype()))
    throw DTypeError(fmt::format("{}: x must be float16, bfloat16 or float32, got {}", prim, dtype_name(x.dtype())));
}

const PrimitiveDef& g_forward_packed = register_primitive([] {
  PrimitiveDef def;
  def.name = "flash_attention_packed";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    options_of(p);
    Packing k = packing_of(p);
    check_packing("flash_attention_packed", in[0].shape(), k, false);
    check_packed_dtype("flash_attention_packed", in[0]);
    const Shape& q = k.q_shape;
    return std::vector<AbstractValue>{AbstractValue{q, in[0].dtype(), false, in[0].aval().vma},
                                      AbstractValue{{q[0], q[2], q[1]}, DType::float32, false, in[0].aval().vma}};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return expand_forward_packed(in[0], options_of(p), packing_of(p));
  };
  return def;
}());

const PrimitiveDef& g_backward_packed = register_primitive([] {
  PrimitiveDef def;
  def.name = "flash_attention_backward_packed";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(4);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    options_of(p);
    const char* prim = "flash_attention_backward_packed";
    Packing k = packing_of(p);
    check_packing(prim, in[0].shape(), k, true);
    check_packed_dtype(prim, in[0]);
    const Shape& q = k.q_shape;
    expect_aval(prim, "out", in[1], q, in[0].dtype());
    expect_aval(prim, "lse", in[2], {q[0], q[2], q[1]}, DType::float32);
    expect_aval(prim, "the output cotangent", in[3], q, in[0].dtype());
    return std::vector<AbstractValue>{like(in[0])};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return std::vector<Array>{expand_backward_packed(in[0], in[1], in[2], in[3], options_of(p), packing_of(p))};
  };
  return def;
}());

// ---- the composite, in [B, K, G, T, *] layout (one batch of G x T query rows per key head) ----

// `x` (made on the host) on the device of `like` where that is not host memory.
Array on_device_of(const Array& x, const Array& like) {
  ConcreteArray* c = dynamic_cast<ConcreteArray*>(like.impl());
  if (!c || c->buffers.size() != 1 || host_accessible(c->device())) return x;
  return device_put(x, SingleDeviceSharding(c->device()));
}

struct Layout {
  Dims d;
  Array f32(const Array& x) const { return lax::convert_element_type(x, DType::float32); }
  // q-shaped [B,T,N,H] -> [B,K,G,T,H] f32, and back.
  Array q5(const Array& x) const {
    return lax::transpose(lax::reshape(f32(x), {d.B, d.T, d.K, d.G, d.H}), {0, 2, 3, 1, 4});
  }
  Array from_q5(const Array& x, DType dtype) const {
    return lax::convert_element_type(lax::reshape(lax::transpose(x, {0, 3, 1, 2, 4}), {d.B, d.T, d.N, d.H}), dtype);
  }
  // k-shaped [B,S,K,H] <-> [B,K,S,H] f32.
  Array kv(const Array& x) const { return lax::transpose(f32(x), {0, 2, 1, 3}); }
  Array from_kv(const Array& x, DType dtype) const {
    return lax::convert_element_type(lax::transpose(x, {0, 2, 1, 3}), dtype);
  }
  // A row value [B,K,G,T] broadcast over the keys.
  Array per_key(const Array& row) const { return lax::broadcast_in_dim(row, {d.B, d.K, d.G, d.T, d.S}, {0, 1, 2, 3}); }
  // [B,K,G,T,H] x [B,K,S,H] -> [B,K,G,T,S], and [B,K,G,T,S] x [B,K,S,H] -> [B,K,G,T,H].
  static Array qk(const Array& q5, const Array& kt) { return lax::dot_general(q5, kt, {{{4}, {3}}, {{0, 1}, {0, 1}}}); }
  static Array pv(const Array& p, const Array& vt) { return lax::dot_general(p, vt, {{{4}, {2}}, {{0, 1}, {0, 1}}}); }
  // [B,K,G,T,S] x [B,K,G,T,H] -> [B,K,S,H], summing over the G query heads of a key head.
  static Array keys_of(const Array& p, const Array& x5) {
    return lax::dot_general(p, x5, {{{2, 3}, {2, 3}}, {{0, 1}, {0, 1}}});
  }
  // Scaled logits, masked entries a large negative value (their probability is exactly 0).
  Array logits(const Array& q5, const Array& kt, const Options& o) const {
    Array s = lax::mul(qk(q5, kt), make_scalar(o.scale, DType::float32));
    if (!o.is_causal) return s;
    // The [T, S] mask and the scalar are made on the host and broadcast where the logits live (a
    // GPU's logits would otherwise meet host arrays of their full size, copied at every call).
    Array keep = on_device_of(lax::ge(lax::broadcasted_iota(DType::int32, {d.T, d.S}, 0),
                                      lax::broadcasted_iota(DType::int32, {d.T, d.S}, 1)),
                              s);
    keep = lax::broadcast_in_dim(keep, s.shape(), {3, 4});
    Array low =
        lax::broadcast_in_dim(on_device_of(make_scalar(-0.7 * std::numeric_limits<float>::max(), DType::float32), s),
                              s.shape(), {});
    return lax::select(keep, s, low);
  }
  // The probabilities, recomputed from the logits rather than from lse so that derivatives of the
  // composites never need lse's tangent (autodiff/rules_attention.cpp leaves it zero).
  Array probs(const Array& q5, const Array& kt, const Options& o) const {
    Array s = logits(q5, kt, o);
    Array p = lax::exp(lax::sub(s, per_key(lax::reduce_max(s, {4}))));
    return lax::div(p, per_key(lax::reduce_sum(p, {4})));
  }
};

Layout layout_of(const Array& q, const Array& k, const Array& v) { return Layout{check_qkv("attention", q, k, v)}; }

}  // namespace

bool fused_dtype(DType d) { return d == DType::float32 || d == DType::bfloat16 || d == DType::float16; }

Params params_of(const Options& o) { return Params{{"is_causal", o.is_causal}, {"scale", o.scale}}; }
Options options_of(const Params& p) { return Options{p.get<double>("scale"), p.get<bool>("is_causal")}; }

int64_t Packing::row_width(const Shape& x) const { return product(x, size_t(axis), x.size()); }
int64_t Packing::offset(const Shape& x, size_t i) const { return starts[i] * product(x, size_t(axis) + 1, x.size()); }
std::array<size_t, 3> Packing::axis_order() const {
  std::array<size_t, 3> order{0, 1, 2};
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return starts[a] < starts[b]; });
  return order;
}

Params packed_params_of(const Options& o, const Packing& k) {
  Params p = params_of(o);
  p.set("axis", k.axis);
  p.set("starts", k.starts);
  p.set("limits", k.limits);
  p.set("q_shape", k.q_shape);
  p.set("kv_shape", k.kv_shape);
  return p;
}
Packing packing_of(const Params& p) {
  const auto& q = p.ints("q_shape");
  const auto& kv = p.ints("kv_shape");
  return Packing{p.get<int64_t>("axis"), p.ints("starts"), p.ints("limits"), q, kv};
}

void check_packing(std::string_view prim, const Shape& x, const Packing& k, bool tiled) {
  auto fail = [&](std::string_view why) {
    throw ShapeError(fmt::format("{}: x [{}] with q, k and v at [{}] .. [{}] along axis {} as [{}], [{}]: {}", prim,
                                 fmt::join(x, ","), fmt::join(k.starts, ","), fmt::join(k.limits, ","), k.axis,
                                 fmt::join(k.q_shape, ","), fmt::join(k.kv_shape, ","), why));
  };
  if (k.axis < 0 || size_t(k.axis) >= x.size() || k.starts.size() != 3 || k.limits.size() != 3 ||
      k.q_shape.size() != 4 || k.kv_shape.size() != 4)
    fail("malformed packing");
  const Shape &q = k.q_shape, &kv = k.kv_shape;
  if (kv[0] != q[0] || kv[1] != q[1] || kv[3] != q[3] || kv[2] == 0 || q[2] % kv[2] != 0)
    fail("k and v must be [B, T, K, H] with q's B, T and H, K dividing q's heads");
  if (product(x, 0, size_t(k.axis)) != q[0] * q[1]) fail("x's axes before the packed axis must hold the B x T rows");
  const int64_t inner = product(x, size_t(k.axis) + 1, x.size());
  for (size_t i = 0; i < 3; ++i) {
    if (k.starts[i] < 0 || k.limits[i] > x[size_t(k.axis)] || k.starts[i] > k.limits[i]) fail("a range outside x");
    if ((k.limits[i] - k.starts[i]) * inner != (i == 0 ? q[2] : kv[2]) * q[3])
      fail("a range's columns are not its operand's heads x head size");
  }
  if (tiled) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (size_t i = 0; i < 3; ++i) r.emplace_back(k.starts[i], k.limits[i]);
    std::sort(r.begin(), r.end());
    if (r[0].first != 0 || r[0].second != r[1].first || r[1].second != r[2].first || r[2].second != x[size_t(k.axis)])
      fail("the ranges must tile the packed axis (dx is written whole)");
  }
}

// q, k and v sliced out of x.
std::vector<Array> unpack(const Array& x, const Packing& k) {
  std::vector<Array> r;
  for (size_t i = 0; i < 3; ++i)
    r.push_back(
        lax::reshape(lax::slice_in_dim(x, k.starts[i], k.limits[i], 1, k.axis), i == 0 ? k.q_shape : k.kv_shape));
  return r;
}

std::vector<Array> expand_forward_packed(const Array& x, const Options& o, const Packing& k) {
  std::vector<Array> qkv = unpack(x, k);
  return forward(qkv[0], qkv[1], qkv[2], o);
}

Array expand_backward_packed(const Array& x, const Array& out, const Array& lse, const Array& dout, const Options& o,
                             const Packing& k) {
  std::vector<Array> qkv = unpack(x, k);
  std::vector<Array> g = backward(qkv[0], qkv[1], qkv[2], out, lse, dout, o);
  // The gradients in the order of their ranges along the axis (they tile it).
  std::vector<Array> pieces;
  for (size_t i : k.axis_order()) {
    Shape s = x.shape();
    s[size_t(k.axis)] = k.limits[i] - k.starts[i];
    pieces.push_back(lax::reshape(g[i], s));
  }
  return lax::concatenate(pieces, k.axis);
}

std::vector<Array> forward_packed(const Array& x, const Options& o, const Packing& k) {
  return bind(g_forward_packed, {x}, packed_params_of(o, k));
}
Array backward_packed(const Array& x, const Array& out, const Array& lse, const Array& dout, const Options& o,
                      const Packing& k) {
  return bind1(g_backward_packed, {x, out, lse, dout}, packed_params_of(o, k));
}

std::vector<Array> forward(const Array& q, const Array& k, const Array& v, const Options& o) {
  return bind(g_forward, {q, k, v}, params_of(o));
}
Array tangent(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse, const Array& dq,
              const Array& dk, const Array& dv, const Options& o) {
  return bind1(g_tangent, {q, k, v, out, lse, dq, dk, dv}, params_of(o));
}
std::vector<Array> backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                            const Array& dout, const Options& o) {
  return bind(g_backward, {q, k, v, out, lse, dout}, params_of(o));
}

std::vector<Array> composite_forward(const Array& q, const Array& k, const Array& v, const Options& o) {
  Layout l = layout_of(q, k, v);
  Array s = l.logits(l.q5(q), l.kv(k), o);
  Array m = lax::reduce_max(s, {4});
  Array p = lax::exp(lax::sub(s, l.per_key(m)));
  Array sum = lax::reduce_sum(p, {4});
  Array lse = lax::add(m, lax::log(sum));
  Array out5 = Layout::pv(lax::div(p, l.per_key(sum)), l.kv(v));
  return {l.from_q5(out5, q.dtype()), lax::reshape(lse, {l.d.B, l.d.N, l.d.T})};
}

Array composite_tangent(const Array& q, const Array& k, const Array& v, const Array&, const Array&, const Array& dq,
                        const Array& dk, const Array& dv, const Options& o) {
  Layout l = layout_of(q, k, v);
  Array q5 = l.q5(q), kt = l.kv(k);
  Array p = l.probs(q5, kt, o);
  Array ds;  // d(logits) = scale (dq k^T + q dk^T)
  if (dq.defined()) ds = Layout::qk(l.q5(dq), kt);
  if (dk.defined()) {
    Array t = Layout::qk(q5, l.kv(dk));
    ds = ds.defined() ? lax::add(ds, t) : t;
  }
  Array dout5;
  if (ds.defined()) {
    Array pds = lax::mul(p, lax::mul(ds, make_scalar(o.scale, DType::float32)));
    Array dp = lax::sub(pds, lax::mul(p, l.per_key(lax::reduce_sum(pds, {4}))));
    dout5 = Layout::pv(dp, l.kv(v));
  }
  if (dv.defined()) {
    Array t = Layout::pv(p, l.kv(dv));
    dout5 = dout5.defined() ? lax::add(dout5, t) : t;
  }
  if (!dout5.defined()) dout5 = lax::broadcast_in_dim(make_scalar(0.0, DType::float32), q5.shape(), {});
  return l.from_q5(dout5, q.dtype());
}

std::vector<Array> composite_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array&,
                                      const Array& dout, const Options& o) {
  Layout l = layout_of(q, k, v);
  Array q5 = l.q5(q), kt = l.kv(k), vt = l.kv(v), do5 = l.q5(dout);
  Array p = l.probs(q5, kt, o);
  Array dv = Layout::keys_of(p, do5);
  Array dp = lax::dot_general(do5, vt, {{{4}, {3}}, {{0, 1}, {0, 1}}});  // [B,K,G,T,S]
  Array delta = lax::reduce_sum(lax::mul(do5, l.q5(out)), {4});
  Array ds = lax::mul(lax::mul(p, lax::sub(dp, l.per_key(delta))), make_scalar(o.scale, DType::float32));
  Array dq5 = lax::dot_general(ds, kt, {{{4}, {2}}, {{0, 1}, {0, 1}}});
  Array dk = Layout::keys_of(ds, q5);
  return {l.from_q5(dq5, q.dtype()), l.from_kv(dk, k.dtype()), l.from_kv(dv, v.dtype())};
}

}  // namespace attention

namespace prims {
const PrimitiveDef& flash_attention() { return attention::g_forward; }
const PrimitiveDef& flash_attention_tangent() { return attention::g_tangent; }
const PrimitiveDef& flash_attention_backward() { return attention::g_backward; }
const PrimitiveDef& flash_attention_packed() { return attention::g_forward_packed; }
const PrimitiveDef& flash_attention_backward_packed() { return attention::g_backward_packed; }
}  // namespace prims

}  // namespace cjax
