// The reference programs of docs/examples.md §1–4 (JAX's shard_map tutorial), shared by the
// samples (which print what the JAX originals print) and tests/test_examples_shard_map.cpp
// (which asserts the values). Run with 8 CPU devices.
#pragma once
#include <cjax/cjax.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace cjax::examples {
namespace jnp = cjax::numpy;

inline Array arange_f(int64_t n) { return jnp::arange(n).astype(f32); }

// ---- §1 shard_map basics ----

struct MatmulBasic {
  Array a, b, c;
  Shape a_block, b_block;
};
inline MatmulBasic matmul_basic() {
  Mesh mesh = make_mesh({4, 2}, {"i", "j"});
  MatmulBasic r;
  r.a = arange_f(8 * 16).reshape({8, 16});
  r.b = arange_f(16 * 32).reshape({16, 32});
  auto f = shard_map(
      [&](const Array& a_block, const Array& b_block) {
        r.a_block = a_block.shape();
        r.b_block = b_block.shape();
        return lax::psum(jnp::dot(a_block, b_block), "j");
      },
      mesh, {P("i", "j"), P("j", None)}, P("i", None));
  r.c = f(r.a, r.b);
  return r;
}

inline Array matmul_reduce_scatter(const Array& a, const Array& b) {
  Mesh mesh = make_mesh({4, 2}, {"i", "j"});
  auto f = shard_map(
      [](const Array& ab, const Array& bb) {
        return lax::psum_scatter(jnp::dot(ab, bb), "j", {.scatter_dimension = 1, .tiled = true});
      },
      mesh, {P("i", "j"), P("j", None)}, P("i", "j"));
  return f(a, b);
}

// f1..f5 of the slicing-and-tiling section: the block shape seen inside and the result shape.
// f2 takes x tiled twice along columns (jnp.tile(x, (1, 2))) with in_specs P(i, j): every
// device gets the same (3,12) block as f1 and the result is the same (12,24) array.
struct Tiling {
  Shape f1_block, f1_out, f2_block, f2_out, f3_out, f4_out, f5_out;
  Array f1_y, f2_y;
};
inline Tiling slicing_and_tiling() {
  Mesh mesh = make_mesh({4, 2}, {"i", "j"});
  Array x = jnp::arange(144).reshape({12, 12});
  Tiling t;
  t.f1_y = shard_map(
      [&](const Array& xb) {
        t.f1_block = xb.shape();
        return xb;
      },
      mesh, P("i", None), P("i", "j"))(x);
  t.f1_out = t.f1_y.shape();
  Array x_ = jnp::tile(x, {1, mesh.shape()[1]});  // (12, 24)
  t.f2_y = shard_map(
      [&](const Array& xb) {
        t.f2_block = xb.shape();
        return xb;
      },
      mesh, P("i", "j"), P("i", "j"))(x_);
  t.f2_out = t.f2_y.shape();
  const Array& y = x;
  t.f3_out = shard_map([](const Array& v) { return lax::psum(v, "j"); }, mesh, P("i", "j"), P("i", None))(y).shape();
  t.f4_out = shard_map([](const Array& v) { return lax::psum(v, "i"); }, mesh, P("i", "j"), P(None, "j"))(y).shape();
  t.f5_out = shard_map(
                 [](const Array& v) {
                   return lax::psum(v, {"i", "j"});
                 },
                 mesh, P("i", "j"), P(None, None))(y)
                 .shape();
  return t;
}

// shard_map(lambda: x, in_specs=(), out_specs=spec) with x = [[3.]].
inline Array tile_constant(const PartitionSpec& spec) {
  Mesh mesh = make_mesh({4, 2}, {"i", "j"});
  Array x = jnp::array(std::vector<float>{3.f}, {1, 1});
  return shard_map([&]() { return x; }, mesh, SpecTree{}, spec)();
}

// ---- §2 collectives ----

inline Array tutorial_vector() {
  return jnp::array(std::vector<float>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 1, 2});
}

inline Mesh mesh_i4() { return make_mesh({4}, {"i"}); }

