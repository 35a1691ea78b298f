// Sharded jit (docs/sharding.md §2): plain jit over arguments split over a mesh partitions the
// program. The acceptance lists of the two-layer MLP (§3.1) under DP, FSDP, TP and FSDP+TP: the
// collectives the partitioner inserts, recorded while the program runs, and the values against
// one device; and programs that must move no data at all.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <sstream>

#include "cjax/collective_recorder.h"
#include "core/array/primitive.h"
#include "test_util.h"
#include "trace/source_info.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace sharded_jit_test {
struct Mlp {
  cjax::Array w1, w2;
};
CJAX_TREE(Mlp, w1, w2)
struct MlpAndInput {
  Mlp p;
  cjax::Array x;
};
CJAX_TREE(MlpAndInput, p, x)
struct TinyLm {
  cjax::Array table, head;  // embedding [V=64, D=32], LM head [32, 64]
};
CJAX_TREE(TinyLm, table, head)
}  // namespace sharded_jit_test
using sharded_jit_test::Mlp;
using sharded_jit_test::MlpAndInput;
using sharded_jit_test::TinyLm;

namespace {

Array mlp_loss(const Mlp& p, const Array& x, const Array& t) {
  Array y = jnp::dot(nn::relu(jnp::dot(x, p.w1)), p.w2);
  return jnp::mean(jnp::square(y - t));
}
Array mlp_loss_ii(const MlpAndInput& a, const Array& t) { return mlp_loss(a.p, a.x, t); }

// "kind axes in->out" of the collectives that move data, sorted (the order of independent
// collectives is the partitioner's choice).
std::string moving(const std::vector<debug::CollectiveRecord>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (r.communicates)
      out.push_back(
          fmt::format("{} {} {}->{}", r.kind, fmt::join(r.axes, ","), shape_str(r.in_shape), shape_str(r.out_shape)));
  std::sort(out.begin(), out.end());
  return fmt::format("{}", fmt::join(out, "; "));
}
const char* const kNoneRunWhole = "for lack of a sharding rule (their split operands gathered): 0\n";

// The same with each collective's phase: "fwd ..." or "bwd ..." (trace/phase.h).
std::string phased(const std::vector<debug::CollectiveRecord>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (r.communicates)
      out.push_back(fmt::format("{} {} {} {}->{}", r.phase == debug::Phase::Backward ? "bwd" : "fwd", r.kind,
                                fmt::join(r.axes, ","), shape_str(r.in_shape), shape_str(r.out_shape)));
  std::sort(out.begin(), out.end());
  return fmt::format("{}", fmt::join(out, "; "));
}

// A layout's text with trailing unsplit dimensions dropped (P('x', None) is P('x',)).
std::string trimmed(const PartitionSpec& p) {
  std::vector<PartitionSpec::Entry> e = p.entries();
  while (!e.empty() && e.back().names.empty()) e.pop_back();
  return PartitionSpec(e).str();
}
std::string layout_of(const Array& a) { return trimmed(dynamic_cast<const NamedSharding&>(a.sharding()).spec()); }
std::string sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return fmt::format("{}", fmt::join(v, "; "));
}

struct Layout {
  const char* name;
  Mesh mesh;
  PartitionSpec x, w1, w2;
  std::vector<std::string> forward, grad, grad_with_input;
};

std::vector<Layout> layouts() {
  Mesh data = make_mesh({4}, {"data"}), fsdp = make_mesh({4}, {"fsdp"}), tensor = make_mesh({4}, {"tensor"});
  Mesh both = make_mesh({2, 2}, {"fsdp", "tensor"});
  return {
      {"DP",
       data,
       P("data"),
       P(),
       P(),
       {"psum data ()->()"},
       {"psum data (32, 8)->(32, 8)", "psum data (8, 32)->(8, 32)"},
       {"psum data (32, 8)->(32, 8)", "psum data (8, 32)->(8, 32)"}},
      {"FSDP",
       fsdp,
       P("fsdp"),
       P("fsdp", None),
       P(None, "fsdp"),
       {"all_gather fsdp (2, 32)->(8, 32)", "all_gather fsdp (32, 2)->(32, 8)", "psum fsdp ()->()"},
       {"all_gather fsdp (2, 32)->(8, 32)", "all_gather fsdp (32, 2)->(32, 8)", "reduce_scatter fsdp (32, 8)->(32, 2)",
        "reduce_scatter fsdp (8, 32)->(2, 32)"},
       {"all_gather fsdp (2, 32)->(8, 32)", "all_gather fsdp (32, 2)->(32, 8)", "reduce_scatter fsdp (32, 8)->(32, 2)",
        "reduce_scatter fsdp (8, 32)->(2, 32)"}},
      {"TP",
       tensor,
       P(),
       P(None, "tensor"),
       P("tensor", None),
       {"psum tensor (16, 8)->(16, 8)"},
       {"psum tensor (16, 8)->(16, 8)"},
       {"psum tensor (16, 8)->(16, 8)", "psum tensor (16, 8)->(16, 8)"}},
      {"FSDP+TP",
       both,
       P("fsdp"),
       P("fsdp", "tensor"),
       P("tensor", "fsdp"),
       {"all_gather fsdp (4, 16)->(8, 16)", "all_gather fsdp (16, 4)->(16, 8)", "psum tensor (8, 8)->(8, 8)",
        "psum fsdp ()->()"},
       {"all_gather fsdp (4, 16)->(8, 16)", "all_gather fsdp (16, 4)->(16, 8)", "psum tensor (8, 8)->(8, 8)",
        "reduce_scatter fsdp (16, 8)->(16, 4)", "reduce_scatter fsdp (8, 16)->(4, 16)"},
       {"all_gather fsdp (4, 16)->(8, 16)", "all_gather fsdp (16, 4)->(16, 8)", "psum tensor (8, 8)->(8, 8)",
        "reduce_scatter fsdp (16, 8)->(16, 4)", "reduce_scatter fsdp (8, 16)->(4, 16)", "psum tensor (8, 8)->(8, 8)"}},
  };
}

}  // namespace

