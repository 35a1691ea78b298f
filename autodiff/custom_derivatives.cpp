// custom_jvp_call, custom_vjp_call and custom_lin (JAX's jax/_src/custom_derivatives.py and
// custom_lin_p in ad.py). The user's rules are C++ functions held in params (printed by name):
//  * custom_jvp_call: its JVP rule calls the user's jvp rule; its batching rule batches the call
//    jaxpr and wraps the rule in a vmap.
//  * custom_vjp_call: its JVP rule runs fwd on the primals and returns, as tangents, a
//    `custom_lin` of the residuals and input tangents. custom_lin has no evaluation, JVP or
//    batching (forward mode of a custom_vjp function is an error, as in JAX); its transpose calls
//    bwd, so linearize + backward_pass (vjp, grad) use fwd in the forward pass and bwd in the
//    backward pass.
#include "autodiff/custom_derivatives.h"

#include <fmt/format.h>

#include <functional>

#include "autodiff/ad.h"
#include "cjax/lax.h"
#include "core/lax/rule_support.h"
#include "trace/batching.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax::custom_detail {

std::vector<AbstractValue> avals_of(std::span<const Array> xs) {
  std::vector<AbstractValue> out;
  for (const Array& x : xs) out.push_back(x.aval());
  return out;
}

FrontBatched move_batch_to_front(std::span<const Array> args, std::span<const int> bdims, int64_t size) {
  FrontBatched r;
  for (size_t i = 0; i < args.size(); ++i) {
    bool batched = bdims[i] != kNotMapped;
    r.args.push_back(batched ? move_bdim(args[i], bdims[i], 0, size) : args[i]);
    r.bdims.push_back(batched ? 0 : kNotMapped);
  }
  return r;
}

std::vector<Array> vmap_all_out_front(const FlatFn& f, std::span<const Array> xs, const std::vector<int>& in_bdims,
                                      const BatchAxis& axis) {
  return vmap_flat(
      f, xs, in_bdims, [](size_t, int) { return 0; }, axis);
}

TracedCall batch_jaxpr_call(std::shared_ptr<const Jaxpr> jaxpr, const FrontBatched& front, const BatchAxis& axis) {
  return trace_to_call(
      [&](const std::vector<Array>& xs) {
        return vmap_all_out_front([&](const std::vector<Array>& a) { return eval_jaxpr(*jaxpr, {}, a); }, xs,
                                  front.bdims, axis);
      },
      avals_of(front.args));
}

bool is_eager() { return current_trace() == eval_trace(); }

void raise_bwd_structure(const std::string& bwd_name, const std::string& f_name, const TreeDef& expected,
                         const TreeDef& got) {
  throw ValueError(fmt::format(
      "custom_vjp bwd rule '{}' of '{}' must return a std::tuple with one cotangent per argument of the primal "
      "function, each with that argument's tree structure, but got bwd output structure {} for primal input "
      "structure {}",
      bwd_name, f_name, got.str(), expected.str()));
}

void raise_rule_structure(const std::string& what, const std::string& rule_name, const std::string& f_name,
                          const TreeDef& expected, const TreeDef& got) {
  throw ValueError(
      fmt::format("custom rule '{}' of '{}' must produce a {} with the primal function's output "
                  "structure {}, but got {}",
                  rule_name, f_name, what, expected.str(), got.str()));
}