// The tutorial's hand-written psum_scatter: a ring of ppermutes and local adds.
inline Array ring_psum_scatter(const Array& x) {
  auto f = shard_map(
      [](const Array& xb) {
        int n = lax::axis_size("i");
        Array chunks = xb.reshape({n, -1});  // (n, chunk)
        Array idx = lax::axis_index("i");
        std::vector<std::pair<int, int>> shift;
        for (int k = 0; k < n; ++k) shift.push_back({k, (k - 1 + n) % n});
        // Step k: take the running sum from the right neighbour and add my chunk (idx + k + 1) % n.
        Array acc = lax::dynamic_index_in_dim(chunks, (idx + 1) % n, 0, false);
        for (int k = 1; k < n; ++k) {
          acc = lax::ppermute(acc, "i", shift);
          acc = acc + lax::dynamic_index_in_dim(chunks, (idx + k + 1) % n, 0, false);
        }
        return acc;
      },
      mesh_i4(), P("i"), P("i"));
  return f(x);
}

// ---- §3 distributed matmuls (mesh i of 4; lhs sharded by rows, rhs by rows) ----

enum class MatmulVariant {
  AllGather,
  AllGatherOverlapped,
  AllGatherBidi,
  PsumScatter,
  PsumScatterOverlapped,
  PsumScatterBidi
};

inline Array distributed_matmul(MatmulVariant v, const Array& lhs, const Array& rhs) {
  Mesh mesh = mesh_i4();
  int n = 4;
  std::vector<std::pair<int, int>> up, down;
  for (int k = 0; k < n; ++k) {
    up.push_back({k, (k + 1) % n});
    down.push_back({k, (k - 1 + n) % n});
  }
  switch (v) {
    case MatmulVariant::AllGather:
      // lhs rows sharded, rhs rows sharded: gather rhs, multiply the local rows.
      return shard_map([](const Array& l,
                          const Array& r) { return jnp::dot(l, lax::all_gather(r, "i", {.tiled = true})); },
                       mesh, {P("i", None), P("i", None)}, P("i", None))(lhs, rhs);
    case MatmulVariant::AllGatherOverlapped:
      // lhs columns sharded: each step multiplies the lhs column block matching the rhs block held now.
      return shard_map(
          [&](const Array& l, const Array& r) {
            int64_t size = r.shape()[0];
            Array idx = lax::axis_index("i");
            auto step = [&](int k, const Array& acc, const Array& rb) {
              Array col = lax::dynamic_slice_in_dim(l, ((idx + k) % n) * int(size), size, 1);
              return acc + jnp::dot(col, rb);
            };
            Array out = jnp::zeros({l.shape()[0], r.shape()[1]}, l.dtype());
            Array rb = r;
            for (int k = 0; k < n; ++k) {
              out = step(k, out, rb);
              if (k + 1 < n) rb = lax::ppermute(rb, "i", down);
            }
            return out;
          },
          mesh, {P("i", None), P("i", None)}, P("i", None))(lhs, rhs);
    case MatmulVariant::AllGatherBidi:
      // Half of each rhs block travels each way; fori_loop form.
      return shard_map(
          [&](const Array& l, const Array& r) {
            int64_t size = r.shape()[0], half = r.shape()[1] / 2;
            Array idx = lax::axis_index("i");
            Array lo = lax::slice_in_dim(r, 0, half, 1, 1), hi = lax::slice_in_dim(r, half, 2 * half, 1, 1);
            Array out = jnp::zeros({l.shape()[0], r.shape()[1]}, l.dtype());
            auto body = [&](const Array& k, const std::tuple<Array, Array, Array>& c) {
              auto [acc, a, b] = c;
              Array col_a = lax::dynamic_slice_in_dim(l, ((idx + k) % n) * int(size), size, 1);
              Array col_b = lax::dynamic_slice_in_dim(l, ((idx - k + n) % n) * int(size), size, 1);
              Array upd = jnp::concatenate({jnp::dot(col_a, a), jnp::dot(col_b, b)}, 1);
              return std::tuple{acc + upd, lax::ppermute(a, "i", down), lax::ppermute(b, "i", up)};
            };
            return std::get<0>(lax::fori_loop(0, n, body, std::tuple{out, lo, hi}));
          },
          mesh, {P("i", None), P("i", None)}, P("i", None))(lhs, rhs);
    case MatmulVariant::PsumScatter:
      // lhs columns sharded, rhs rows sharded: local partial products, reduce-scattered by rows.
      return shard_map([](const Array& l,
                          const Array& r) { return lax::psum_scatter(jnp::dot(l, r), "i", {.tiled = true}); },
                       mesh, {P(None, "i"), P("i", None)}, P("i", None))(lhs, rhs);
    case MatmulVariant::PsumScatterOverlapped:
      return shard_map(
          [&](const Array& l, const Array& r) {
            int64_t rows = l.shape()[0] / n;
            Array idx = lax::axis_index("i");
            auto block = [&](const Array& j) { return lax::dynamic_slice_in_dim(l, j * int(rows), rows, 0); };
            Array acc = jnp::dot(block((idx + 1) % n), r);
            for (int k = 2; k <= n; ++k) {
              acc = lax::ppermute(acc, "i", down);
              acc = acc + jnp::dot(block((idx + k) % n), r);
            }
            return acc;
          },
          mesh, {P(None, "i"), P("i", None)}, P("i", None))(lhs, rhs);
    case MatmulVariant::PsumScatterBidi:
      return shard_map(
          [&](const Array& l, const Array& r) {
            int64_t rows = l.shape()[0] / n, half = r.shape()[1] / 2;
            Array idx = lax::axis_index("i");
            auto block = [&](const Array& j) { return lax::dynamic_slice_in_dim(l, j * int(rows), rows, 0); };
            Array rlo = lax::slice_in_dim(r, 0, half, 1, 1), rhi = lax::slice_in_dim(r, half, 2 * half, 1, 1);
            Array a = jnp::dot(block((idx + 1) % n), rlo);      // travels down
            Array b = jnp::dot(block((idx - 1 + n) % n), rhi);  // travels up
            for (int k = 2; k <= n; ++k) {
              a = lax::ppermute(a, "i", down) + jnp::dot(block((idx + k) % n), rlo);
              b = lax::ppermute(b, "i", up) + jnp::dot(block((idx - k + 2 * n) % n), rhi);
            }
            return jnp::concatenate({a, b}, 1);
          },
          mesh, {P(None, "i"), P("i", None)}, P("i", None))(lhs, rhs);
  }
  throw ValueError("unknown matmul variant");
}

