// Elementwise primitives and their eager CPU kernels, generated from the scalar-op table.
// Operands have equal shapes, or are rank-0 and broadcast (as lax allows); dtypes are equal.
#include "core/elementwise.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "cjax/lax.h"
#include "core/array_impl.h"
#include "core/parallel.h"
#include "core/scalar_fns.h"
#include "core/visit_dtype.h"

namespace cjax {
namespace {

constexpr int64_t kGrain = 1 << 15;

template <class T> constexpr bool domain_accepts(ScalarDomain d) {
  constexpr bool fl = is_float_like_v<T>, b = std::is_same_v<T, bool>, in = !fl && !b;
  switch (d) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return fl;
    case ScalarDomain::Int: return in;
    case ScalarDomain::Num: return fl || in;
    case ScalarDomain::Logic: return b || in;
    case ScalarDomain::Any:
    case ScalarDomain::Cmp: return true;
  }
  return false;
}
bool dtype_in_domain(DType d, ScalarDomain dom) {
  return visit_dtype(d, [&](auto tag) { return domain_accepts<typename decltype(tag)::type>(dom); });
}
std::string_view domain_desc(ScalarDomain d) {
  switch (d) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return "floating-point";
    case ScalarDomain::Int: return "integer";
    case ScalarDomain::Num: return "numeric (integer or floating-point)";
    case ScalarDomain::Logic: return "bool or integer";
    default: return "any";
  }
}

// Shape/dtype rule shared by every elementwise primitive: equal dtypes; equal shapes or rank-0.
AbstractValue elementwise_out(std::string_view name, std::span<const Array> in, size_t first = 0) {
  const Array* big = nullptr;
  bool all_weak = true;
  for (size_t i = first; i < in.size(); ++i) {
    const Array& a = in[i];
    if (a.dtype() != in[first].dtype())
      throw DTypeError(fmt::format("{} requires arguments to have the same dtypes, got {} and {} "
                                   "(use jnp functions for automatic promotion, or astype)",
                                   name, dtype_name(in[first].dtype()), dtype_name(a.dtype())));
    all_weak &= a.weak_type();
    if (a.ndim() == 0) continue;
    if (big && big->shape() != a.shape())
      throw ShapeError(fmt::format("{} got incompatible shapes for broadcasting: {} and {} "
                                   "(lax ops need equal shapes; jnp functions broadcast)",
                                   name, shape_str(big->shape()), shape_str(a.shape())));
    if (!big) big = &a;
  }
  return AbstractValue{big ? big->shape() : Shape{}, in[first].dtype(), all_weak, {}};
}

template <class T> inline compute_t<T> load(const T& x) { return compute_t<T>(x); }
template <class T, class V> inline T store(V v) {
  if constexpr (is_half_v<T>) return T(float(v));
  else return T(v);
}

template <ScalarOp op, int arity> struct Kernel;

template <ScalarOp op> struct Kernel<op, 1> {
  template <class T, class O> static void run(const T* x, O* y, int64_t n) {
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = store<O>(scalar::Fn<op>::apply(load(x[i])));
    });
  }
};
template <ScalarOp op> struct Kernel<op, 2> {
  template <bool XS, bool YS, class T, class O> static void loop(const T* x, const T* y, O* z, int64_t n) {
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        z[i] = store<O>(scalar::Fn<op>::apply(load(x[XS ? 0 : i]), load(y[YS ? 0 : i])));
    });
  }
  template <class T, class O> static void run(const T* x, bool xs, const T* y, bool ys, O* z, int64_t n) {
    if (xs == ys) loop<false, false>(x, y, z, n);  // both full (or both scalar with n == 1)
    else if (xs) loop<true, false>(x, y, z, n);
    else loop<false, true>(x, y, z, n);
  }
};
template <ScalarOp op> struct Kernel<op, 3> {
  template <class T, class O> static void run(const T* a, bool as, const T* b, bool bs, const T* c, bool cs, O* z,
                                              int64_t n) {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        z[i] = store<O>(scalar::Fn<op>::apply(load(a[as ? 0 : i]), load(b[bs ? 0 : i]), load(c[cs ? 0 : i])));
    });
  }
};