namespace {

// A C++ rule held in a param; it prints as its name (JAX prints the rule function's name).
template <class Fn>
struct RuleParam final : ParamObject {
  RuleParam(std::string n, Fn f) : name(std::move(n)), fn(std::move(f)) {}
  std::string name;
  Fn fn;
  std::string str() const override { return name; }
  size_t hash() const override { return std::hash<const void*>()(this); }
  bool equals(const ParamObject& o) const override { return &o == this; }
};
using JvpRuleParam = RuleParam<JvpFn>;
using FwdRuleParam = RuleParam<FwdFn>;

// custom_lin's bwd: the rule bound to one call's residual structure, plus the output avals
// (JAX's out_avals param, which JAX does not print either).
struct BwdParam final : ParamObject {
  std::string name, f_name;
  BwdFn fn;
  std::vector<AbstractValue> out_avals;
  std::string str() const override { return name; }
  size_t hash() const override { return std::hash<const void*>()(this); }
  bool equals(const ParamObject& o) const override { return &o == this; }
};

std::shared_ptr<const Jaxpr> call_jaxpr_of(const Params& p) { return p.object<JaxprParam>("call_jaxpr")->jaxpr; }
size_t num_consts_of(const Params& p) { return p.has("num_consts") ? size_t(p.i("num_consts")) : 0; }
const std::string& name_of(const Params& p) { return p.get<std::string>("name"); }

std::vector<AbstractValue> call_abstract_eval(std::span<const Array> in, const Params& p) {
  auto j = call_jaxpr_of(p);
  if (in.size() != j->invars().size())
    throw Error(fmt::format("internal: custom call '{}' with {} inputs for {} invars", name_of(p), in.size(),
                            j->invars().size()));
  return j->out_avals();
}
// Eagerly (e.g. inside a jit's jaxpr) the primal function runs: JAX's custom_*_call impl.
std::vector<Array> call_impl(std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
  return eval_jaxpr(*call_jaxpr_of(p), {}, in);
}

PrimitiveDef call_def(const char* name) {
  PrimitiveDef def;
  def.name = name;
  def.kind = PrimKind::HigherOrder;
  def.arity = Arity::any();  // checked against call_jaxpr
  def.leading_params = {"name"};
  def.abstract_eval = call_abstract_eval;
  def.impl = call_impl;
  return def;
}
const PrimitiveDef& g_custom_jvp_call = register_primitive(call_def("custom_jvp_call"));
const PrimitiveDef& g_custom_vjp_call = register_primitive(call_def("custom_vjp_call"));

constexpr const char* kForwardModeError = "can't apply forward-mode autodiff (jvp) to a custom_vjp function.";

const PrimitiveDef& g_custom_lin = register_primitive([] {
  PrimitiveDef def;
  def.name = "custom_lin";
  def.kind = PrimKind::HigherOrder;
  def.arity = Arity::any();
  def.abstract_eval = [](std::span<const Array>, const Params& p) { return p.object<BwdParam>("bwd")->out_avals; };
  def.impl = [](std::span<const Array>, std::span<const AbstractValue>, const Params&) -> std::vector<Array> {
    throw ValueError(kForwardModeError);
  };
  return def;
}());

Params call_params(std::shared_ptr<const Jaxpr> jaxpr, size_t num_consts, const std::string& name) {
  Params p;
  p.set("call_jaxpr", std::make_shared<const JaxprParam>(std::move(jaxpr)));
  p.set("name", name);
  p.set("symbolic_zeros", false);
  if (num_consts) p.set("num_consts", int64_t(num_consts));  // JAX prints num_consts only when nonzero
  return p;
}

// The rules only cover the explicit arguments: a perturbed closed-over value cannot be handled.
void check_closure_tangents(std::span<const Array> tangents, size_t num_consts, const char* kind,
                            const std::string& name) {
  for (size_t i = 0; i < num_consts; ++i)
    if (tangents[i].defined())
      throw ValueError(fmt::format(
          "Detected differentiation of a {0} function ('{1}') with respect to a closed-over value. That isn't "
          "supported because the custom rule only specifies how to differentiate the {0} function with respect "
          "to explicit input parameters. Try passing the closed-over value into the {0} function as an "
          "argument, and adapting the rules",
          kind, name));
}

std::string aval_short(const AbstractValue& a) { return a.str(); }
bool same_type(const AbstractValue& a, const AbstractValue& b) { return a.shape == b.shape && a.dtype == b.dtype; }

// The primal outputs of a rule against the primal function's output types.
void check_rule_primals(const std::vector<Array>& outs, const std::vector<AbstractValue>& want, const std::string& rule,
                        const std::string& name) {
  if (outs.size() != want.size())
    throw ValueError(fmt::format("custom rule '{}' of '{}' produced {} primal outputs but the function has {}", rule,
                                 name, outs.size(), want.size()));
  for (size_t i = 0; i < outs.size(); ++i)
    if (!same_type(outs[i].aval(), want[i])) {
      std::string msg = fmt::format(
          "custom rule '{}' of '{}' must produce primal outputs with the primal function's shapes and dtypes, "
          "but output {} has type {} where the function gives {}",
          rule, name, i, aval_short(outs[i].aval()), aval_short(want[i]));
      if (outs[i].shape() != want[i].shape) throw ShapeError(msg);
      throw DTypeError(msg);
    }
}

JvpOut custom_jvp_rule(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  size_t nc = num_consts_of(p);
  check_closure_tangents(tangents, nc, "custom_jvp", name_of(p));
  auto rule = p.object<JvpRuleParam>("jvp");
  std::vector<Array> ps(primals.begin() + std::ptrdiff_t(nc), primals.end()), ts;
  for (size_t i = nc; i < primals.size(); ++i) ts.push_back(instantiate_zero(tangents[i], primals[i].aval()));
  auto [outs, touts] = rule->fn(ps, ts);
  check_rule_primals(outs, call_jaxpr_of(p)->out_avals(), rule->name, name_of(p));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!is_floating(outs[i].dtype())) continue;  // no tangent space
    if (!touts[i].defined() || !same_type(touts[i].aval(), outs[i].aval())) {
      std::string msg = fmt::format(
          "Custom JVP rule '{}' of '{}' must produce primal and tangent outputs with corresponding shapes and "
          "dtypes, but output {} has primal {} with tangent {}, expecting tangent {}",
          rule->name, name_of(p), i, aval_short(outs[i].aval()),
          touts[i].defined() ? aval_short(touts[i].aval()) : std::string("<empty Array>"), aval_short(outs[i].aval()));
      if (touts[i].defined() && touts[i].shape() == outs[i].shape()) throw DTypeError(msg);
      throw ShapeError(msg);
    }
  }
  return JvpOut{std::move(outs), std::move(touts)};
}