inline const char* variant_name(MatmulVariant v) {
  switch (v) {
    case MatmulVariant::AllGather: return "all_gather";
    case MatmulVariant::AllGatherOverlapped: return "all_gather overlapped (ppermute)";
    case MatmulVariant::AllGatherBidi: return "all_gather bidirectional (fori_loop)";
    case MatmulVariant::PsumScatter: return "psum_scatter";
    case MatmulVariant::PsumScatterOverlapped: return "psum_scatter overlapped";
    case MatmulVariant::PsumScatterBidi: return "psum_scatter bidirectional";
  }
  return "?";
}
inline const std::vector<MatmulVariant> kMatmulVariants{MatmulVariant::AllGather,
                                                        MatmulVariant::AllGatherOverlapped,
                                                        MatmulVariant::AllGatherBidi,
                                                        MatmulVariant::PsumScatter,
                                                        MatmulVariant::PsumScatterOverlapped,
                                                        MatmulVariant::PsumScatterBidi};

// ---- §4 neural network strategies ----

using Layer = std::pair<Array, Array>;  // (W, b)
using Params = std::vector<Layer>;
struct Batch {
  Array inputs, targets;
};
CJAX_TREE(Batch, inputs, targets)

inline const std::vector<int64_t> kLayerSizes{784, 128, 128, 128, 128, 128, 8};

