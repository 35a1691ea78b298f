// Inline, vectorizable approximations of the transcendental scalar ops (see llvm_math.h).
//
// Method: Cody-Waite range reduction (ln2 split into a short head, whose products with the
// reduction multiple are exact, and a tail), then minimax polynomials evaluated with fma (Horner).
// 2^k is built from its bit pattern; results that may be denormal are scaled in two steps
// (p * 2^k1 * 2^k2, the first exact) so that they are rounded once. Special values are patched in
// with selects at the end; out-of-range inputs are clamped first so that no lane ever converts a NaN
// or an infinity to an integer (which would be poison). log follows fdlibm's scheme (s = f/(2+f));
// erfc(x) = exp(-x^2) P((x-3)/(x+3)) with x^2 split exactly; f32 sin/cos/tan reduce with an exact
// Payne-Hanek step in 64-bit integer lanes (the 2/pi window chosen by selects, no table loads);
// f64 pow uses a double-double log (about 2^-64) and an exp of a double-double argument.
//
// The backend may contract a*b + c into an fma anywhere (the JIT uses FPOpFusion::Fast), so every
// product whose rounding matters is either exact or an explicit llvm.fma.
//
// The polynomial coefficients were computed for this file with a Remez exchange (weighted minimax)
// in 40-digit arithmetic with mpmath, then rounded to the target type; the comments give the
// approximated function, the interval and the minimax error.
#include "backends/cpu/llvm_math.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <utility>

#include "backends/cpu/llvm_math_coefficients.h"

namespace cjax::cpu {
namespace {

using llvm::Type;
using llvm::Value;

using namespace math_coefficients;

struct Poly {
  const double* c;
  size_t n;
};
template <size_t N>
constexpr Poly poly(const double (&a)[N]) {
  return {a, N};
}

// Emits math for one floating type (float or double, scalar or vector).
class Em {
 public:
  Em(llvm::IRBuilder<>& b, Type* ty) : b_(b), ty_(ty) {
    dbl_ = ty->getScalarType()->isDoubleTy();
    ity_ = ty->getWithNewType(dbl_ ? b.getInt64Ty() : b.getInt32Ty());
    mbits_ = dbl_ ? 52 : 23;
    bias_ = dbl_ ? 1023 : 127;
  }

  Type* type() const { return ty_; }
  Type* itype() const { return ity_; }
  bool is_double() const { return dbl_; }

  // ---- building blocks ----
  Value* C(double v) { return llvm::ConstantFP::get(ty_, v); }
  Value* I(int64_t v) { return llvm::ConstantInt::get(ity_, uint64_t(v), true); }
  Value* add(Value* a, Value* c) { return b_.CreateFAdd(a, c); }
  Value* sub(Value* a, Value* c) { return b_.CreateFSub(a, c); }
  Value* mul(Value* a, Value* c) { return b_.CreateFMul(a, c); }
  Value* div(Value* a, Value* c) { return b_.CreateFDiv(a, c); }
  Value* neg(Value* a) { return b_.CreateFNeg(a); }
  Value* fma(Value* a, Value* c, Value* d) { return b_.CreateIntrinsic(llvm::Intrinsic::fma, {ty_}, {a, c, d}); }
  Value* fabs(Value* a) { return b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, a); }
  Value* rint(Value* a) { return b_.CreateUnaryIntrinsic(llvm::Intrinsic::rint, a); }
  Value* trunc(Value* a) { return b_.CreateUnaryIntrinsic(llvm::Intrinsic::trunc, a); }
  Value* sqrt(Value* a) { return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, a); }
  Value* copysign(Value* mag, Value* sgn) { return b_.CreateBinaryIntrinsic(llvm::Intrinsic::copysign, mag, sgn); }
  Value* sel(Value* c, Value* a, Value* d) { return b_.CreateSelect(c, a, d); }
  Value* lt(Value* a, Value* c) { return b_.CreateFCmpOLT(a, c); }
  Value* le(Value* a, Value* c) { return b_.CreateFCmpOLE(a, c); }
  Value* gt(Value* a, Value* c) { return b_.CreateFCmpOGT(a, c); }
  Value* ge(Value* a, Value* c) { return b_.CreateFCmpOGE(a, c); }
  Value* eq(Value* a, Value* c) { return b_.CreateFCmpOEQ(a, c); }
  Value* ult(Value* a, Value* c) { return b_.CreateFCmpULT(a, c); }  // a < c or unordered
  Value* isnan(Value* a) { return b_.CreateFCmpUNO(a, a); }
  Value* lor(Value* a, Value* c) { return b_.CreateOr(a, c); }
  Value* land(Value* a, Value* c) { return b_.CreateAnd(a, c); }
  // min/max that map NaN to the bound (one x86 min/max instruction each).
  Value* minf(Value* a, Value* c) { return sel(lt(a, c), a, c); }
  Value* maxf(Value* a, Value* c) { return sel(gt(a, c), a, c); }
  Value* clamp(Value* a, double lo, double hi) { return maxf(minf(a, C(hi)), C(lo)); }

  Value* bits(Value* a) { return b_.CreateBitCast(a, ity_); }
  Value* from_bits(Value* i) { return b_.CreateBitCast(i, ty_); }
  Value* iadd(Value* a, Value* c) { return b_.CreateAdd(a, c); }
  Value* isub(Value* a, Value* c) { return b_.CreateSub(a, c); }
  Value* iand(Value* a, Value* c) { return b_.CreateAnd(a, c); }
  Value* ior(Value* a, Value* c) { return b_.CreateOr(a, c); }
  Value* ixor(Value* a, Value* c) { return b_.CreateXor(a, c); }
  Value* shl(Value* a, int s) { return b_.CreateShl(a, uint64_t(s)); }
  Value* ashr(Value* a, int s) { return b_.CreateAShr(a, uint64_t(s)); }
  Value* lshr(Value* a, int s) { return b_.CreateLShr(a, uint64_t(s)); }
  Value* igt(Value* a, Value* c) { return b_.CreateICmpSGT(a, c); }
  Value* ieq(Value* a, Value* c) { return b_.CreateICmpEQ(a, c); }
  Value* to_int(Value* a) { return b_.CreateFPToSI(a, ity_); }  // a must be finite and in range
  Value* to_fp(Value* i) { return b_.CreateSIToFP(i, ty_); }