using SetRules = std::function<void(Params&, const std::vector<int>& arg_bdims)>;

// A custom call batched: its call jaxpr vmapped with all outputs at 0 and its rules replaced by
// `set_rules` (given the arguments' batch dimensions, 0 or kNotMapped).
BatchOut batch_custom_call(const PrimitiveDef& def, std::span<const Array> args, std::span<const int> bdims,
                           const BatchAxis& axis, const Params& p, const SetRules& set_rules) {
  size_t nc = num_consts_of(p);
  FrontBatched front = move_batch_to_front(args, bdims, axis.size);
  TracedCall call = batch_jaxpr_call(call_jaxpr_of(p), front, axis);
  Params np = call_params(call.jaxpr, call.consts.size() + nc, name_of(p));
  set_rules(np, std::vector<int>(front.bdims.begin() + std::ptrdiff_t(nc), front.bdims.end()));
  std::vector<Array> in = call.consts;
  in.insert(in.end(), front.args.begin(), front.args.end());
  std::vector<Array> outs = cjax::bind(def, in, np);
  return BatchOut{outs, std::vector<int>(outs.size(), 0)};
}

// A tangent has its primal's type, so it is batched exactly when its primal is.
JvpFn batch_jvp_rule(JvpFn old, const std::vector<int>& arg_bdims, const BatchAxis& axis) {
  return [old = std::move(old), arg_bdims, axis](const std::vector<Array>& ps, const std::vector<Array>& ts) {
    std::vector<Array> xs = ps;
    xs.insert(xs.end(), ts.begin(), ts.end());
    std::vector<int> in = arg_bdims;
    in.insert(in.end(), arg_bdims.begin(), arg_bdims.end());
    std::vector<Array> all = vmap_all_out_front(
        [&](const std::vector<Array>& a) {
          size_t n = ps.size();
          auto [o, t] = old(std::vector<Array>(a.begin(), a.begin() + std::ptrdiff_t(n)),
                            std::vector<Array>(a.begin() + std::ptrdiff_t(n), a.end()));
          if (o.size() != t.size())
            throw ValueError(
                fmt::format("custom_jvp rule produced {} primal but {} tangent outputs", o.size(), t.size()));
          o.insert(o.end(), t.begin(), t.end());
          return o;
        },
        xs, in, axis);
    size_t m = all.size() / 2;
    return std::pair{std::vector<Array>(all.begin(), all.begin() + std::ptrdiff_t(m)),
                     std::vector<Array>(all.begin() + std::ptrdiff_t(m), all.end())};
  };
}

