// llvm_math: the inline, vectorizable approximations of the transcendental ops of the LLVM CPU
// backend. Each op is compiled the way the kernel generator uses it (a scalar loop
// `out[i] = op(in[i])` that the O3 loop vectorizer must vectorize), then checked against a
// higher-precision reference (f32: the C library's double function; f64: its long double one):
// every 64th f32 bit pattern (all 2^32 with CJAX_EXHAUSTIVE_MATH=1), a few million f64 inputs, dense
// sweeps around the interesting points, and the IEEE special values. The table of max ulp errors
// (and ns per element, jit vs libm) printed at the end goes into the release notes.
// Environment: CJAX_EXHAUSTIVE_MATH=1 (all f32 inputs; minutes per op), CJAX_MATH_OPS=exp,log (only
// these ops), CJAX_MATH_F64_SAMPLES=N (random f64 inputs per op and kind), CJAX_MATH_VERBOSE=1
// (worst inputs and vector widths).
#include <doctest/doctest.h>
#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "backends/cpu/llvm_jit.h"
#include "backends/cpu/llvm_math.h"

using namespace cjax;
using cjax::cpu::emit_math_approx;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- the ops under test, with their references and the error bounds this suite asserts ----
using Ref1 = long double (*)(long double);
using Ref2 = long double (*)(long double, long double);

long double ref_exp(long double x) { return expl(x); }
long double ref_exp2(long double x) { return exp2l(x); }
long double ref_log(long double x) { return logl(x); }
long double ref_log1p(long double x) { return log1pl(x); }
long double ref_expm1(long double x) { return expm1l(x); }
long double ref_tanh(long double x) { return tanhl(x); }
long double ref_logistic(long double x) { return 1.0L / (1.0L + expl(-x)); }
long double ref_erf(long double x) { return erfl(x); }
long double ref_erfc(long double x) { return erfcl(x); }
long double ref_sin(long double x) { return sinl(x); }
long double ref_cos(long double x) { return cosl(x); }
long double ref_tan(long double x) { return tanl(x); }
long double ref_asin(long double x) { return asinl(x); }
long double ref_acos(long double x) { return acosl(x); }
long double ref_atan(long double x) { return atanl(x); }
long double ref_sinh(long double x) { return sinhl(x); }
long double ref_cosh(long double x) { return coshl(x); }
long double ref_asinh(long double x) { return asinhl(x); }
long double ref_acosh(long double x) { return acoshl(x); }
long double ref_atanh(long double x) { return atanhl(x); }
long double ref_cbrt(long double x) { return cbrtl(x); }
long double ref_pow(long double x, long double y) { return powl(x, y); }
long double ref_atan2(long double y, long double x) { return atan2l(y, x); }

// The f32 references use the double functions (faster; the error of glibc's double functions is
// far below a float ulp).
double dref(ScalarOp op, double x, double y) {
  switch (op) {
    case ScalarOp::Exp: return std::exp(x);
    case ScalarOp::Exp2: return std::exp2(x);
    case ScalarOp::Log: return std::log(x);
    case ScalarOp::Log1p: return std::log1p(x);
    case ScalarOp::Expm1: return std::expm1(x);
    case ScalarOp::Tanh: return std::tanh(x);
    case ScalarOp::Logistic: return 1.0 / (1.0 + std::exp(-x));
    case ScalarOp::Erf: return std::erf(x);
    case ScalarOp::Erfc: return std::erfc(x);
    case ScalarOp::Sin: return std::sin(x);
    case ScalarOp::Cos: return std::cos(x);
    case ScalarOp::Tan: return std::tan(x);
    case ScalarOp::Asin: return std::asin(x);
    case ScalarOp::Acos: return std::acos(x);
    case ScalarOp::Atan: return std::atan(x);
    case ScalarOp::Sinh: return std::sinh(x);
    case ScalarOp::Cosh: return std::cosh(x);
    case ScalarOp::Asinh: return std::asinh(x);
    case ScalarOp::Acosh: return std::acosh(x);
    case ScalarOp::Atanh: return std::atanh(x);
    case ScalarOp::Cbrt: return std::cbrt(x);
    case ScalarOp::Pow: return std::pow(x, y);
    case ScalarOp::Atan2: return std::atan2(x, y);
    default: return kNaN;
  }
}

struct OpSpec {
  ScalarOp op;
  const char* name;
  Ref1 ref1;
  Ref2 ref2;
  // Asserted max ulp error (results in the normal range): what the approximations achieve (see the
  // table printed at the end) rounded up with a margin; the required bound is 4 ulp.
  double bound_f32, bound_f64;
  double lo, hi;  // a range of interesting finite inputs for random sampling
};

const OpSpec kOps[] = {
    {ScalarOp::Exp, "exp", ref_exp, nullptr, 1.5, 1, -750, 750},
    {ScalarOp::Exp2, "exp2", ref_exp2, nullptr, 1, 1, -1080, 1080},
    {ScalarOp::Log, "log", ref_log, nullptr, 1, 1, 0, 4},
    {ScalarOp::Log1p, "log1p", ref_log1p, nullptr, 2, 2, -1, 4},
    {ScalarOp::Expm1, "expm1", ref_expm1, nullptr, 2, 2, -40, 40},
    {ScalarOp::Tanh, "tanh", ref_tanh, nullptr, 2, 2, -10, 10},
    {ScalarOp::Logistic, "logistic", ref_logistic, nullptr, 3, 3, -750, 750},
    {ScalarOp::Erf, "erf", ref_erf, nullptr, 1, 2, -7, 7},
    {ScalarOp::Erfc, "erfc", ref_erfc, nullptr, 1, 4, -7, 28},
    {ScalarOp::Sin, "sin", ref_sin, nullptr, 1, 4, -10, 10},
    {ScalarOp::Cos, "cos", ref_cos, nullptr, 1, 4, -10, 10},
    {ScalarOp::Tan, "tan", ref_tan, nullptr, 1, 4, -10, 10},
    {ScalarOp::Asin, "asin", ref_asin, nullptr, 3, 3, -1, 1},
    {ScalarOp::Acos, "acos", ref_acos, nullptr, 2, 2, -1, 1},
    {ScalarOp::Atan, "atan", ref_atan, nullptr, 3, 3, -10, 10},
    {ScalarOp::Sinh, "sinh", ref_sinh, nullptr, 1, 2.5, -720, 720},
    {ScalarOp::Cosh, "cosh", ref_cosh, nullptr, 1, 2, -720, 720},
    {ScalarOp::Asinh, "asinh", ref_asinh, nullptr, 1, 2.5, -10, 10},
    {ScalarOp::Acosh, "acosh", ref_acosh, nullptr, 1, 3, 1, 10},
    {ScalarOp::Atanh, "atanh", ref_atanh, nullptr, 1, 2.5, -1, 1},
    {ScalarOp::Cbrt, "cbrt", ref_cbrt, nullptr, 1, 1, -10, 10},
    {ScalarOp::Pow, "pow", nullptr, ref_pow, 1, 3, -10, 10},
    {ScalarOp::Atan2, "atan2", nullptr, ref_atan2, 3, 3.5, -10, 10},
};