  Value* horner(Value* x, Poly p) {
    Value* acc = C(p.c[p.n - 1]);
    for (size_t i = p.n - 1; i-- > 0;) acc = fma(acc, x, C(p.c[i]));
    return acc;
  }
  // NaN inputs give a quiet NaN.
  Value* nan_pass(Value* x, Value* res) { return sel(isnan(x), add(x, x), res); }

  double inf() const { return HUGE_VAL; }
  double nan() const { return std::nan(""); }
  double min_normal() const { return dbl_ ? 0x1p-1022 : 0x1p-126; }
  int mbits() const { return mbits_; }
  int emax() const { return bias_; }

  // 2^k for an integer vector k in [1 - bias, bias].
  Value* pow2i(Value* k) { return from_bits(shl(iadd(k, I(bias_)), mbits_)); }
  // p * 2^k for k in [2 - 2 bias, 2 bias]: two steps, the first exact, so denormals round once.
  Value* scale2(Value* p, Value* k) {
    Value* k1 = ashr(k, 1);
    Value* k2 = isub(k, k1);
    return mul(mul(p, pow2i(k1)), pow2i(k2));
  }
  // scale2, but 0 where `zero`: those lanes skip the underflowing multiply (an underflow costs a
  // microcode assist on x86, ~2.5x for exp; masked softmax inputs are often all -inf or -1e9).
  Value* scale2z(Value* p, Value* k, Value* zero) { return sel(zero, C(0), scale2(p, sel(zero, I(0), k))); }
  // Below this, exp(x) rounds to 0.
  double exp_zero() const { return dbl_ ? -745.14 : -103.98; }

  // ---- exp family ----
  struct Reduced {
    Value* kf;    // the multiple of ln2, integral
    Value* r;     // reduced argument
    Value* tail;  // expm1(xh + xl - kf ln2) = r + tail
  };
  // Cody-Waite reduction of xh (+ xl, a small low part) by ln2 and the expm1 polynomial.
  // |xh| must be within the clamp ranges below (|kf| <= 1100 for double, 160 for float).
  Reduced exp_reduce(Value* xh, Value* xl, Poly s) {
    // The head of ln2 has few bits so that kf * L1 is exact and xh - kf * L1 is exact.
    const double L1 = dbl_ ? 0x1.62e42feep-1 : 0x1.62e4p-1;
    const double L2 = dbl_ ? 0x1.a39ef35793c76p-33 : 0x1.7f7d1cp-20;
    const double log2e = dbl_ ? 0x1.71547652b82fep+0 : 0x1.715476p+0;
    Value* kf = rint(mul(xh, C(log2e)));
    Value* rh = fma(kf, C(-L1), xh);
    Value* rr = xl ? add(rh, xl) : rh;
    Value* r = fma(kf, C(-L2), rr);
    // c = what r lost: (rh - r) + xl - kf * L2.
    Value* d = sub(rh, r);
    if (xl) d = add(d, xl);
    Value* c = fma(kf, C(-L2), d);
    Value* r2 = mul(r, r);
    Value* q = fma(r, horner(r, s), C(0.5));  // expm1(r) = r + r^2 q
    Value* tail = fma(r2, q, fma(c, r, c));   // + c (1 + r)
    return {kf, r, tail};
  }
  Poly exp_poly() const { return dbl_ ? poly(kExpS_d) : poly(kExpS_f); }

  Value* exp(Value* x) {
    if (!dbl_) return exp_f32(x);
    Value* xc = clamp(x, -746, 710);
    Reduced e = exp_reduce(xc, nullptr, exp_poly());
    Value* p = add(C(1), add(e.r, e.tail));
    return nan_pass(x, scale2z(p, to_int(e.kf), lt(x, C(exp_zero()))));
  }

  // f32 exp in about 24 vector ops (the shared path above takes 35; softmax and the attention
  // kernels are bound by it). The reduction drops the low part of r (its rounding costs under
  // 0.25 ulp), the polynomial has four terms (2e-8 relative; 1.19 ulp in all), k comes out of the rounding addition's
  // low bits (no float-to-int conversion, so a NaN lane is never poison), and 2^k goes straight into p's exponent
  // field; only arguments below -80 (denormal results) take a second multiply, by 2^-64.
  Value* exp_f32(Value* x) {
    Value* xc = sel(lt(x, C(-104)), C(-104), x);  // NaN stays NaN
    ExpCore e = exp_f32_core(xc);
    Value* low = lt(xc, C(-80));
    Value* kbits = iadd(e.kbits, sel(low, I(int64_t(64) << mbits_), I(0)));
    Value* scale = sel(lt(xc, C(exp_zero())), C(0), sel(low, C(0x1p-64), C(1)));
    Value* res = mul(from_bits(iadd(bits(e.p), kbits)), scale);
    // From the first float above ln(FLT_MAX) (k = 128 with p >= 1 would overflow the exponent
    // field) and for NaN: x + inf.
    return sel(lt(x, C(0x1.62e43p+6)), res, add(x, C(inf())));
  }
  // exp(r) = p in [0.70, 1.42] and 2^k's exponent field for x (in [-104, 128]), k = round(x log2e).
  struct ExpCore {
    Value* p;
    Value* kbits;
  };
  ExpCore exp_f32_core(Value* x) {
    const double shifter = 0x1.8p23;  // x log2e + shifter: k in the low mantissa bits
    Value* t = fma(x, C(0x1.715476p+0), C(shifter));
    Value* kf = sub(t, C(shifter));
    Value* r = fma(kf, C(-0x1.7f7d1cp-20), fma(kf, C(-0x1.62e4p-1), x));
    Value* q = fma(r, horner(r, poly(kExpS4_f)), C(0.5));  // expm1(r) = r + r^2 q
    return {add(C(1), fma(mul(r, r), q, r)), shl(bits(t), mbits_)};
  }
  // f32 exp of a whole vector in explicit vector code (a vector kernel pass), with a branch
  // instead of selects for the special cases: when every lane is in [-80, 80] or rounds to 0
  // (below -103.98: softmax's masked -inf), about 16 ops; otherwise exp_f32 (NaN, infinities,
  // overflow, denormal results). The results are exp_f32's bit for bit (2^k in range is exact,
  // and exp_f32 gives +0 below -103.98), so its accuracy tests cover both paths.
  Value* exp_f32_branching(Value* x) {
    ExpCore e = exp_f32_core(x);
    Value* zero = lt(x, C(exp_zero()));
    Value* fast = sel(zero, C(0), from_bits(iadd(bits(e.p), e.kbits)));
    Value* common = b_.CreateAndReduce(lor(lt(fabs(x), C(80)), zero));
    llvm::BasicBlock* from = b_.GetInsertBlock();
    llvm::Function* fn = from->getParent();
    auto* rare = llvm::BasicBlock::Create(b_.getContext(), "exp.rare", fn);
    auto* join = llvm::BasicBlock::Create(b_.getContext(), "exp.join", fn);
    llvm::MDNode* likely = llvm::MDBuilder(b_.getContext()).createLikelyBranchWeights();
    b_.CreateCondBr(common, join, rare, likely);
    b_.SetInsertPoint(rare);
    Value* slow = exp_f32(x);
    llvm::BasicBlock* rare_end = b_.GetInsertBlock();
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    llvm::PHINode* res = b_.CreatePHI(ty_, 2);
    res->addIncoming(fast, from);
    res->addIncoming(slow, rare_end);
    return res;
  }