BatchOut custom_jvp_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis,
                          const Params& p) {
  auto rule = p.object<JvpRuleParam>("jvp");
  return batch_custom_call(g_custom_jvp_call, args, bdims, axis, p, [&](Params& np, const std::vector<int>& ab) {
    np.set("jvp", std::make_shared<const JvpRuleParam>(rule->name, batch_jvp_rule(rule->fn, ab, axis)));
  });
}

JvpOut custom_vjp_rule(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  size_t nc = num_consts_of(p);
  check_closure_tangents(tangents, nc, "custom_vjp", name_of(p));
  auto fwd = p.object<FwdRuleParam>("fwd");
  std::vector<Array> ps(primals.begin() + std::ptrdiff_t(nc), primals.end());
  FwdOut fo = fwd->fn(ps);
  check_rule_primals(fo.outs, call_jaxpr_of(p)->out_avals(), fwd->name, name_of(p));
  std::vector<Array> lin_in = fo.residuals;
  for (size_t i = nc; i < primals.size(); ++i) lin_in.push_back(instantiate_zero(tangents[i], primals[i].aval()));
  auto bwd = std::make_shared<BwdParam>();
  bwd->name = p.get<std::string>("bwd");
  bwd->f_name = name_of(p);
  bwd->fn = std::move(fo.bwd);
  bwd->out_avals = avals_of(fo.outs);
  Params lp;
  lp.set("bwd", std::shared_ptr<const ParamObject>(bwd));
  lp.set("num_res", int64_t(fo.residuals.size()));
  lp.set("symbolic_zeros", false);
  std::vector<Array> touts;
  // Under linearize the tangent map is always staged (even if every input happens to be known),
  // so that only the backward pass, never an evaluation, meets it.
  if (auto* staging = dynamic_cast<JaxprTrace*>(current_trace()))
    touts = staging->stage(g_custom_lin, lin_in, lp, bwd->out_avals);
  else
    touts = cjax::bind(g_custom_lin, lin_in, lp);
  return JvpOut{std::move(fo.outs), std::move(touts)};
}

// fwd batched with outputs and residuals at 0; its bwd batched likewise, with the cotangents of
// unbatched arguments summed over the batch (every example contributes to them).
FwdFn batch_fwd_rule(FwdFn old, const std::vector<int>& arg_bdims, const BatchAxis& axis) {
  return [old = std::move(old), arg_bdims, axis](const std::vector<Array>& ps) {
    BwdFn inner;
    size_t n_out = 0;
    std::vector<Array> all = vmap_all_out_front(
        [&](const std::vector<Array>& xs) {
          FwdOut o = old(xs);
          inner = std::move(o.bwd);
          n_out = o.outs.size();
          o.outs.insert(o.outs.end(), o.residuals.begin(), o.residuals.end());
          return o.outs;
        },
        ps, arg_bdims, axis);
    FwdOut r;
    r.outs.assign(all.begin(), all.begin() + std::ptrdiff_t(n_out));
    r.residuals.assign(all.begin() + std::ptrdiff_t(n_out), all.end());
    r.bwd = [inner, arg_bdims, axis, n_res = r.residuals.size()](const std::vector<Array>& res,
                                                                 const std::vector<Array>& cts) {
      std::vector<Array> xs = res;
      xs.insert(xs.end(), cts.begin(), cts.end());
      std::vector<Array> in_cts = vmap_all_out_front(
          [&](const std::vector<Array>& a) {
            return inner(std::vector<Array>(a.begin(), a.begin() + std::ptrdiff_t(n_res)),
                         std::vector<Array>(a.begin() + std::ptrdiff_t(n_res), a.end()));
          },
          xs, std::vector<int>(xs.size(), 0), axis);
      for (size_t i = 0; i < in_cts.size() && i < arg_bdims.size(); ++i)
        if (arg_bdims[i] == kNotMapped) in_cts[i] = lax::reduce_sum(in_cts[i], {0});
      return in_cts;
    };
    return r;
  };
}

