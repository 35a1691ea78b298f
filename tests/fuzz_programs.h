// Random straight-line programs for the differential fuzz test (tests/test_fuzz.cpp).
//
// A program is a list of ops over a growing pool of values: the inputs first, then one value per
// op. It is generated against three concrete input sets at once (the examples vmap will batch):
// every op is evaluated eagerly while generating, so its shape and value preconditions are
// decided from real values, identically for the three sets. Non-smooth ops (abs, maximum,
// where, max-reductions, sort) are only emitted where their inputs are at least `kMargin` away
// from a kink or tie, so eager, jit, vmap and finite differences all take the same branch.
// Domain-restricted ops (log, sqrt, exp, division, pow) use the plain formula when the values
// allow it and a squashed operand (softplus, tanh) otherwise; the choice is part of the op.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cjax/cjax.h"
#include "cjax/control_flow.h"

namespace cjax::fuzz {

namespace jnp = cjax::numpy;

// Distance kept from kinks and ties (finite differences in check_grads use eps = 1e-4).
inline constexpr double kMargin = 2e-2;
// Largest magnitude a value may reach (keeps exp/pow chains finite and tolerances meaningful).
inline constexpr double kMaxMagnitude = 1e2;

enum class Kind {
  Sin,
  Cos,
  Tanh,
  Exp,
  Log,
  Logistic,
  Sqrt,
  Square,
  Abs,
  Neg,
  IntPow,
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  Sum,
  Mean,
  Max,
  Reshape,
  Transpose,
  ExpandDims,
  Squeeze,
  Slice,
  Concatenate,
  Stack,
  Dot,
  Matmul,
  Einsum,
  Where,
  Softmax,
  LogSoftmax,
  Logsumexp,
  Cumsum,
  Sort,
  Take,
  AtAdd,
  Min,
  Prod,
  Var,
  Clip,
  Flip,
  Roll,
  Pad,
  Tile,
  BroadcastTo,
  TakeAlongArgmax,
  AtSet,
  AtMul,
  Cumprod,
  Cummax,
  TopK,
  DynamicSlice,
  Split,
  Cond,
  Switch,
  ForiLoop,
  Scan,
  Astype,
  Count
};

inline const char* kind_name(Kind k) {
  static const char* names[] =
      {"sin",     "cos",       "tanh",        "exp",         "log",     "logistic",      "sqrt",
       "square",  "abs",       "neg",         "integer_pow", "add",     "sub",           "mul",
       "div",     "maximum",   "minimum",     "pow",         "sum",     "mean",          "max",
       "reshape", "transpose", "expand_dims", "squeeze",     "index",   "concatenate",   "stack",
       "dot",     "matmul",    "einsum",      "where",       "softmax", "log_softmax",   "logsumexp",
       "cumsum",  "sort",      "take",        "at_add",      "min",     "prod",          "var",
       "clip",    "flip",      "roll",        "pad",         "tile",    "broadcast_to",  "take_along_axis(argmax)",
       "at_set",  "at_mul",    "cumprod",     "cummax",      "top_k",   "dynamic_slice", "split",
       "cond",    "switch",    "fori_loop",   "scan",        "astype"};
  static_assert(sizeof(names) / sizeof(names[0]) == size_t(Kind::Count));
  return names[size_t(k)];
}

// The indexing expressions of Kind::Slice.
enum SliceVariant { kFromOne, kColumnZero, kLast, kReverseLast, kStrided, kNewAxisLast, kGatherRows };

struct Op {
  Kind kind = Kind::Sin;
  std::vector<int> args;        // pool indices
  std::vector<int64_t> ints;    // axes / shape / permutation / take indices / slice variant
  Shape index_shape;            // take / at_add: shape of the constant index array
  std::optional<int64_t> axis;  // nullopt: all axes (reductions, take: flattened)
  bool keepdims = false;
  bool guarded = false;            // domain ops: squash the (first) operand
  bool guarded2 = false;           // pow: squash the exponent
  std::optional<double> constant;  // binary ops / where: weak scalar second operand
  std::string subscripts;          // einsum
};

struct Program {
  uint64_t seed = 0;
  int index = 0;
  std::vector<AbstractValue> inputs;
  std::vector<bool> batched;    // per input: mapped by vmap (else shared by the three examples)
  std::vector<int> batch_axis;  // per batched input: where vmap finds the examples (may be negative)
  std::vector<Op> ops;
  std::vector<int> outputs;   // pool indices
  std::vector<int> out_axis;  // per output: where vmap puts the examples (0 or -1)

  // Whether some value is f32 (an f32 input or a cast to f32): f32 tolerances, no check_grads.
  bool any_f32() const {
    return std::any_of(inputs.begin(), inputs.end(), [](const AbstractValue& a) { return a.dtype == f32; }) ||
           std::any_of(ops.begin(), ops.end(), [](const Op& op) { return op.kind == Kind::Astype && op.ints[0] == 0; });
  }
  bool all_f64() const { return !any_f32(); }

  std::string str() const {
    std::ostringstream os;
    os << "program " << index << " of seed " << seed << " (reproduce: CJAX_FUZZ_SEED=" << seed
       << " CJAX_FUZZ_ONLY=" << index << ")\n";
    for (size_t i = 0; i < inputs.size(); ++i)
      os << "  v" << i << " = input " << inputs[i].str()
         << (batched[i] ? " (vmap in_axis " + std::to_string(batch_axis[i]) + ")" : " (unbatched)") << "\n";
    for (size_t k = 0; k < ops.size(); ++k) os << "  v" << inputs.size() + k << " = " << op_str(ops[k]) << "\n";
    os << "  outputs:";
    for (size_t k = 0; k < outputs.size(); ++k) os << " v" << outputs[k] << " (vmap out_axis " << out_axis[k] << ")";
    return os.str();
  }