TEST_CASE("two-layer MLP: sharded jit inserts exactly the collectives of each layout, values as one device") {
  Mlp p{random::normal(random::key(1), {8, 32}), random::normal(random::key(2), {32, 8})};
  Array x = random::normal(random::key(3), {16, 8}), t = random::normal(random::key(4), {16, 8});
  Array want_loss = mlp_loss(p, x, t);
  Mlp want_grad = grad(mlp_loss)(p, x, t);
  MlpAndInput want_ii = grad(mlp_loss_ii)(MlpAndInput{p, x}, t);

  for (const Layout& l : layouts()) {
    CAPTURE(l.name);
    Mlp ps{device_put(p.w1, NamedSharding(l.mesh, l.w1)), device_put(p.w2, NamedSharding(l.mesh, l.w2))};
    Array xs = device_put(x, NamedSharding(l.mesh, l.x)), ts = device_put(t, NamedSharding(l.mesh, l.x));

    debug::CollectiveRecorder rec;
    Array loss = jit(mlp_loss)(ps, xs, ts);
    check_all_close(loss, want_loss, 1e-5);
    CHECK(moving(rec.records()) == sorted(l.forward));

    rec.clear();
    SpecTree weights{l.w1, l.w2};
    Mlp g = jit(grad(mlp_loss), {.out_shardings = weights})(ps, xs, ts);
    check_all_close(g.w1, want_grad.w1, 1e-5);
    check_all_close(g.w2, want_grad.w2, 1e-5);
    CHECK(moving(rec.records()) == sorted(l.grad));
    // Spec §3.1's fwd/bwd split: weights are gathered in the forward pass (and reused), gradients
    // reduced in the backward pass.
    std::map<std::string, std::string> phases{
        {"DP", "bwd psum data (32, 8)->(32, 8); bwd psum data (8, 32)->(8, 32)"},
        {"FSDP",
         "bwd reduce_scatter fsdp (32, 8)->(32, 2); bwd reduce_scatter fsdp (8, 32)->(2, 32); "
         "fwd all_gather fsdp (2, 32)->(8, 32); fwd all_gather fsdp (32, 2)->(32, 8)"},
        {"TP", "fwd psum tensor (16, 8)->(16, 8)"},
        {"FSDP+TP",
         "bwd reduce_scatter fsdp (16, 8)->(16, 4); bwd reduce_scatter fsdp (8, 16)->(4, 16); "
         "fwd all_gather fsdp (16, 4)->(16, 8); fwd all_gather fsdp (4, 16)->(8, 16); fwd psum tensor (8, 8)->(8, 8)"}};
    CHECK(phased(rec.records()) == phases.at(l.name));
    CHECK(layout_of(g.w1) == trimmed(l.w1));
    CHECK(layout_of(g.w2) == trimmed(l.w2));

    // Never the "full rematerialization" fallback (an equation run whole on gathered operands).
    auto gj = jit(grad(mlp_loss), {.out_shardings = weights});
    CHECK_MESSAGE(gj.sharding_report(ps, xs, ts).find(kNoneRunWhole) != std::string::npos,
                  gj.sharding_report(ps, xs, ts));

    rec.clear();
    MlpAndInput gi = jit(grad(mlp_loss_ii), {.out_shardings = SpecTree{weights, l.x}})(MlpAndInput{ps, xs}, ts);
    check_all_close(gi.p.w1, want_ii.p.w1, 1e-5);
    check_all_close(gi.x, want_ii.x, 1e-5);
    CHECK(moving(rec.records()) == sorted(l.grad_with_input));
    CHECK(layout_of(gi.x) == trimmed(l.x));
  }
}