  Value* exp2(Value* x) {
    Value* xc = dbl_ ? clamp(x, -1076, 1025) : clamp(x, -151, 129);
    Value* kf = rint(xc);
    Value* r = sub(xc, kf);
    Value* p = fma(r, horner(r, dbl_ ? poly(kExp2Q_d) : poly(kExp2Q_f)), C(1));
    return nan_pass(x, scale2z(p, to_int(kf), lt(x, C(dbl_ ? -1075 : -150))));
  }

  // exp(xc) = s (1 + em) [* 2 where big], for xc clamped so that k >= 1 - bias.
  struct ExpParts {
    Value* s;
    Value* em;
    Value* big;
  };
  ExpParts exp_parts(Value* xc) {
    Reduced e = exp_reduce(xc, nullptr, exp_poly());
    Value* k = to_int(e.kf);
    Value* big = igt(k, I(bias_));
    return {pow2i(sel(big, I(bias_), k)), add(e.r, e.tail), big};
  }
  Value* expm1_core(Value* xc) {
    ExpParts e = exp_parts(xc);
    Value* res = fma(e.s, e.em, sub(e.s, C(1)));  // 2^k (1 + em) - 1
    return sel(e.big, mul(res, C(2)), res);
  }
  // exp(a) / 2 for a in [0, hi], without overflowing before the end.
  Value* half_exp(Value* a) {
    Value* ac = minf(a, C(dbl_ ? 711 : 90));
    Reduced e = exp_reduce(ac, nullptr, exp_poly());
    return scale2(add(C(1), add(e.r, e.tail)), isub(to_int(e.kf), I(1)));
  }
  Value* expm1(Value* x) {
    Value* xc = dbl_ ? clamp(x, -80, 710) : clamp(x, -40, 89);
    Value* res = expm1_core(xc);
    res = sel(eq(x, C(0)), x, res);  // keeps the sign of zero
    return nan_pass(x, res);
  }

  Value* tanh(Value* x) {
    Value* a = fabs(x);
    Value* ac = minf(a, C(dbl_ ? 20 : 9.5));  // tanh rounds to 1 beyond 19.06 (double), 9.01 (float)
    Value* yb;
    if (dbl_) {
      Value* t = expm1_core(add(ac, ac));
      yb = div(t, add(t, C(2)));
    } else {
      // 1 - 2 / (e^2a + 1) with the short f32 exp: from a = 0.55 up the quotient is at most 1/2,
      // so its error shrinks in the subtraction. Exhaustively 1.51 ulp (1.50 through expm1), and
      // the GELU forward kernel 7% faster (AVX2, one thread).
      ExpCore e = exp_f32_core(add(ac, ac));
      Value* E = from_bits(iadd(bits(e.p), e.kbits));
      yb = sub(C(1), div(C(2), add(E, C(1))));
    }
    Value* z = mul(ac, ac);
    Value* ys = fma(mul(ac, z), horner(z, dbl_ ? poly(kTanhU_d) : poly(kTanhU_f)), ac);
    Value* y = sel(lt(a, C(0.55)), ys, yb);
    return nan_pass(x, copysign(y, x));
  }

  Value* logistic(Value* x) {
    Value* xn = maxf(neg(fabs(x)), C(dbl_ ? -746 : -104));
    Value* ex;  // exp(-|x|)
    if (dbl_) {
      Reduced e = exp_reduce(xn, nullptr, exp_poly());
      ex = scale2z(add(C(1), add(e.r, e.tail)), to_int(e.kf), lt(xn, C(exp_zero())));
    } else {  // the short f32 exp: the same 2.40 ulp exhaustively, the op ~20% faster
      ex = exp_f32(xn);
    }
    Value* num = sel(lt(x, C(0)), ex, C(1));
    return nan_pass(x, div(num, add(C(1), ex)));
  }

  // ---- log family ----
  // log(u + c) + eextra ln2, for finite u >= min_normal, |c| <= ulp(u) (c may be null).
  // Garbage (but no poison) for other u; callers patch the special cases.
  Value* log_core(Value* u, Value* c, Value* eextra) {
    // u = 2^e m with m in [sqrt(1/2), sqrt(2)).
    const int64_t one = dbl_ ? 0x3ff0000000000000 : 0x3f800000;
    const int64_t sqrt_half = dbl_ ? 0x3fe6a09e667f3bcd : 0x3f3504f3;
    const int64_t mmask = (int64_t(1) << mbits_) - 1;
    Value* ix = iadd(bits(u), I(one - sqrt_half));
    Value* e = isub(ashr(ix, mbits_), I(bias_));
    Value* m = from_bits(iadd(iand(ix, I(mmask)), I(sqrt_half)));
    Value* f = sub(m, C(1));
    if (c) {
      // f += c 2^-e; c is irrelevant (and 2^-e not normal) for large u.
      Value* big = igt(e, I(mbits_ + 2));
      Value* es = sel(big, I(mbits_ + 2), e);
      f = add(f, sel(big, C(0), mul(c, pow2i(isub(I(0), es)))));
    }
    if (eextra) e = iadd(e, eextra);
    Value* ef = to_fp(e);
    const double L1 = dbl_ ? 0x1.62e42feep-1 : 0x1.62e4p-1;
    const double L2 = dbl_ ? 0x1.a39ef35793c76p-33 : 0x1.7f7d1cp-20;
    // log1p(f) = f - hfsq + s (hfsq + R), s = f / (2 + f), R = s^2 T(s^2)  (fdlibm's scheme)
    Value* hfsq = mul(C(0.5), mul(f, f));
    Value* s = div(f, add(C(2), f));
    Value* z = mul(s, s);
    Value* R = mul(z, horner(z, dbl_ ? poly(kLogT_d) : poly(kLogT_f)));
    Value* lo = fma(s, add(hfsq, R), mul(ef, C(L2)));
    return add(mul(ef, C(L1)), sub(f, sub(hfsq, lo)));
  }
  // 1 + v = u + c exactly (Knuth's TwoSum).
  std::pair<Value*, Value*> one_plus(Value* v) {
    Value* u = add(C(1), v);
    Value* bp = sub(u, C(1));
    Value* ap = sub(u, bp);
    return {u, add(sub(C(1), ap), sub(v, bp))};
  }