// JAX's init: key, *keys = split(key, len(sizes)); W = normal(k1) / sqrt(n_in), b = normal(k2);
// then key, *keys = split(key, 3) for the inputs and targets.
inline std::pair<Params, Batch> mlp_init(int64_t batch_size = 32) {
  Array key = random::key(0);
  size_t n = kLayerSizes.size();
  Array keys = random::split(key, int64_t(n));
  Params params;
  for (size_t l = 0; l + 1 < n; ++l) {
    Array ks = random::split(keys[int64_t(l + 1)]);
    Array w = random::normal(ks[0], {kLayerSizes[l], kLayerSizes[l + 1]}) / float(std::sqrt(double(kLayerSizes[l])));
    params.push_back({w, random::normal(ks[1], {kLayerSizes[l + 1]})});
  }
  Array k2 = random::split(keys[0], 3);
  Batch b{random::normal(k2[1], {batch_size, kLayerSizes.front()}),
          random::normal(k2[2], {batch_size, kLayerSizes.back()})};
  return {params, b};
}

inline Array predict(const Params& params, Array x) {
  Array out;
  for (const auto& [w, b] : params) {
    out = jnp::dot(x, w) + b;
    x = nn::relu(out);
  }
  return out;
}
inline Array mlp_loss(const Params& params, const Batch& batch) {
  return jnp::mean(jnp::sum(jnp::square(predict(params, batch.inputs) - batch.targets), -1));
}

inline Mesh mesh8(const char* name) { return make_mesh({8}, {name}); }

// Data parallel: params replicated, batch split; pmean of the local losses.
inline Array loss_dp(const Params& params, const Batch& batch) {
  return shard_map([](const Params& p, const Batch& b) { return lax::pmean(mlp_loss(p, b), "batch"); }, mesh8("batch"),
                   {P(), P("batch", None)}, P())(params, batch);
}

// FSDP: params split along their first axis too; each is all-gathered just before use and
// re-gathered in the backward pass (the gather is checkpointed without saving its output).
inline Array loss_fsdp(const Params& params, const Batch& batch) {
  auto gather = checkpoint([](const Array& p) { return lax::all_gather(p, "batch", {.tiled = true}); },
                           checkpoint_policies::save_everything_except({"all_gather"}));
  return shard_map(
      [&](const Params& p, const Batch& b) {
        Params full;
        for (const auto& [w, bias] : p) full.push_back({gather(w), gather(bias)});
        return lax::pmean(mlp_loss(full, b), "batch");
      },
      mesh8("batch"), P("batch"), P())(params, batch);
}

// Tensor parallel: features split; gemm_tp = local dot + psum_scatter over features + bias.
inline Array gemm_tp(const Array& inputs, const Array& w, const Array& b) {
  return shard_map(
      [](const Array& x, const Array& wb, const Array& bb) {
        return lax::psum_scatter(jnp::dot(x, wb), "feats", {.scatter_dimension = 1, .tiled = true}) + bb;
      },
      mesh8("feats"), {P(None, "feats"), P("feats", None), P("feats")}, P(None, "feats"))(inputs, w, b);
}
inline Array loss_tp(const Params& params, const Batch& batch) {
  Array x = batch.inputs, out;
  for (const auto& [w, b] : params) {
    out = gemm_tp(x, w, b);
    x = nn::relu(out);
  }
  return jnp::mean(jnp::sum(jnp::square(out - batch.targets), -1));
}

// FSDP + TP on a 4x2 mesh (batch, feats): params split over both, gathered over batch; the
// squared error is summed over feats and averaged over batch.
inline Array loss_fsdp_tp(const Params& params, const Batch& batch) {
  Mesh mesh = make_mesh({4, 2}, {"batch", "feats"});
  auto gather = checkpoint([](const Array& p) { return lax::all_gather(p, "batch", {.tiled = true}); },
                           checkpoint_policies::save_everything_except({"all_gather"}));
  return shard_map(
      [&](const Params& p, const Batch& b) {
        Array x = b.inputs, out;
        for (const auto& [wf, bf] : p) {
          Array w = gather(wf), bias = gather(bf);
          out = lax::psum_scatter(jnp::dot(x, w), "feats", {.scatter_dimension = 1, .tiled = true}) + bias;
          x = nn::relu(out);
        }
        Array sq = lax::psum(jnp::sum(jnp::square(out - b.targets), -1), "feats");
        return lax::pmean(jnp::mean(sq), "batch");
      },
      mesh, {P(axes("feats", "batch")), P("batch", "feats")}, P())(params, batch);
}