  static std::string op_str(const Op& op) {
    std::ostringstream os;
    auto list = [&](const std::vector<int64_t>& v) {
      os << "[";
      for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
      os << "]";
    };
    os << kind_name(op.kind) << "(";
    for (size_t i = 0; i < op.args.size(); ++i) os << (i ? ", " : "") << "v" << op.args[i];
    if (op.constant && op.kind != Kind::AtAdd) os << ", " << *op.constant;
    os << ")";
    if (op.kind == Kind::AtAdd && op.constant) os << " (update: mean of v" << op.args[1] << ")";
    if (op.kind == Kind::Clip) os << " [-0.5, 0.8]";
    if (op.kind == Kind::Cond)
      os << " : cond(sum(v" << op.args[0] << ") > 0, a -> tanh(a) * b, a -> a + 0.5 b - cos(b), a=v" << op.args[1]
         << ", b=v" << op.args[2] << " captured)";
    if (op.kind == Kind::Switch)
      os << " : switch(index=2(s>0)-1+(s>1) clamped, s=sum(v" << op.args[0] << "); [sin(a), a * cos(a), a * a]; a=v"
         << op.args[1] << ")";
    if (op.kind == Kind::ForiLoop)
      os << " : fori_loop(0, " << op.ints[0]
         << ", (i, c) -> {0.9 c0 + 0.1 sin(c0) tanh(b) + 0.01 i, 0.8 c1 + 0.1 mean(c0)})"
         << ", c = {v" << op.args[0] << ", v" << op.args[1] << "}, b=v" << op.args[2] << " captured"
         << (op.guarded ? " as its mean" : "") << ", returns c" << op.ints[1];
    if (op.kind == Kind::Scan)
      os << " : scan((h, x) -> {tanh(0.7 h + x), h * x}, init=v" << op.args[1] << (op.guarded ? " as its mean" : "")
         << ", xs=v" << op.args[0] << (op.guarded2 ? ", reverse" : "") << "), returns "
         << (op.ints[0] ? "ys" : "the carry");
    if (op.kind == Kind::Pad) os << (op.guarded ? " mode=edge" : " mode=constant");
    if (op.kind == Kind::TopK || op.kind == Kind::DynamicSlice || op.kind == Kind::Split || op.kind == Kind::Roll)
      os << " k/start/shift=" << *op.constant;
    if (op.kind == Kind::Einsum) os << " \"" << op.subscripts << "\"";
    if (op.kind == Kind::Slice) {
      static const char* forms[] = {"x[1:]",  "x[:, 0]",      "x[-1]",     "x[..., ::-1]",
                                    "x[::2]", "x[..., None]", "x[[-1, 0]]"};
      os << " " << forms[op.ints[0]];
    } else if (op.kind == Kind::Take || op.kind == Kind::AtAdd || op.kind == Kind::AtSet || op.kind == Kind::AtMul) {
      os << " indices=";
      list(op.ints);
      os << " shape=";
      list(op.index_shape);
    } else if (op.kind == Kind::Astype) {
      os << " to " << (op.ints[0] == 0 ? "f32" : "f64");
    } else if (!op.ints.empty() && op.kind != Kind::ForiLoop && op.kind != Kind::Scan) {
      os << " ";
      list(op.ints);
    }
    if (op.kind == Kind::Take || op.kind == Kind::Sum || op.kind == Kind::Mean || op.kind == Kind::Max ||
        op.kind == Kind::Logsumexp || op.kind == Kind::Softmax || op.kind == Kind::LogSoftmax ||
        op.kind == Kind::Cumsum || op.kind == Kind::Sort || op.kind == Kind::Concatenate || op.kind == Kind::Stack ||
        op.kind == Kind::ExpandDims || op.kind == Kind::Squeeze || op.kind == Kind::Min || op.kind == Kind::Prod ||
        op.kind == Kind::Var || op.kind == Kind::Flip || op.kind == Kind::Roll || op.kind == Kind::TakeAlongArgmax ||
        op.kind == Kind::Cumprod || op.kind == Kind::Cummax || op.kind == Kind::DynamicSlice || op.kind == Kind::Split)
      os << " axis=" << (op.axis ? std::to_string(*op.axis) : "None");
    if (op.keepdims) os << " keepdims";
    bool own_text =
        op.kind == Kind::ForiLoop || op.kind == Kind::Scan || op.kind == Kind::Pad || op.kind == Kind::Cummax;
    if (op.guarded && !own_text) os << " (operand squashed)";
    if (op.guarded2 && !own_text) os << " (exponent squashed)";
    if (op.kind == Kind::Cummax && op.guarded) os << " reverse";
    return os.str();
  }
};

inline int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Axis list for reductions: nullopt = all, else the axes stored in ints.
inline numpy::Axis reduce_axes(const Op& op) {
  if (!op.axis && op.ints.empty()) return None;
  return numpy::Axis(op.ints);
}

inline Array index_array(const Op& op) {
  return jnp::array<int64_t>(op.ints, {int64_t(op.ints.size())}).reshape(op.index_shape).astype(i32);
}

// Evaluates one op on the pool (under whatever transformation is active).
inline Array apply_op(const Op& op, const std::vector<Array>& pool) {
  const Array& x = pool[size_t(op.args[0])];
  auto second = [&]() -> Array { return op.constant ? Array(*op.constant) : pool[size_t(op.args[1])]; };
  auto positive = [&](const Array& v, bool squash) { return squash ? nn::softplus(v) + 0.5 : v; };
  switch (op.kind) {
    case Kind::Sin: return jnp::sin(op.guarded ? jnp::tanh(x) * 3.0 : x);
    case Kind::Cos: return jnp::cos(op.guarded ? jnp::tanh(x) * 3.0 : x);
    case Kind::Tanh: return jnp::tanh(x);
    case Kind::Exp: return jnp::exp(op.guarded ? jnp::tanh(x) * 2.0 : x);
    case Kind::Log: return jnp::log(op.guarded ? nn::softplus(x) + 0.1 : x);
    case Kind::Logistic: return lax::logistic(x);
    case Kind::Sqrt: return jnp::sqrt(op.guarded ? nn::softplus(x) + 0.1 : x);
    case Kind::Square: return jnp::square(x);
    case Kind::Abs: return jnp::abs(x);
    case Kind::Neg: return -x;
    case Kind::IntPow: return jnp::power(x, Array(int(op.ints[0])));
    case Kind::Add: return x + second();
    case Kind::Sub: return x - second();
    case Kind::Mul: return x * second();
    case Kind::Div: return x / (op.guarded ? jnp::tanh(second()) + 1.5 : second());
    case Kind::Maximum: return jnp::maximum(x, second());
    case Kind::Minimum: return jnp::minimum(x, second());
    case Kind::Pow: {
      Array e = second();
      return jnp::power(positive(x, op.guarded), op.guarded2 ? jnp::tanh(e) : e);
    }
    case Kind::Sum: return jnp::sum(x, reduce_axes(op), op.keepdims);
    case Kind::Mean: return jnp::mean(x, reduce_axes(op), op.keepdims);
    case Kind::Max: return jnp::max(x, reduce_axes(op), op.keepdims);
    case Kind::Reshape: return x.reshape(Shape(op.ints));
    case Kind::Transpose: return jnp::transpose(x, op.ints);
    case Kind::ExpandDims: return jnp::expand_dims(x, int64_t(*op.axis));
    case Kind::Squeeze: return op.axis ? jnp::squeeze(x, int64_t(*op.axis)) : jnp::squeeze(x);
    case Kind::Slice:
      switch (op.ints[0]) {
        case kFromOne: return x[Slice(1, None)];
        case kColumnZero: return x[{Slice(), 0}];
        case kLast: return x[-1];
        case kReverseLast: return x[{Ellipsis, Slice(None, None, -1)}];
        case kStrided: return x[Slice(None, None, 2)];
        case kNewAxisLast: return x[{Ellipsis, NewAxis}];
        default: return x[jnp::array<int32_t>({-1, 0})];
      }
    case Kind::Concatenate: return jnp::concatenate({x, pool[size_t(op.args[1])]}, *op.axis);
    case Kind::Stack: return jnp::stack({x, pool[size_t(op.args[1])]}, *op.axis);
    case Kind::Dot: return jnp::dot(x, pool[size_t(op.args[1])]);
    case Kind::Matmul: return jnp::matmul(x, pool[size_t(op.args[1])]);
    case Kind::Einsum: return jnp::einsum(op.subscripts, {x, pool[size_t(op.args[1])]});
    case Kind::Where: {
      Array b = op.constant ? Array(*op.constant) : pool[size_t(op.args[2])];
      return jnp::where(x > 0.0, pool[size_t(op.args[1])], b);
    }
    case Kind::Softmax: return nn::softmax(x, int64_t(*op.axis));
    case Kind::LogSoftmax: return nn::log_softmax(x, int64_t(*op.axis));
    case Kind::Logsumexp: return nn::logsumexp(x, reduce_axes(op), op.keepdims);
    case Kind::Cumsum: return jnp::cumsum(x, *op.axis);
    case Kind::Sort: return jnp::sort(x, *op.axis);
    case Kind::Take: return jnp::take(x, index_array(op), op.axis);
    case Kind::AtAdd: {
      Array update = op.constant ? jnp::mean(pool[size_t(op.args[1])]) : pool[size_t(op.args[1])];
      return x.at(index_array(op)).add(update);
    }
    case Kind::Min: return jnp::min(x, reduce_axes(op), op.keepdims);
    case Kind::Prod: return jnp::prod(x, reduce_axes(op), op.keepdims);
    case Kind::Var: return jnp::var(x, reduce_axes(op), 0, op.keepdims);
    case Kind::Clip: return jnp::clip(x, Array(-0.5), Array(0.8));
    case Kind::Flip: return op.axis ? jnp::flip(x, int64_t(*op.axis)) : jnp::flip(x);
    case Kind::Roll: return jnp::roll(x, int64_t(*op.constant), op.axis);
    case Kind::Pad: {
      std::vector<std::pair<int64_t, int64_t>> widths;
      for (size_t i = 0; i + 1 < op.ints.size(); i += 2) widths.emplace_back(op.ints[i], op.ints[i + 1]);
      return op.guarded ? jnp::pad(x, widths, "edge") : jnp::pad(x, widths, "constant", Array(0.25));
    }
    case Kind::Tile: return jnp::tile(x, op.ints);
    case Kind::BroadcastTo: return jnp::broadcast_to(x, Shape(op.ints));
    case Kind::TakeAlongArgmax:
      return jnp::take_along_axis(x, jnp::argmax(pool[size_t(op.args[1])], *op.axis, true), *op.axis);
    case Kind::AtSet: return x.at(index_array(op)).set(pool[size_t(op.args[1])]);
    case Kind::AtMul: return x.at(index_array(op)).multiply(pool[size_t(op.args[1])]);
    case Kind::Cumprod: return jnp::cumprod(x, *op.axis);
    case Kind::Cummax: return lax::cummax(x, *op.axis, op.guarded);
    case Kind::TopK: return lax::top_k(x, int64_t(*op.constant)).first;
    case Kind::DynamicSlice: return lax::dynamic_slice_in_dim(x, Array(int(*op.constant)), op.ints[0], *op.axis);
    case Kind::Split: return jnp::split(x, 2, *op.axis)[size_t(op.ints[0])];
    case Kind::Cond: {
      const Array& a = pool[size_t(op.args[1])];
      const Array& b = pool[size_t(op.args[2])];
      return lax::cond(
          jnp::sum(x) > 0.0, [&](const Array& v) { return jnp::tanh(v) * b; },
          [&](const Array& v) { return v + b * 0.5 - jnp::cos(b); }, a);
    }
    case Kind::Switch: {
      Array s = jnp::sum(x);
      Array index = (s > 0.0).astype(i32) * 2 - 1 + (s > 1.0).astype(i32);
      std::vector<std::function<Array(const Array&)>> branches{[](const Array& v) { return jnp::sin(v); },
                                                               [](const Array& v) { return v * jnp::cos(v); },
                                                               [](const Array& v) { return v * v; }};
      return lax::switch_(index, branches, pool[size_t(op.args[1])]);
    }
    case Kind::ForiLoop: {
      Array b = op.guarded ? jnp::mean(pool[size_t(op.args[2])]) : pool[size_t(op.args[2])];
      std::vector<Array> init{x, pool[size_t(op.args[1])]};
      std::vector<Array> out = lax::fori_loop(
          0, op.ints[0],
          [&](const Array& i, const std::vector<Array>& c) {
            // tanh(b): a large captured factor would make central differences meaningless.
            Array c0 = c[0] * 0.9 + jnp::sin(c[0]) * jnp::tanh(b) * 0.1 + i * 0.01;
            Array c1 = c[1] * 0.8 + jnp::mean(c[0]) * 0.1;
            return std::vector<Array>{c0.astype(c[0].dtype()), c1.astype(c[1].dtype())};
          },
          init);
      return out[size_t(op.ints[1])];
    }
    case Kind::Scan: {
      Array h0 = pool[size_t(op.args[1])];
      if (op.guarded) h0 = jnp::zeros_like(x[0]) + jnp::mean(h0);
      auto [h, ys] = lax::scan(
          [](const Array& hc, const Array& xt) {
            return std::pair{jnp::tanh(hc * 0.7 + xt).astype(hc.dtype()), hc * xt};
          },
          h0, x, lax::ScanOptions{.reverse = op.guarded2});
      return op.ints[0] ? ys : h;
    }
    case Kind::Astype: return x.astype(op.ints[0] == 0 ? f32 : f64);
    case Kind::Count: break;
  }
  throw ValueError("fuzz: unknown op kind");
}

inline std::vector<Array> run(const Program& p, const std::vector<Array>& inputs) {
  std::vector<Array> pool = inputs;
  for (const Op& op : p.ops) pool.push_back(apply_op(op, pool));
  std::vector<Array> outs;
  for (int o : p.outputs) outs.push_back(pool[size_t(o)]);
  return outs;
}

// ---- generation ----

struct Generated {
  Program program;
  std::vector<std::vector<Array>> input_sets;  // three examples
};

namespace detail {

using Rng = std::mt19937_64;
using Pools = std::vector<std::vector<Array>>;  // [example][value]

inline int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
inline bool coin(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }
inline std::vector<double> host(const Array& a) { return a.astype(f64).to_vector<double>(); }
inline double min_abs(const Array& a) {
  double m = INFINITY;
  for (double v : host(a)) m = std::min(m, std::abs(v));
  return m;
}
inline double max_abs(const Array& a) {
  double m = 0;
  for (double v : host(a)) m = std::isfinite(v) ? std::max(m, std::abs(v)) : INFINITY;
  return m;
}
inline double min_value(const Array& a) {
  double m = INFINITY;
  for (double v : host(a)) m = std::min(m, v);
  return m;
}

inline std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = std::max(da, db);
  }
  return out;
}