  Value* log(Value* x) {
    Value* den = lt(x, C(min_normal()));
    Value* u = sel(den, mul(x, C(std::ldexp(1.0, mbits_ + 2))), x);
    Value* res = log_core(u, nullptr, sel(den, I(-(mbits_ + 2)), I(0)));
    res = sel(eq(x, C(inf())), x, res);
    res = sel(eq(x, C(0)), C(-inf()), res);
    return sel(ult(x, C(0)), C(nan()), res);  // x < 0 or NaN
  }

  Value* log1p(Value* x) {
    auto [u, c] = one_plus(x);
    Value* res = log_core(u, c, nullptr);
    res = sel(eq(x, C(0)), x, res);  // keeps the sign of zero
    res = sel(eq(x, C(inf())), x, res);
    res = sel(eq(x, C(-1)), C(-inf()), res);
    return sel(ult(x, C(-1)), C(nan()), res);  // x < -1 or NaN
  }

  // ---- hyperbolic functions (used for double; f32 goes through double) ----
  Value* sinh(Value* x) {
    Value* a = fabs(x);
    Value* t = expm1_core(minf(a, C(22)));
    Value* tp1 = add(t, C(1));
    Value* hs = mul(C(0.5), sub(add(t, t), div(mul(t, t), tp1)));  // |x| < 1 (fdlibm)
    Value* hm = mul(C(0.5), add(t, div(t, tp1)));                  // |x| < 22
    Value* h = sel(lt(a, C(1)), hs, sel(lt(a, C(22)), hm, half_exp(a)));
    return nan_pass(x, copysign(h, x));
  }

  Value* cosh(Value* x) {
    Value* a = fabs(x);
    ExpParts p = exp_parts(minf(a, C(22)));
    Value* t = fma(p.s, p.em, sub(p.s, C(1)));            // expm1(|x|)
    Value* e = fma(p.s, p.em, p.s);                       // exp(|x|)
    Value* hs = add(C(1), div(mul(t, t), mul(C(2), e)));  // |x| < ln2 / 2 (fdlibm)
    Value* hm = add(mul(C(0.5), e), div(C(0.5), e));
    Value* h = sel(lt(a, C(0.3465)), hs, sel(lt(a, C(22)), hm, half_exp(a)));
    return nan_pass(x, h);
  }

  Value* asinh(Value* x) {
    Value* a = fabs(x);
    Value* a2 = mul(a, a);
    // a < 2: log1p(a + a^2 / (1 + sqrt(1 + a^2))); a <= 2^28: log(2a + 1 / (a + sqrt(a^2 + 1)));
    // beyond: log(a) + ln2 (fdlibm's split).
    Value* vs = add(a, div(a2, add(C(1), sqrt(add(C(1), a2)))));
    auto [us, cs] = one_plus(vs);
    Value* vm = add(add(a, a), div(C(1), add(a, sqrt(add(a2, C(1))))));
    Value* small = lt(a, C(2));
    Value* big = gt(a, C(0x1p28));
    Value* u = sel(small, us, sel(big, a, vm));
    Value* c = sel(small, cs, C(0));
    Value* res = log_core(u, c, sel(big, I(1), I(0)));
    res = sel(eq(a, C(inf())), a, res);
    res = sel(eq(a, C(0)), a, res);
    return nan_pass(x, copysign(res, x));
  }

  Value* acosh(Value* x) {
    // x < 2: log1p(t + sqrt(2t + t^2)), t = x - 1; x <= 2^28: log(2x - 1 / (x + sqrt(x^2 - 1)));
    // beyond: log(x) + ln2.
    Value* t = sub(x, C(1));
    Value* vs = add(t, sqrt(fma(t, t, add(t, t))));
    auto [us, cs] = one_plus(vs);
    Value* vm = sub(add(x, x), div(C(1), add(x, sqrt(fma(x, x, C(-1))))));
    Value* small = lt(x, C(2));
    Value* big = gt(x, C(0x1p28));
    Value* u = sel(small, us, sel(big, x, vm));
    Value* c = sel(small, cs, C(0));
    Value* res = log_core(u, c, sel(big, I(1), I(0)));
    res = sel(eq(x, C(inf())), x, res);
    return sel(ult(x, C(1)), C(nan()), res);  // x < 1 or NaN
  }

  Value* atanh(Value* x) {
    Value* a = fabs(x);
    Value* t = add(a, a);
    Value* oma = sub(C(1), a);
    // 0.5 log1p(2a + 2a^2 / (1 - a)) below 0.5, 0.5 log1p(2a / (1 - a)) above (fdlibm).
    Value* v = sel(lt(a, C(0.5)), add(t, div(mul(t, a), oma)), div(t, oma));
    auto [u, c] = one_plus(v);
    Value* res = mul(C(0.5), log_core(u, c, nullptr));
    res = sel(eq(a, C(0)), a, res);
    res = sel(eq(a, C(1)), C(inf()), res);
    res = sel(gt(a, C(1)), C(nan()), res);
    return nan_pass(x, copysign(res, x));
  }