TEST_CASE("sharded jit: programs that must move no data") {
  Mesh mesh = make_mesh({4}, {"x"});
  NamedSharding rows(mesh, P("x", None));
  Array a = random::normal(random::key(1), {8, 4}), b = random::normal(random::key(2), {8, 4});
  Array as = device_put(a, rows), bs = device_put(b, rows);
  debug::CollectiveRecorder rec;

  SUBCASE("elementwise on identically split operands") {
    Array y = jit([](const Array& u, const Array& v) { return jnp::tanh(u * v + 1.0f); })(as, bs);
    check_all_close(y, jnp::tanh(a * b + 1.0f), 1e-6);
    CHECK(layout_of(y) == P("x").str());
  }
  SUBCASE("a replicated or one-device operand is sliced, not gathered") {
    Array y = jit([](const Array& u, const Array& v) { return u - v; })(as, b);
    check_all_close(y, a - b, 1e-6);
    CHECK(layout_of(y) == P("x").str());
  }
  SUBCASE("a constraint to the layout the value has") {
    Array y = jit([&](const Array& u) { return with_sharding_constraint(u * 2.0f, rows); })(as);
    check_all_close(y, a * 2.0f, 1e-6);
  }
  SUBCASE("reshape keeping the split on the major factor") {
    Array y = jit([](const Array& u) { return jnp::reshape(u, {4, 2, 4}); })(as);
    check_all_close(y, jnp::reshape(a, {4, 2, 4}), 1e-7);
    CHECK(layout_of(y) == P("x").str());
    Array z = jit([](const Array& u) { return jnp::reshape(u, {32}); })(as);
    check_all_close(z, jnp::reshape(a, {32}), 1e-7);
  }
  SUBCASE("an optimizer update on FSDP shards") {
    Array y = jit([](const Array& w, const Array& g) { return w - 0.1f * g; })(as, bs);
    check_all_close(y, a - 0.1f * b, 1e-6);
  }
  SUBCASE("random numbers generated split") {
    auto f = [](const Array& key) { return random::normal(key, {16, 8}); };
    Array y = jit(f, {.mesh = mesh, .out_shardings = P("x")})(random::key(7));
    check_all_close(y, f(random::key(7)), 1e-6);
    CHECK(layout_of(y) == P("x").str());
  }
  SUBCASE("a shard_map whose operands already match its in_specs (its body's own psum aside)") {
    auto f = jit([&](const Array& u, const Array& v) {
      return shard_map([](const Array& l, const Array& r) { return lax::psum(jnp::sum(l * r, 0), "x"); }, mesh,
                       SpecTree{P("x"), P("x")}, P())(u, v);
    });
    check_all_close(f(as, bs), jnp::sum(a * b, 0), 1e-5);
    auto rs = rec.records();
    rec.clear();
    CHECK(rs.size() == 1);
    CHECK(rs.at(0).kind == "psum_invariant");
  }
  SUBCASE("cotangents nobody uses: the input's gradient is not computed, so nothing reduces it") {
    auto loss = [](const Array& w, const Array& x) { return jnp::sum(jnp::tanh(x * w)); };
    Array g = jit(grad(loss), {.out_shardings = P("x")})(as, bs);  // d/dw only; w and x split alike
    check_all_close(g, grad(loss)(a, b), 1e-5);
  }
  SUBCASE("an all-reduce of a value already replicated: a sum over unsplit dimensions") {
    Array s = jit([](const Array& u) { return jnp::sum(u, {1}); })(as);
    check_all_close(s, jnp::sum(a, {1}), 1e-5);
    CHECK(layout_of(s) == P("x").str());
  }
  SUBCASE("a batched matmul with the batch split on both operands") {
    Array u = random::normal(random::key(3), {4, 8, 8}), v = random::normal(random::key(4), {4, 8, 2});
    NamedSharding batch(mesh, P("x"));
    Array y = jit([](const Array& l, const Array& r) { return jnp::matmul(l, r); })(device_put(u, batch),
                                                                                    device_put(v, batch));
    check_all_close(y, jnp::matmul(u, v), 1e-5);
  }
  CHECK(moving(rec.records()) == "");
}

TEST_CASE("sharded jit: reductions, reshards and the layouts of results") {
  Mesh mesh = make_mesh({2, 2}, {"x", "y"});
  Array a = random::normal(random::key(1), {8, 4});
  Array as = device_put(a, NamedSharding(mesh, P("x", "y")));
  debug::CollectiveRecorder rec;

  SUBCASE("a sum over a split dimension leaves a pending sum: psum where the result is replicated") {
    Array s = jit([](const Array& u) { return jnp::sum(u, {0}); })(as);
    check_all_close(s, jnp::sum(a, {0}), 1e-5);
    CHECK(moving(rec.records()) == "psum x (2,)->(2,)");
    CHECK(layout_of(s) == P("y").str());
  }
  SUBCASE("... and a reduce-scatter where the result is asked for split") {
    auto f = [](const Array& u) { return jnp::sum(u, {1}); };
    Array s = jit(f, {.out_shardings = P(axes("x", "y"))})(as);
    check_all_close(s, jnp::sum(a, {1}), 1e-5);
    CHECK(moving(rec.records()) == "reduce_scatter y (4,)->(2,)");
  }
  SUBCASE("max over split dimensions: the local maxima, then one pmax of the small result") {
    Array m = jit([](const Array& u) { return jnp::max(u); })(as);
    CHECK(m.item<float>() == jnp::max(a).item<float>());
    CHECK(moving(rec.records()) == "pmax x,y ()->()");
  }
  SUBCASE("moving a split from one dimension to another is one all_to_all") {
    NamedSharding cols(mesh, P(None, "x"));
    Array u = device_put(a, NamedSharding(mesh, P("x")));
    Array y = jit([&](const Array& v) { return with_sharding_constraint(v + 1.0f, cols); })(u);
    check_all_close(y, a + 1.0f, 1e-6);
    CHECK(moving(rec.records()) == "all_to_all x (4, 4)->(8, 2)");
    CHECK(layout_of(y) == P(None, "x").str());
  }
  SUBCASE("softmax over an unsplit dimension moves nothing") {
    Array u = device_put(a, NamedSharding(mesh, P(axes("x", "y"))));
    Array y = jit([](const Array& v) { return nn::softmax(v, -1); })(u);
    check_all_close(y, nn::softmax(a, -1), 1e-6);
    CHECK(moving(rec.records()) == "");
  }
}

