// spec/examples.md §4: the MLP of JAX's shard_map tutorial under data parallelism, FSDP, tensor
// parallelism and FSDP+TP on 8 CPU devices; each strategy's jit(loss) and jit(grad(loss)) are
// compared with the single-device reference.
#include <iostream>

#include "examples_shard_map.h"

using namespace cjax;
using namespace cjax::examples;

int main() {
  config::set_num_cpu_devices(8);
  auto [params, batch] = mlp_init();
  float ref = jit(mlp_loss)(params, batch).item<float>();
  Params ref_grad = jit(grad(mlp_loss))(params, batch);
  std::cout << "single device loss: " << ref << "\n";
  auto report = [&](const char* name, auto loss) {
    float l = jit(loss)(params, batch).template item<float>();
    Params g = jit(grad(loss))(params, batch);
    bool close = true;
    for (size_t k = 0; k < g.size(); ++k)
      close = close && jnp::allclose(g[k].first, ref_grad[k].first, 1e-2, 1e-2) &&
              jnp::allclose(g[k].second, ref_grad[k].second, 1e-2, 1e-2);
    std::cout << name << ": loss " << l << " (reference " << ref << "), grads allclose: " << std::boolalpha << close
              << "\n";
  };
  report("DP", loss_dp);
  report("FSDP", loss_fsdp);
  report("TP", loss_tp);
  report("FSDP+TP", loss_fsdp_tp);
  return 0;
}
