// A decoder-only byte-level transformer and its training step (docs/examples.md §5), written once
// and run under four layouts: one device, data parallel (DP), FSDP and FSDP+TP on a 2-D mesh. The
// sharded layouts are shard_maps with explicit collectives (docs/sharding.md §3.2): FSDP gathers each
// weight just before use (re-gathered in the backward pass), TP splits heads and the MLP hidden
// dimension over `tensor` and all-reduces the two block outputs.
//
// Used by samples/train_transformer.cpp (the CLI) and tests/test_train_transformer.cpp.
#pragma once
#include <cjax/cjax.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace cjax::transformer {

enum class Layout { Single, DP, FSDP, FSDP_TP };
Layout parse_layout(const std::string& s);  // "single" | "dp" | "fsdp" | "fsdp_tp" (ValueError otherwise)
std::string layout_name(Layout l);

struct Config {
  // Model.
  int64_t vocab = 256, seq_len = 64, d_model = 128, n_heads = 8, head_dim = 16, d_ff = 512, n_layers = 2;
  bool cookbook_norm = false;  // the cookbook's x * rsqrt(||x|| + 1e-6) instead of RMSNorm with a gain
  DType param_dtype = DType::float32;
  // Training.
  int64_t batch = 32;  // global batch (sequences per step)
  double lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t warmup = 20;  // linear learning-rate warmup steps (host-side schedule, passed as an argument)
  uint64_t seed = 0;
  // Layout.
  Layout layout = Layout::Single;
  int64_t tensor = 2;    // size of the `tensor` axis in FSDP+TP (the `fsdp` axis gets the rest)
  int64_t devices = 8;   // devices used by the sharded layouts
  bool regather = true;  // FSDP: re-gather weights in the backward pass instead of keeping them
  // The sharded layouts written as plain jit over sharded parameters and batches (the partitioner
  // inserts the collectives, docs/sharding.md §2) instead of shard_maps with explicit collectives.
  bool auto_sharding = false;
  bool operator==(const Config&) const = default;
  size_t hash() const;
  std::string str() const;
};

// Parameters (sorted-key flattening is not needed: a struct flattens in field order, which is the
// order of the PRNG keys and of the checkpoint entries' leaves).
struct Block {
  Array attn_qkv;      // [3, D, N, H]
  Array attn_out;      // [N, H, D]
  Array mlp_in;        // [D, F]
  Array mlp_out;       // [F, D]
  Array norm1, norm2;  // [D] RMSNorm gains
};
CJAX_TREE(Block, attn_qkv, attn_out, mlp_in, mlp_out, norm1, norm2)

struct Params {
  Array embed;      // [V, D]
  Array pos_embed;  // [S, D]
  std::vector<Block> layers;
  Array out_kernel;  // [D, V]
};
CJAX_TREE(Params, embed, pos_embed, layers, out_kernel)

// Adam (optax's scale_by_adam + scale(-lr)): one step counter for the whole tree.
struct TrainState {
  Params params, mu, nu;
  Array count;  // int32 scalar
};
CJAX_TREE(TrainState, params, mu, nu, count)

// The mesh of a layout (Single: a 1-device mesh that is not used for shard_map).
Mesh layout_mesh(const Config& c);
// The batch axis name(s) the inputs are split over ("" for Single).
std::string batch_axis(const Config& c);
// PartitionSpecs of every parameter (a SpecTree shaped like Params) and of the TrainState.
SpecTree param_specs(const Config& c);
SpecTree state_specs(const Config& c);
// The sharding of each parameter leaf, in leaf order.
std::vector<PartitionSpec> param_leaf_specs(const Config& c);
// Sharding of a token batch [B, S+1].
NamedSharding batch_sharding(const Config& c);

// Parameters created directly sharded: every device computes only its own block of each leaf from
// the partitionable threefry counters of the block's global indices, so the values do not depend on
// the layout and no full copy exists anywhere. Leaf k uses random::split(key(seed), num_leaves)[k];
// matrices are normal / sqrt(fan_in), embeddings normal, gains one.
TrainState init_state(const Config& c);

// The bits of random::normal(key, global_shape, f32) restricted to one block (the element whose
// global row-major index is i gets the same value as element i of the full draw). `offsets` are the
// block's starting indices (int32 scalars, may be traced), `block` its shape.
Array normal_block(const Array& key, const Shape& global_shape, const std::vector<Array>& offsets, const Shape& block);