TEST_CASE("sharded jit: loops and branches run split, their bodies partitioned like the program") {
  Mesh mesh = make_mesh({4}, {"x"});
  NamedSharding rows(mesh, P("x"));
  Array h0 = random::normal(random::key(1), {16, 8}), w = random::normal(random::key(2), {8, 8}) * 0.3f;
  Array hs = device_put(h0, rows);
  debug::CollectiveRecorder rec;
  auto count = [&](const std::string& kind, const Shape& in) {
    auto rs = rec.records();
    return std::count_if(rs.begin(), rs.end(),
                         [&](auto& r) { return r.communicates && r.kind == kind && r.in_shape == in; });
  };

  SUBCASE("a scan over steps keeps its carry split: nothing moves") {
    auto steps = [](const Array& h, const Array& m) {
      return lax::scan(
                 [&](const Array& c, NoneT) {
                   return std::pair{jnp::tanh(jnp::dot(c, m)), None};
                 },
                 h, None, {.length = 5})
          .first;
    };
    Array y = jit(steps)(hs, w);
    check_all_close(y, steps(h0, w), 1e-5);
    CHECK(layout_of(y) == P("x").str());
    CHECK(moving(rec.records()) == "");
  }
  SUBCASE("scan over stacked layer weights split FSDP-style: one all_gather per layer") {
    Array ws = random::normal(random::key(3), {3, 8, 8}) * 0.3f;
    auto layers = [](const Array& h, const Array& stack) {
      return lax::scan(
          [](const Array& c, const Array& m) {
            return std::pair{jnp::tanh(jnp::dot(c, m)), jnp::sum(c)};
          },
          h, stack);
    };
    auto [y, sums] = jit(layers)(hs, device_put(ws, NamedSharding(mesh, P(None, "x"))));
    auto [y1, sums1] = layers(h0, ws);
    check_all_close(y, y1, 1e-5);
    check_all_close(sums, sums1, 1e-4);
    CHECK(layout_of(y) == P("x").str());
    CHECK(count("all_gather", {2, 8}) == 3);  // each layer's weight, in its iteration
    CHECK(count("psum", {3}) == 1);           // the per-layer sums reduced once, after the loop
    CHECK(rec.records().size() == 4);
  }
  SUBCASE("gradient accumulation over micro-batches: one all-reduce after the loop, not one per step") {
    Array mbs = random::normal(random::key(4), {4, 16, 8});
    auto accumulated = [](const Array& m, const Array& batches) {
      auto g = grad([](const Array& v, const Array& b) { return jnp::sum(jnp::square(jnp::dot(b, v))); });
      return lax::scan(
                 [&](const Array& acc, const Array& b) {
                   return std::pair{acc + g(m, b), None};
                 },
                 jnp::zeros_like(m), batches)
          .first;
    };
    Array y = jit(accumulated)(w, device_put(mbs, NamedSharding(mesh, P(None, "x"))));
    check_all_close(y, accumulated(w, mbs), 1e-4);
    CHECK(moving(rec.records()) == "psum x (8, 8)->(8, 8)");
  }
  SUBCASE("grad through a scan: the weight gradient is reduced once") {
    auto loss = [](const Array& m, const Array& h) {
      Array last = lax::scan(
                       [&](const Array& c, NoneT) {
                         return std::pair{jnp::tanh(jnp::dot(c, m)), None};
                       },
                       h, None, {.length = 3})
                       .first;
      return jnp::sum(jnp::square(last));
    };
    Array g = jit(grad(loss))(w, hs);
    check_all_close(g, grad(loss)(w, h0), 1e-4);
    CHECK(moving(rec.records()) == "psum x (8, 8)->(8, 8)");
  }
  SUBCASE("a while_loop whose predicate reads a split value: one scalar psum per test") {
    auto doubling = [](const Array& v) {
      return lax::while_loop([](const Array& c) { return jnp::sum(c) < 1000.0f; },
                             [](const Array& c) { return c * 2.0f; }, v);
    };
    Array ones = jnp::ones({16, 8}) * 0.5f;  // sum 64: doubled 4 times, tested 5 times
    Array y = jit(doubling)(device_put(ones, rows));
    check_all_close(y, ones * 16.0f, 1e-6);
    CHECK(layout_of(y) == P("x").str());
    CHECK(moving(rec.records()) == "psum x ()->(); psum x ()->(); psum x ()->(); psum x ()->(); psum x ()->()");
  }
  SUBCASE("cond on a replicated predicate: both branches run on blocks") {
    auto branchy = [](const Array& flag, const Array& v) {
      return lax::cond(
          flag > 0.0f, [](const Array& u) { return u * 2.0f; }, [](const Array& u) { return -u; }, v);
    };
    auto f = jit(branchy);
    check_all_close(f(Array(1.0f), hs), h0 * 2.0f, 1e-6);
    check_all_close(f(Array(-1.0f), hs), -h0, 1e-6);
    CHECK(layout_of(f(Array(1.0f), hs)) == P("x").str());
    CHECK(moving(rec.records()) == "");
  }
  SUBCASE("convolutions keep the batch and output-feature splits; scatters keep their window splits") {
    Array img = random::normal(random::key(6), {8, 2, 6, 6}), kern = random::normal(random::key(7), {4, 2, 3, 3});
    auto conv = [](const Array& a, const Array& k) { return lax::conv(a, k, {1, 1}, "SAME"); };
    Array by_batch = jit(conv)(device_put(img, rows), kern);
    check_all_close(by_batch, conv(img, kern), 1e-4);
    CHECK(layout_of(by_batch) == P("x").str());
    Array by_feature = jit(conv)(img, device_put(kern, rows));
    check_all_close(by_feature, conv(img, kern), 1e-4);
    CHECK(layout_of(by_feature) == P(None, "x").str());
    auto put = [](const Array& v, const Array& r) { return v.at({Slice(), 3}).set(r); };  // column 3 of each row
    Array updated = jit(put)(hs, device_put(jnp::arange(16).astype(DType::float32), rows));
    check_all_close(updated, put(h0, jnp::arange(16).astype(DType::float32)), 1e-7);
    CHECK(layout_of(updated) == P("x").str());
    CHECK(moving(rec.records()) == "");
  }
  SUBCASE("dynamic slices and reversals keep the split of the dimensions they do not cut") {
    auto f = [](const Array& v, const Array& i) {
      Array cols = lax::dynamic_slice(v, {Array(0), i}, {16, 3});
      Array put = lax::dynamic_update_slice(v, cols * 0.0f, {Array(0), i});
      return std::pair{lax::rev(cols, {1}), put};
    };
    auto [a, b] = jit(f)(hs, Array(2));
    auto [a1, b1] = f(h0, Array(2));
    check_all_close(a, a1, 1e-7);
    check_all_close(b, b1, 1e-7);
    CHECK(layout_of(a) == P("x").str());
    CHECK(layout_of(b) == P("x").str());
    CHECK(moving(rec.records()) == "");
    Array r = jit([](const Array& v) { return lax::rev(v, {0}); })(hs);
    check_all_close(r, lax::rev(h0, {0}), 1e-7);
    CHECK(moving(rec.records()) == "all_gather x (4, 8)->(16, 8)");
  }
}