template <ScalarOp op, int arity>
std::vector<Array> run_elementwise(std::span<const Array> in, std::span<const AbstractValue> out_avals) {
  constexpr ScalarOpInfo info = scalar_op_info(op);
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  int64_t n = out_avals[0].size();
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (domain_accepts<T>(info.domain)) {
      using O = std::conditional_t<(info.domain == ScalarDomain::Cmp || info.domain == ScalarDomain::Pred), bool, T>;
      O* z = data_ptr<O>(out);
      auto p = [&](int k) { return data_ptr<const T>(in[size_t(k)]); };
      auto sc = [&](int k) { return in[size_t(k)].ndim() == 0; };
      if constexpr (arity == 1) Kernel<op, 1>::run(p(0), z, n);
      else if constexpr (arity == 2) Kernel<op, 2>::run(p(0), sc(0), p(1), sc(1), z, n);
      else Kernel<op, 3>::run(p(0), sc(0), p(1), sc(1), p(2), sc(2), z, n);
    }
  });
  return {out};
}

template <ScalarOp op, int arity> PrimitiveDef make_elementwise_def() {
  const ScalarOpInfo& info = scalar_op_info(op);
  PrimitiveDef def;
  def.name = std::string(info.name);
  def.kind = PrimKind::Elementwise;
  def.scalar_op = op;
  def.arity = Arity::exactly(size_t(arity));
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    const ScalarOpInfo& info = scalar_op_info(op);
    AbstractValue out = elementwise_out(info.name, in);
    if (!dtype_in_domain(out.dtype, info.domain))
      throw DTypeError(fmt::format("{} does not accept dtype {}: it needs a {} dtype", info.name,
                                   dtype_name(out.dtype), domain_desc(info.domain)));
    if (info.domain == ScalarDomain::Cmp || info.domain == ScalarDomain::Pred) {
      out.dtype = DType::bool_;
      out.weak_type = false;
    }
    return {out};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return run_elementwise<op, arity>(in, out_avals);
  };
  return def;
}

const PrimitiveDef* g_table[] = {
#define CJAX_X(e, n, a, d) &register_primitive(make_elementwise_def<ScalarOp::e, a>()),
    CJAX_SCALAR_OPS(CJAX_X)
#undef CJAX_X
};