// Inputs worth a dense sweep for every op: switch points of the approximations, overflow and
// underflow thresholds, the edges of the domains.
const double kInteresting[] = {0,        1,         -1,        0.25,      -0.25,      0.5,       -0.5,       0.55,
                               -0.55,    0.75,      -0.75,     0.3465736, -0.3465736, 0.6931472, -0.6931472, 2,
                               88.72284, -87.33655, -103.9721, 89.41599,  128,        -126,      -149,       -150,
                               709.7827, -708.3964, -745.1332, 1024,      -1022,      -1074,     -1075,      9.01,
                               19.06,    10.05,     9.19,      26.55,     27.2,       3.92,      5.93,       17.3,
                               37.4,     -17.3,     -37.4,     0.84375,   1.25,       3.0,       4.0,        27.23,
                               -103.98,  -745.14,   103.98,    745.14};

// ---- JIT-compiled kernels ----
template <class T>
using Kernel1 = void (*)(const T*, T*, int64_t);
template <class T>
using Kernel2 = void (*)(const T*, const T*, T*, int64_t);

struct Compiled {
  std::shared_ptr<cpu::JitCode> code;
  std::map<std::string, void*> kernels;   // "exp_f32" -> address; absent: no inline version
  std::map<std::string, std::string> ir;  // optimized IR per kernel
};

std::string kernel_name(const char* op, bool dbl) { return std::string(op) + (dbl ? "_f64" : "_f32"); }

// void name(const T* in..., T* out, int64_t n) { for (i = 0; i < n; ++i) out[i] = op(in[i]...); }
bool build_loop(llvm::Module& m, const std::string& name, ScalarOp op, llvm::Type* t, int arity) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  std::vector<llvm::Type*> params(size_t(arity) + 1, b.getPtrTy());
  params.push_back(b.getInt64Ty());
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false),
                                    llvm::Function::ExternalLinkage, name, m);
  cpu::set_host_attributes(*fn);
  for (int a = 0; a <= arity; ++a) fn->addParamAttr(unsigned(a), llvm::Attribute::NoAlias);
  auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
  auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
  auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
  b.SetInsertPoint(entry);
  llvm::Value* n = fn->getArg(unsigned(arity) + 1);
  b.CreateCondBr(b.CreateICmpSGT(n, b.getInt64(0)), loop, exit);
  b.SetInsertPoint(loop);
  llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2);
  i->addIncoming(b.getInt64(0), entry);
  std::vector<llvm::Value*> xs;
  for (int a = 0; a < arity; ++a) xs.push_back(b.CreateLoad(t, b.CreateGEP(t, fn->getArg(unsigned(a)), i)));
  llvm::Value* y = emit_math_approx(b, op, xs);
  if (!y) {
    fn->eraseFromParent();
    return false;
  }
  b.CreateStore(y, b.CreateGEP(t, fn->getArg(unsigned(arity)), i));
  llvm::Value* next = b.CreateAdd(i, b.getInt64(1));
  i->addIncoming(next, b.GetInsertBlock());
  b.CreateCondBr(b.CreateICmpSLT(next, n), loop, exit);
  b.SetInsertPoint(exit);
  b.CreateRetVoid();
  return true;
}

// void name(const T* in..., T* out): out[0:W] = op(in[0:W]...) emitted directly on <W x T> values.
void build_vector(llvm::Module& m, const std::string& name, ScalarOp op, llvm::Type* t, int arity, unsigned w) {
  llvm::LLVMContext& ctx = m.getContext();
  llvm::IRBuilder<> b(ctx);
  std::vector<llvm::Type*> params(size_t(arity) + 1, b.getPtrTy());
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), params, false),
                                    llvm::Function::ExternalLinkage, name, m);
  cpu::set_host_attributes(*fn);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
  llvm::Type* vt = llvm::FixedVectorType::get(t, w);
  std::vector<llvm::Value*> xs;
  llvm::Align al(t->getPrimitiveSizeInBits() / 8);
  for (int a = 0; a < arity; ++a) xs.push_back(b.CreateAlignedLoad(vt, fn->getArg(unsigned(a)), al));
  llvm::Value* y = emit_math_approx(b, op, xs);
  REQUIRE(y != nullptr);
  REQUIRE(y->getType() == vt);
  b.CreateAlignedStore(y, fn->getArg(unsigned(arity)), al);
  b.CreateRetVoid();
}

int arity_of(ScalarOp op) { return scalar_op_info(op).arity; }

const Compiled& compiled() {
  static Compiled c = [] {
    Compiled out;
    llvm::LLVMContext ctx;
    auto m = std::make_unique<llvm::Module>("llvm_math_test", ctx);
    cpu::configure_for_host(*m);
    std::vector<std::string> names;
    for (const OpSpec& s : kOps) {
      for (bool dbl : {false, true}) {
        llvm::Type* t = dbl ? llvm::Type::getDoubleTy(ctx) : llvm::Type::getFloatTy(ctx);
        std::string name = kernel_name(s.name, dbl);
        if (!build_loop(*m, name, s.op, t, arity_of(s.op))) continue;
        names.push_back(name);
        build_vector(*m, name + "_vec", s.op, t, arity_of(s.op), dbl ? 4 : 8);
        names.push_back(name + "_vec");
      }
    }
    std::string err;
    llvm::raw_string_ostream es(err);
    if (llvm::verifyModule(*m, &es)) FAIL("invalid IR: " << err);
    auto obj = cpu::compile_to_object(*m);
    for (const std::string& name : names) {
      std::string s;
      llvm::raw_string_ostream os(s);
      m->getFunction(name)->print(os);
      out.ir[name] = s;
    }
    out.code = cpu::link_object(std::move(obj));
    for (const std::string& name : names) out.kernels[name] = out.code->lookup(name);
    return out;
  }();
  return c;
}

template <class T>
bool has_kernel(const OpSpec& s) {
  return compiled().kernels.count(kernel_name(s.name, std::is_same_v<T, double>)) != 0;
}