// §3.3: the embedding, the LM head and the loss, ids [8, 16] (the next token is the label).
Array lm_loss(const TinyLm& m, const Array& ids, const Array& labels) {
  Array hidden = jnp::tanh(jnp::take(m.table, ids, 0));
  Array logp = nn::log_softmax(jnp::dot(hidden, m.head), -1);
  return -jnp::mean(jnp::sum(logp * nn::one_hot(labels, 64), -1));
}

TEST_CASE("embedding, LM head and loss: the collectives of docs/sharding.md §3.3") {
  TinyLm lm{random::normal(random::key(1), {64, 32}), random::normal(random::key(2), {32, 64}) * 0.2f};
  Array ids = random::randint(random::key(3), {8, 16}, 0, 64), labels = random::randint(random::key(4), {8, 16}, 0, 64);
  auto [loss1, grads1] = value_and_grad(lm_loss)(lm, ids, labels);
  // Gradients laid out as their parameters (an optimizer update needs no further collective).
  auto check = [&](const Mesh& mesh, const PartitionSpec& batch, const PartitionSpec& table, const PartitionSpec& head,
                   const std::string& want) {
    TinyLm placed{device_put(lm.table, NamedSharding(mesh, table)), device_put(lm.head, NamedSharding(mesh, head))};
    Array i = device_put(ids, NamedSharding(mesh, batch)), l = device_put(labels, NamedSharding(mesh, batch));
    auto f = jit([](const TinyLm& m, const Array& x, const Array& y) { return value_and_grad(lm_loss)(m, x, y); },
                 {.mesh = mesh, .out_shardings = SpecTree{P(), SpecTree{table, head}}});
    CHECK(f.sharding_report(placed, i, l).find(kNoneRunWhole) != std::string::npos);
    f(placed, i, l).first.block_until_ready();
    debug::CollectiveRecorder rec;
    auto [loss, grads] = f(placed, i, l);
    CHECK(std::abs(loss.item<float>() - loss1.item<float>()) <= 1e-5f * std::abs(loss1.item<float>()));
    check_all_close(grads.table, grads1.table, 1e-5);
    check_all_close(grads.head, grads1.head, 1e-5);
    CHECK(layout_of(grads.head) == trimmed(head));
    CHECK(moving(rec.records()) == want);
  };
  SUBCASE("replicated embedding, FSDP LM head, batch split") {
    // fwd: the head gathered, the loss's mean all-reduced; bwd: the replicated table's gradient
    // all-reduced, the head's reduce-scattered back to its shards.
    check(make_mesh({4}, {"fsdp"}), P("fsdp"), P(), P("fsdp", None),
          "all_gather fsdp (8, 64)->(32, 64); psum fsdp ()->(); psum fsdp (64, 32)->(64, 32); "
          "reduce_scatter fsdp (32, 64)->(8, 64)");
  }
  SUBCASE("vocab-parallel LM head") {
    // fwd: log_softmax's max and sum over the split vocabulary, the label pick fused into the loss
    // scalar; bwd: the hidden cotangent all-reduced; the head's gradient is local.
    check(make_mesh({4}, {"tensor"}), P(), P(), P(None, "tensor"),
          "pmax tensor (8, 16)->(8, 16); psum tensor ()->(); psum tensor (8, 16, 1)->(8, 16, 1); "
          "psum tensor (8, 16, 32)->(8, 16, 32)");
  }
}