// The smallest gap between the two largest entries (or all neighbours, for sort) of x's rows
// along `axes` (moved last); infinite when the rows have one entry.
inline double tie_gap(const Array& x, std::vector<int64_t> axes, bool all_neighbours) {
  int64_t nd = x.ndim();
  if (nd == 0) return INFINITY;
  std::vector<int64_t> dest;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0) axes[i] += nd;
    dest.push_back(nd - int64_t(axes.size()) + int64_t(i));
  }
  Array rows = jnp::moveaxis(x, axes, dest);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[size_t(a)];
  if (n < 2) return INFINITY;
  std::vector<double> v = host(jnp::sort(rows.reshape({-1, n}), -1));
  double gap = INFINITY;
  for (size_t r = 0; r < v.size() / size_t(n); ++r) {
    const double* row = v.data() + r * size_t(n);
    for (int64_t k = all_neighbours ? 1 : n - 1; k < n; ++k) gap = std::min(gap, row[k] - row[k - 1]);
  }
  return gap;
}

// A random shape with `size` elements (rank 0..3).
inline Shape random_shape_of_size(Rng& rng, int64_t size) {
  std::vector<int64_t> factors;
  for (int64_t n = size, p = 2; n > 1;) {
    if (n % p == 0) {
      factors.push_back(p);
      n /= p;
    } else {
      ++p;
    }
  }
  std::shuffle(factors.begin(), factors.end(), rng);
  size_t rank = size_t(uniform_int(rng, factors.empty() ? 0 : 1, 3));
  if (rank == 0) return {};
  Shape s(rank, 1);
  for (int64_t f : factors) s[size_t(uniform_int(rng, 0, int64_t(rank) - 1))] *= f;
  return s;
}