  // ---- cube root (used for double; f32 goes through double) ----
  Value* cbrt(Value* x) {
    Value* a = fabs(x);
    Value* den = lt(a, C(min_normal()));
    Value* as = sel(den, mul(a, C(std::ldexp(1.0, mbits_ + 2))), a);
    const int64_t one = dbl_ ? 0x3ff0000000000000 : 0x3f800000;
    Value* ix = bits(as);
    Value* e = isub(ashr(ix, mbits_), I(bias_));
    Value* m = from_bits(ior(iand(ix, I((int64_t(1) << mbits_) - 1)), I(one)));  // [1, 2)
    Value* ef = sub(to_fp(e), sel(den, C(mbits_ + 2), C(0)));
    // a = 2^(3q) v, v = 2^rem m in [1, 8): cbrt(a) = 2^q cbrt(v).
    Value* qf = b_.CreateUnaryIntrinsic(llvm::Intrinsic::floor, mul(add(ef, C(0.5)), C(1.0 / 3)));
    Value* rem = fma(qf, C(-3), ef);
    Value *r1 = eq(rem, C(1)), *r2 = eq(rem, C(2));
    Value* v = mul(m, sel(r1, C(2), sel(r2, C(4), C(1))));
    Value* y = mul(horner(m, poly(kCbrtG)), sel(r1, C(0x1.428a2f98d728bp+0), sel(r2, C(0x1.965fea53d6e3dp+0), C(1))));
    // Halley: y -= y (y^3 - v) / (2 y^3 + v); the second step with an exact residual.
    Value* y3 = mul(mul(y, y), y);
    y = mul(y, div(add(y3, add(v, v)), add(add(y3, y3), v)));
    Value* y2 = mul(y, y);
    Value* y2l = fma(y, y, neg(y2));
    y3 = mul(y2, y);
    Value* y3l = fma(y2, y, neg(y3));
    Value* d = add(sub(y3, v), fma(y2l, y, y3l));
    y = fma(neg(y), div(d, add(add(y3, y3), v)), y);
    Value* res = mul(y, pow2i(to_int(qf)));
    res = sel(lor(eq(a, C(0)), eq(a, C(inf()))), a, res);
    return nan_pass(x, copysign(res, x));
  }

  // ---- inverse trigonometric functions ----
  double pio2_hi() const { return dbl_ ? 0x1.921fb54442d18p+0 : 0x1.921fb6p+0; }
  double pio2_lo() const { return dbl_ ? 0x1.1a62633145c07p-54 : -0x1.777a5cp-25; }
  double pio4_hi() const { return dbl_ ? 0x1.921fb54442d18p-1 : 0x1.921fb6p-1; }
  double pio4_lo() const { return dbl_ ? 0x1.1a62633145c07p-55 : -0x1.777a5cp-26; }
  double pi_hi() const { return dbl_ ? 0x1.921fb54442d18p+1 : 0x1.921fb6p+1; }
  double pi_lo() const { return dbl_ ? 0x1.1a62633145c07p-53 : -0x1.777a5cp-24; }

  // atan(a) for a >= 0 (or NaN): reduced to |u| <= tan(pi/8) around 0, pi/4 and pi/2.
  Value* atan_pos(Value* a) {
    Value* c1 = gt(a, C(0.41421356237309503));
    Value* c3 = gt(a, C(2.4142135623730949));
    Value* num = sel(c3, C(-1), sel(c1, sub(a, C(1)), a));
    Value* den = sel(c3, a, sel(c1, add(a, C(1)), C(1)));
    Value* u = div(num, den);
    Value* z = mul(u, u);
    Value* v = fma(mul(u, z), horner(z, dbl_ ? poly(kAtanA_d) : poly(kAtanA_f)), u);
    Value* hi = sel(c3, C(pio2_hi()), sel(c1, C(pio4_hi()), C(0)));
    Value* lo = sel(c3, C(pio2_lo()), sel(c1, C(pio4_lo()), C(0)));
    return add(hi, add(v, lo));
  }
  Value* atan(Value* x) { return nan_pass(x, copysign(atan_pos(fabs(x)), x)); }

  Value* signbit(Value* x) { return b_.CreateICmpSLT(bits(x), I(0)); }

  Value* atan2(Value* y, Value* x) {
    Value* ay = fabs(y);
    Value* ax = fabs(x);
    Value* swap = gt(ay, ax);
    Value* t = div(sel(swap, ax, ay), sel(swap, ay, ax));  // in [0, 1]
    Value* at = atan_pos(t);
    Value* xneg = signbit(x);
    // |y| <= |x|: at or pi - at; |y| > |x|: pi/2 - at or pi/2 + at.
    Value* hi = sel(swap, C(pio2_hi()), sel(xneg, C(pi_hi()), C(0)));
    Value* lo = sel(swap, C(pio2_lo()), sel(xneg, C(pi_lo()), C(0)));
    Value* r = add(hi, add(sel(b_.CreateXor(swap, xneg), neg(at), at), lo));
    // 0/0 and inf/inf.
    r = sel(land(eq(ay, C(0)), eq(ax, C(0))), sel(xneg, C(pi_hi()), C(0)), r);
    Value* three_pio4 = C(dbl_ ? 0x1.2d97c7f3321d2p+1 : 0x1.2d97c8p+1);
    r = sel(land(eq(ay, C(inf())), eq(ax, C(inf()))), sel(xneg, three_pio4, C(pio4_hi())), r);
    r = copysign(r, y);
    return sel(lor(isnan(x), isnan(y)), add(x, y), r);
  }

  // asin(w) for the reduced argument: w + w z P(z), z = w^2 (z passed in).
  Value* asin_red(Value* w, Value* z) { return fma(mul(w, z), horner(z, dbl_ ? poly(kAsinP_d) : poly(kAsinP_f)), w); }
  Value* asin(Value* x) {
    Value* a = fabs(x);
    Value* small = le(a, C(0.5));
    // |x| > 0.5: asin(x) = pi/2 - 2 asin(sqrt((1 - |x|) / 2))  (NaN for |x| > 1)
    Value* zl = mul(sub(C(1), a), C(0.5));
    Value* z = sel(small, mul(a, a), zl);
    Value* r = asin_red(sel(small, a, sqrt(zl)), z);
    Value* big = sub(C(pio2_hi()), sub(add(r, r), C(pio2_lo())));
    return nan_pass(x, copysign(sel(small, r, big), x));
  }
  Value* acos(Value* x) {
    Value* a = fabs(x);
    Value* small = le(a, C(0.5));
    Value* zl = mul(sub(C(1), a), C(0.5));
    Value* z = sel(small, mul(a, a), zl);
    Value* r = asin_red(sel(small, a, sqrt(zl)), z);
    Value* mid = sub(C(pio2_hi()), sub(copysign(r, x), C(pio2_lo())));
    Value* pos = add(r, r);
    Value* negv = sub(C(pi_hi()), sub(add(r, r), C(pi_lo())));
    return nan_pass(x, sel(small, mid, sel(lt(x, C(0)), negv, pos)));
  }