TEST_CASE("sharded jit: cache, options and errors") {
  Mesh mesh = make_mesh({4}, {"x"});
  Array a = random::normal(random::key(1), {8, 4});
  auto f = jit([](const Array& u) { return u * 3.0f; });
  Array rows = device_put(a, NamedSharding(mesh, P("x"))), cols = device_put(a, NamedSharding(mesh, P(None, "x")));
  check_all_close(f(rows), a * 3.0f, 1e-6);
  check_all_close(f(cols), a * 3.0f, 1e-6);
  CHECK(layout_of(f(rows)) == P("x").str());
  CHECK(layout_of(f(cols)) == P(None, "x").str());
  CHECK(f.trace_count() == 1);  // one trace, one partition per layout

  // in_shardings lay out an argument that arrives on one device.
  auto g = jit([](const Array& u) { return u + 1.0f; }, {.mesh = mesh, .in_shardings = P(None, "x")});
  Array y = g(a);
  check_all_close(y, a + 1.0f, 1e-6);
  CHECK(layout_of(y) == P(None, "x").str());

  CHECK_THROWS_AS(jit([](const Array& u) { return u; }, {.out_shardings = P("x")})(a), ValueError);
  auto bad = jit([](const Array& u) { return u; }, {.mesh = mesh, .out_shardings = P("x")});
  CHECK_THROWS_WITH_AS(bad(random::normal(random::key(2), {6})), doctest::Contains("not divisible"), ShardingError);
  Mesh other = make_mesh({2}, {"x"});
  CHECK_THROWS_AS(jit([](const Array& u, const Array& v) {
                    return u + v;
                  })(rows, device_put(a, NamedSharding(other, P("x")))),
                  ShardingError);
}

TEST_CASE("grad of a jitted function over split arguments: the jit equations run partitioned") {
  Mlp p{random::normal(random::key(1), {8, 32}), random::normal(random::key(2), {32, 8})};
  Array x = random::normal(random::key(3), {16, 8}), t = random::normal(random::key(4), {16, 8});
  Mesh data = make_mesh({4}, {"data"});
  Array xs = device_put(x, NamedSharding(data, P("data"))), ts = device_put(t, NamedSharding(data, P("data")));
  debug::CollectiveRecorder rec;
  Mlp g = grad(jit(mlp_loss))(p, xs, ts);
  Mlp want = grad(mlp_loss)(p, x, t);
  check_all_close(g.w1, want.w1, 1e-5);
  check_all_close(g.w2, want.w2, 1e-5);
  // §3.1 DP: the loss all-reduced forward, each weight gradient backward.
  CHECK(moving(rec.records()) == "psum data ()->(); psum data (32, 8)->(32, 8); psum data (8, 32)->(8, 32)");
}

TEST_CASE("sharded jit through nested jit, checkpoint, custom_jvp/vjp and shard_map regions") {
  Mesh mesh = make_mesh({4}, {"x"});
  NamedSharding rows(mesh, P("x"));
  Array a = random::normal(random::key(1), {16, 8}), w = random::normal(random::key(2), {8, 8}) * 0.3f;
  Array as = device_put(a, rows);
  debug::CollectiveRecorder rec;

  SUBCASE("their bodies are partitioned like the program: a DP gradient, one psum") {
    auto softplus = custom_jvp([](const Array& x) { return jnp::log1p(jnp::exp(x)); },
                               [](const std::tuple<Array>& p, const std::tuple<Array>& t) {
                                 auto [x] = p;
                                 auto [dx] = t;
                                 return std::pair{jnp::log1p(jnp::exp(x)), dx * lax::logistic(x)};
                               });
    auto clip = custom_vjp([](const Array& x) { return x; },
                           [](const Array& x) {
                             return std::pair{x, std::tuple<>{}};
                           },
                           [](const std::tuple<>&, const Array& g) { return std::tuple{jnp::clip(g, -1.0, 1.0)}; });
    auto layer = checkpoint([&](const Array& m, const Array& x) { return softplus(jnp::dot(clip(x), m)); });
    auto inner = jit([&](const Array& m, const Array& x) { return layer(m, layer(m, x)); });
    auto loss = [&](const Array& m, const Array& x) { return jnp::sum(inner(m, x)); };
    Array g = jit(grad(loss))(w, as);
    check_all_close(g, grad(loss)(w, a), 1e-4);
    CHECK(moving(rec.records()) == "psum x (8, 8)->(8, 8)");
  }
  SUBCASE("a shard_map taking operands laid out otherwise: they are resharded into its in_specs") {
    auto f = jit([&](const Array& u) {
      return shard_map([](const Array& b) { return b * 2.0f; }, mesh, P(None, "x"), P(None, "x"))(u + 1.0f);
    });
    Array y = f(as);
    check_all_close(y, (a + 1.0f) * 2.0f, 1e-6);
    CHECK(layout_of(y) == P(None, "x").str());
    CHECK(moving(rec.records()) == "all_to_all x (4, 8)->(16, 2)");
  }
}

