// The flat entry points behind cjax/autodiff.h.
#include <fmt/format.h>

#include "autodiff/ad.h"
#include "cjax/autodiff.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"

namespace cjax::ad_detail {

std::pair<std::vector<Array>, std::vector<Array>> jvp(const FlatFn& f, const std::vector<Array>& primals,
                                                      const std::vector<Array>& tangents) {
  JvpResult r = jvp_flat(f, primals, tangents);
  return {std::move(r.primals_out), std::move(r.tangents_out)};
}

Vjp vjp(const FlatFn& f, const std::vector<Array>& primals) {
  VjpResult r = vjp_flat(f, primals);
  return Vjp{std::move(r.primals_out),
             [b = std::move(r.backward)](const std::vector<Array>& cts) { return b(cts); }};
}

void check_grad_output(const Array& out, const char* api) {
  if (out.ndim() != 0)
    throw ShapeError(fmt::format("{} requires a scalar output, but the function returned {}; reduce it to a "
                                 "scalar (e.g. jnp::sum) or use vjp/jacrev for non-scalar outputs",
                                 api, out.aval().str()));
  if (!is_floating(out.dtype()))
    throw DTypeError(fmt::format("{} requires a real-valued (floating) output, but the function returned {}",
                                 api, out.aval().str()));
}

void check_grad_input(const Array& leaf, size_t argnum, const char* api) {
  if (!leaf.defined()) throw ValueError(fmt::format("{}: argument {} holds an empty Array handle", api, argnum));
  if (!is_floating(leaf.dtype()))
    throw DTypeError(fmt::format("{} requires real-valued (floating) inputs, but argument {} has a leaf of type {}; "
                                 "convert it with astype(f32), or mark it static by not listing it in argnums",
                                 api, argnum, leaf.aval().str()));
}

Array ones_like(const Array& x) { return lax::broadcast_in_dim(make_scalar(1.0, x.dtype()), x.shape(), {}); }

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