  // ---- pow (double) ----
  // a + c = s + e exactly (Knuth's TwoSum).
  std::pair<Value*, Value*> two_sum(Value* a, Value* c) {
    Value* sm = add(a, c);
    Value* bp = sub(sm, a);
    Value* ap = sub(sm, bp);
    return {sm, add(sub(a, ap), sub(c, bp))};
  }
  // log(a) as hi + lo with a relative error of about 2^-64, for finite a > 0 (garbage otherwise).
  std::pair<Value*, Value*> log_dd(Value* a) {
    Value* den = lt(a, C(min_normal()));
    Value* u = sel(den, mul(a, C(0x1p54)), a);
    const int64_t one = 0x3ff0000000000000, sqrt_half = 0x3fe6a09e667f3bcd;
    Value* ix = iadd(bits(u), I(one - sqrt_half));
    Value* e = iadd(isub(ashr(ix, mbits_), I(bias_)), sel(den, I(-54), I(0)));
    Value* m = from_bits(iadd(iand(ix, I((int64_t(1) << mbits_) - 1)), I(sqrt_half)));  // [sqrt(1/2), sqrt(2))
    // log(m) = log(c) + 2 atanh(s), s = (m - c) / (m + c), for the nearest center c = 2^(j/5).
    Value *c = C(kPowC[0]), *lch = C(kPowLogCHi[0]), *lcl = C(kPowLogCLo[0]);
    for (int j = 1; j < 5; ++j) {
      Value* above = ge(m, C(kPowBounds[j - 1]));
      c = sel(above, C(kPowC[j]), c);
      lch = sel(above, C(kPowLogCHi[j]), lch);
      lcl = sel(above, C(kPowLogCLo[j]), lcl);
    }
    Value* num = sub(m, c);  // exact (Sterbenz)
    auto [dh, dl] = two_sum(m, c);
    Value* sh = div(num, dh);
    Value* sl = div(sub(fma(neg(sh), dh, num), mul(sh, dl)), dh);
    Value* z = mul(sh, sh);
    Value* tail = mul(mul(sh, z), horner(z, poly(kLogT_dd)));  // 2 atanh(s) - 2s
    const double L1 = 0x1.62e42feep-1, L2 = 0x1.a39ef35793c76p-33;
    Value* ef = to_fp(e);
    // e L1 + log(c)_hi + 2 sh, exactly as hi + lo, plus the small terms.
    auto [h1, l1] = two_sum(mul(ef, C(L1)), lch);
    auto [h2, l2] = two_sum(h1, add(sh, sh));
    Value* lo = add(add(l1, l2), add(add(mul(ef, C(L2)), lcl), add(add(sl, sl), tail)));
    Value* hi = add(h2, lo);
    return {hi, sub(lo, sub(hi, h2))};
  }
  Value* pow(Value* x, Value* y) {
    Value* ax = fabs(x);
    auto [lh, ll] = log_dd(ax);
    // t = y log|x| as th + tl; exp(th + tl).
    Value* th = mul(y, lh);
    Value* tl = fma(y, ll, fma(y, lh, neg(th)));
    tl = sel(lt(fabs(th), C(746)), tl, C(0));
    Reduced e = exp_reduce(clamp(th, -746, 710), tl, exp_poly());
    Value* mag = scale2z(add(C(1), add(e.r, e.tail)), to_int(e.kf), lt(th, C(exp_zero())));
    // Zero, infinite base or exponent.
    Value* yneg = lt(y, C(0));
    mag = sel(eq(ax, C(0)), sel(yneg, C(inf()), C(0)), mag);
    mag = sel(eq(ax, C(inf())), sel(yneg, C(0), C(inf())), mag);
    Value* to_zero = b_.CreateXor(lt(ax, C(1)), yneg);  // |x| < 1 and y = +inf, or |x| > 1 and y = -inf
    mag = sel(eq(fabs(y), C(inf())), sel(to_zero, C(0), C(inf())), mag);
    mag = sel(eq(ax, C(1)), C(1), mag);  // (-1)^+-inf = 1
    return pow_signs(x, y, mag);
  }

  // C's pow given |x|^y as `mag`: negative bases, NaNs, pow(x, 0) = pow(1, y) = 1.
  Value* pow_signs(Value* x, Value* y, Value* mag) {
    Value* yint = eq(trunc(y), y);  // also true for +-inf
    Value* yh = mul(y, C(0.5));
    Value* yodd = land(yint, b_.CreateFCmpUNE(trunc(yh), yh));
    Value* res = sel(land(signbit(x), yodd), neg(mag), mag);
    Value* neg_finite = land(lt(x, C(0)), gt(x, C(-inf())));
    res = sel(land(neg_finite, b_.CreateNot(yint)), C(nan()), res);  // (-x)^fraction
    res = sel(lor(isnan(x), isnan(y)), C(nan()), res);
    res = sel(eq(x, C(1)), C(1), res);
    return sel(eq(y, C(0)), C(1), res);
  }

