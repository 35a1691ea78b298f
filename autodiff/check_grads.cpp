#include "autodiff/check_grads.h"

#include <fmt/format.h>

#include <cmath>

#include "autodiff/ad.h"
#include "cjax/numpy.h"
#include "cjax/random.h"

namespace cjax {
namespace {

using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

struct Ctx {
  CheckGradsOptions opts;
  uint64_t next_key = 1;
  Array random_like(const Array& x) {
    Array k = random::key(opts.seed * 7919 + next_key++);
    DType dt = x.dtype() == f64 ? f64 : f32;
    return random::normal(k, x.shape(), dt).astype(x.dtype());
  }
};

bool low_precision(std::span<const Array> xs) {
  for (const Array& x : xs)
    if (is_floating(x.dtype()) && x.dtype() != f64) return true;
  return false;
}

double inner(std::span<const Array> a, std::span<const Array> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!is_floating(a[i].dtype())) continue;
    auto x = a[i].astype(f64).to_vector<double>(), y = b[i].astype(f64).to_vector<double>();
    for (size_t j = 0; j < x.size(); ++j) s += x[j] * y[j];
  }
  return s;
}

void check_close(const Array& got, const Array& want, double tol, const std::string& what) {
  auto g = got.astype(f64).to_vector<double>(), w = want.astype(f64).to_vector<double>();
  if (g.size() != w.size())
    throw Error(fmt::format("check_grads {}: sizes differ ({} vs {})", what, g.size(), w.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(w[i])) continue;
    if (!(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i]))))
      throw Error(fmt::format("check_grads {}: element {} is {} but the numerical value is {} (tolerance {})", what, i,
                              g[i], w[i], tol));
  }
}

void check_jvp(Ctx& c, const Fn& f, const std::vector<Array>& args, double eps, double tol, int order) {
  std::vector<Array> v;
  for (const Array& a : args) v.push_back(is_floating(a.dtype()) ? c.random_like(a) : Array());
  JvpResult r = jvp_flat(f, args, v);
  std::vector<Array> plus, minus;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!v[i].defined()) {
      plus.push_back(args[i]);
      minus.push_back(args[i]);
      continue;
    }
    Array step = (v[i].astype(f64) * eps);
    plus.push_back((args[i].astype(f64) + step).astype(args[i].dtype()));
    minus.push_back((args[i].astype(f64) - step).astype(args[i].dtype()));
  }
  std::vector<Array> fp = f(plus), fm = f(minus);
  for (size_t j = 0; j < fp.size(); ++j) {
    if (!is_floating(fp[j].dtype())) continue;
    Array numeric = (fp[j].astype(f64) - fm[j].astype(f64)) / (2 * eps);
    check_close(r.tangents_out[j], numeric, tol, fmt::format("JVP (order {}) of output {}", order, j));
  }
}

void check_vjp(Ctx& c, const Fn& f, const std::vector<Array>& args, double tol, int order) {
  std::vector<Array> v;
  for (const Array& a : args) v.push_back(is_floating(a.dtype()) ? c.random_like(a) : Array());
  JvpResult jr = jvp_flat(f, args, v);
  VjpResult vr = vjp_flat(f, args);
  std::vector<Array> u;
  for (const Array& o : vr.primals_out) u.push_back(is_floating(o.dtype()) ? c.random_like(o) : Array());
  std::vector<Array> w = vr.backward(u);
  std::vector<Array> vv;
  for (size_t i = 0; i < v.size(); ++i) vv.push_back(v[i].defined() ? v[i] : w[i]);
  std::vector<Array> uu;
  for (size_t i = 0; i < u.size(); ++i) uu.push_back(u[i].defined() ? u[i] : jr.tangents_out[i]);
  double lhs = inner(jr.tangents_out, uu), rhs = inner(vv, w);
  if (!(std::abs(lhs - rhs) <= tol * (1 + std::abs(lhs))))
    throw Error(
        fmt::format("check_grads VJP (order {}): dot-product test failed: <jvp v, u> = {} but <v, vjp u> = {} "
                    "(tolerance {})",
                    order, lhs, rhs, tol));
}

void check_rec(Ctx& c, const Fn& f, const std::vector<Array>& args, int order, int level) {
  bool low = low_precision(args);
  double eps = c.opts.eps > 0 ? c.opts.eps : (low ? 2e-2 : 1e-4);
  double tol = c.opts.atol > 0 ? c.opts.atol : (low ? 5e-2 : 1e-5);
  if (c.opts.fwd) {
    check_jvp(c, f, args, eps, tol, level);
    if (order > 1) {
      std::vector<Array> v;
      for (const Array& a : args) v.push_back(is_floating(a.dtype()) ? c.random_like(a) : Array());
      Fn g = [f, v](const std::vector<Array>& xs) { return jvp_flat(f, xs, v).tangents_out; };
      check_rec(c, g, args, order - 1, level + 1);
    }
  }
  if (c.opts.rev) {
    check_vjp(c, f, args, tol, level);
    if (order > 1) {
      std::vector<Array> outs = f(args);
      std::vector<Array> u;
      for (const Array& o : outs) u.push_back(is_floating(o.dtype()) ? c.random_like(o) : Array());
      Fn g = [f, u](const std::vector<Array>& xs) { return vjp_flat(f, xs).backward(u); };
      check_rec(c, g, args, order - 1, level + 1);
    }
  }
}

}  // namespace

void check_grads(const Fn& f, const std::vector<Array>& args, const CheckGradsOptions& opts) {
  Ctx c{opts};
  check_rec(c, f, args, opts.order, 1);
}

}  // namespace cjax