class Generator {
 public:
  Generator(uint64_t seed, int index) : rng_(seed * 0x9E3779B97F4A7C15ull + uint64_t(index) + 1) {
    prog_.seed = seed;
    prog_.index = index;
  }

  Generated generate() {
    make_inputs();
    int n_ops = int(uniform_int(rng_, 3, 12));
    for (int attempts = 0; int(prog_.ops.size()) < n_ops && attempts < 400; ++attempts) {
      Kind k = Kind(uniform_int(rng_, 0, int64_t(Kind::Count) - 1));
      std::optional<Op> op = propose(k);
      if (op && settle(*op)) accept(*op);
    }
    // The outputs are the values no op consumes, so every op contributes to some output.
    std::vector<bool> used(pools_[0].size(), false);
    for (const Op& op : prog_.ops)
      for (int a : op.args) used[size_t(a)] = true;
    for (size_t v = prog_.inputs.size(); v < used.size(); ++v)
      if (!used[v]) prog_.outputs.push_back(int(v));
    if (prog_.outputs.empty()) prog_.outputs.push_back(int(used.size()) - 1);
    for (size_t k = 0; k < prog_.outputs.size(); ++k) prog_.out_axis.push_back(coin(rng_, 0.7) ? 0 : -1);
    return {prog_, inputs_};
  }

