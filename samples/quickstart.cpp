// quickstart: eager cjax in one screen. Fits y = X·w_true + b_true + noise by gradient descent
// with hand-written gradients (autodiff arrives with the tracing layer), printing the loss as it
// goes, then the recovered parameters next to the true ones. Every line runs eagerly: set a
// breakpoint anywhere and print any Array in gdb (docs/gdb.md).
#include <cjax/cjax.h>

#include <cstdio>
#include <iostream>

using namespace cjax;
namespace jnp = cjax::numpy;

int main() {
  std::printf("cjax quickstart on %d CPU device(s)\n", device_count());
  Array root = random::key(0);
  Array keys = random::split(root, 3);
  const int64_t n = 4096, d = 8;

  Array x = random::normal(keys[0], {n, d});
  Array w_true = jnp::arange(1.0, 1.0 + double(d), 1.0) / 4.0;  // [0.25, 0.5, ..., 2]
  Array b_true = Array(0.5f);
  Array noise = random::normal(keys[1], {n}) * 0.01f;
  Array y = jnp::matmul(x, w_true) + b_true + noise;

  Array w = jnp::zeros({d}), b = jnp::zeros({});
  const float lr = 0.1f;
  for (int step = 0; step <= 200; ++step) {
    Array err = jnp::matmul(x, w) + b - y;  // [n]
    Array loss = jnp::mean(jnp::square(err));
    Array grad_w = jnp::matmul(x.T(), err) * (2.0f / float(n));
    Array grad_b = jnp::mean(err) * 2.0f;
    w = w - lr * grad_w;
    b = b - lr * grad_b;
    if (step % 40 == 0) std::printf("step %3d  loss %.6f\n", step, loss.item<float>());
  }
  std::cout << "learned w: " << w << "\ntrue    w: " << w_true << "\n";
  std::printf("learned b: %.4f (true 0.5)\n", b.item<float>());
  bool ok = jnp::allclose(w, w_true, 0.0, 1e-2) && std::abs(b.item<float>() - 0.5f) < 1e-2f;
  std::printf("%s\n", ok ? "recovered the true parameters" : "did NOT converge");
  return ok ? 0 : 1;
}