// Runs the loop kernel of `s` on in (and in2 for binary ops).
template <class T>
void run(const OpSpec& s, const T* in, const T* in2, T* out, int64_t n) {
  void* k = compiled().kernels.at(kernel_name(s.name, std::is_same_v<T, double>));
  if (arity_of(s.op) == 1)
    reinterpret_cast<Kernel1<T>>(k)(in, out, n);
  else
    reinterpret_cast<Kernel2<T>>(k)(in, in2, out, n);
}

// ---- error measurement ----
template <class T>
struct Traits;
template <>
struct Traits<float> {
  using Wide = double;  // reference precision
  static constexpr int kMant = 23, kEmin = -126;
};
template <>
struct Traits<double> {
  using Wide = long double;
  static constexpr int kMant = 52, kEmin = -1022;
};

template <class T>
struct Stats {
  double max_ulp = 0;  // over results whose reference is a normal number (or overflows)
  T worst_x = 0, worst_x2 = 0, worst_y = 0;
  double worst_ref = 0;
  double max_denormal_ulp = 0;  // over references below the smallest normal (denormal ulps)
  int64_t count = 0, bad = 0;   // bad: NaN / inf / denormal-tolerance mismatches
  T bad_x = 0, bad_x2 = 0, bad_y = 0;
  double bad_ref = 0;

  void merge(const Stats& o) {
    count += o.count;
    if (o.max_ulp > max_ulp) {
      max_ulp = o.max_ulp;
      worst_x = o.worst_x, worst_x2 = o.worst_x2, worst_y = o.worst_y, worst_ref = o.worst_ref;
    }
    max_denormal_ulp = std::max(max_denormal_ulp, o.max_denormal_ulp);
    if (o.bad && !bad) bad_x = o.bad_x, bad_x2 = o.bad_x2, bad_y = o.bad_y, bad_ref = o.bad_ref;
    bad += o.bad;
  }
};

template <class T>
void account(Stats<T>& st, T x, T x2, T y, typename Traits<T>::Wide r) {
  using W = typename Traits<T>::Wide;
  ++st.count;
  auto fail = [&] {
    if (!st.bad) st.bad_x = x, st.bad_x2 = x2, st.bad_y = y, st.bad_ref = double(r);
    ++st.bad;
  };
  if (std::isnan(r)) {
    if (!std::isnan(y)) fail();
    return;
  }
  if (std::isnan(y)) return fail();
  T rr = T(r);
  if (std::isinf(rr) || std::isinf(y)) {
    if (y == rr) return;
    // Near the overflow threshold: measure against the largest finite value's ulp.
    W yv = std::isinf(y) ? std::copysign(std::ldexp(W(1), std::numeric_limits<T>::max_exponent), W(y)) : W(y);
    W rv = std::isinf(r) ? std::copysign(std::ldexp(W(1), std::numeric_limits<T>::max_exponent), r) : r;
    double e =
        double(std::fabs(yv - rv) / std::ldexp(W(1), std::numeric_limits<T>::max_exponent - 1 - Traits<T>::kMant));
    if (e > 16) return fail();
    if (e > st.max_ulp) st.max_ulp = e, st.worst_x = x, st.worst_x2 = x2, st.worst_y = y, st.worst_ref = double(r);
    return;
  }
  W ar = std::fabs(r);
  int ex;
  if constexpr (std::is_same_v<W, double>)
    ex = int((std::bit_cast<uint64_t>(ar) >> 52) & 0x7ff) - 1023;  // fast path
  else
    ex = ar == 0 ? Traits<T>::kEmin : int(std::ilogb(ar));
  ex = std::max(ex, Traits<T>::kEmin);
  W ulp = std::ldexp(W(1), ex - Traits<T>::kMant);
  double e = double(std::fabs(W(y) - r) / ulp);
  if (ar < W(std::numeric_limits<T>::min())) {
    // Denormal (or zero) reference: absolute tolerance of the smallest normal.
    st.max_denormal_ulp = std::max(st.max_denormal_ulp, e);
    if (std::fabs(W(y) - r) > W(std::numeric_limits<T>::min())) fail();
    return;
  }
  if (e > st.max_ulp) st.max_ulp = e, st.worst_x = x, st.worst_x2 = x2, st.worst_y = y, st.worst_ref = double(r);
}

template <class T>
typename Traits<T>::Wide reference(const OpSpec& s, T x, T x2) {
  if constexpr (std::is_same_v<T, float>)
    return dref(s.op, double(x), double(x2));
  else
    return s.ref1 ? s.ref1(x) : s.ref2(x, x2);
}

// Evaluates `s` on inputs produced by gen(i) for i in [0, n) (i -> (x, x2)), on two threads.
template <class T, class Gen>
Stats<T> measure(const OpSpec& s, int64_t n, Gen gen) {
  constexpr int64_t kChunk = 1 << 16;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  Stats<T> total;
  auto worker = [&] {
    std::vector<T> in(kChunk), in2(kChunk), out(kChunk);
    Stats<T> st;
    for (;;) {
      int64_t start = next.fetch_add(kChunk);
      if (start >= n) break;
      int64_t len = std::min(kChunk, n - start);
      for (int64_t i = 0; i < len; ++i) {
        auto [a, c] = gen(start + i);
        in[size_t(i)] = a, in2[size_t(i)] = c;
      }
      run<T>(s, in.data(), in2.data(), out.data(), len);
      for (int64_t i = 0; i < len; ++i) {
        T x = in[size_t(i)], x2 = in2[size_t(i)];
        account<T>(st, x, x2, out[size_t(i)], reference<T>(s, x, x2));
      }
    }
    std::lock_guard lk(mu);
    total.merge(st);
  };
  std::thread t1(worker), t2(worker);
  t1.join(), t2.join();
  return total;
}

template <class T>
std::vector<T> sweep_inputs(const OpSpec& s, int per_point) {
  std::vector<T> v;
  auto around = [&](T p) {
    T lo = p, hi = p;
    for (int i = 0; i < per_point; ++i) {
      lo = std::nextafter(lo, T(-kInf)), hi = std::nextafter(hi, T(kInf));
      v.push_back(lo), v.push_back(hi);
    }
    v.push_back(p);
  };
  for (double p : kInteresting) around(T(p));
  // Denormal and tiny inputs, and wide logarithmic ranges.
  for (int e = std::numeric_limits<T>::min_exponent - std::numeric_limits<T>::digits;
       e < std::numeric_limits<T>::max_exponent; ++e) {
    for (T m : {T(1), T(1.3), T(1.7)}) v.push_back(std::ldexp(m, e)), v.push_back(-std::ldexp(m, e));
  }
  // Uniform over the interesting range.
  std::mt19937_64 rng(uint64_t(s.op) * 7919 + sizeof(T));
  std::uniform_real_distribution<double> u(s.lo, s.hi);
  for (int i = 0; i < 200000; ++i) v.push_back(T(u(rng)));
  return v;
}

