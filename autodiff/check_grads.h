// check_grads (JAX's jax.test_util.check_grads): numerical checks of a function's derivatives.
//  * forward mode: jvp(f)(x, v) against central differences (f(x + eps v) - f(x - eps v)) / 2eps;
//  * reverse mode: the dot-product test <jvp(f)(x, v), u> == <v, vjp(f)(x)(u)>;
// for random directions v, u (fixed seed), to `order` (the checks are applied again to the jvp
// and vjp functions themselves). Floating inputs are perturbed; integer inputs are held fixed.
// Raises cjax::Error with the mode, order, output and both values on a mismatch.
#pragma once
#include <functional>
#include <vector>

#include "cjax/array.h"

namespace cjax {

struct CheckGradsOptions {
  int order = 2;
  bool fwd = true, rev = true;
  double eps = 0;   // 0: 1e-4 for f64 inputs, 2e-2 for lower precision
  double atol = 0;  // 0: by dtype (f64 1e-5, else 5e-2), as relative+absolute tolerance
  uint64_t seed = 0;
};

void check_grads(const std::function<std::vector<Array>(const std::vector<Array>&)>& f, const std::vector<Array>& args,
                 const CheckGradsOptions& opts = {});

}  // namespace cjax