// Pipeline parallel (GPipe), as in JAX's tutorial: 2 stages, microbatches of 8, the 4 inner layers
// stacked and split over the stages; the first and last layers are replicated.
struct PipelineParams {
  Layer first, inner, last;  // inner: W (4, 128, 128), b (4, 128)
};
CJAX_TREE(PipelineParams, first, inner, last)

inline PipelineParams stack_for_pipeline(const Params& p) {
  std::vector<Array> ws, bs;
  for (size_t k = 1; k + 1 < p.size(); ++k) {
    ws.push_back(p[k].first);
    bs.push_back(p[k].second);
  }
  return {p.front(), {jnp::stack(ws, 0), jnp::stack(bs, 0)}, p.back()};
}

namespace pipeline {
constexpr int64_t S = 2, B = 8, L = 4;                                    // stages, microbatch size, pipelined layers
inline int64_t pymod(int64_t a, int64_t m) { return ((a % m) + m) % m; }  // Python's %
inline Array shift(const Array& x, int d) {
  std::vector<std::pair<int, int>> perm;
  for (int k = 0; k < S; ++k) perm.push_back({k, int(pymod(k + d, S))});
  return lax::ppermute(x, "stages", perm);
}

// inputs: (K, B, F) microbatches of this stage. The tutorial fills the idle pipeline slots with
// NaN; their NaN products with zero cotangents make the gradients NaN (IEEE: NaN * 0 = NaN), so
// `fill` = 0 gives the same loss with usable gradients.
inline Array spmd_pipeline(const Layer& stage_params, Array inputs, float fill) {
  int64_t K = inputs.shape()[0], F = inputs.shape()[2], M = K * S;
  Array stage = lax::axis_index("stages");
  Array outputs = jnp::full_like(inputs, Array(fill));
  Array state = jnp::full({L / S, B, F}, Array(fill));
  auto layer = [](const Layer& wb, const Array& x) { return nn::relu(jnp::dot(x, wb.first) + wb.second); };
  for (int64_t i = 0; i < M + L - 1; ++i) {
    state = state.at(0).set(jnp::where(stage == 0, inputs[int(pymod(i, K))], state[0]));
    state = vmap(layer)(stage_params, state);
    int64_t o = pymod(i - L + 1, K);
    outputs = outputs.at(int(o)).set(jnp::where(stage == int(S - 1), state[-1], outputs[int(o)]));
    // shift
    state = jnp::roll(state, 1, 0).at(0).set(shift(state[-1], +1));
    if (pymod(i, K) == pymod(-1, K)) inputs = shift(inputs, +1);
    if (pymod(i - L + 1, K) == pymod(-1, K)) outputs = shift(outputs, -1);
  }
  return shift(outputs, +1);
}
}  // namespace pipeline

inline Array loss_pp(const PipelineParams& params, const Batch& batch, float fill = std::nanf("")) {
  using namespace pipeline;
  Mesh mesh = make_mesh({S}, {"stages"});
  return shard_map(
      [fill](const PipelineParams& p, const Batch& b) {
        int64_t K = b.inputs.shape()[0] / B;
        Array x = b.inputs.reshape({K, B, -1});
        x = nn::relu(jnp::dot(x, p.first.first) + p.first.second);
        x = spmd_pipeline(p.inner, x, fill);
        Array pred = (jnp::dot(x, p.last.first) + p.last.second).reshape({K * B, -1});
        return lax::pmean(jnp::mean(jnp::sum(jnp::square(pred - b.targets), -1)), "stages");
      },
      mesh, {{P(), P("stages"), P()}, P("stages")}, P())(params, batch);
}

}  // namespace cjax::examples