struct Row {
  std::string name;
  double f32 = -1, f32_den = -1, f64 = -1, f64_den = -1;
  int64_t n32 = 0, n64 = 0;
  double ns32 = -1, libm32 = -1, ns64 = -1, libm64 = -1;  // ns per element
};
std::map<std::string, Row>& table() {
  static std::map<std::string, Row> t;
  return t;
}

template <class T>
void check_stats(const OpSpec& s, const Stats<T>& st, double bound) {
  constexpr bool dbl = std::is_same_v<T, double>;
  INFO(s.name << (dbl ? " f64" : " f32") << ": max " << st.max_ulp << " ulp at x=" << double(st.worst_x)
              << " x2=" << double(st.worst_x2) << " got " << double(st.worst_y) << " want " << st.worst_ref);
  INFO("mismatches " << st.bad << " first at x=" << double(st.bad_x) << " x2=" << double(st.bad_x2) << " got "
                     << double(st.bad_y) << " want " << st.bad_ref);
  CHECK(st.bad == 0);
  CHECK(st.max_ulp <= bound);
  if (std::getenv("CJAX_MATH_VERBOSE"))
    std::printf("%s %s: max %.4f ulp at x=%a x2=%a: got %a, want %a\n", s.name, dbl ? "f64" : "f32", st.max_ulp,
                double(st.worst_x), double(st.worst_x2), double(st.worst_y), st.worst_ref);
  Row& row = table()[s.name];
  row.name = s.name;
  (dbl ? row.f64 : row.f32) = st.max_ulp;
  (dbl ? row.f64_den : row.f32_den) = st.max_denormal_ulp;
  (dbl ? row.n64 : row.n32) = st.count;
}

// A loop calling the C library's function per element, as the kernel generator's fallback does.
template <class T>
void libm_loop(ScalarOp op, const T* a, const T* c, T* out, int64_t n) {
  constexpr bool f = std::is_same_v<T, float>;
  switch (op) {
#define CJAX_LIBM1(E, F32, F64)                                                              \
  case ScalarOp::E:                                                                          \
    for (int64_t i = 0; i < n; ++i) out[i] = f ? T(F32(float(a[i]))) : T(F64(double(a[i]))); \
    return;
#define CJAX_LIBM2(E, F32, F64)                                                           \
  case ScalarOp::E:                                                                       \
    for (int64_t i = 0; i < n; ++i)                                                       \
      out[i] = f ? T(F32(float(a[i]), float(c[i]))) : T(F64(double(a[i]), double(c[i]))); \
    return;
    CJAX_LIBM1(Exp, expf, exp)
    CJAX_LIBM1(Exp2, exp2f, exp2)
    CJAX_LIBM1(Log, logf, log)
    CJAX_LIBM1(Log1p, log1pf, log1p)
    CJAX_LIBM1(Expm1, expm1f, expm1)
    CJAX_LIBM1(Tanh, tanhf, tanh)
    CJAX_LIBM1(Erf, erff, erf)
    CJAX_LIBM1(Erfc, erfcf, erfc)
    CJAX_LIBM1(Sin, sinf, sin)
    CJAX_LIBM1(Cos, cosf, cos)
    CJAX_LIBM1(Tan, tanf, tan)
    CJAX_LIBM1(Asin, asinf, asin)
    CJAX_LIBM1(Acos, acosf, acos)
    CJAX_LIBM1(Atan, atanf, atan)
    CJAX_LIBM1(Sinh, sinhf, sinh)
    CJAX_LIBM1(Cosh, coshf, cosh)
    CJAX_LIBM1(Asinh, asinhf, asinh)
    CJAX_LIBM1(Acosh, acoshf, acosh)
    CJAX_LIBM1(Atanh, atanhf, atanh)
    CJAX_LIBM1(Cbrt, cbrtf, cbrt)
    CJAX_LIBM2(Pow, powf, pow)
    CJAX_LIBM2(Atan2, atan2f, atan2)
#undef CJAX_LIBM1
#undef CJAX_LIBM2
    case ScalarOp::Logistic:
      for (int64_t i = 0; i < n; ++i) out[i] = f ? T(1 / (1 + expf(-float(a[i])))) : T(1 / (1 + exp(-double(a[i]))));
      return;
    default: return;
  }
}

// ns per element of the jitted kernel and of a loop calling libm, on inputs of the op's range
// clipped to [-20, 20] (no denormal results: those cost a microcode assist); informational only.
template <class T>
void record_timing(const OpSpec& s) {
  constexpr int64_t n = 1 << 18;
  std::vector<T> in(n), in2(n), out(n);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(std::max(s.lo, -20.0), std::min(s.hi, 20.0)), v(-4, 4);  // no underflow
  for (int64_t i = 0; i < n; ++i)
    in[size_t(i)] = T(u(rng)), in2[size_t(i)] = T(s.op == ScalarOp::Pow ? v(rng) : u(rng));
  if (s.op == ScalarOp::Pow)
    for (T& x : in) x = std::fabs(x);
  auto best = [&](auto&& f) {
    double b = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      b = std::min(b, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
    }
    return b;
  };
  double jit = best([&] { run<T>(s, in.data(), in2.data(), out.data(), n); });
  double lib = best([&] { libm_loop<T>(s.op, in.data(), in2.data(), out.data(), n); });
  Row& row = table()[s.name];
  (std::is_same_v<T, double> ? row.ns64 : row.ns32) = jit;
  (std::is_same_v<T, double> ? row.libm64 : row.libm32) = lib;
}

void print_table() {
  std::printf("\nllvm_math: max error in ulp (results in the normal range; denormal results in denormal ulps)\n");
  std::printf("%-9s %8s %8s %11s %8s %8s %11s   %s\n", "op", "f32", "f32 den", "f32 inputs", "f64", "f64 den",
              "f64 inputs", "ns/element jit (libm): f32, f64");
  for (const OpSpec& s : kOps) {
    auto it = table().find(s.name);
    if (it == table().end()) continue;
    const Row& r = it->second;
    auto num = [](double v) { return v < 0 ? std::string("-") : std::to_string(v).substr(0, 6); };
    auto ns = [](double j, double l) {
      return j < 0 ? std::string("-") : std::to_string(j).substr(0, 5) + " (" + std::to_string(l).substr(0, 5) + ")";
    };
    std::printf("%-9s %8s %8s %11lld %8s %8s %11lld   %s, %s\n", s.name, num(r.f32).c_str(), num(r.f32_den).c_str(),
                (long long)r.n32, num(r.f64).c_str(), num(r.f64_den).c_str(), (long long)r.n64,
                ns(r.ns32, r.libm32).c_str(), ns(r.ns64, r.libm64).c_str());
  }
  std::fflush(stdout);
}

