// samples/transformer (issue 6): the byte transformer under the four layouts gives the same losses,
// FSDP holds 1/n of the parameters and Adam state per device, the collectives per layout are those of
// docs/sharding.md §3.2, and checkpoints resume exactly and fail cleanly on corrupt files.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "core/array/array_impl.h"
#include "test_util.h"
#include "transformer/transformer.h"

using namespace cjax;
namespace tf = cjax::transformer;
namespace jnp = cjax::numpy;

namespace {

// Small enough for a quick test; sizes divisible by 8 so every layout fits 8 devices.
tf::Config small_config(tf::Layout layout) {
  tf::Config c;
  c.layout = layout;
  c.seq_len = 16;
  c.d_model = 32;
  c.n_heads = 8;
  c.head_dim = 4;
  c.d_ff = 64;
  c.n_layers = 2;
  c.batch = 16;
  c.lr = 1e-2;
  c.warmup = 0;
  c.devices = 8;
  c.tensor = 2;
  c.seed = 3;
  return c;
}

tf::Corpus test_corpus() {
  tf::Corpus c;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "In the beginning God created the heaven and the earth. ";
  c.bytes.assign(text.begin(), text.end());
  return c;
}

std::vector<float> train_losses(const tf::Config& c, int steps, tf::TrainState* final_state = nullptr) {
  tf::Corpus corpus = test_corpus();
  tf::TrainState s = tf::init_state(c);
  tf::Trainer trainer(c);
  std::vector<Array> losses;
  {
    tf::Loader loader(corpus, c, 0);
    for (int k = 0; k < steps; ++k) losses.push_back(trainer.step(s, loader.next(), k));
  }
  std::vector<float> out;
  for (const Array& l : losses) out.push_back(l.item<float>());
  if (final_state) *final_state = s;
  return out;
}

// §3.2's sizes: B=8, S=16, D=32, N=4, H=8, F=128, one block, meshes of 4 devices (fsdp=2 x tensor=2).
tf::Config block_config(tf::Layout l) {
  tf::Config c;
  c.layout = l;
  c.seq_len = 16, c.d_model = 32, c.n_heads = 4, c.head_dim = 8, c.d_ff = 128, c.n_layers = 1, c.batch = 8;
  c.devices = 4, c.tensor = 2;
  return c;
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("cjax_test_train_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

TEST_CASE("normal_block reproduces random::normal block by block") {
  Array key = random::key(7);
  Shape g{6, 8};
  Array full = random::normal(key, g);
  Array whole = tf::normal_block(key, g, {Array(0), Array(0)}, g);
  CHECK(jnp::array_equal(full, whole));
  Array blk = tf::normal_block(key, g, {Array(2), Array(4)}, {2, 4});
  CHECK(jnp::array_equal(full[{Slice(2, 4), Slice(4, 8)}], blk));
}

TEST_CASE("initial loss is about ln 256 and the layouts agree for 20 steps") {
  std::map<tf::Layout, std::vector<float>> losses;
  for (tf::Layout l : {tf::Layout::Single, tf::Layout::DP, tf::Layout::FSDP, tf::Layout::FSDP_TP})
    losses[l] = train_losses(small_config(l), 20);
  const auto& ref = losses[tf::Layout::Single];
  CHECK(std::abs(ref[0] - std::log(256.0f)) < 0.5f);
  CHECK(ref.back() < ref.front() - 1.0f);  // it learns the repeated sentence
  for (auto& [layout, ls] : losses) {
    INFO("layout " << tf::layout_name(layout));
    for (size_t k = 0; k < ref.size(); ++k) {
      INFO("step " << k << ": " << ls[k] << " vs single " << ref[k]);
      CHECK(std::abs(ls[k] - ref[k]) <= 1e-4f * std::abs(ref[k]));
    }
  }
}

TEST_CASE("FSDP keeps 1/8 of the parameters and Adam state on each device") {
  tf::Config c;  // the sample's default model (467k parameters), so that small-buffer rounding is negligible
  c.layout = tf::Layout::FSDP;
  std::vector<int64_t> before;
  for (const Device& d : devices()) before.push_back(memory_stats(d).bytes_in_use);
  tf::TrainState s = tf::init_state(c);
  for (const Array& a : tree::leaves(s)) a.block_until_ready();
  int64_t total = tf::tree_bytes(s);  // global bytes of params + mu + nu + count
  for (size_t k = 0; k < devices().size(); ++k) {
    int64_t used = memory_stats(devices()[k]).bytes_in_use - before[k];
    int64_t shards = 0, own = 0;  // bytes of the blocks this device holds, and of those in its own memory
    for (const Array& a : tree::leaves(s))
      for (const Shard& sh : a.addressable_shards())
        if (sh.device == devices()[k]) {
          int64_t bytes = sh.data.size() * int64_t(itemsize(sh.data.dtype()));
          shards += bytes;
          // Blocks that are the same on every device (the zero Adam moments) are computed once
          // and shared: they count where they were allocated.
          if (!concrete(sh.data)->buffer()->shares_memory()) own += bytes;
        }
    INFO("device " << k << " holds " << shards << " bytes in shards (" << own << " its own), " << used
                   << " bytes allocated, of " << total);
    CHECK(shards == (total - 4) / 8 + 4);  // everything split 8 ways but the replicated step counter
    // The caching allocator rounds blocks up to its size classes (e.g. 24 KiB -> 32 KiB).
    CHECK(double(used) >= double(own));
    CHECK(double(used) <= double(total) / 8 * 1.1);
  }
}

namespace {
struct Expect {
  std::string kind;
  std::vector<std::string> axes;
  Shape in, out;
  debug::Phase phase;
};
std::string str(const Expect& e) {
  std::string s = (e.phase == debug::Phase::Forward ? "forward " : "backward ") + e.kind + " over";
  for (auto& a : e.axes) s += " " + a;
  return s + " " + shape_str(e.in) + " -> " + shape_str(e.out);
}
// How many times each expected collective appears among the records.
int count(const std::vector<debug::CollectiveRecord>& recs, const Expect& e) {
  int n = 0;
  for (const auto& r : recs)
    if (r.kind == e.kind && r.axes == e.axes && r.in_shape == e.in && r.out_shape == e.out && r.phase == e.phase) ++n;
  return n;
}
}  // namespace

TEST_CASE("collectives of one block per layout (docs/sharding.md §3.2)") {
  tf::Corpus corpus = test_corpus();
  auto records = [&](const tf::Config& c) {
    tf::TrainState s = tf::init_state(c);
    Array tokens = jnp::array(tf::host_batch(corpus, c, 0), {c.batch, c.seq_len + 1});
    if (c.layout != tf::Layout::Single) tokens = device_put(tokens, tf::batch_sharding(c));
    auto g = jit([c](const tf::Params& p, const Array& t) {
      return grad([&](const tf::Params& q) { return tf::loss_fn(c, q, t); })(p);
    });
    for (const Array& a : tree::leaves(g(s.params, tokens)))
      a.block_until_ready();  // compile and run outside the recorder
    debug::CollectiveRecorder rec;
    tree::leaves(g(s.params, tokens))[0].block_until_ready();
    auto r = rec.records();
    std::vector<debug::CollectiveRecord> out;
    for (auto& x : r)
      if (x.communicates) out.push_back(x);
    return out;
  };
  using debug::Phase;
  auto check_all = [](const std::vector<debug::CollectiveRecord>& recs, const std::vector<Expect>& want) {
    std::string all;
    for (auto& r : recs) all += r.str() + "\n";
    for (const Expect& e : want) {
      INFO("expected " << str(e) << " among\n" << all);
      CHECK(count(recs, e) >= 1);
    }
  };
  SUBCASE("DP: weight gradients all-reduced, nothing in the forward block") {
    auto recs = records(block_config(tf::Layout::DP));
    check_all(recs, {{"psum_invariant", {"data"}, {3, 32, 4, 8}, {3, 32, 4, 8}, Phase::Backward},
                     {"psum_invariant", {"data"}, {4, 8, 32}, {4, 8, 32}, Phase::Backward},
                     {"psum_invariant", {"data"}, {32, 128}, {32, 128}, Phase::Backward},
                     {"psum_invariant", {"data"}, {128, 32}, {128, 32}, Phase::Backward}});
    for (auto& r : recs)
      if (r.phase == Phase::Forward) CHECK(r.in_shape == Shape{});  // only the loss
  }
  SUBCASE("FSDP: all-gathers forward and again backward, reduce-scatters backward") {
    auto recs = records(block_config(tf::Layout::FSDP));
    std::vector<Expect> want;
    struct W {
      Shape local, full;
    };
    for (W w :
         {W{{3, 8, 4, 8}, {3, 32, 4, 8}}, W{{1, 8, 32}, {4, 8, 32}}, W{{8, 128}, {32, 128}}, W{{128, 8}, {128, 32}}}) {
      want.push_back({"all_gather", {"fsdp"}, w.local, w.full, Phase::Forward});
      want.push_back({"reduce_scatter", {"fsdp"}, w.full, w.local, Phase::Backward});
      // Re-gathered for the input cotangents (Config::regather: the body is checkpointed without
      // saving all_gather outputs); Wqkv too, since the block input comes from the embedding.
      want.push_back({"all_gather", {"fsdp"}, w.local, w.full, Phase::Backward});
    }
    check_all(recs, want);
    for (auto& r : recs) {  // no gradient all-reduce
      bool ok = r.kind != "psum_invariant" || r.in_shape == Shape{};
      CHECK(ok);
    }
  }
  SUBCASE("FSDP+TP: fsdp gathers/scatters on tensor-sharded weights, 2+2 all-reduces over tensor") {
    auto recs = records(block_config(tf::Layout::FSDP_TP));
    std::vector<Expect> want;
    struct W {
      Shape local, full;
    };
    for (W w :
         {W{{3, 16, 2, 8}, {3, 32, 2, 8}}, W{{2, 8, 16}, {2, 8, 32}}, W{{16, 64}, {32, 64}}, W{{64, 16}, {64, 32}}}) {
      want.push_back({"all_gather", {"fsdp"}, w.local, w.full, Phase::Forward});
      want.push_back({"reduce_scatter", {"fsdp"}, w.full, w.local, Phase::Backward});
      want.push_back({"all_gather", {"fsdp"}, w.local, w.full, Phase::Backward});
    }
    check_all(recs, want);
    Expect ar_fwd{"psum_invariant", {"tensor"}, {4, 16, 32}, {4, 16, 32}, Phase::Forward};
    Expect ar_bwd{"psum_invariant", {"tensor"}, {4, 16, 32}, {4, 16, 32}, Phase::Backward};
    CHECK(count(recs, ar_fwd) == 2);
    CHECK(count(recs, ar_bwd) == 2);
    for (auto& r : recs)  // never a collective over tensor on weights
      if (r.axes == std::vector<std::string>{"tensor"}) CHECK(r.in_shape == Shape({4, 16, 32}));
  }
}

TEST_CASE("checkpoint: stop, reload and continue reproduces the losses exactly") {
  tf::Config c = small_config(tf::Layout::FSDP);
  std::vector<float> ref = train_losses(c, 8);
  tf::Corpus corpus = test_corpus();
  auto path = temp_path("resume.safetensors");
  {
    tf::TrainState s = tf::init_state(c);
    tf::Trainer trainer(c);
    tf::Loader loader(corpus, c, 0);
    for (int k = 0; k < 4; ++k) CHECK(trainer.step(s, loader.next(), k).item<float>() == ref[size_t(k)]);
    tf::save_checkpoint(path, s, 4, loader.position(), c);
  }
  tf::Checkpoint ck = tf::load_checkpoint(path, c);
  CHECK(ck.step == 4);
  CHECK(ck.data_position == 4);
  tf::Trainer trainer(c);
  tf::Loader loader(corpus, c, ck.data_position);
  for (int k = 4; k < 8; ++k) CHECK(trainer.step(ck.state, loader.next(), k).item<float>() == ref[size_t(k)]);
  // Sampling from the (sharded) trained params: deterministic for a seed, the requested length.
  std::string sample = tf::generate(c, ck.state.params, "In the", 24, 0.8, 1);
  CHECK(sample.size() == 24);
  CHECK(sample == tf::generate(c, ck.state.params, "In the", 24, 0.8, 1));

  SUBCASE("a truncated checkpoint raises IoError naming the file") {
    auto bad = temp_path("truncated.safetensors");
    std::filesystem::copy_file(path, bad, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(bad, std::filesystem::file_size(bad) / 2);
    try {
      tf::load_checkpoint(bad, c);
      FAIL("no IoError");
    } catch (const IoError& e) {
      CHECK(std::string(e.what()).find(bad.filename().string()) != std::string::npos);
    }
    std::filesystem::remove(bad);
  }
  SUBCASE("a corrupt header raises IoError naming the file") {
    auto bad = temp_path("corrupt.safetensors");
    std::filesystem::copy_file(path, bad, std::filesystem::copy_options::overwrite_existing);
    {
      std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(12);
      f.write("\x01\x02garbage{{", 11);
    }
    try {
      tf::load_checkpoint(bad, c);
      FAIL("no IoError");
    } catch (const IoError& e) {
      CHECK(std::string(e.what()).find(bad.filename().string()) != std::string::npos);
    }
    std::filesystem::remove(bad);
  }
  SUBCASE("a checkpoint of another model config raises IoError") {
    tf::Config other = c;
    other.d_ff = 128;
    CHECK_THROWS_AS(tf::load_checkpoint(path, other), IoError);
  }
  std::filesystem::remove(path);
}

TEST_CASE("the corpus loader refuses directories and FIFOs with an IoError naming the path") {
  auto dir = temp_path("corpus_dir");
  std::filesystem::create_directories(dir);
  try {
    tf::load_corpus(dir);
    FAIL("no IoError");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()) == "corpus '" + dir.string() + "' is a directory; pass a text file");
  }
  auto fifo = dir / "pipe.txt";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Should the loader block on the FIFO, this thread opens its write end after 3 s to release it.
  std::atomic<bool> done{false};
  std::thread rescuer([&] {
    for (int i = 0; i < 30 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    while (!done) {
      int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(tf::load_corpus(fifo), doctest::Contains("is not a regular file (a FIFO)"), IoError);
  CHECK_THROWS_WITH_AS(tf::load_checkpoint(fifo, small_config(tf::Layout::Single)),
                       doctest::Contains("not a regular file"), IoError);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done = true;
  rescuer.join();
  CHECK(seconds < 2.0);
  CHECK_THROWS_WITH_AS(tf::load_corpus(dir / "missing.txt"), doctest::Contains("No such file"), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a non-finite loss stops training with the step and the value") {
  CHECK_NOTHROW(tf::check_loss(3, 2.5));
  CHECK_THROWS_WITH_AS(tf::check_loss(12, std::nan("")), doctest::Contains("non-finite at step 12 (loss nan)"),
                       tf::NonFiniteLossError);
  CHECK_THROWS_WITH_AS(tf::check_loss(7, -INFINITY), doctest::Contains("at step 7 (loss -inf)"), Error);
  // A state whose parameters hold a NaN gives a NaN loss, which check_loss refuses.
  tf::Config c = small_config(tf::Layout::Single);
  tf::TrainState s = tf::init_state(c);
  s.params.out_kernel = s.params.out_kernel * std::nanf("");
  tf::Trainer trainer(c);
  tf::Corpus corpus = test_corpus();
  double loss = trainer.step(s, jnp::array(tf::host_batch(corpus, c, 0), {c.batch, c.seq_len + 1}), 0).item<float>();
  CHECK(std::isnan(loss));
  CHECK_THROWS_AS(tf::check_loss(0, loss), tf::NonFiniteLossError);
}

TEST_CASE("checkpoints: stale temporaries of killed saves are removed; a flipped bit names the tensor") {
  tf::Config c = small_config(tf::Layout::Single);
  tf::TrainState s = tf::init_state(c);
  auto dir = temp_path("ckpt_dir");
  std::filesystem::create_directories(dir);
  auto path = dir / "ckpt.safetensors";
  pid_t dead = ::fork();  // a pid that no longer exists, as of a run killed mid-save
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  auto stale = dir / (".ckpt.safetensors.cjax-tmp." + std::to_string(dead) + ".0");
  auto unrelated = dir / "notes.tmp";
  for (const auto& f : {stale, unrelated}) std::ofstream(f) << "partial";
  tf::save_checkpoint(path, s, 5, 5, c);
  CHECK(!std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(unrelated));
  std::ofstream(stale) << "partial";  // the loader cleans up too
  CHECK(tf::load_checkpoint(path, c).step == 5);
  CHECK(!std::filesystem::exists(stale));
  // Flip one bit of the last byte of the data section: the last tensor in name order, params.pos_embed.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char b = 0;
    f.read(&b, 1);
    f.seekp(-1, std::ios::end);
    b ^= 0x01;
    f.write(&b, 1);
  }
  CHECK_THROWS_WITH_AS(tf::load_checkpoint(path, c),
                       doctest::Contains("checksum mismatch in tensor 'params.pos_embed'"), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("auto sharding: the layouts as plain jit over sharded state agree with one device for 20 steps") {
  std::vector<float> ref = train_losses(small_config(tf::Layout::Single), 20);
  for (tf::Layout l : {tf::Layout::DP, tf::Layout::FSDP, tf::Layout::FSDP_TP}) {
    tf::Config c = small_config(l);
    c.auto_sharding = true;
    std::vector<float> ls = train_losses(c, 20);
    INFO("layout " << tf::layout_name(l));
    for (size_t k = 0; k < ref.size(); ++k) {
      INFO("step " << k << ": " << ls[k] << " vs single " << ref[k]);
      CHECK(std::abs(ls[k] - ref[k]) <= 1e-4f * std::abs(ref[k]));
    }
  }
}

TEST_CASE("auto sharding: the collectives the partitioner inserts in one block (docs/sharding.md §3.2)") {
  tf::Corpus corpus = test_corpus();
  auto records = [&](const tf::Config& c) {
    tf::TrainState s = tf::init_state(c);
    Array tokens =
        device_put(jnp::array(tf::host_batch(corpus, c, 0), {c.batch, c.seq_len + 1}), tf::batch_sharding(c));
    tf::Config one = c;
    one.layout = tf::Layout::Single;
    auto g = jit([one](const tf::Params& p,
                       const Array& t) { return grad([&](const tf::Params& q) { return tf::loss_fn(one, q, t); })(p); },
                 {.out_shardings = tf::param_specs(c)});
    for (const Array& a : tree::leaves(g(s.params, tokens))) a.block_until_ready();
    debug::CollectiveRecorder rec;
    for (const Array& a : tree::leaves(g(s.params, tokens))) a.block_until_ready();
    std::vector<debug::CollectiveRecord> out;
    for (auto& x : rec.records())
      if (x.communicates) out.push_back(x);
    return out;
  };
  auto count_of = [](const std::vector<debug::CollectiveRecord>& rs, const std::string& kind, const std::string& axis,
                     const Shape& in, const Shape& out) {
    return std::count_if(rs.begin(), rs.end(), [&](const debug::CollectiveRecord& r) {
      return r.kind == kind && r.axes == std::vector<std::string>{axis} && r.in_shape == in && r.out_shape == out;
    });
  };
  struct W {
    Shape local, full;
  };
  SUBCASE("DP: each weight gradient all-reduced once, nothing else but the loss") {
    auto recs = records(block_config(tf::Layout::DP));
    for (Shape w : {Shape{3, 32, 4, 8}, Shape{4, 8, 32}, Shape{32, 128}, Shape{128, 32}})
      CHECK(count_of(recs, "psum", "data", w, w) == 1);
    for (auto& r : recs) {
      CHECK(r.kind == "psum");  // no gather, no scatter
      CHECK(r.phase == debug::Phase::Backward);
    }
  }
  SUBCASE("TP (the fsdp_tp layout over fsdp=1 x tensor=4): 2 all-reduces forward, 2 backward, none on weights") {
    tf::Config c = block_config(tf::Layout::FSDP_TP);
    c.tensor = 4;
    auto recs = records(c);
    CHECK(count_of(recs, "psum", "tensor", {8, 16, 32}, {8, 16, 32}) == 4);
    int backward = 0;
    for (auto& r : recs) {
      INFO(r.str());
      CHECK((r.axes == std::vector<std::string>{"tensor"} && r.in_shape == Shape({8, 16, 32})));
      backward += r.phase == debug::Phase::Backward;
    }
    CHECK(backward == 2);  // the MLP input's and the block input's cotangents
  }
  SUBCASE("FSDP: each weight gathered, each gradient reduce-scattered, no gradient all-reduce") {
    auto recs = records(block_config(tf::Layout::FSDP));
    for (W w :
         {W{{3, 8, 4, 8}, {3, 32, 4, 8}}, W{{1, 8, 32}, {4, 8, 32}}, W{{8, 128}, {32, 128}}, W{{128, 8}, {128, 32}}}) {
      CHECK(count_of(recs, "all_gather", "fsdp", w.local, w.full) == 1);  // the backward pass reuses it
      CHECK(count_of(recs, "reduce_scatter", "fsdp", w.full, w.local) == 1);
    }
    for (auto& r : recs) {
      CHECK((r.kind != "psum" || r.in_shape == Shape{}));
      if (r.kind == "all_gather") CHECK(r.phase == debug::Phase::Forward);
      if (r.kind == "reduce_scatter") CHECK(r.phase == debug::Phase::Backward);
    }
  }
  SUBCASE("FSDP+TP: fsdp gathers and scatters on tensor-split weights, 2+2 all-reduces over tensor") {
    auto recs = records(block_config(tf::Layout::FSDP_TP));
    for (W w :
         {W{{3, 16, 2, 8}, {3, 32, 2, 8}}, W{{2, 8, 16}, {2, 8, 32}}, W{{16, 64}, {32, 64}}, W{{64, 16}, {64, 32}}}) {
      CHECK(count_of(recs, "all_gather", "fsdp", w.local, w.full) == 1);
      CHECK(count_of(recs, "reduce_scatter", "fsdp", w.full, w.local) == 1);
    }
    CHECK(count_of(recs, "psum", "tensor", {4, 16, 32}, {4, 16, 32}) == 4);
    for (auto& r : recs)  // never a collective over tensor on a weight
      if (r.axes == std::vector<std::string>{"tensor"}) CHECK(r.in_shape == Shape({4, 16, 32}));
  }
}