BatchOut custom_vjp_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis,
                          const Params& p) {
  auto fwd = p.object<FwdRuleParam>("fwd");
  return batch_custom_call(g_custom_vjp_call, args, bdims, axis, p, [&](Params& np, const std::vector<int>& ab) {
    np.set("fwd", std::make_shared<const FwdRuleParam>(fwd->name, batch_fwd_rule(fwd->fn, ab, axis)));
    np.set("bwd", p.get<std::string>("bwd"));
  });
}

std::vector<Array> custom_lin_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  size_t num_res = size_t(p.i("num_res"));
  auto bwd = p.object<BwdParam>("bwd");
  std::vector<Array> res(args.begin(), args.begin() + std::ptrdiff_t(num_res));
  for (const Array& r : res)
    if (is_undefined_primal(r)) throw Error("internal: a custom_lin residual is linear");
  std::vector<Array> ct_out;
  for (size_t i = 0; i < cts.size(); ++i) ct_out.push_back(instantiate_zero(cts[i], bwd->out_avals[i]));
  std::vector<Array> in_cts = bwd->fn(res, ct_out);
  size_t n_args = args.size() - num_res;
  if (in_cts.size() != n_args)
    throw ValueError(fmt::format("custom_vjp bwd rule '{}' of '{}' produced {} cotangent leaves for {} argument leaves",
                                 bwd->name, bwd->f_name, in_cts.size(), n_args));
  std::vector<Array> out(num_res);
  for (size_t i = 0; i < n_args; ++i) {
    const AbstractValue& a = args[num_res + i].aval();
    Array c = in_cts[i];
    if (!is_floating(a.dtype) || !c.defined()) {
      out.emplace_back();
      continue;
    }
    if (!same_type(c.aval(), a))
      throw ValueError(fmt::format(
          "Custom VJP bwd rule '{}' attached to '{}' must produce an output with the same type as the args tuple "
          "of the primal function, but at output leaf {} the bwd rule produced an output of type {} corresponding "
          "to an input of type {}",
          bwd->name, bwd->f_name, i, aval_short(c.aval()), aval_short(a)));
    out.push_back(std::move(c));
  }
  return out;
}

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& j = define_rules("custom_jvp_call");
  j.jvp = custom_jvp_rule;
  j.batch = custom_jvp_batch;
  PrimitiveRules& v = define_rules("custom_vjp_call");
  v.jvp = custom_vjp_rule;
  v.batch = custom_vjp_batch;
  PrimitiveRules& l = define_rules("custom_lin");
  l.jvp = [](std::span<const Array>, std::span<const Array>, const Params&) -> JvpOut {
    throw ValueError(kForwardModeError);
  };
  l.batch = [](std::span<const Array>, std::span<const int>, const BatchAxis&, const Params&) -> BatchOut {
    throw ValueError(kForwardModeError);
  };
  l.transpose = custom_lin_transpose;
});

}  // namespace

namespace {
std::vector<Array> bind_custom_call(const PrimitiveDef& def, const FlatFn& f, const std::vector<Array>& args,
                                    const std::string& name, const std::function<void(Params&)>& set_rules) {
  TracedCall call = trace_to_call(f, avals_of(args));
  Params p = call_params(call.jaxpr, call.consts.size(), name);
  set_rules(p);
  std::vector<Array> in = call.consts;
  in.insert(in.end(), args.begin(), args.end());
  return cjax::bind(def, in, p);
}
}  // namespace

std::vector<Array> custom_jvp_call(const FlatFn& f, JvpFn jvp, const std::vector<Array>& args,
                                   const CustomJvpOptions& opts) {
  return bind_custom_call(g_custom_jvp_call, f, args, opts.name, [&](Params& p) {
    p.set("jvp", std::make_shared<const JvpRuleParam>(opts.jvp_name, std::move(jvp)));
  });
}

std::vector<Array> custom_vjp_call(const FlatFn& f, FwdFn fwd, const std::vector<Array>& args,
                                   const CustomVjpOptions& opts) {
  return bind_custom_call(g_custom_vjp_call, f, args, opts.name, [&](Params& p) {
    p.set("fwd", std::make_shared<const FwdRuleParam>(opts.fwd_name, std::move(fwd)));
    p.set("bwd", opts.bwd_name);
  });
}

}  // namespace cjax::custom_detail