// CJAX_MATH_OPS=exp,log restricts the accuracy tests to some ops (e.g. for an exhaustive run).
bool selected(const OpSpec& s) {
  const char* e = std::getenv("CJAX_MATH_OPS");
  if (!e || !*e) return true;
  std::string list = std::string(",") + e + ",";
  return list.find(std::string(",") + s.name + ",") != std::string::npos;
}

bool exhaustive() {
  const char* e = std::getenv("CJAX_EXHAUSTIVE_MATH");
  return e && std::string(e) == "1";
}

// The accuracy sweeps are the release build's job; under ASan/UBSan (CI's second leg) they run
// the same code on a sample this many times smaller, which finds the same memory errors in a
// few seconds instead of five minutes.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kSanitizerThinning = 16;
#else
constexpr int64_t kSanitizerThinning = 1;
#endif

template <class T>
bool same(T got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == T(want) && std::signbit(got) == std::signbit(want);
}

// Runs `s` on the values as a long array (vector body and remainder loop) and checks each.
template <class T>
void check_special(const OpSpec& s, const std::vector<std::pair<double, double>>& cases) {
  std::vector<T> in, out;
  for (int rep = 0; rep < 37; ++rep)
    for (auto& c : cases) in.push_back(T(c.first));
  out.resize(in.size());
  run<T>(s, in.data(), in.data(), out.data(), int64_t(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& c = cases[i % cases.size()];
    INFO(s.name << (std::is_same_v<T, double> ? " f64" : " f32") << "(" << c.first << ") = " << double(out[i])
                << ", want " << c.second << " (element " << i << ")");
    CHECK(same(out[i], c.second));
  }
}

// Binary ops: (x, y, want) triples.
template <class T>
void check_special2(const OpSpec& s, const std::vector<std::array<double, 3>>& cases) {
  std::vector<T> a, c, out;
  for (int rep = 0; rep < 37; ++rep)
    for (auto& t : cases) a.push_back(T(t[0])), c.push_back(T(t[1]));
  out.resize(a.size());
  run<T>(s, a.data(), c.data(), out.data(), int64_t(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& t = cases[i % cases.size()];
    INFO(s.name << (std::is_same_v<T, double> ? " f64" : " f32") << "(" << t[0] << ", " << t[1]
                << ") = " << double(out[i]) << ", want " << t[2] << " (element " << i << ")");
    CHECK(same(out[i], t[2]));
  }
}

const OpSpec& spec(ScalarOp op) {
  for (const OpSpec& s : kOps)
    if (s.op == op) return s;
  throw std::runtime_error("no spec");
}

}  // namespace

TEST_CASE("llvm_math: every scalar loop is vectorized and calls nothing") {
  const Compiled& c = compiled();
  std::regex vec_type(R"(<(\d+) x (float|double)>)");
  for (const OpSpec& s : kOps) {
    for (bool dbl : {false, true}) {
      std::string name = kernel_name(s.name, dbl);
      if (!c.kernels.count(name)) continue;
      const std::string& ir = c.ir.at(name);
      INFO(name << " optimized IR:\n" << ir);
      unsigned widest = 0;
      for (auto it = std::sregex_iterator(ir.begin(), ir.end(), vec_type); it != std::sregex_iterator(); ++it)
        widest = std::max(widest, unsigned(std::stoul((*it)[1].str())));
      CHECK(widest >= 4);
      if (std::getenv("CJAX_MATH_VERBOSE")) std::printf("%s: vectorized with <%u x ...>\n", name.c_str(), widest);
      // Only intrinsics are called.
      std::regex call(R"(call [^@]*@([A-Za-z0-9_.]+))");
      for (auto it = std::sregex_iterator(ir.begin(), ir.end(), call); it != std::sregex_iterator(); ++it)
        CHECK((*it)[1].str().rfind("llvm.", 0) == 0);
    }
  }
  // The required ops have inline versions for both types.
  for (const char* op : {"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc"}) {
    CHECK(c.kernels.count(kernel_name(op, false)));
    CHECK(c.kernels.count(kernel_name(op, true)));
  }
  // Types without an inline version.
  llvm::LLVMContext ctx;
  llvm::Module m("t", ctx);
  llvm::IRBuilder<> b(ctx);
  auto* fn = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {b.getHalfTy()}, false),
                                    llvm::Function::ExternalLinkage, "h", m);
  b.SetInsertPoint(llvm::BasicBlock::Create(ctx, "entry", fn));
  CHECK(emit_math_approx(b, ScalarOp::Exp, {fn->getArg(0)}) == nullptr);
  CHECK(emit_math_approx(b, ScalarOp::Add, {fn->getArg(0), fn->getArg(0)}) == nullptr);
}

TEST_CASE("llvm_math: vector operands give the same results as the vectorized scalar loop") {
  const Compiled& c = compiled();
  std::mt19937 rng(7);
  for (const OpSpec& s : kOps) {
    for (bool dbl : {false, true}) {
      std::string name = kernel_name(s.name, dbl);
      if (!c.kernels.count(name)) continue;
      auto check = [&](auto zero) {
        using T = decltype(zero);
        constexpr unsigned w = std::is_same_v<T, double> ? 4 : 8;
        std::uniform_real_distribution<double> u(s.lo, s.hi);
        T in[w], in2[w], out[w], ref[w];
        for (int trial = 0; trial < 64; ++trial) {
          for (unsigned i = 0; i < w; ++i) in[i] = T(u(rng)), in2[i] = T(u(rng));
          if (trial == 0) in[0] = T(kNaN), in[1] = T(kInf), in[2] = T(-kInf), in[3] = T(-0.0);
          run<T>(s, in, in2, ref, w);
          void* vk = c.kernels.at(name + "_vec");
          if (arity_of(s.op) == 1)
            reinterpret_cast<void (*)(const T*, T*)>(vk)(in, out);
          else
            reinterpret_cast<void (*)(const T*, const T*, T*)>(vk)(in, in2, out);
          for (unsigned i = 0; i < w; ++i) {
            INFO(name << "(" << double(in[i]) << ")");
            CHECK((std::memcmp(&out[i], &ref[i], sizeof(T)) == 0 || (std::isnan(out[i]) && std::isnan(ref[i]))));
          }
        }
      };
      if (dbl)
        check(0.0);
      else
        check(0.0f);
    }
  }
}

