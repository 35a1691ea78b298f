// docs/examples.md §4: the MLP of JAX's shard_map tutorial under data parallelism, FSDP, tensor
// parallelism and FSDP+TP on 8 CPU devices; each strategy's jit(loss) and jit(grad(loss)) are
// compared with the single-device reference; then the same placements as plain sharded jit of the
// single-device loss (docs/sharding.md §2), where the partitioner inserts the collectives.
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
  PipelineParams pp = stack_for_pipeline(params);
  auto loss_pp_zero = [](const PipelineParams& p, const Batch& b) { return loss_pp(p, b, 0.f); };
  PipelineParams gpp = jit(grad(loss_pp_zero))(pp, batch);
  std::cout << "PP (2 stages, GPipe): loss "
            << jit([](const PipelineParams& p, const Batch& b) { return loss_pp(p, b); })(pp, batch).item<float>()
            << " (reference " << ref << "), first-layer grads allclose: " << std::boolalpha
            << jnp::allclose(gpp.first.first, ref_grad[0].first, 1e-2, 1e-2) << "\n";

  // The same strategies as plain sharded jit: place the parameters and the batch with
  // NamedShardings and jit the single-device loss; the partitioner inserts the collectives.
  struct Placement {
    const char* name;
    Mesh mesh;
    PartitionSpec weight, bias, batch;
  };
  Mesh grid = make_mesh({4, 2}, {"batch", "feats"});
  for (const Placement& s : {Placement{"DP", mesh8("batch"), P(), P(), P("batch")},
                             Placement{"FSDP", mesh8("batch"), P("batch"), P("batch"), P("batch")},
                             Placement{"TP", mesh8("feats"), P(None, "feats"), P("feats"), P()},
                             Placement{"FSDP+TP", grid, P("batch", "feats"), P("feats"), P("batch")}}) {
    Params placed;
    SpecTree grad_specs;
    std::vector<SpecTree> layers;
    for (const auto& [w, b] : params) {
      placed.push_back({device_put(w, NamedSharding(s.mesh, s.weight)), device_put(b, NamedSharding(s.mesh, s.bias))});
      layers.push_back(SpecTree{s.weight, s.bias});
    }
    Batch sharded{device_put(batch.inputs, NamedSharding(s.mesh, s.batch)),
                  device_put(batch.targets, NamedSharding(s.mesh, s.batch))};
    auto grads = jit(grad(mlp_loss), {.out_shardings = SpecTree(layers)});
    float l = jit(mlp_loss)(placed, sharded).item<float>();
    Params g = grads(placed, sharded);
    bool close = true;
    for (size_t k = 0; k < g.size(); ++k)
      close = close && jnp::allclose(g[k].first, ref_grad[k].first, 1e-4, 1e-4) &&
              jnp::allclose(g[k].second, ref_grad[k].second, 1e-4, 1e-4);
    std::string report = grads.sharding_report(placed, sharded);
    std::string line = report.substr(report.find("collectives inserted"));
    std::cout << "sharded jit " << s.name << ": loss " << l << ", grads allclose: " << std::boolalpha << close
              << ", grad step " << line.substr(0, line.find('\n')) << "\n";
  }

  // A short FSDP training run: SGD steps of one jitted update on 8 devices, params kept sharded.
  Mesh mesh = make_mesh({8}, {"batch"});
  Params p = device_put(params, NamedSharding(mesh, P("batch")));
  auto make_step = [](auto loss) {
    return jit([loss](const Params& w, const Batch& b) {
      auto [l, g] = value_and_grad(loss)(w, b);
      Params next;
      for (size_t k = 0; k < w.size(); ++k)
        next.push_back({w[k].first - 0.01f * g[k].first, w[k].second - 0.01f * g[k].second});
      return std::pair{l, next};
    });
  };
  auto step = make_step(loss_fsdp);
  auto ref_step = make_step(mlp_loss);
  Params q = params;
  for (int s = 0; s < 10; ++s) {
    auto [l, next] = step(p, batch);
    auto [rl, rnext] = ref_step(q, batch);
    std::cout << "FSDP step " << s << ": loss " << l.item<float>() << " (one device: " << rl.item<float>() << ")\n";
    p = next;
    q = rnext;
  }
  return 0;
}