// Mean next-byte cross-entropy of `tokens` [B, S+1] (inputs tokens[:, :-1], targets tokens[:, 1:])
// under the layout's shard_map (or directly for Single). Differentiable in params.
Array loss_fn(const Config& c, const Params& params, const Array& tokens);

// Logits [B, T, V] (f32) of a single-device, unsharded params tree, for sampling.
Array logits_fn(const Config& c, const Params& params, const Array& ids);

// One jitted training step: (state, tokens, lr) -> (new state, loss); the state is donated.
class Trainer {
 public:
  explicit Trainer(Config c);
  const Config& config() const { return cfg_; }
  // Dispatches one step asynchronously; returns the (future) loss. state is replaced.
  Array step(TrainState& state, const Array& tokens, int64_t step_index);
  double lr_at(int64_t step_index) const;  // host-side schedule

 private:
  Config cfg_;
  std::function<std::pair<TrainState, Array>(const TrainState&, const Array&, const Array&)> step_;
};

// ---- data ----
// A byte corpus and a deterministic batch sampler: batch k is a pure function of (seed, k), so the
// data position in a checkpoint is just the number of batches consumed.
struct Corpus {
  std::vector<uint8_t> bytes;
  std::string path;
};
// IoError naming the file if it is missing, a directory ("is a directory; pass a text file"), not a
// regular file (a FIFO is refused at once, not waited on), unreadable or too small.
Corpus load_corpus(const std::filesystem::path& path);
// Rows [first_row, first_row + rows) of batch `index` (rows < 0: to the end); each row is a function
// of (seed, index, row), so a process can load only its own rows.
std::vector<int32_t> host_batch(const Corpus& corpus, const Config& c, int64_t index, int64_t first_row = 0,
                                int64_t rows = -1);

// Prefetches batches on a background thread and places them on the devices sharded over the batch
// axis (device_put is asynchronous with respect to the training thread), `depth` batches ahead.
class Loader {
 public:
  Loader(const Corpus& corpus, Config c, int64_t first_index, int depth = 2);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  Array next();  // the batch at position(), then advances
  int64_t position() const { return next_index_; }

 private:
  void run();
  const Corpus& corpus_;
  Config cfg_;
  NamedSharding sharding_;
  std::pair<int64_t, int64_t> local_rows_;  // [first, end) of the rows this process loads
  int64_t next_index_, produce_index_;
  int depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, Array>> ready_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// ---- divergence ----
// Raised by check_loss when a step's loss is NaN or infinite; the CLI stops (exit 1) instead of
// training on, and saves no checkpoint of the diverged state.
struct NonFiniteLossError : Error {
  using Error::Error;
};
// NonFiniteLossError naming the step and the loss value unless `loss` is finite.
void check_loss(int64_t step, double loss);

// ---- checkpoints ----
// On one process: safetensors at `path` with every leaf of the TrainState gathered to one device
// ("params.layers.0.mlp_in", "mu....", "nu....", "count"), plus metadata step, data_position and the
// config; written atomically (io's per-tensor checksums included: a corrupted tensor is an IoError
// naming it on load). Saving and loading first delete the checkpoint's temporaries left by runs
// killed mid-save (io::remove_stale_temporaries). Across processes: a sharded checkpoint in the
// directory beside it (path without ".safetensors": OUT/ckpt/), each process writing its own blocks
// (io::save_sharded). Loading reads the newer of the two onto the layout's shardings, with any
// number of processes.
void save_checkpoint(const std::filesystem::path& path, const TrainState& state, int64_t step, int64_t data_position,
                     const Config& c);
struct Checkpoint {
  TrainState state;  // placed with the layout's shardings
  int64_t step = 0, data_position = 0;
};
// IoError naming the file for missing, truncated, corrupt or mismatching checkpoints.
Checkpoint load_checkpoint(const std::filesystem::path& path, const Config& c);

// Samples `n` bytes after `prompt` (temperature 0: greedy) with a single-device copy of params.
std::string generate(const Config& c, const Params& params, const std::string& prompt, int64_t n, double temperature,
                     uint64_t seed);

// Bytes of a tree's leaves held by each device (its shards), for memory reporting.
int64_t tree_bytes(const TrainState& s);

}  // namespace cjax::transformer