// f32 exp on vector operands branches: vectors whose lanes are all in [-80, 80] or below -103.98
// take a short path, others the full one. Both must give the loop's results bit for bit; every 64th
// bit pattern in order (nearly all vectors uniform: both paths) and shuffled (mixed vectors).
TEST_CASE("llvm_math: f32 exp on 16-lane vectors matches the loop bit for bit on both of its paths") {
  llvm::LLVMContext ctx;
  auto m = std::make_unique<llvm::Module>("exp16", ctx);
  cpu::configure_for_host(*m);
  build_vector(*m, "exp16", ScalarOp::Exp, llvm::Type::getFloatTy(ctx), 1, 16);
  std::string ir;
  llvm::raw_string_ostream os(ir);
  m->print(os, nullptr);
  CHECK(ir.find("exp.rare") != std::string::npos);
  auto code = cpu::link_object(cpu::compile_to_object(*m));
  auto exp16 = reinterpret_cast<void (*)(const float*, float*)>(code->lookup("exp16"));
  const int64_t n = (int64_t(1) << 32) / 64;
  std::vector<float> in(static_cast<size_t>(n)), want(in.size()), got(in.size());
  for (int64_t i = 0; i < n; ++i) in[size_t(i)] = std::bit_cast<float>(uint32_t(i * 64 + (i >> 6) % 64));
  for (int shuffled = 0; shuffled < 2; ++shuffled) {
    if (shuffled) std::shuffle(in.begin(), in.end(), std::mt19937(5));
    run<float>(spec(ScalarOp::Exp), in.data(), in.data(), want.data(), n);
    int64_t common = 0, rare = 0, bad = 0;
    for (int64_t v = 0; v < n; v += 16) {
      bool all = true;
      for (int64_t i = v; i < v + 16; ++i) all = all && (std::fabs(in[size_t(i)]) < 80 || in[size_t(i)] < -103.98f);
      ++(all ? common : rare);
      exp16(&in[size_t(v)], &got[size_t(v)]);
    }
    for (int64_t i = 0; i < n && bad < 5; ++i)
      if (std::memcmp(&got[size_t(i)], &want[size_t(i)], 4) != 0 &&
          !(std::isnan(got[size_t(i)]) && std::isnan(want[size_t(i)]))) {
        ++bad;
        FAIL_CHECK("exp(" << in[size_t(i)] << ") = " << got[size_t(i)] << " on vectors, " << want[size_t(i)]
                          << " in the loop");
      }
    CHECK(common > 1000);
    CHECK(rare > 1000);
  }
}