 private:
  void make_inputs() {
    static const Shape shapes[] = {{}, {3}, {2, 3}, {4, 1}, {3, 1}, {1, 3}, {2, 1, 3}, {3, 2}, {4}};
    DType main = coin(rng_, 0.5) ? f64 : f32;
    bool mixed = coin(rng_, 0.15);
    int n = int(uniform_int(rng_, 2, 3));
    inputs_.assign(3, {});
    for (int i = 0; i < n; ++i) {
      Shape s = shapes[uniform_int(rng_, 0, std::size(shapes) - 1)];
      DType dt = mixed && i == n - 1 ? (main == f64 ? f32 : f64) : main;
      bool batched = i == 0 || coin(rng_, 0.75);
      AbstractValue aval;
      aval.shape = s;
      aval.dtype = dt;
      prog_.inputs.push_back(aval);
      prog_.batched.push_back(batched);
      int axis = int(uniform_int(rng_, 0, int64_t(s.size())));
      prog_.batch_axis.push_back(coin(rng_, 0.6) ? 0 : coin(rng_, 0.5) ? axis : axis - int(s.size()) - 1);
      for (int e = 0; e < 3; ++e) {
        if (!batched && e > 0) {
          inputs_[size_t(e)].push_back(inputs_[0].back());
          continue;
        }
        std::vector<double> v(size_t(num_elements(s)));
        for (double& x : v) x = std::uniform_real_distribution<double>(-2.0, 2.0)(rng_);
        inputs_[size_t(e)].push_back(jnp::array<double>(v, {int64_t(v.size())}).reshape(s).astype(dt));
      }
    }
    pools_ = inputs_;
  }

  const Shape& shape(int v) const { return pools_[0][size_t(v)].shape(); }
  int num_values() const { return int(pools_[0].size()); }
  // Recent values are preferred so ops chain into deep expressions.
  int pick() {
    int n = num_values();
    return coin(rng_, 0.5) ? n - 1 : int(uniform_int(rng_, 0, n - 1));
  }
  // A value satisfying `ok`, or nullopt.
  template <class Pred>
  std::optional<int> pick_where(Pred ok) {
    std::vector<int> candidates;
    for (int v = 0; v < num_values(); ++v)
      if (ok(v)) candidates.push_back(v);
    if (candidates.empty()) return std::nullopt;
    if (ok(num_values() - 1) && coin(rng_, 0.4)) return num_values() - 1;
    return candidates[size_t(uniform_int(rng_, 0, int64_t(candidates.size()) - 1))];
  }
  std::optional<int> pick_broadcastable_to(const Shape& target) {
    return pick_where([&](int v) {
      auto b = broadcast(target, shape(v));
      return b && *b == target;
    });
  }
  int64_t random_axis(int nd) { return uniform_int(rng_, -nd, nd - 1); }