  // ---- erf family (double only; f32acc: float accuracy, for f32 ops computed in double) ----
  Value* erf(Value* x, bool f32acc, bool erfc) {
    const double cut = f32acc ? 1.0 : 0.75;  // erf(x) = x + x y(x^2) below, exp(-x^2) P(t) above
    Value* a = fabs(x);
    Value* ac = minf(a, C(f32acc ? 11 : 27.3));  // erfc(x) rounds to 0 beyond (float: 10.06)
    // small |x|
    Value* am = minf(ac, C(cut));
    Value* y = horner(mul(am, am), f32acc ? poly(kErfY_df) : poly(kErfY_d));
    Value* ay = mul(am, y);
    Value* erf_a = add(am, ay);
    // large |x|: erfc(x) = exp(-x^2) P((x - 3) / (x + 3)) [/ (x + 1/2) for f64]
    Value* ab = maxf(ac, C(cut));
    Value* erfc_b;
    if (f32acc) {
      Value* t = div(sub(ab, C(3)), add(ab, C(3)));
      Value* p = horner(t, poly(kErfcP_df));
      Reduced e = exp_reduce(neg(mul(ab, ab)), nullptr, poly(kExpS_df));
      Value* ex = add(C(1), add(e.r, e.tail));
      erfc_b = mul(mul(ex, p), pow2i(to_int(e.kf)));
    } else {
      Value* t = div(sub(ab, C(3)), add(ab, C(3)));
      Value* p = horner(t, poly(kErfcP_d));  // (x + 1/2) exp(x^2) erfc(x): flat, so t's rounding hardly matters
      // x^2 = hi + lo exactly enough: hi = xh^2 with xh the leading 26 bits of x.
      Value* xh = from_bits(iand(bits(ab), I(~((int64_t(1) << 27) - 1))));
      Value* xl = sub(ab, xh);
      Value* hi = mul(xh, xh);
      Value* lo = mul(xl, add(ab, xh));
      Reduced e = exp_reduce(neg(hi), neg(lo), poly(kExpS_d));
      erfc_b = scale2z(div(fma(p, add(e.r, e.tail), p), add(ab, C(0.5))), to_int(e.kf), gt(ab, C(27.23)));
    }
    Value* small = lt(a, C(cut));
    if (!erfc) {
      Value* r = sel(small, erf_a, sub(C(1), erfc_b));
      return nan_pass(x, copysign(r, x));
    }
    // erfc for |x| < cut: 1 - erf, arranged so that the rounding error stays below 1 ulp.
    Value* erfc_a = sel(lt(a, C(0.25)), sub(C(1), erf_a), sub(C(0.5), add(sub(am, C(0.5)), ay)));
    Value* pos = sel(small, erfc_a, erfc_b);
    Value* negv = sel(small, add(C(1), erf_a), sub(C(2), erfc_b));
    return nan_pass(x, sel(lt(x, C(0)), negv, pos));
  }

 private:
  llvm::IRBuilder<>& b_;
  Type* ty_;
  Type* ity_;
  bool dbl_;
  int mbits_, bias_;
};

// Runs `f` on `x` converted to double (same vector shape) and rounds the result back to float.
template <class F>
Value* via_double(llvm::IRBuilder<>& b, Value* x, F&& f) {
  Type* ty = x->getType();
  Type* dty = ty->getWithNewType(b.getDoubleTy());
  Em d(b, dty);
  return b.CreateFPTrunc(f(d, b.CreateFPExt(x, dty)), ty);
}

// Bits of 2/pi for the f32 Payne-Hanek reduction: for biased exponent be in [120, 255], window
// i = (be >> 3) - 15 holds the 96 bits b_j of 2/pi = sum b_j 2^-j for j in [8(i+15) - 151, +96),
// as w0:w1 (64 bits) and w2 (32 bits).
constexpr uint64_t kTwoOverPiW01[] = {0x00000000a2f9836e, 0x000000a2f9836e4e, 0x0000a2f9836e4e44, 0x00a2f9836e4e4415,
                                      0xa2f9836e4e441529, 0xf9836e4e441529fc, 0x836e4e441529fc27, 0x6e4e441529fc2757,
                                      0x4e441529fc2757d1, 0x441529fc2757d1f5, 0x1529fc2757d1f534, 0x29fc2757d1f534dd,
                                      0xfc2757d1f534ddc0, 0x2757d1f534ddc0db, 0x57d1f534ddc0db62, 0xd1f534ddc0db6295,
                                      0xf534ddc0db629599};
constexpr uint64_t kTwoOverPiW2[] = {0x4e441529, 0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5,
                                     0x57d1f534, 0xd1f534dd, 0xf534ddc0, 0x34ddc0db, 0xddc0db62, 0xc0db6295,
                                     0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041};

enum class Trig { Sin, Cos, Tan };

// f32 sin/cos/tan: exact reduction of |x| by pi/2 for every float (Payne-Hanek in 64-bit integer
// lanes: x 2/pi mod 4 as a fixed-point number with 62 fraction bits), then double polynomials.
Value* trig_f32(llvm::IRBuilder<>& b, Value* x, Trig which) {
  Type* ty = x->getType();
  Em f(b, ty);
  Em d(b, ty->getWithNewType(b.getDoubleTy()));
  Type* i64 = d.itype();
  Value* ai = f.iand(f.bits(x), f.I(0x7fffffff));
  Value* be = b.CreateZExt(f.lshr(ai, 23), i64);  // biased exponent
  Value* mant = b.CreateZExt(f.ior(f.iand(ai, f.I(0x7fffff)), f.I(0x800000)), i64);
  // |x| = (mant << (be & 7)) 2^(8 i - 150) with i = be >> 3: the window of 2/pi starts where the
  // product stops being a multiple of 4.
  Value* mp = b.CreateShl(mant, d.iand(be, d.I(7)));
  Value* idx = d.isub(d.lshr(be, 3), d.I(15));
  Value* w01 = d.I(int64_t(kTwoOverPiW01[0]));
  Value* w2 = d.I(int64_t(kTwoOverPiW2[0]));
  for (size_t k = 1; k < std::size(kTwoOverPiW01); ++k) {
    Value* hit = d.ieq(idx, d.I(int64_t(k)));
    w01 = b.CreateSelect(hit, d.I(int64_t(kTwoOverPiW01[k])), w01);
    w2 = b.CreateSelect(hit, d.I(int64_t(kTwoOverPiW2[k])), w2);
  }
  Value* w0 = d.lshr(w01, 32);
  Value* w1 = d.iand(w01, d.I(0xffffffff));
  // R = (mant' W 2^-32) mod 2^64: |x| 2/pi mod 4 in units of 2^-62.
  Value* r = d.iadd(d.iadd(d.shl(b.CreateMul(mp, w0), 32), b.CreateMul(mp, w1)), d.lshr(b.CreateMul(mp, w2), 32));
  Value* q = d.lshr(d.iadd(r, d.I(int64_t(1) << 61)), 62);
  Value* frac = d.isub(r, d.shl(q, 62));                                          // in [-2^61, 2^61)
  Value* rb = d.mul(b.CreateSIToFP(frac, d.type()), d.C(0x1.921fb54442d18p-62));  // * pi/2 * 2^-62
  // |x| < 0.5 needs no reduction.
  Value* small = b.CreateICmpULT(be, d.I(126));
  Value* ad = d.fabs(b.CreateFPExt(x, d.type()));
  Value* rr = d.sel(small, ad, rb);
  q = d.sel(small, d.I(0), q);
  Value* z = d.mul(rr, rr);
  Value* s = d.fma(d.mul(rr, z), d.horner(z, poly(kSinS_df)), rr);
  Value* c = d.fma(d.mul(z, z), d.horner(z, poly(kCosC_df)), d.fma(z, d.C(-0.5), d.C(1)));
  Value* odd = d.ieq(d.iand(q, d.I(1)), d.I(1));
  Value* res;
  Value* negate;
  Value* xneg = f.signbit(x);
  if (which == Trig::Sin) {
    res = d.sel(odd, c, s);
    negate = b.CreateXor(d.ieq(d.iand(q, d.I(2)), d.I(2)), xneg);
  } else if (which == Trig::Cos) {
    res = d.sel(odd, s, c);
    negate = d.ieq(d.iand(d.iadd(q, d.I(1)), d.I(2)), d.I(2));
  } else {
    res = d.div(d.sel(odd, d.neg(c), s), d.sel(odd, s, c));
    negate = xneg;
  }
  res = d.sel(negate, d.neg(res), res);
  Value* out = b.CreateFPTrunc(res, ty);
  // inf and NaN give NaN.
  return f.sel(b.CreateICmpUGE(ai, f.I(0x7f800000)), f.C(std::nan("")), out);
}