TEST_CASE("eager operations on split arrays run through the partitioner") {
  Mesh mesh = make_mesh({4}, {"x"});
  Array a = random::normal(random::key(1), {8, 4}), w = random::normal(random::key(2), {4, 6});
  Array rows = device_put(a, NamedSharding(mesh, P("x")));
  debug::CollectiveRecorder rec;

  SUBCASE("a matmul of row blocks by a replicated matrix keeps the rows split") {
    Array y = jnp::matmul(rows, w);
    check_all_close(y, jnp::matmul(a, w), 1e-5);
    CHECK(layout_of(y) == P("x").str());
    CHECK(moving(rec.records()) == "");
  }
  SUBCASE("indexing and slicing") {
    check_all_close(rows[1], a[1], 1e-7);
    check_all_close(jnp::transpose(rows)[Slice(1, 3)], jnp::transpose(a)[Slice(1, 3)], 1e-7);
  }
  SUBCASE("the output of a shard_map feeds eager code") {
    auto doubled = shard_map([](const Array& b) { return b * 2.0f; }, mesh, P("x"), P("x"))(rows);
    check_all_close(jnp::matmul(doubled, w)[0], jnp::matmul(a * 2.0f, w)[0], 1e-5);
  }
  SUBCASE("device_put to another layout moves only what must move") {
    Array cols = device_put(rows, NamedSharding(mesh, P(None, "x")));
    check_all_close(cols, a, 1e-7);
    CHECK(layout_of(cols) == P(None, "x").str());
    CHECK(moving(rec.records()) == "all_to_all x (2, 4)->(8, 1)");
    rec.clear();
    Array whole = device_put(rows, NamedSharding(mesh, P()));
    check_all_close(whole, a, 1e-7);
    CHECK(moving(rec.records()) == "all_gather x (2, 4)->(8, 4)");
  }
}

TEST_CASE("a sharded jit's first call symbolizes no call site; its report does, when asked") {
  // Symbolizing reads the binary's debug info (about half a second the first time in a process),
  // so the partitioner keeps the call sites as captured and the report turns them into text.
  Mesh mesh = make_mesh({4}, {"fsdp"});
  Array x = device_put(random::normal(random::key(4), {16, 8}), NamedSharding(mesh, P("fsdp")));
  Array w = device_put(random::normal(random::key(5), {8, 32}), NamedSharding(mesh, P("fsdp", None)));
  auto f = jit([](const Array& a, const Array& b) { return jnp::sum(jnp::dot(a, b) * 3.0f); }, {.name = "lazy"});
  int64_t before = SourceInfo::symbolized_count();
  Array y = f(x, w);
  CHECK(y.item<float>() == doctest::Approx(3.0f * jnp::sum(jnp::dot(x, w)).item<float>()).epsilon(1e-5));
  CHECK(SourceInfo::symbolized_count() == before);
  std::string r = f.sharding_report(x, w);
  CAPTURE(r);
  CHECK(SourceInfo::symbolized_count() > before);
  CHECK(r.find("all_gather over (fsdp) f32[2,32] -> f32[8,32] (256 bytes) for dot_general at test_sharded_jit.cpp:") !=
        std::string::npos);
}

TEST_CASE("sharding report: layouts and inserted collectives with their source lines, before running") {
  Mesh mesh = make_mesh({4}, {"fsdp"});
  Array x = device_put(random::normal(random::key(1), {16, 8}), NamedSharding(mesh, P("fsdp")));
  Array w = device_put(random::normal(random::key(2), {8, 32}), NamedSharding(mesh, P("fsdp", None)));
  auto f = jit([](const Array& a, const Array& b) { return jnp::sum(jnp::dot(a, b)); }, {.name = "layer"});
  std::string r = f.sharding_report(x, w);
  CAPTURE(r);
  CHECK(r.find("sharded jit 'layer' over Mesh('fsdp': 4)") != std::string::npos);
  CHECK(r.find("dot_general at test_sharded_jit.cpp:") != std::string::npos);
  CHECK(r.find("f32[16,32] P('fsdp',)") != std::string::npos);
  CHECK(r.find("all_gather over (fsdp) f32[2,32] -> f32[8,32] (256 bytes) for dot_general at "
               "test_sharded_jit.cpp:") != std::string::npos);
  CHECK(r.find("psum over (fsdp)") != std::string::npos);
  CHECK(r.find(kNoneRunWhole) != std::string::npos);
  // An equation without a sharding rule is named with its line (and warned about when it runs):
  // a primitive registered here, which the partitioner has no rule for.
  static const PrimitiveDef& reversed_rows = register_primitive(
      PrimitiveDef{"test_reversed_rows",
                   PrimKind::Opaque,
                   Arity::exactly(1),
                   [](std::span<const Array> in, const Params&) { return std::vector<AbstractValue>{in[0].aval()}; },
                   [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
                     return std::vector<Array>{lax::rev(in[0], {0})};
                   },
                   std::nullopt,
                   {}});
  auto opaque = jit([](const Array& a) { return bind1(reversed_rows, {a}, {}) * 2.0f; });
  std::string ro = opaque.sharding_report(x);
  CAPTURE(ro);
  CHECK(ro.find("for lack of a sharding rule (their split operands gathered): 1\n  'test_reversed_rows' at "
                "test_sharded_jit.cpp:") != std::string::npos);
  Array whole = random::normal(random::key(1), {16, 8});
  testing::check_all_close(opaque(x), lax::rev(whole, {0}) * 2.0f, 1e-6);
  // debug::print prints the global value once (JAX's partitioned=False), not once per device.
  std::ostringstream printed;
  debug::set_print_stream(&printed);
  jit([](const Array& a) {
    debug::print("rows {}", a[Slice(2, 6)]);  // rows of two devices' blocks, no arithmetic: exact text
    return a;
  })(x)
      .block_until_ready();
  debug::set_print_stream(nullptr);
  std::ostringstream want;
  want << "rows " << whole[Slice(2, 6)] << "\n";
  CHECK(printed.str() == want.str());
  CHECK(jit([](const Array& a) { return a; })
            .sharding_report(random::normal(random::key(3), {2}))
            .find("not partitioned") != std::string::npos);
}