  std::optional<Op> propose(Kind k) {
    Op op;
    op.kind = k;
    int x = pick();
    const Shape& sx = shape(x);
    int nd = int(sx.size());
    op.args = {x};
    switch (k) {
      case Kind::IntPow: op.ints = {uniform_int(rng_, 2, 3)}; return op;
      case Kind::Add:
      case Kind::Sub:
      case Kind::Mul:
      case Kind::Div:
      case Kind::Maximum:
      case Kind::Minimum:
      case Kind::Pow: {
        if (coin(rng_, 0.15)) {
          op.constant = std::round(std::uniform_real_distribution<double>(-1.5, 1.5)(rng_) * 8) / 8;
          if (k == Kind::Div || k == Kind::Pow) op.constant = 0.75;
          return op;
        }
        auto y = pick_where([&](int v) { return broadcast(sx, shape(v)).has_value(); });
        op.args.push_back(*y);  // x itself always qualifies
        return op;
      }
      case Kind::Sum:
      case Kind::Mean:
      case Kind::Max:
      case Kind::Logsumexp:
      case Kind::Min:
      case Kind::Prod:
      case Kind::Var: {
        op.keepdims = coin(rng_, 0.3);
        if (nd == 0 || coin(rng_, 0.25)) return op;  // all axes
        for (int a = 0; a < nd; ++a)
          if (coin(rng_, 0.5)) op.ints.push_back(coin(rng_, 0.3) ? a - nd : a);
        if (op.ints.empty()) op.ints.push_back(random_axis(nd));
        op.axis = op.ints[0];
        return op;
      }
      case Kind::Reshape: op.ints = random_shape_of_size(rng_, num_elements(sx)); return op;
      case Kind::Transpose: {
        if (nd < 2) return std::nullopt;
        for (int a = 0; a < nd; ++a) op.ints.push_back(a);
        std::shuffle(op.ints.begin(), op.ints.end(), rng_);
        return op;
      }
      case Kind::ExpandDims: op.axis = uniform_int(rng_, -nd - 1, nd); return op;
      case Kind::Squeeze: {
        std::vector<int64_t> ones;
        for (int a = 0; a < nd; ++a)
          if (sx[size_t(a)] == 1) ones.push_back(a);
        if (ones.empty()) return std::nullopt;
        if (!coin(rng_, 0.3)) op.axis = ones[size_t(uniform_int(rng_, 0, int64_t(ones.size()) - 1))];
        return op;
      }
      case Kind::Slice: {
        std::vector<int64_t> ok;
        if (nd >= 1 && sx[0] >= 2) ok.insert(ok.end(), {kFromOne, kStrided});
        if (nd >= 2) ok.push_back(kColumnZero);
        if (nd >= 1) ok.insert(ok.end(), {kLast, kReverseLast, kNewAxisLast});
        if (nd >= 1 && sx[0] >= 2) ok.push_back(kGatherRows);
        if (ok.empty()) return std::nullopt;
        op.ints = {ok[size_t(uniform_int(rng_, 0, int64_t(ok.size()) - 1))]};
        return op;
      }
      case Kind::Concatenate:
      case Kind::Stack: {
        if (k == Kind::Concatenate && nd == 0) return std::nullopt;
        int64_t axis = k == Kind::Stack ? uniform_int(rng_, 0, nd) : uniform_int(rng_, 0, nd - 1);
        auto y = pick_where([&](int v) {
          const Shape& sv = shape(v);
          if (sv.size() != sx.size()) return false;
          for (size_t i = 0; i < sv.size(); ++i)
            if (sv[i] != sx[i] && (k == Kind::Stack || int64_t(i) != axis)) return false;
          return true;
        });
        op.args.push_back(*y);
        op.axis = axis;
        return op;
      }
      case Kind::Dot:
      case Kind::Matmul: {
        auto y = pick_where([&](int v) { return contractible(k, sx, shape(v)); });
        if (!y) return std::nullopt;
        op.args.push_back(*y);
        return op;
      }
      case Kind::Einsum: {
        int y = pick();
        op.args.push_back(y);
        op.subscripts = random_einsum(sx, shape(y));
        return op;
      }
      case Kind::Where: {
        auto a = pick_where([&](int v) { return broadcast(sx, shape(v)).has_value(); });
        op.args.push_back(*a);
        Shape sa = *broadcast(sx, shape(*a));
        if (coin(rng_, 0.2)) {
          op.constant = 0.5;
        } else {
          auto b = pick_where([&](int v) { return broadcast(sa, shape(v)).has_value(); });
          op.args.push_back(*b);
        }
        return op;
      }
      case Kind::Softmax:
      case Kind::LogSoftmax:
      case Kind::Cumsum:
      case Kind::Sort:
        if (nd == 0) return std::nullopt;
        op.axis = random_axis(nd);
        return op;
      case Kind::Take: {
        int64_t extent = num_elements(sx);
        if (nd >= 1 && coin(rng_, 0.7)) {
          op.axis = random_axis(nd);
          extent = sx[size_t(*op.axis < 0 ? *op.axis + nd : *op.axis)];
        }
        op.index_shape = coin(rng_, 0.7) ? Shape{uniform_int(rng_, 1, 4)} : Shape{2, 2};
        for (int64_t i = 0; i < num_elements(op.index_shape); ++i) op.ints.push_back(uniform_int(rng_, 0, extent - 1));
        return op;
      }
      case Kind::AtAdd: {
        if (nd == 0) return std::nullopt;
        op.index_shape = {uniform_int(rng_, 1, 3)};
        for (int64_t i = 0; i < op.index_shape[0]; ++i) op.ints.push_back(uniform_int(rng_, 0, sx[0] - 1));
        Shape target = op.index_shape;
        target.insert(target.end(), sx.begin() + 1, sx.end());
        auto u = pick_broadcastable_to(target);
        if (u) {
          op.args.push_back(*u);
        } else {
          op.args.push_back(pick());
          op.constant = 0.0;  // marker: the update is the mean of args[1]
        }
        return op;
      }
      case Kind::Flip:
      case Kind::Cumprod:
      case Kind::Cummax:
      case Kind::Split:
      case Kind::DynamicSlice: {
        if (nd == 0) return op.kind == Kind::Flip ? std::optional<Op>(op) : std::nullopt;
        op.axis = random_axis(nd);
        int64_t dim = sx[size_t(*op.axis < 0 ? *op.axis + nd : *op.axis)];
        op.guarded = coin(rng_, 0.3);  // cummax: reverse
        if (op.kind == Kind::Flip && coin(rng_, 0.3)) op.axis.reset();
        if (op.kind == Kind::Split) {
          if (dim % 2) return std::nullopt;
          op.ints = {uniform_int(rng_, 0, 1)};
        }
        if (op.kind == Kind::DynamicSlice) {  // the start may overhang: it is clamped
          op.ints = {uniform_int(rng_, 1, dim)};
          op.constant = double(uniform_int(rng_, 0, dim));
        }
        return op;
      }
      case Kind::Roll:
        op.constant = double(uniform_int(rng_, -3, 3));
        if (nd >= 1 && coin(rng_, 0.7)) op.axis = random_axis(nd);
        return op;
      case Kind::Pad:
        for (int a = 0; a < 2 * nd; ++a) op.ints.push_back(uniform_int(rng_, 0, 2));
        op.guarded = coin(rng_, 0.4);  // edge mode
        return op;
      case Kind::Tile: {
        size_t n = size_t(uniform_int(rng_, 1, 2));
        for (size_t i = 0; i < n; ++i) op.ints.push_back(uniform_int(rng_, 1, 2));
        return op;
      }
      case Kind::BroadcastTo: {
        Shape target = sx;
        for (int64_t& d : target)
          if (d == 1 && coin(rng_, 0.6)) d = uniform_int(rng_, 2, 3);
        if (coin(rng_, 0.5)) target.insert(target.begin(), 2);
        op.ints = target;
        return op;
      }
      case Kind::TakeAlongArgmax: {
        if (nd == 0) return std::nullopt;
        op.axis = random_axis(nd);
        auto y = pick_where([&](int v) { return shape(v) == sx; });
        op.args.push_back(*y);
        return op;
      }
      case Kind::AtSet:
      case Kind::AtMul: {
        if (nd == 0) return std::nullopt;
        int64_t n = uniform_int(rng_, 1, std::min<int64_t>(3, sx[0]));
        op.index_shape = {n};
        std::vector<int64_t> rows(static_cast<size_t>(sx[0]));
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
        std::shuffle(rows.begin(), rows.end(), rng_);
        // set: unique indices (JAX leaves the winner of duplicates unspecified); mul may repeat.
        for (int64_t i = 0; i < n; ++i)
          op.ints.push_back(op.kind == Kind::AtSet ? rows[size_t(i)] : uniform_int(rng_, 0, sx[0] - 1));
        Shape target = op.index_shape;
        target.insert(target.end(), sx.begin() + 1, sx.end());
        auto u = pick_broadcastable_to(target);
        if (!u) return std::nullopt;
        op.args.push_back(*u);
        return op;
      }
      case Kind::TopK:
        if (nd == 0) return std::nullopt;
        op.constant = double(uniform_int(rng_, 1, sx.back()));
        return op;
      case Kind::Cond:
      case Kind::Switch: {
        int a = pick();
        op.args.push_back(a);
        if (op.kind == Kind::Cond)
          op.args.push_back(*pick_where([&](int v) { return broadcast(shape(a), shape(v)).has_value(); }));
        return op;
      }
      case Kind::ForiLoop: {
        op.args.push_back(pick());
        int b = pick();
        auto joint = broadcast(sx, shape(b));
        op.guarded = !joint || *joint != sx;  // the captured value must keep c0's shape
        op.args.push_back(b);
        op.ints = {uniform_int(rng_, 0, 4), uniform_int(rng_, 0, 1)};
        return op;
      }
      case Kind::Scan: {
        if (nd == 0) return std::nullopt;
        Shape step(sx.begin() + 1, sx.end());
        auto h = pick_where([&](int v) { return shape(v) == step; });
        op.guarded = !h;  // no value of the carry's shape: start from the mean of one
        op.args.push_back(h ? *h : pick());
        op.guarded2 = coin(rng_, 0.3);
        op.ints = {uniform_int(rng_, 0, 1)};
        return op;
      }
      case Kind::Astype:
        op.ints = {pools_[0][size_t(x)].dtype() == f64 ? 0 : 1};  // the other float type
        return op;
      default: return op;  // unary elementwise, clip
    }
  }