TEST_CASE("llvm_math: special values match C/IEEE libm") {
  const double tiny32 = 0x1p-149, tiny64 = 0x1p-1074;
  for (bool dbl : {false, true}) {
    double tiny = dbl ? tiny64 : tiny32;
    double big = dbl ? 1e300 : 1e38;
    std::vector<std::pair<ScalarOp, std::vector<std::pair<double, double>>>> cases = {
        {ScalarOp::Exp,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, 0},
          {0, 1},
          {-0.0, 1},
          {1000, kInf},
          {-1000, 0},
          {dbl ? 710 : 89, kInf},
          {dbl ? -746 : -104, 0},
          {tiny, 1}}},
        {ScalarOp::Exp2,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, 0},
          {0, 1},
          {1, 2},
          {10, 1024},
          {-1, 0.5},
          {dbl ? 1024 : 128, kInf},
          {dbl ? -1074 : -149, tiny},
          {dbl ? -1076 : -151, 0},
          {dbl ? -1022 : -126, dbl ? 0x1p-1022 : 0x1p-126},
          {dbl ? 1023 : 127, dbl ? 0x1p1023 : 0x1p127}}},
        {ScalarOp::Log,
         {{kNaN, kNaN}, {kInf, kInf}, {-kInf, kNaN}, {0, -kInf}, {-0.0, -kInf}, {1, 0}, {-1, kNaN}, {-tiny, kNaN}}},
        {ScalarOp::Log1p,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, kNaN},
          {-1, -kInf},
          {-2, kNaN},
          {0, 0},
          {-0.0, -0.0},
          {tiny, tiny},
          {-tiny, -tiny}}},
        {ScalarOp::Expm1,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, -1},
          {0, 0},
          {-0.0, -0.0},
          {1000, kInf},
          {-1000, -1},
          {tiny, tiny},
          {-tiny, -tiny}}},
        {ScalarOp::Tanh,
         {{kNaN, kNaN},
          {kInf, 1},
          {-kInf, -1},
          {0, 0},
          {-0.0, -0.0},
          {1000, 1},
          {-1000, -1},
          {big, 1},
          {-big, -1},
          {30, 1},
          {-30, -1},
          {tiny, tiny},
          {-tiny, -tiny}}},
        {ScalarOp::Logistic,
         {{kNaN, kNaN}, {kInf, 1}, {-kInf, 0}, {0, 0.5}, {-0.0, 0.5}, {1000, 1}, {-1000, 0}, {big, 1}, {-big, 0}}},
        {ScalarOp::Erf,
         {{kNaN, kNaN}, {kInf, 1}, {-kInf, -1}, {0, 0}, {-0.0, -0.0}, {10, 1}, {-10, -1}, {big, 1}, {-big, -1}}},
        {ScalarOp::Erfc,
         {{kNaN, kNaN}, {kInf, 0}, {-kInf, 2}, {0, 1}, {-0.0, 1}, {30, 0}, {1000, 0}, {big, 0}, {-30, 2}, {-big, 2}}},
    };
    const double pi = dbl ? M_PI : double(float(M_PI)), pio2 = dbl ? M_PI_2 : double(float(M_PI_2));
    const double pio4 = dbl ? M_PI_4 : double(float(M_PI_4));
    const double tpio4 = dbl ? 3 * M_PI_4 : double(float(3 * M_PI_4));
    std::vector<std::pair<ScalarOp, std::vector<std::pair<double, double>>>> more = {
        {ScalarOp::Sin,
         {{kNaN, kNaN}, {kInf, kNaN}, {-kInf, kNaN}, {0, 0}, {-0.0, -0.0}, {tiny, tiny}, {-tiny, -tiny}}},
        {ScalarOp::Cos, {{kNaN, kNaN}, {kInf, kNaN}, {-kInf, kNaN}, {0, 1}, {-0.0, 1}, {tiny, 1}}},
        {ScalarOp::Tan, {{kNaN, kNaN}, {kInf, kNaN}, {-kInf, kNaN}, {0, 0}, {-0.0, -0.0}, {tiny, tiny}}},
        {ScalarOp::Asin,
         {{kNaN, kNaN},
          {kInf, kNaN},
          {1.5, kNaN},
          {-1.5, kNaN},
          {0, 0},
          {-0.0, -0.0},
          {1, pio2},
          {-1, -pio2},
          {tiny, tiny}}},
        {ScalarOp::Acos, {{kNaN, kNaN}, {kInf, kNaN}, {1.5, kNaN}, {-1.5, kNaN}, {1, 0}, {-1, pi}, {0, pio2}}},
        {ScalarOp::Atan,
         {{kNaN, kNaN}, {kInf, pio2}, {-kInf, -pio2}, {0, 0}, {-0.0, -0.0}, {1, pio4}, {big, pio2}, {tiny, tiny}}},
        {ScalarOp::Sinh,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, -kInf},
          {0, 0},
          {-0.0, -0.0},
          {1000, kInf},
          {-1000, -kInf},
          {tiny, tiny}}},
        {ScalarOp::Cosh, {{kNaN, kNaN}, {kInf, kInf}, {-kInf, kInf}, {0, 1}, {-0.0, 1}, {1000, kInf}, {-1000, kInf}}},
        {ScalarOp::Asinh, {{kNaN, kNaN}, {kInf, kInf}, {-kInf, -kInf}, {0, 0}, {-0.0, -0.0}, {tiny, tiny}}},
        {ScalarOp::Acosh, {{kNaN, kNaN}, {kInf, kInf}, {-kInf, kNaN}, {1, 0}, {0.5, kNaN}, {0, kNaN}, {-1, kNaN}}},
        {ScalarOp::Atanh,
         {{kNaN, kNaN},
          {kInf, kNaN},
          {0, 0},
          {-0.0, -0.0},
          {1, kInf},
          {-1, -kInf},
          {2, kNaN},
          {-2, kNaN},
          {tiny, tiny}}},
        {ScalarOp::Cbrt,
         {{kNaN, kNaN},
          {kInf, kInf},
          {-kInf, -kInf},
          {0, 0},
          {-0.0, -0.0},
          {-8, -2},
          {27, 3},
          {0.125, 0.5},
          {dbl ? 0x1p-1074 : 0x1p-149, dbl ? 0x1p-358 : 0x1.428a3p-50}}},
    };
    for (auto& c : more) cases.push_back(c);
    for (auto& [op, cs] : cases) {
      const OpSpec& s = spec(op);
      if (dbl ? !has_kernel<double>(s) : !has_kernel<float>(s)) continue;
      if (dbl)
        check_special<double>(s, cs);
      else
        check_special<float>(s, cs);
    }
    // C's pow: every special case of C99 F.9.4.4, and negative bases with integral exponents.
    const double maxexp = dbl ? 1024 : 128;
    // clang-format off
    std::vector<std::array<double, 3>> pow_cases = {
        {kNaN, 0, 1}, {kNaN, -0.0, 1}, {1, kNaN, 1}, {1, kInf, 1}, {-1, kInf, 1},
        {-1, -kInf, 1}, {kNaN, 1, kNaN}, {2, kNaN, kNaN}, {-1, kNaN, kNaN}, {0, -3, kInf},
        {-0.0, -3, -kInf}, {0, -2, kInf}, {-0.0, -2, kInf}, {-0.0, -0.5, kInf}, {0, -kInf, kInf},
        {-0.0, -kInf, kInf}, {0, 3, 0}, {-0.0, 3, -0.0}, {-0.0, 2, 0}, {-0.0, 0.5, 0},
        {0, kInf, 0}, {0.5, -kInf, kInf}, {-0.5, -kInf, kInf}, {2, -kInf, 0}, {-2, -kInf, 0},
        {0.5, kInf, 0}, {-0.5, kInf, 0}, {2, kInf, kInf}, {-2, kInf, kInf}, {-kInf, -3, -0.0},
        {-kInf, -2, 0}, {-kInf, -0.5, 0}, {-kInf, 3, -kInf}, {-kInf, 2, kInf}, {-kInf, 0.5, kInf},
        {kInf, -1, 0}, {kInf, 0.5, kInf}, {kInf, 0, 1}, {-2, 0.5, kNaN}, {-8, 1.0 / 3, kNaN},
        {-2, 3, -8}, {-2, 2, 4}, {-2, -1, -0.5}, {-3, 3, -27}, {2, 10, 1024},
        {2, maxexp, kInf}, {-2, maxexp + 1, -kInf}, {2, dbl ? -1074.0 : -149.0, tiny},
        {-2, dbl ? -1074.0 : -149.0, dbl ? tiny : -tiny}, {-2, dbl ? -1073.0 : -147.0, dbl ? -0x1p-1073 : -0x1p-147},
        {2, dbl ? -1076.0 : -151.0, 0}, {10, 2, 100}, {3, 4, 81}, {-0.5, 3, -0.125}, {4, 0.5, 2},
        {big, 2, kInf}, {big, -2, 0}, {-big, 3, -kInf}, {0.5, 1e30, 0}, {1.0000001, 1e30, kInf}
    };
    // clang-format on
    if (has_kernel<double>(spec(ScalarOp::Pow)) || !dbl) {
      if (dbl)
        check_special2<double>(spec(ScalarOp::Pow), pow_cases);
      else
        check_special2<float>(spec(ScalarOp::Pow), pow_cases);
    }
    // clang-format off
    std::vector<std::array<double, 3>> atan2_cases = {
        {0, 0, 0}, {-0.0, 0, -0.0}, {0, -0.0, pi}, {-0.0, -0.0, -pi}, {0, -1, pi},
        {-0.0, -1, -pi}, {0, 1, 0}, {-0.0, 1, -0.0}, {-1, 0, -pio2}, {-1, -0.0, -pio2},
        {1, 0, pio2}, {1, -0.0, pio2}, {1, -kInf, pi}, {-1, -kInf, -pi}, {1, kInf, 0},
        {-1, kInf, -0.0}, {kInf, 1, pio2}, {-kInf, 1, -pio2}, {kInf, -1, pio2}, {kInf, -kInf, tpio4},
        {-kInf, -kInf, -tpio4}, {kInf, kInf, pio4}, {-kInf, kInf, -pio4}, {kNaN, 1, kNaN}, {1, kNaN, kNaN},
        {kNaN, kNaN, kNaN}, {1, 1, pio4}, {-1, -1, -tpio4}, {tiny, 1, tiny}, {big, tiny, pio2}
    };
    // clang-format on
    if (dbl)
      check_special2<double>(spec(ScalarOp::Atan2), atan2_cases);
    else
      check_special2<float>(spec(ScalarOp::Atan2), atan2_cases);
  }
  // Tiny arguments keep their relative accuracy.
  std::vector<float> xf = {1e-10f, -1e-10f, 1e-30f, 3e-39f};
  std::vector<double> xd = {1e-10, -1e-10, 1e-200, 1e-310};
  for (ScalarOp op : {ScalarOp::Expm1, ScalarOp::Log1p, ScalarOp::Tanh, ScalarOp::Erf}) {
    const OpSpec& s = spec(op);
    std::vector<float> of(xf.size());
    std::vector<double> od(xd.size());
    run<float>(s, xf.data(), xf.data(), of.data(), int64_t(xf.size()));
    run<double>(s, xd.data(), xd.data(), od.data(), int64_t(xd.size()));
    for (size_t i = 0; i < xf.size(); ++i) {
      INFO(s.name << "(" << xf[i] << ") = " << of[i] << ", " << s.name << "(" << xd[i] << ") = " << od[i]);
      CHECK(std::fabs(of[i] - float(dref(op, xf[i], 0))) <= std::fabs(float(dref(op, xf[i], 0))) * 4e-7f);
      CHECK(std::fabs(od[i] - double(s.ref1(xd[i]))) <= std::fabs(double(s.ref1(xd[i]))) * 8e-16);
    }
  }
}