// ---- convert_element_type ----
template <class S, class D> inline D convert_value(S s) {
  if constexpr (std::is_same_v<D, bool>) return load(s) != 0;
  else if constexpr (is_float_like_v<D>) return store<D>(load(s));
  else if constexpr (is_float_like_v<S>) {
    // float -> int: NaN -> 0, saturating at the integer range (XLA's CPU semantics).
    double v = double(load(s));
    if (std::isnan(v)) return D(0);
    if (v <= double(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
    if (v >= double(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return D(v);
  } else {
    return D(s);  // integer -> integer wraps (two's complement), bool -> 0/1
  }
}

const PrimitiveDef& g_convert = register_primitive([] {
  PrimitiveDef def;
  def.name = "convert_element_type";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    return {AbstractValue{in[0].shape(), p.get<DType>("new_dtype"), p.get<bool>("weak_type"), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    if (in[0].dtype() == out_avals[0].dtype) return std::vector<Array>{make_view(in[0], out_avals[0])};
    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
    int64_t n = out.size();
    visit_dtype(in[0].dtype(), [&](auto st) {
      using S = typename decltype(st)::type;
      visit_dtype(out.dtype(), [&](auto dt) {
        using D = typename decltype(dt)::type;
        const S* x = data_ptr<const S>(in[0]);
        D* y = data_ptr<D>(out);
        parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) y[i] = convert_value<S, D>(x[i]);
        });
      });
    });
    return std::vector<Array>{out};
  };
  return def;
}());

const PrimitiveDef& g_bitcast = register_primitive([] {
  PrimitiveDef def;
  def.name = "bitcast_convert_type";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    DType to = p.get<DType>("new_dtype");
    if (itemsize(to) != itemsize(in[0].dtype()))
      throw DTypeError(fmt::format("bitcast_convert_type from {} to {}: item sizes differ ({} vs {} bytes); "
                                   "cjax only bitcasts between types of equal width",
                                   dtype_name(in[0].dtype()), dtype_name(to), itemsize(in[0].dtype()), itemsize(to)));
    return {AbstractValue{in[0].shape(), to, false, {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- select_n ----
const PrimitiveDef& g_select_n = register_primitive([] {
  PrimitiveDef def;
  def.name = "select_n";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::at_least(2);  // a predicate and at least one case
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    const Array& which = in[0];
    if (which.dtype() != DType::bool_ && which.dtype() != DType::int32)
      throw DTypeError(fmt::format("select_n predicate must be bool or int32, got {}", dtype_name(which.dtype())));
    if (which.dtype() == DType::bool_ && in.size() > 3)
      throw ValueError("select_n with a bool predicate takes at most two cases");
    AbstractValue out = elementwise_out("select_n", in, 1);
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].ndim() == 0 && out.ndim() != 0)
        throw ShapeError(fmt::format("select_n cases must all have shape {}, got a scalar case; broadcast it first",
                                     shape_str(out.shape)));
    if (which.ndim() != 0 && which.shape() != out.shape)
      throw ShapeError(fmt::format("select_n predicate shape {} must be scalar or equal to the case shape {}",
                                   shape_str(which.shape()), shape_str(out.shape)));
    return {out};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    Array out = make_uninitialized(out_avals[0], concrete(in[1])->device());
    int64_t n = out.size();
    size_t ncases = in.size() - 1;
    bool scalar_pred = in[0].ndim() == 0;
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::vector<const T*> cases(ncases);
      for (size_t c = 0; c < ncases; ++c) cases[c] = data_ptr<const T>(in[c + 1]);
      T* z = data_ptr<T>(out);
      visit_dtype(in[0].dtype(), [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        if constexpr (std::is_same_v<P, bool> || std::is_same_v<P, int32_t>) {
          const P* w = data_ptr<const P>(in[0]);
          parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
              int64_t c = int64_t(w[scalar_pred ? 0 : i]);
              c = std::clamp<int64_t>(c, 0, int64_t(ncases) - 1);
              z[i] = cases[size_t(c)][i];
            }
          });
        }
      });
    });
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- integer_pow ----
template <class T> inline T ipow(T x, int64_t y) {
  bool neg = y < 0;
  uint64_t e = uint64_t(neg ? -y : y);
  T acc = T(1), base = x;
  while (e) {
    if (e & 1) acc = scalar::wrap_mul(acc, base);
    base = scalar::wrap_mul(base, base);
    e >>= 1;
  }
  if constexpr (std::is_floating_point_v<T>) return neg ? T(1) / acc : acc;
  else return acc;
}
const PrimitiveDef& g_integer_pow = register_primitive([] {
  PrimitiveDef def;
  def.name = "integer_pow";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    DType d = in[0].dtype();
    if (d == DType::bool_) throw DTypeError("integer_pow does not accept bool; cast to an integer or float first");
    if (is_integer(d) && p.i("y") < 0)
      throw ValueError(fmt::format("integer_pow of an {} array with negative exponent {}: integers have no "
                                   "reciprocal; cast to float first",
                                   dtype_name(d), p.i("y")));
    return {AbstractValue{in[0].shape(), d, in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
    int64_t y = p.i("y"), n = out.size();
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, bool>) {
        const T* x = data_ptr<const T>(in[0]);
        T* z = data_ptr<T>(out);
        parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) z[i] = store<T>(ipow(load(x[i]), y));
        });
      }
    });
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- threefry2x32 (spec/prng.md): Random123 Threefry-2x32 with 20 rounds ----
inline uint32_t rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }
inline void threefry_block(uint32_t k0, uint32_t k1, uint32_t& x0, uint32_t& x1) {
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  static constexpr int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  x0 += ks[0];
  x1 += ks[1];
  for (int g = 1; g <= 5; ++g) {
    const int* r = rot[(g - 1) & 1];
    for (int j = 0; j < 4; ++j) {
      x0 += x1;
      x1 = rotl(x1, r[j]);
      x1 ^= x0;
    }
    x0 += ks[g % 3];
    x1 += ks[(g + 1) % 3] + uint32_t(g);
  }
}
const PrimitiveDef& g_threefry = register_primitive([] {
  PrimitiveDef def;
  def.name = "threefry2x32";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(4);  // k0, k1, x0, x1
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    for (auto& a : in)
      if (a.dtype() != DType::uint32)
        throw DTypeError(fmt::format("threefry2x32 operands must be uint32, got {}", dtype_name(a.dtype())));
    AbstractValue out = elementwise_out("threefry2x32", in);
    out.weak_type = false;
    return {out, out};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    Device dev = concrete(in[0])->device();
    Array y0 = make_uninitialized(out_avals[0], dev), y1 = make_uninitialized(out_avals[1], dev);
    int64_t n = y0.size();
    const uint32_t *k0 = data_ptr<const uint32_t>(in[0]), *k1 = data_ptr<const uint32_t>(in[1]),
                   *x0 = data_ptr<const uint32_t>(in[2]), *x1 = data_ptr<const uint32_t>(in[3]);
    bool s0 = in[0].ndim() == 0, s1 = in[1].ndim() == 0, s2 = in[2].ndim() == 0, s3 = in[3].ndim() == 0;
    uint32_t *o0 = data_ptr<uint32_t>(y0), *o1 = data_ptr<uint32_t>(y1);
    parallel_for(n, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        uint32_t a = x0[s2 ? 0 : i], c = x1[s3 ? 0 : i];
        threefry_block(k0[s0 ? 0 : i], k1[s1 ? 0 : i], a, c);
        o0[i] = a;
        o1[i] = c;
      }
    });
    return std::vector<Array>{y0, y1};
  };
  return def;
}());

}  // namespace