  static bool contractible(Kind k, const Shape& a, const Shape& b) {
    if (k == Kind::Dot) {
      if (a.empty() || b.empty()) return true;
      return b.size() == 1 ? a.back() == b[0] : a.back() == b[b.size() - 2];
    }
    if (a.empty() || b.empty()) return false;
    if (a.back() != (b.size() == 1 ? b[0] : b[b.size() - 2])) return false;
    if (a.size() <= 2 || b.size() <= 2) return true;
    return broadcast(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)).has_value();
  }

  // Subscripts for two operands: b's axes reuse a's letters where sizes match (contracted or
  // batch axes); every letter is kept in the output with probability 0.6 (others are summed).
  std::string random_einsum(const Shape& a, const Shape& b) {
    std::string la, lb, all;
    char next = 'a';
    for (size_t i = 0; i < a.size(); ++i) la += next++;
    for (size_t i = 0; i < b.size(); ++i) {
      char c = 0;
      for (size_t j = 0; j < a.size(); ++j)
        if (a[j] == b[i] && lb.find(la[j]) == std::string::npos && coin(rng_, 0.6)) {
          c = la[j];
          break;
        }
      lb += c ? c : next++;
    }
    for (char c = 'a'; c < next; ++c)
      if (coin(rng_, 0.6)) all += c;
    std::shuffle(all.begin(), all.end(), rng_);
    return la + "," + lb + "->" + all;
  }

  // Decides the value-dependent choices of `op` from the three examples; false rejects it.
  bool settle(Op& op) {
    auto all = [&](auto pred) {
      for (auto& pool : pools_)
        if (!pred(pool)) return false;
      return true;
    };
    auto arg = [&](const std::vector<Array>& pool, size_t i) { return pool[size_t(op.args[i])]; };
    try {
      switch (op.kind) {
        // Large arguments of sin/cos make central differences meaningless (derivatives ~ |x|^k).
        case Kind::Sin:
        case Kind::Cos: op.guarded = !all([&](auto& p) { return max_abs(arg(p, 0)) < 5; }); break;
        case Kind::Exp: op.guarded = !all([&](auto& p) { return max_abs(arg(p, 0)) < 3; }); break;
        case Kind::Log:
        case Kind::Sqrt: op.guarded = !all([&](auto& p) { return min_value(arg(p, 0)) > 0.1; }); break;
        case Kind::Abs: return all([&](auto& p) { return min_abs(arg(p, 0)) > kMargin; });
        case Kind::Div:
          if (!op.constant) op.guarded = !all([&](auto& p) { return min_abs(arg(p, 1)) > 0.3; });
          break;
        case Kind::Pow:
          op.guarded = !all([&](auto& p) { return min_value(arg(p, 0)) > 0.2; });
          if (!op.constant) op.guarded2 = !all([&](auto& p) { return max_abs(arg(p, 1)) < 2; });
          break;
        case Kind::Maximum:
        case Kind::Minimum:
          return all([&](auto& p) {
            Array y = op.constant ? Array(*op.constant) : arg(p, 1);
            return min_abs(arg(p, 0) - y) > kMargin;
          });
        case Kind::Where: return all([&](auto& p) { return min_abs(arg(p, 0)) > kMargin; });
        case Kind::Max:
        case Kind::Min: {
          std::vector<int64_t> axes = op.ints;
          if (axes.empty())
            for (int a = 0; a < arg(pools_[0], 0).ndim(); ++a) axes.push_back(a);
          double sign = op.kind == Kind::Max ? 1.0 : -1.0;
          return all([&](auto& p) { return tie_gap(arg(p, 0) * sign, axes, false) > kMargin; });
        }
        case Kind::Sort:
        case Kind::Cummax: return all([&](auto& p) { return tie_gap(arg(p, 0), {*op.axis}, true) > kMargin; });
        case Kind::TopK: return all([&](auto& p) { return tie_gap(arg(p, 0), {-1}, true) > kMargin; });
        case Kind::TakeAlongArgmax:
          return all([&](auto& p) { return tie_gap(arg(p, 1), {*op.axis}, false) > kMargin; });
        case Kind::Cond: return all([&](auto& p) { return min_abs(jnp::sum(arg(p, 0))) > kMargin; });
        case Kind::Switch:
          return all([&](auto& p) {
            Array sum = jnp::sum(arg(p, 0));
            return min_abs(sum) > kMargin && min_abs(sum - 1.0) > kMargin;
          });
        case Kind::Clip:
          return all([&](auto& p) { return min_abs(arg(p, 0) + 0.5) > kMargin && min_abs(arg(p, 0) - 0.8) > kMargin; });
        default: break;
      }
    } catch (const std::exception&) {
      return false;  // a shape the precondition helpers cannot handle: skip the op
    }
    return true;
  }

  void accept(const Op& op) {
    std::vector<Array> results;
    for (auto& pool : pools_) {
      try {
        results.push_back(apply_op(op, pool));
      } catch (const std::exception& e) {  // a finding (the generator only proposes valid ops)
        throw std::runtime_error(prog_.str() + "\n  eager evaluation failed in: " + Program::op_str(op) +
                                 "\n  error: " + e.what());
      }
      if (!(max_abs(results.back()) < kMaxMagnitude)) return;
    }
    for (size_t e = 0; e < pools_.size(); ++e) pools_[e].push_back(results[e]);
    prog_.ops.push_back(op);
  }

  Rng rng_;
  Program prog_;
  std::vector<std::vector<Array>> inputs_;
  Pools pools_;
};

}  // namespace detail

// The `index`-th program of `seed` with its three input sets.
inline Generated generate(uint64_t seed, int index) { return detail::Generator(seed, index).generate(); }

}  // namespace cjax::fuzz
