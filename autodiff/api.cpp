// The flat entry points behind cjax/autodiff.h.
#include <fmt/format.h>

#include "autodiff/ad.h"
#include "cjax/autodiff.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/lax/rule_support.h"
#include "trace/eval_jaxpr.h"

namespace cjax::ad_detail {

std::pair<std::vector<Array>, std::vector<Array>> jvp(const FlatFn& f, const std::vector<Array>& primals,
                                                      const std::vector<Array>& tangents) {
  JvpResult r = jvp_flat(f, primals, tangents);
  return {std::move(r.primals_out), std::move(r.tangents_out)};
}

Vjp vjp(const FlatFn& f, const std::vector<Array>& primals) {
  VjpResult r = vjp_flat(f, primals);
  return Vjp{std::move(r.primals_out), [b = std::move(r.backward)](const std::vector<Array>& cts) { return b(cts); }};
}

Linearized linearize(const FlatFn& f, const std::vector<Array>& primals) {
  std::vector<AbstractValue> in_avals;
  for (size_t i = 0; i < primals.size(); ++i) {
    if (!primals[i].defined()) throw ValueError(fmt::format("linearize: primal leaf {} is an empty Array handle", i));
    in_avals.push_back(primals[i].aval());
  }
  auto lin = std::make_shared<const LinearizeResult>(linearize_flat(f, primals));
  Linearized r;
  r.outs = lin->primals_out;
  r.jvp = [lin, in_avals = std::move(in_avals)](const std::vector<Array>& tangents) {
    if (tangents.size() != in_avals.size())
      throw ValueError(fmt::format("linearize: f_jvp takes one tangent leaf per primal leaf ({}) but got {}",
                                   in_avals.size(), tangents.size()));
    std::vector<Array> args;
    for (size_t i = 0; i < tangents.size(); ++i) {
      const Array& t = tangents[i];
      if (!t.defined()) throw ValueError(fmt::format("linearize: tangent leaf {} is an empty Array handle", i));
      if (t.shape() != in_avals[i].shape || t.dtype() != in_avals[i].dtype)
        throw ValueError(
            fmt::format("linearize: tangent leaf {} has type {} but its primal has type {}; a tangent "
                        "must have the primal's shape and dtype",
                        i, t.aval().str(), in_avals[i].str()));
      if (lin->diff_inputs[i]) args.push_back(t);  // integer and bool leaves have no tangent space
    }
    return eval_jaxpr(lin->linear, args);
  };
  return r;
}

std::function<std::vector<Array>(const std::vector<Array>&)> linear_transpose(
    const FlatFn& f, const std::vector<AbstractValue>& in_avals) {
  auto need_floating = [](const AbstractValue& a, const char* what, size_t i) {
    if (!is_floating(a.dtype))
      throw DTypeError(
          fmt::format("linear_transpose: {} leaf {} has type {}; linear_transpose needs floating inputs "
                      "and outputs (a linear map between real vector spaces)",
                      what, i, a.str()));
  };
  for (size_t i = 0; i < in_avals.size(); ++i) need_floating(in_avals[i], "input", i);
  auto traced = std::make_shared<const ClosedJaxpr>(jaxpr_detail::trace_flat(f, in_avals, "linear_transpose"));
  std::vector<AbstractValue> out_avals = traced->out_avals();
  for (size_t i = 0; i < out_avals.size(); ++i) need_floating(out_avals[i], "output", i);
  return [traced, in_avals, out_avals](const std::vector<Array>& cts) {
    if (cts.size() != out_avals.size())
      throw ValueError(fmt::format("linear_transpose: the function has {} output leaves but {} cotangents were given",
                                   out_avals.size(), cts.size()));
    for (size_t i = 0; i < cts.size(); ++i) {
      if (!cts[i].defined())
        throw ValueError(fmt::format("linear_transpose: cotangent leaf {} is an empty Array handle", i));
      if (cts[i].shape() != out_avals[i].shape || cts[i].dtype() != out_avals[i].dtype)
        throw ValueError(
            fmt::format("linear_transpose: cotangent leaf {} has type {} but the function's output has "
                        "type {}; pass a cotangent of the output's shape and dtype",
                        i, cts[i].aval().str(), out_avals[i].str()));
    }
    std::vector<Array> res = transpose_linear(**traced, traced->consts, cts);
    std::vector<Array> out;
    for (size_t i = 0; i < in_avals.size(); ++i) out.push_back(instantiate_zero(res[i], in_avals[i]));
    return out;
  };
}

void check_grad_output(const Array& out, const char* api) {
  if (out.ndim() != 0)
    throw ShapeError(
        fmt::format("{} requires a scalar output, but the function returned {}; reduce it to a "
                    "scalar (e.g. jnp::sum) or use vjp/jacrev for non-scalar outputs",
                    api, out.aval().str()));
  if (!is_floating(out.dtype()))
    throw DTypeError(fmt::format("{} requires a real-valued (floating) output, but the function returned {}", api,
                                 out.aval().str()));
}

void check_grad_input(const Array& leaf, size_t argnum, const char* api) {
  if (!leaf.defined()) throw ValueError(fmt::format("{}: argument {} holds an empty Array handle", api, argnum));
  if (!is_floating(leaf.dtype()))
    throw DTypeError(
        fmt::format("{} requires real-valued (floating) inputs, but argument {} has a leaf of type {}; "
                    "convert it with astype(f32), or mark it static by not listing it in argnums",
                    api, argnum, leaf.aval().str()));
}

Array ones_like(const Array& x) {
  Array one = make_scalar(1.0, x.dtype());
  // On x's device: the seed of a GPU loss's backward pass is broadcast there, not on the host
  // and then copied over.
  if (auto* c = dynamic_cast<const ConcreteArray*>(x.impl()); c && c->ready() && !c->buffers.empty()) {
    const Device& d = c->buffers[0]->device();
    if (!host_accessible(d)) one = device_put(one, SingleDeviceSharding(d));
  }
  return lax::broadcast_in_dim(one, x.shape(), {});
}

namespace {
// Row i of the identity of size n, shaped like x.
Array basis(const Array& x, int64_t i) {
  std::vector<double> e(size_t(x.size()), 0.0);
  e[size_t(i)] = 1.0;
  return numpy::array(e, {int64_t(e.size())}).reshape(x.shape()).astype(x.dtype());
}
}  // namespace

Array jacfwd(const std::function<Array(const Array&)>& f, const Array& x) {
  check_grad_input(x, 0, "jacfwd");
  std::vector<Array> cols;
  Array out;
  for (int64_t j = 0; j < x.size(); ++j) {
    auto [o, t] = jvp([&](const std::vector<Array>& xs) { return std::vector<Array>{f(xs[0])}; }, {x}, {basis(x, j)});
    out = o[0];
    cols.push_back(t[0]);
  }
  if (cols.empty()) throw ValueError("jacfwd: the input has no elements");
  Array stacked = numpy::stack(cols, -1);  // out.shape + [x.size]
  Shape shape = out.shape();
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  return stacked.reshape(shape);
}

Array jacrev(const std::function<Array(const Array&)>& f, const Array& x) {
  check_grad_input(x, 0, "jacrev");
  Vjp v = vjp([&](const std::vector<Array>& xs) { return std::vector<Array>{f(xs[0])}; }, {x});
  const Array& out = v.outs[0];
  std::vector<Array> rows;
  for (int64_t i = 0; i < out.size(); ++i) rows.push_back(v.backward({basis(out, i)})[0]);
  Shape shape = out.shape();
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  if (rows.empty()) return numpy::zeros(shape, x.dtype());
  return numpy::stack(rows, 0).reshape(shape);
}

}  // namespace cjax::ad_detail