namespace prims {
const PrimitiveDef& elementwise(ScalarOp op) { return *g_table[size_t(op)]; }
const PrimitiveDef& convert_element_type() { return g_convert; }
const PrimitiveDef& bitcast_convert_type() { return g_bitcast; }
const PrimitiveDef& select_n() { return g_select_n; }
const PrimitiveDef& integer_pow() { return g_integer_pow; }
const PrimitiveDef& threefry2x32() { return g_threefry; }
}  // namespace prims

Array convert_concrete(const Array& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  AbstractValue aval{x.shape(), dtype, false, {}};
  Params params{{"new_dtype", dtype}, {"weak_type", false}};
  return g_convert.cpu_impl(std::span<const Array>(&x, 1), std::span<const AbstractValue>(&aval, 1), params)[0];
}

// ---- lax wrappers ----
namespace lax {
#define CJAX_LAX_UNARY(fn, E) \
  Array fn(const Array& x) { return bind1(prims::elementwise(ScalarOp::E), {x}); }
#define CJAX_LAX_BINARY(fn, E) \
  Array fn(const Array& x, const Array& y) { return bind1(prims::elementwise(ScalarOp::E), {x, y}); }
CJAX_LAX_UNARY(neg, Neg)
CJAX_LAX_UNARY(sign, Sign)
CJAX_LAX_UNARY(abs, Abs)
CJAX_LAX_UNARY(floor, Floor)
CJAX_LAX_UNARY(ceil, Ceil)
CJAX_LAX_UNARY(round, Round)
CJAX_LAX_UNARY(is_finite, IsFinite)
CJAX_LAX_UNARY(exp, Exp)
CJAX_LAX_UNARY(exp2, Exp2)
CJAX_LAX_UNARY(log, Log)
CJAX_LAX_UNARY(log1p, Log1p)
CJAX_LAX_UNARY(expm1, Expm1)
CJAX_LAX_UNARY(tanh, Tanh)
CJAX_LAX_UNARY(logistic, Logistic)
CJAX_LAX_UNARY(sin, Sin)
CJAX_LAX_UNARY(cos, Cos)
CJAX_LAX_UNARY(tan, Tan)
CJAX_LAX_UNARY(asin, Asin)
CJAX_LAX_UNARY(acos, Acos)
CJAX_LAX_UNARY(atan, Atan)
CJAX_LAX_UNARY(sinh, Sinh)
CJAX_LAX_UNARY(cosh, Cosh)
CJAX_LAX_UNARY(asinh, Asinh)
CJAX_LAX_UNARY(acosh, Acosh)
CJAX_LAX_UNARY(atanh, Atanh)
CJAX_LAX_UNARY(sqrt, Sqrt)
CJAX_LAX_UNARY(rsqrt, Rsqrt)
CJAX_LAX_UNARY(cbrt, Cbrt)
CJAX_LAX_UNARY(erf, Erf)
CJAX_LAX_UNARY(erfc, Erfc)
CJAX_LAX_UNARY(erf_inv, ErfInv)
CJAX_LAX_UNARY(lgamma, Lgamma)
CJAX_LAX_UNARY(bitwise_not, Not)
CJAX_LAX_UNARY(square, Square)
CJAX_LAX_BINARY(add, Add)
CJAX_LAX_BINARY(sub, Sub)
CJAX_LAX_BINARY(mul, Mul)
CJAX_LAX_BINARY(div, Div)
CJAX_LAX_BINARY(rem, Rem)
CJAX_LAX_BINARY(pow, Pow)
CJAX_LAX_BINARY(max, Max)
CJAX_LAX_BINARY(min, Min)
CJAX_LAX_BINARY(atan2, Atan2)
CJAX_LAX_BINARY(nextafter, Nextafter)
CJAX_LAX_BINARY(bitwise_and, And)
CJAX_LAX_BINARY(bitwise_or, Or)
CJAX_LAX_BINARY(bitwise_xor, Xor)
CJAX_LAX_BINARY(shift_left, ShiftLeft)
CJAX_LAX_BINARY(shift_right_logical, ShiftRightLogical)
CJAX_LAX_BINARY(shift_right_arithmetic, ShiftRightArithmetic)
CJAX_LAX_BINARY(eq, Eq)
CJAX_LAX_BINARY(ne, Ne)
CJAX_LAX_BINARY(lt, Lt)
CJAX_LAX_BINARY(le, Le)
CJAX_LAX_BINARY(gt, Gt)
CJAX_LAX_BINARY(ge, Ge)
#undef CJAX_LAX_UNARY
#undef CJAX_LAX_BINARY

Array clamp(const Array& lo, const Array& x, const Array& hi) {
  return bind1(prims::elementwise(ScalarOp::Clamp), {lo, x, hi});
}
Array integer_pow(const Array& x, int y) { return bind1(prims::integer_pow(), {x}, Params{{"y", int64_t(y)}}); }
// The lax entries that put a DType into a primitive's params validate it (DTypeError "invalid dtype
// value N" from core/dtype.cpp) before a tracer could carry it into a jaxpr.
Array convert_element_type(const Array& x, DType d) {
  (void)itemsize(d);  // validates
  if (x.dtype() == d && !x.weak_type()) return x;
  return bind1(prims::convert_element_type(), {x}, Params{{"new_dtype", d}, {"weak_type", false}});
}
Array bitcast_convert_type(const Array& x, DType d) {
  (void)itemsize(d);  // validates
  return bind1(prims::bitcast_convert_type(), {x}, Params{{"new_dtype", d}});
}
Array select_n(const Array& which, const std::vector<Array>& cases) {
  std::vector<Array> in;
  in.reserve(cases.size() + 1);
  in.push_back(which);
  in.insert(in.end(), cases.begin(), cases.end());
  return bind1(prims::select_n(), in);
}
Array select(const Array& pred, const Array& on_true, const Array& on_false) {
  return select_n(pred, {on_false, on_true});
}
std::pair<Array, Array> threefry2x32(const Array& k0, const Array& k1, const Array& x0, const Array& x1) {
  auto outs = bind(prims::threefry2x32(), {k0, k1, x0, x1});
  return {outs[0], outs[1]};
}
}  // namespace lax

}  // namespace cjax

namespace cjax {
namespace {
// stop_gradient: the identity on values; its JVP rule (autodiff/) gives a zero tangent.
const PrimitiveDef& g_stop_gradient = register_primitive([] {
  PrimitiveDef def;
  def.name = "stop_gradient";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    return {in[0].aval()};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
    return std::vector<Array>{in[0]};
  };
  return def;
}());
}  // namespace
namespace prims {
const PrimitiveDef& stop_gradient() { return g_stop_gradient; }
}  // namespace prims
namespace lax {
// As JAX: only floating values are bound (integers have no gradient to stop).
Array stop_gradient(const Array& x) {
  if (!is_floating(x.dtype())) return x;
  return bind1(g_stop_gradient, {x});
}
}  // namespace lax
}  // namespace cjax