TEST_CASE("llvm_math: f32 accuracy (every 64th bit pattern, or all with CJAX_EXHAUSTIVE_MATH=1)") {
  const int64_t stride = exhaustive() ? 1 : 64 * kSanitizerThinning;
  for (const OpSpec& s : kOps) {
    if (!has_kernel<float>(s) || arity_of(s.op) != 1 || !selected(s)) continue;
    Stats<float> st = measure<float>(s, (int64_t(1) << 32) / stride, [&](int64_t i) {
      return std::pair{std::bit_cast<float>(uint32_t(i * stride + (stride > 1 ? (i >> 6) % stride : 0))), 0.0f};
    });
    std::vector<float> sw = sweep_inputs<float>(s, 4096);
    st.merge(measure<float>(s, int64_t(sw.size()), [&](int64_t i) { return std::pair{sw[size_t(i)], 0.0f}; }));
    check_stats(s, st, s.bound_f32);
    record_timing<float>(s);
  }
}

// Inputs of the binary ops: random bit patterns, uniform samples, and for pow bases near 1 with
// large exponents, negative bases with integral exponents, results near overflow and underflow.
template <class T>
std::vector<std::pair<T, T>> binary_inputs(const OpSpec& s, int n) {
  using U = std::conditional_t<std::is_same_v<T, float>, uint32_t, uint64_t>;
  std::mt19937_64 rng(uint64_t(s.op) * 31 + sizeof(T));
  auto bits = [&] { return std::bit_cast<T>(U(rng())); };
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<std::pair<T, T>> v;
  const double maxlog = std::is_same_v<T, float> ? 89 : 710;
  for (int i = 0; i < n; ++i) {
    if (s.op == ScalarOp::Atan2) {
      T y = bits(), x = bits();
      if (i % 4 == 1) y = T(u(rng) * 100), x = T(u(rng) * 100);
      if (i % 4 == 2) y = T(u(rng)), x = T(y * T(1 + u(rng) * 1e-3));  // ratio near 1
      if (i % 4 == 3) y = T(std::ldexp(u(rng), int(u(rng) * 60))), x = T(std::ldexp(u(rng), int(u(rng) * 60)));
      v.push_back({y, x});
      continue;
    }
    T x, y;
    switch (i % 6) {
      case 0: x = std::fabs(bits()), y = T(u(rng) * 8); break;
      case 1: x = T(std::exp(u(rng) * 8)), y = T(u(rng) * maxlog); break;           // results of all sizes
      case 2: x = T(1 + u(rng) * 1e-3), y = T(u(rng) * maxlog * 1e3); break;        // base near 1
      case 3: x = T(-std::exp(u(rng) * 3)), y = T(std::round(u(rng) * 60)); break;  // negative base
      case 4: {  // results near the overflow and underflow thresholds
        x = T(std::exp(u(rng) * 5));
        double target = (u(rng) > 0 ? 1 : -1) * (maxlog + u(rng) * 20);
        y = T(target / std::log(double(x)));
        break;
      }
      default: x = bits(), y = bits(); break;
    }
    v.push_back({x, y});
  }
  return v;
}

TEST_CASE("llvm_math: binary ops accuracy") {
  for (ScalarOp op : {ScalarOp::Pow, ScalarOp::Atan2}) {
    const OpSpec& s = spec(op);
    if (!selected(s)) continue;
    if (has_kernel<float>(s)) {
      auto in = binary_inputs<float>(s, exhaustive() ? 200000000 : int(4000000 / kSanitizerThinning));
      Stats<float> st = measure<float>(s, int64_t(in.size()), [&](int64_t i) { return in[size_t(i)]; });
      check_stats(s, st, s.bound_f32);
      record_timing<float>(s);
    }
    if (has_kernel<double>(s)) {
      auto in = binary_inputs<double>(s, int(2000000 / kSanitizerThinning));
      Stats<double> st = measure<double>(s, int64_t(in.size()), [&](int64_t i) { return in[size_t(i)]; });
      check_stats(s, st, s.bound_f64);
      record_timing<double>(s);
    }
  }
}

TEST_CASE("llvm_math: f64 accuracy (random and structured inputs)") {
  // CJAX_MATH_F64_SAMPLES: random inputs per op and kind (default 1e6).
  const char* env = std::getenv("CJAX_MATH_F64_SAMPLES");
  const int64_t f64_samples = env && *env ? std::atoll(env) : 1000000 / kSanitizerThinning;
  for (const OpSpec& s : kOps) {
    if (!has_kernel<double>(s) || arity_of(s.op) != 1 || !selected(s)) continue;
    // Random bit patterns (every magnitude), uniform samples of the interesting range, sweeps.
    std::mt19937_64 rng(uint64_t(s.op) + 1);
    std::vector<double> in;
    for (int64_t i = 0; i < f64_samples; ++i) in.push_back(std::bit_cast<double>(rng()));
    std::uniform_real_distribution<double> u(s.lo, s.hi);
    for (int64_t i = 0; i < f64_samples; ++i) in.push_back(u(rng));
    std::vector<double> sw = sweep_inputs<double>(s, 2048);
    in.insert(in.end(), sw.begin(), sw.end());
    Stats<double> st = measure<double>(s, int64_t(in.size()), [&](int64_t i) { return std::pair{in[size_t(i)], 0.0}; });
    check_stats(s, st, s.bound_f64);
    record_timing<double>(s);
  }
  print_table();
}