// f32 pow in double: exp(y log|x|) (its relative error, about 2^-45 for results in the float range,
// is far below a float ulp), then the sign and special cases of C's pow.
Value* pow_f32(llvm::IRBuilder<>& b, Value* x, Value* y) {
  Em f(b, x->getType());
  Value* mag = via_double(b, x, [&](Em& d, Value* xd) {
    Value* yd = b.CreateFPExt(y, d.type());
    return d.exp(d.mul(yd, d.log(d.fabs(xd))));
  });
  mag = f.sel(f.eq(f.fabs(x), f.C(1)), f.C(1), mag);  // (-1)^+-inf = 1
  return f.pow_signs(x, y, mag);
}

}  // namespace

bool has_math_approx(ScalarOp op, Type* element) {
  if (!element || (!element->isFloatTy() && !element->isDoubleTy())) return false;
  switch (op) {
    case ScalarOp::Exp:
    case ScalarOp::Exp2:
    case ScalarOp::Log:
    case ScalarOp::Log1p:
    case ScalarOp::Expm1:
    case ScalarOp::Tanh:
    case ScalarOp::Logistic:
    case ScalarOp::Erf:
    case ScalarOp::Erfc:
    case ScalarOp::Atan:
    case ScalarOp::Atan2:
    case ScalarOp::Asin:
    case ScalarOp::Acos:
    case ScalarOp::Sinh:
    case ScalarOp::Cosh:
    case ScalarOp::Asinh:
    case ScalarOp::Acosh:
    case ScalarOp::Atanh:
    case ScalarOp::Cbrt: return true;
    case ScalarOp::Pow: return true;
    case ScalarOp::Sin:
    case ScalarOp::Cos:
    case ScalarOp::Tan: return element->isFloatTy();  // f64 would need a Payne-Hanek reduction with ~1100 bits of 2/pi
    default: return false;
  }
}

Value* emit_math_approx(llvm::IRBuilder<>& b, ScalarOp op, llvm::ArrayRef<Value*> args) {
  if (args.empty() || size_t(scalar_op_info(op).arity) != args.size()) return nullptr;
  Type* ty = args[0]->getType();
  for (Value* a : args)
    if (a->getType() != ty) return nullptr;
  if (ty->isVectorTy() && !llvm::isa<llvm::FixedVectorType>(ty)) return nullptr;
  if (!has_math_approx(op, ty->getScalarType())) return nullptr;
  llvm::IRBuilderBase::FastMathFlagGuard guard(b);
  b.clearFastMathFlags();
  Em m(b, ty);
  Value* x = args[0];
  const bool f32 = !m.is_double();
  // Ops computed in double for f32 (the double code with the result rounded once).
  auto dbl = [&](auto fn) {
    if (!f32) return fn(m, x);
    return via_double(b, x, [&](Em& d, Value* xd) { return fn(d, xd); });
  };
  switch (op) {
    case ScalarOp::Exp:
      if (f32 && ty->isVectorTy() && b.GetInsertBlock()) return m.exp_f32_branching(x);
      return m.exp(x);
    case ScalarOp::Exp2: return m.exp2(x);
    case ScalarOp::Log: return m.log(x);
    case ScalarOp::Log1p: return m.log1p(x);
    case ScalarOp::Expm1: return m.expm1(x);
    case ScalarOp::Tanh: return m.tanh(x);
    case ScalarOp::Logistic: return m.logistic(x);
    case ScalarOp::Erf: return dbl([&](Em& e, Value* v) { return e.erf(v, f32, false); });
    case ScalarOp::Erfc: return dbl([&](Em& e, Value* v) { return e.erf(v, f32, true); });
    case ScalarOp::Atan: return m.atan(x);
    case ScalarOp::Atan2: return m.atan2(x, args[1]);
    case ScalarOp::Asin: return m.asin(x);
    case ScalarOp::Acos: return m.acos(x);
    case ScalarOp::Sinh: return dbl([](Em& e, Value* v) { return e.sinh(v); });
    case ScalarOp::Cosh: return dbl([](Em& e, Value* v) { return e.cosh(v); });
    case ScalarOp::Asinh: return dbl([](Em& e, Value* v) { return e.asinh(v); });
    case ScalarOp::Acosh: return dbl([](Em& e, Value* v) { return e.acosh(v); });
    case ScalarOp::Atanh: return dbl([](Em& e, Value* v) { return e.atanh(v); });
    case ScalarOp::Cbrt: return dbl([](Em& e, Value* v) { return e.cbrt(v); });
    case ScalarOp::Sin: return trig_f32(b, x, Trig::Sin);
    case ScalarOp::Cos: return trig_f32(b, x, Trig::Cos);
    case ScalarOp::Tan: return trig_f32(b, x, Trig::Tan);
    case ScalarOp::Pow: return f32 ? pow_f32(b, x, args[1]) : m.pow(x, args[1]);
    default: return nullptr;
  }
}

}  // namespace cjax::cpu