TEST_CASE("rule-based parameter sharding: the first matching rule per leaf path") {
  Mesh mesh = make_mesh({2, 2}, {"fsdp", "tensor"});
  MlpAndInput tree{Mlp{random::normal(random::key(1), {8, 32}), random::normal(random::key(2), {32, 8})},
                   random::normal(random::key(3), {16, 8})};
  std::vector<sharding::Rule> rules{{"w1$", P("fsdp", "tensor")}, {"^p\\.w", P("tensor", "fsdp")}};
  auto placed = sharding::apply_rules(tree, mesh, rules);
  CHECK(layout_of(placed.p.w1) == P("fsdp", "tensor").str());
  CHECK(layout_of(placed.p.w2) == P("tensor", "fsdp").str());
  CHECK(layout_of(placed.x) == P().str());  // no rule: replicated
  check_all_close(placed.p.w2, tree.p.w2, 1e-7);
  CHECK_THROWS_WITH_AS(sharding::apply_rules(tree, mesh, rules, {.strict = true}),
                       doctest::Contains("no sharding rule matches 1 leaf(s): 'x' (16, 8)"), ShardingError);
  CHECK_THROWS_WITH_AS(sharding::apply_rules(tree, mesh, {{"x", P("fsdp", None, None)}}),
                       doctest::Contains("does not fit leaf 'x'"), ShardingError);
  // The placed tree trains as plain sharded jit.
  Array t = random::normal(random::key(4), {16, 8});
  check_all_close(jit(mlp_loss_ii)(placed, t), mlp_loss_ii(tree, t), 1e-5);
}

TEST_CASE("sharded jit: an update of replicated weights after the gradient's psum runs once, not per device") {
  // Data parallelism as plain jit: the partitioner's body has unchecked types, and its in_specs
  // say which arguments are the same on every device.
  Mesh mesh = make_mesh({8}, {"data"});
  auto step = [](const Array& w, const Array& v, const Array& x) {
    Array g = jnp::matmul(jnp::transpose(x), jnp::tanh(jnp::matmul(x, w)));  // a psum over 'data'
    Array v2 = v * 0.9f + g * g * 0.1f;
    Array w2 = w - g * 0.01f / (jnp::sqrt(v2) + 1e-6f);
    return std::vector<Array>{w2, v2};
  };
  Array w = random::normal(random::key(1), {16, 16}) * 0.3f, v = jnp::ones({16, 16}) * 0.5f,
        x = random::normal(random::key(2), {64, 16});
  Array ws = device_put(w, NamedSharding(mesh, P())), vs = device_put(v, NamedSharding(mesh, P())),
        xs = device_put(x, NamedSharding(mesh, P("data")));
  auto f = jit(step);
  for (const Array& a : f(ws, vs, xs)) a.block_until_ready();  // compiled
  profiler::start();
  std::vector<Array> got = f(ws, vs, xs);
  for (const Array& a : got) a.block_until_ready();
  profiler::stop();
  int sqrt_kernels = 0;
  for (const profiler::Event& e : profiler::events()) sqrt_kernels += e.name.find("sqrt") != std::string::npos;
  CHECK(sqrt_kernels == 1);
  std::vector<Array> want = jit(step)(w, v, x);
  for (size_t k = 0; k < 2; ++k) {
    std::vector<float> a = got[k].to_vector<float>(), b = want[k].to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
  }
}

TEST_CASE("sharded jit: an FSDP gradient is reduce-scattered onto its optimizer state, not summed and sliced") {
  // Adam's moments of a weight split by rows: the gradient (a pending sum over 'data') meets
  // them first as 0.1 * g and g * g, which name no layout; the moments it is headed for do.
  Mesh mesh = make_mesh({8}, {"data"});
  auto step = [](const Array& w, const Array& m, const Array& v, const Array& x) {
    Array g = jnp::matmul(jnp::transpose(x), jnp::tanh(jnp::matmul(x, w)));
    Array m2 = 0.9f * m + 0.1f * g;  // traced right to left or left to right: both find m's layout
    Array v2 = 0.99f * v + 0.01f * jnp::square(g);
    Array w2 = w - 0.01f * m2 / (jnp::sqrt(v2) + 1e-6f);
    return std::vector<Array>{w2, m2, v2};
  };
  Array w = random::normal(random::key(5), {16, 16}) * 0.3f, m = random::normal(random::key(6), {16, 16}) * 0.1f,
        v = jnp::ones({16, 16}) * 0.5f, x = random::normal(random::key(7), {64, 16});
  auto rows = [&](const Array& a) { return device_put(a, NamedSharding(mesh, P("data"))); };
  Array ws = rows(w), ms = rows(m), vs = rows(v), xs = rows(x);
  auto f = jit(step);
  for (const Array& a : f(ws, ms, vs, xs)) a.block_until_ready();  // compiled
  debug::CollectiveRecorder rec;
  std::vector<Array> got = f(ws, ms, vs, xs);
  for (const Array& a : got) a.block_until_ready();
  // The forward's all_gather of w's rows, the gradient's one reduce_scatter: no psum.
  CHECK(moving(rec.records()) == "all_gather data (2, 16)->(16, 16); reduce_scatter data (16, 16)->(2, 16)");
  std::vector<Array> want = step(w, m, v, x);
  for (size_t k = 0; k < 3; ++k) {
    CHECK(layout_of(got[k]) == P("data").str());
    check_all_close(got[k], want[k], 1e-5);
  }
}
