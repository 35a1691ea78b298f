#include "transformer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace cjax::transformer {
namespace jnp = cjax::numpy;

Layout parse_layout(const std::string& s) {
  if (s == "single") return Layout::Single;
  if (s == "dp") return Layout::DP;
  if (s == "fsdp") return Layout::FSDP;
  if (s == "fsdp_tp" || s == "fsdp+tp") return Layout::FSDP_TP;
  throw ValueError("unknown layout '" + s + "': expected single, dp, fsdp or fsdp_tp");
}

std::string layout_name(Layout l) {
  switch (l) {
    case Layout::Single: return "single";
    case Layout::DP: return "dp";
    case Layout::FSDP: return "fsdp";
    case Layout::FSDP_TP: return "fsdp_tp";
  }
  return "?";
}

size_t Config::hash() const {
  std::hash<std::string> h;
  return h(str());
}

std::string Config::str() const {
  std::ostringstream os;
  os << "vocab=" << vocab << " seq_len=" << seq_len << " d_model=" << d_model << " n_heads=" << n_heads
     << " head_dim=" << head_dim << " d_ff=" << d_ff << " n_layers=" << n_layers << " cookbook_norm=" << cookbook_norm
     << " param_dtype=" << dtype_name(param_dtype) << " batch=" << batch << " lr=" << lr << " b1=" << b1 << " b2=" << b2
     << " eps=" << eps << " warmup=" << warmup << " seed=" << seed << " layout=" << layout_name(layout)
     << " tensor=" << tensor << " devices=" << devices << " regather=" << regather;
  if (auto_sharding) os << " auto_sharding=1";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Layouts

namespace {

// Which mesh axes a layout uses inside the model body ("" = none).
struct Comm {
  std::string batch, fsdp, tensor;
  bool regather = true;
};

Comm comm_of(const Config& c) {
  switch (c.layout) {
    case Layout::Single: return {};
    case Layout::DP: return {"data", "", "", c.regather};
    case Layout::FSDP: return {"fsdp", "fsdp", "", c.regather};
    case Layout::FSDP_TP: return {"fsdp", "fsdp", "tensor", c.regather};
  }
  return {};
}

// Per parameter kind: its spec, and the dimension split over `fsdp` (gathered before use), -1 if none.
struct LeafLayout {
  PartitionSpec spec;
  int fsdp_dim = -1;
};
enum class Kind { Embed, Pos, Qkv, AttnOut, MlpIn, MlpOut, Norm, OutKernel };

LeafLayout leaf_layout(const Config& c, Kind k) {
  if (c.layout == Layout::Single || c.layout == Layout::DP) return {P(), -1};
  bool tp = c.layout == Layout::FSDP_TP;
  switch (k) {
    // JAX's cookbook keeps the embeddings (and has no gains) replicated under FSDP; we split them
    // over `fsdp` along D too, so that every parameter and Adam moment is held 1/n per device (their
    // gradients become reduce-scatters instead of all-reduces, docs/sharding.md §3.3).
    case Kind::Embed:
    case Kind::Pos: return {P(None, "fsdp"), 1};
    case Kind::Norm: return {P("fsdp"), 0};
    case Kind::Qkv:
      return tp ? LeafLayout{P(None, "fsdp", "tensor", None), 1} : LeafLayout{P(None, "fsdp", None, None), 1};
    // FSDP: the cookbook's P('fsdp', None, None) (heads); FSDP+TP: the Megatron-consistent
    // P('tensor', None, 'fsdp') of docs/sharding.md §3.2.
    case Kind::AttnOut: return tp ? LeafLayout{P("tensor", None, "fsdp"), 2} : LeafLayout{P("fsdp", None, None), 0};
    case Kind::MlpIn: return tp ? LeafLayout{P("fsdp", "tensor"), 0} : LeafLayout{P("fsdp", None), 0};
    case Kind::MlpOut: return tp ? LeafLayout{P("tensor", "fsdp"), 1} : LeafLayout{P(None, "fsdp"), 1};
    case Kind::OutKernel: return {P("fsdp", None), 0};
  }
  return {P(), -1};
}

const std::vector<Kind> kBlockKinds{Kind::Qkv, Kind::AttnOut, Kind::MlpIn, Kind::MlpOut, Kind::Norm, Kind::Norm};

// Leaf kinds in the flattening order of Params.
std::vector<Kind> leaf_kinds(const Config& c) {
  std::vector<Kind> k{Kind::Embed, Kind::Pos};
  for (int64_t l = 0; l < c.n_layers; ++l) k.insert(k.end(), kBlockKinds.begin(), kBlockKinds.end());
  k.push_back(Kind::OutKernel);
  return k;
}

Shape leaf_shape(const Config& c, Kind k) {
  switch (k) {
    case Kind::Embed: return {c.vocab, c.d_model};
    case Kind::Pos: return {c.seq_len, c.d_model};
    case Kind::Qkv: return {3, c.d_model, c.n_heads, c.head_dim};
    case Kind::AttnOut: return {c.n_heads, c.head_dim, c.d_model};
    case Kind::MlpIn: return {c.d_model, c.d_ff};
    case Kind::MlpOut: return {c.d_ff, c.d_model};
    case Kind::Norm: return {c.d_model};
    case Kind::OutKernel: return {c.d_model, c.vocab};
  }
  return {};
}

double init_scale(const Config& c, Kind k) {
  switch (k) {
    case Kind::Embed: return 1.0;
    case Kind::Pos: return 0.1;
    case Kind::Qkv:
    case Kind::MlpIn:
    case Kind::OutKernel: return 1.0 / std::sqrt(double(c.d_model));
    case Kind::AttnOut: return 1.0 / std::sqrt(double(c.n_heads * c.head_dim));
    case Kind::MlpOut: return 1.0 / std::sqrt(double(c.d_ff));
    case Kind::Norm: return 0.0;  // ones
  }
  return 0.0;
}

// A Params tree with empty leaves, for structure (unflatten, key paths).
Params skeleton_params(const Config& c) {
  Params p;
  p.layers.resize(size_t(c.n_layers));
  return p;
}

TrainState skeleton_state(const Config& c) {
  Params p = skeleton_params(c);
  return TrainState{p, p, p, Array()};
}

void check_config(const Config& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw ValueError("transformer config: " + what);
  };
  need(c.vocab > 0 && c.seq_len > 0 && c.d_model > 0 && c.n_heads > 0 && c.head_dim > 0 && c.d_ff > 0 &&
           c.n_layers > 0 && c.batch > 0,
       "sizes must be positive");
  if (c.layout == Layout::Single) return;
  int64_t n = c.devices;
  need(device_count() >= n, "layout " + layout_name(c.layout) + " needs " + std::to_string(n) + " devices but " +
                                std::to_string(device_count()) + " exist (set CJAX_NUM_CPU_DEVICES)");
  int64_t f = n;
  if (c.layout == Layout::FSDP_TP) {
    need(c.tensor > 0 && n % c.tensor == 0, "--tensor must divide the device count");
    f = n / c.tensor;
    need(c.n_heads % c.tensor == 0 && c.d_ff % c.tensor == 0, "n_heads and d_ff must be multiples of --tensor");
  }
  need(c.batch % f == 0, "the batch (" + std::to_string(c.batch) + ") must be a multiple of the batch axis size (" +
                             std::to_string(f) + ")");
  if (c.layout == Layout::FSDP || c.layout == Layout::FSDP_TP) {
    need(c.d_model % f == 0 && c.d_ff % f == 0, "d_model and d_ff must be multiples of the fsdp axis size");
    if (c.layout == Layout::FSDP)
      need(c.n_heads % f == 0, "FSDP shards attn_out over heads: n_heads must be a multiple of the device count");
  }
}

}  // namespace

Mesh layout_mesh(const Config& c) {
  switch (c.layout) {
    case Layout::Single: return make_mesh({1}, {"data"});
    case Layout::DP: return make_mesh({c.devices}, {"data"});
    case Layout::FSDP: return make_mesh({c.devices}, {"fsdp"});
    case Layout::FSDP_TP: return make_mesh({c.devices / c.tensor, c.tensor}, {"fsdp", "tensor"});
  }
  throw ValueError("unknown layout");
}

std::string batch_axis(const Config& c) { return comm_of(c).batch; }

std::vector<PartitionSpec> param_leaf_specs(const Config& c) {
  std::vector<PartitionSpec> out;
  for (Kind k : leaf_kinds(c)) out.push_back(leaf_layout(c, k).spec);
  return out;
}

SpecTree param_specs(const Config& c) {
  std::vector<SpecTree> blocks;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::vector<SpecTree> b;
    for (Kind k : kBlockKinds) b.push_back(leaf_layout(c, k).spec);
    blocks.push_back(SpecTree(b));
  }
  return SpecTree(std::vector<SpecTree>{leaf_layout(c, Kind::Embed).spec, leaf_layout(c, Kind::Pos).spec,
                                        SpecTree(blocks), leaf_layout(c, Kind::OutKernel).spec});
}

SpecTree state_specs(const Config& c) {
  SpecTree p = param_specs(c);
  return SpecTree(std::vector<SpecTree>{p, p, p, P()});
}

NamedSharding batch_sharding(const Config& c) {
  std::string b = batch_axis(c);
  return b.empty() ? NamedSharding(layout_mesh(c), P()) : NamedSharding(layout_mesh(c), P(b, None));
}

// ---------------------------------------------------------------------------------------------
// Initialisation

Array normal_block(const Array& key, const Shape& global_shape, const std::vector<Array>& offsets, const Shape& block) {
  int nd = int(global_shape.size());
  Array idx = jnp::zeros(block, DType::uint32);
  int64_t stride = 1;
  for (int d = nd - 1; d >= 0; --d) {
    Array i = lax::broadcasted_iota(DType::uint32, block, d) + offsets[size_t(d)].astype(DType::uint32);
    idx = idx + i * Array(int64_t(stride)).astype(DType::uint32);
    stride *= global_shape[size_t(d)];
  }
  if (stride >= (int64_t(1) << 32)) throw ValueError("normal_block: arrays of 2^32 or more elements are not supported");
  Array k0 = jnp::broadcast_to(key[0], block), k1 = jnp::broadcast_to(key[1], block);
  auto [a, b] = lax::threefry2x32(k0, k1, jnp::zeros(block, DType::uint32), idx);
  Array bits = a ^ b;
  Array one_bits = jnp::full({}, int64_t(0x3F800000), DType::uint32);
  Array f = lax::bitcast_convert_type(lax::shift_right_logical(bits, jnp::full({}, 9, DType::uint32)) | one_bits,
                                      DType::float32) -
            jnp::full({}, 1.0, DType::float32);
  // random::normal: uniform in [nextafter(-1, 0), 1) then sqrt(2) * erf_inv.
  Array lo = jnp::full({}, -(1.0 - std::ldexp(1.0, -24)), DType::float32);
  Array hi = jnp::full({}, 1.0, DType::float32);
  Array u = jnp::maximum(lo, f * (hi - lo) + lo);
  return jnp::full({}, std::sqrt(2.0), DType::float32) * lax::erf_inv(u);
}

TrainState init_state(const Config& c) {
  check_config(c);
  std::vector<Kind> kinds = leaf_kinds(c);
  Mesh mesh = layout_mesh(c);
  Array keys = random::split(random::key(c.seed), int64_t(kinds.size()));
  bool sharded = c.layout != Layout::Single;
  std::vector<Array> leaves;
  for (size_t i = 0; i < kinds.size(); ++i) {
    Kind k = kinds[i];
    Shape g = leaf_shape(c, k);
    double scale = init_scale(c, k);
    PartitionSpec spec = leaf_layout(c, k).spec;
    auto gen = [g, k, spec, scale, &c, &mesh](const Array& key) {
      Shape block = g;
      std::vector<Array> offs;
      for (size_t d = 0; d < g.size(); ++d) {
        std::vector<std::string> names;
        if (d < spec.size()) names = spec.entries()[d].names;
        if (names.empty()) {
          offs.push_back(Array(0));
          continue;
        }
        int64_t parts = 1;
        for (auto& n : names) parts *= mesh.axis_size(n);
        block[d] = g[d] / parts;
        offs.push_back(lax::axis_index(AxisNames(names)) * int(block[d]));
      }
      if (k == Kind::Norm)
        return jnp::ones(block, c.param_dtype) + 0 * offs[0].astype(c.param_dtype);  // varies like its spec
      return (normal_block(key, g, offs, block) * float(scale)).astype(c.param_dtype);
    };
    Array key = keys[int64_t(i)];
    if (!sharded) {
      leaves.push_back(jit([g, k, scale, &c](const Array& kk) {
        if (k == Kind::Norm) return jnp::ones(g, c.param_dtype);
        return (normal_block(kk, g, std::vector<Array>(g.size(), Array(0)), g) * float(scale)).astype(c.param_dtype);
      })(key));
    } else {
      // Every device computes only its block; the key is replicated.
      leaves.push_back(jit(shard_map(gen, mesh, P(), spec))(device_put(key, NamedSharding(mesh, P()))));
    }
  }
  Params params = tree::unflatten(skeleton_params(c), leaves);
  auto zeros = [](const Params& p) { return tree::map([](const Array& x) { return jnp::zeros_like(x); }, p); };
  Params mu, nu;
  if (sharded) {
    auto z = jit(shard_map(zeros, mesh, SpecTree(std::vector<SpecTree>{param_specs(c)}), param_specs(c)));
    mu = z(params);
    nu = z(params);
  } else {
    mu = jit(zeros)(params);
    nu = jit(zeros)(params);
  }
  Array count = jnp::zeros({}, DType::int32);
  if (sharded) count = device_put(count, NamedSharding(mesh, P()));
  return TrainState{params, mu, nu, count};
}

// ---------------------------------------------------------------------------------------------
// Model (written once on local blocks; `comm` says which collectives connect them)

namespace {

// FSDP: the full weight from this device's block. With `regather`, loss_fn checkpoints the whole
// body with a policy that saves everything but all_gather outputs, so the backward pass gathers each
// weight again instead of keeping the full copies alive (checkpointing only this gather would not:
// the gathered value is then an ordinary residual of the matmul that uses it, as in JAX).
Array gather(const Comm& m, const Array& w, int dim) {
  if (m.fsdp.empty() || dim < 0) return w;
  return lax::all_gather(w, m.fsdp, {.axis = dim, .tiled = true});
}

Array norm(const Config& c, const Array& x, const Array& gain) {
  if (!c.cookbook_norm) return nn::rms_norm(x, gain, 1e-6);
  // The cookbook's formula: x * rsqrt(||x||_2 + 1e-6) over the last axis, no gain (docs/examples.md §5.5).
  Array xf = x.astype(DType::float32);
  Array n = jnp::sqrt(jnp::sum(xf * xf, -1, true));
  return (xf * lax::rsqrt(n + 1e-6f)).astype(x.dtype());
}

int fsdp_dim(const Config& c, Kind k) { return leaf_layout(c, k).fsdp_dim; }

Array block_fwd(const Config& c, const Comm& m, const Block& b, const Array& x) {
  Array wqkv = gather(m, b.attn_qkv, fsdp_dim(c, Kind::Qkv));  // [3, D, n, H]
  Array qkv = jnp::einsum("bsd,cdnh->cbsnh", x, wqkv);
  Array o = nn::dot_product_attention(qkv[0], qkv[1], qkv[2], {.is_causal = true});
  Array y = jnp::einsum("bsnh,nhd->bsd", o, gather(m, b.attn_out, fsdp_dim(c, Kind::AttnOut)));
  if (!m.tensor.empty()) y = lax::psum(y, m.tensor);
  y = norm(c, y + x, gather(m, b.norm1, fsdp_dim(c, Kind::Norm)));
  Array u = nn::gelu(jnp::einsum("bsd,df->bsf", y, gather(m, b.mlp_in, fsdp_dim(c, Kind::MlpIn))));
  Array z = jnp::einsum("bsf,fd->bsd", u, gather(m, b.mlp_out, fsdp_dim(c, Kind::MlpOut)));
  if (!m.tensor.empty()) z = lax::psum(z, m.tensor);
  return norm(c, z + y, gather(m, b.norm2, fsdp_dim(c, Kind::Norm)));
}

Array logits_local(const Config& c, const Comm& m, const Params& p, const Array& ids) {
  int64_t t = ids.shape()[1];
  Array x = jnp::take(gather(m, p.embed, fsdp_dim(c, Kind::Embed)), ids, 0, "clip");  // [b, T, D]
  x = x + gather(m, p.pos_embed, fsdp_dim(c, Kind::Pos))[Slice(0, t)];
  for (const Block& b : p.layers) x = block_fwd(c, m, b, x);
  return jnp::einsum("bsd,dv->bsv", x, gather(m, p.out_kernel, fsdp_dim(c, Kind::OutKernel))).astype(DType::float32);
}

Array loss_local(const Config& c, const Comm& m, const Params& p, const Array& tokens) {
  int64_t s = tokens.shape()[1];
  Array inputs = tokens[{Slice(), Slice(0, s - 1)}], targets = tokens[{Slice(), Slice(1, s)}];
  Array logp = nn::log_softmax(logits_local(c, m, p, inputs), -1);
  return -jnp::mean(jnp::sum(nn::one_hot(targets, c.vocab) * logp, -1));
}

}  // namespace

Array loss_fn(const Config& c, const Params& params, const Array& tokens) {
  Comm m = comm_of(c);
  if (c.layout == Layout::Single) return loss_local(c, m, params, tokens);
  return shard_map(
      [c, m](const Params& p, const Array& t) {
        auto body = [c, m](const Params& q, const Array& u) { return loss_local(c, m, q, u); };
        Array l = m.regather && !m.fsdp.empty()
                      ? checkpoint(body, checkpoint_policies::save_everything_except({"all_gather"}))(p, t)
                      : body(p, t);
        return lax::pmean(l, m.batch);
      },
      layout_mesh(c), {param_specs(c), P(m.batch, None)}, P(),
      {.name = "loss_" + layout_name(c.layout)})(params, tokens);
}

Array logits_fn(const Config& c, const Params& params, const Array& ids) {
  return logits_local(c, Comm{}, params, ids);
}

// ---------------------------------------------------------------------------------------------
// Adam and the step

namespace {

TrainState adam_update(const Config& c, const TrainState& s, const Params& g, const Array& lr) {
  Array count = s.count + 1;
  Array t = count.astype(DType::float32);
  Array bc1 = 1.0f - jnp::power(jnp::full({}, c.b1, DType::float32), t);
  Array bc2 = 1.0f - jnp::power(jnp::full({}, c.b2, DType::float32), t);
  float b1 = float(c.b1), b2 = float(c.b2), eps = float(c.eps);
  auto f32 = [](const Array& x) { return x.astype(DType::float32); };
  Params mu =
      tree::map([&](const Array& m, const Array& gr) { return (b1 * f32(m) + (1 - b1) * f32(gr)).astype(m.dtype()); },
                s.mu, g);
  Params nu =
      tree::map([&](const Array& v,
                    const Array& gr) { return (b2 * f32(v) + (1 - b2) * jnp::square(f32(gr))).astype(v.dtype()); },
                s.nu, g);
  Params p = tree::map(
      [&](const Array& w, const Array& m, const Array& v) {
        Array mhat = f32(m) / bc1, vhat = f32(v) / bc2;
        return (f32(w) - lr * mhat / (jnp::sqrt(vhat) + eps)).astype(w.dtype());
      },
      s.params, mu, nu);
  return TrainState{p, mu, nu, count};
}

}  // namespace

Trainer::Trainer(Config c) : cfg_(std::move(c)) {
  check_config(cfg_);
  Config cfg = cfg_;
  auto step = [cfg](const TrainState& s, const Array& tokens, const Array& lr) {
    auto [loss, grads] = value_and_grad([&](const Params& p) { return loss_fn(cfg, p, tokens); })(s.params);
    TrainState next;
    if (cfg.layout == Layout::Single) {
      next = adam_update(cfg, s, grads, lr);
    } else {
      // The update is elementwise on each device's shards: no communication.
      next =
          shard_map([cfg](const TrainState& st, const Params& g, const Array& l) { return adam_update(cfg, st, g, l); },
                    layout_mesh(cfg), {state_specs(cfg), param_specs(cfg), P()}, state_specs(cfg),
                    {.name = "adam"})(s, grads, lr);
    }
    return std::pair{next, loss};
  };
  if (cfg.auto_sharding && cfg.layout != Layout::Single) {
    // The one-device program, partitioned by jit from the layouts of the state and the batch.
    auto plain = [cfg](const TrainState& s, const Array& tokens, const Array& lr) {
      Config one = cfg;
      one.layout = Layout::Single;
      auto [loss, grads] = value_and_grad([&](const Params& p) { return loss_fn(one, p, tokens); })(s.params);
      return std::pair{adam_update(cfg, s, grads, lr), loss};
    };
    auto jitted = jit(plain, {.name = "train_step",
                              .donate_argnums = {0},
                              .mesh = layout_mesh(cfg),
                              .in_shardings = SpecTree{state_specs(cfg), P(batch_axis(cfg), None), P()},
                              .out_shardings = SpecTree{state_specs(cfg), P()}});
    step_ = [jitted](const TrainState& s, const Array& tokens, const Array& lr) { return jitted(s, tokens, lr); };
    return;
  }
  auto jitted = jit(step, {.name = "train_step", .donate_argnums = {0}});
  step_ = [jitted](const TrainState& s, const Array& tokens, const Array& lr) { return jitted(s, tokens, lr); };
}

double Trainer::lr_at(int64_t i) const {
  if (cfg_.warmup > 0 && i < cfg_.warmup) return cfg_.lr * double(i + 1) / double(cfg_.warmup);
  return cfg_.lr;
}

Array Trainer::step(TrainState& state, const Array& tokens, int64_t step_index) {
  Array lr = jnp::full({}, lr_at(step_index), DType::float32);
  if (cfg_.layout != Layout::Single) lr = device_put(lr, NamedSharding(layout_mesh(cfg_), P()));
  auto [next, loss] = step_(state, tokens, lr);
  state = std::move(next);
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Data

Corpus load_corpus(const std::filesystem::path& path) {
  const std::string name = "corpus '" + path.string() + "'";
  // O_NONBLOCK so that a FIFO is refused below instead of waiting for a writer; a directory opens
  // but cannot be read (std::ifstream used to throw std::ios_base::failure from its first read).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open " + name + ": " + std::strerror(errno));
  struct FdGuard {
    int fd;
    ~FdGuard() { ::close(fd); }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError("cannot stat " + name + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw IoError(name + " is a directory; pass a text file");
  if (!S_ISREG(st.st_mode))
    throw IoError(name + " is not a regular file (" + (S_ISFIFO(st.st_mode) ? "a FIFO" : "a device or socket") +
                  "); pass a text file");
  Corpus c;
  c.path = path.string();
  c.bytes.resize(size_t(st.st_size));
  size_t got = 0;
  while (got < c.bytes.size()) {
    ssize_t r = ::read(fd, c.bytes.data() + got, c.bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw IoError("cannot read " + name + ": " + std::strerror(errno));
    if (r == 0) break;  // shrank while reading
    got += size_t(r);
  }
  c.bytes.resize(got);
  if (c.bytes.size() < 1024)
    throw IoError(name + " is too small (" + std::to_string(c.bytes.size()) + " bytes; need >= 1024)");
  return c;
}

void check_loss(int64_t step, double loss) {
  if (std::isfinite(loss)) return;
  std::ostringstream os;
  os << "the loss became non-finite at step " << step << " (loss " << loss
     << "): training diverged; stopping without saving a checkpoint of this state (lower --lr or raise --warmup, "
        "or --resume from the last checkpoint)";
  throw NonFiniteLossError(os.str());
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<int32_t> host_batch(const Corpus& corpus, const Config& c, int64_t index, int64_t first_row, int64_t rows) {
  if (rows < 0) rows = c.batch - first_row;
  int64_t len = c.seq_len + 1;
  uint64_t range = uint64_t(int64_t(corpus.bytes.size()) - len + 1);
  std::vector<int32_t> out(size_t(rows * len));
  for (int64_t b = first_row; b < first_row + rows; ++b) {
    uint64_t r = splitmix64(splitmix64(c.seed * 0x100000001B3ull + uint64_t(index)) + uint64_t(b));
    uint64_t off = r % range;
    for (int64_t s = 0; s < len; ++s) out[size_t((b - first_row) * len + s)] = corpus.bytes[size_t(off) + size_t(s)];
  }
  return out;
}

Loader::Loader(const Corpus& corpus, Config c, int64_t first_index, int depth)
    : corpus_(corpus),
      cfg_(std::move(c)),
      sharding_(batch_sharding(cfg_)),
      next_index_(first_index),
      produce_index_(first_index),
      depth_(depth) {
  // The rows of the batch that this process's devices hold (all of them on one process).
  std::vector<std::vector<Slice>> index = sharding_.devices_indices({cfg_.batch, cfg_.seq_len + 1});
  local_rows_ = {cfg_.batch, 0};
  for (size_t k = 0; k < index.size(); ++k)
    if (process_index_of(sharding_.mesh().devices()[k]) == process_index()) {
      local_rows_.first = std::min(local_rows_.first, index[k][0].start.value_or(0));
      local_rows_.second = std::max(local_rows_.second, index[k][0].stop.value_or(cfg_.batch));
    }
  thread_ = std::thread([this] { run(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Loader::run() {
  try {
    for (;;) {
      int64_t idx;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || int(ready_.size()) < depth_; });
        if (stop_) return;
        idx = produce_index_++;
      }
      Array a;
      if (process_count() > 1) {  // this process's rows only
        auto [lo, hi] = local_rows_;
        a = make_array_from_process_local_data(sharding_, jnp::array(host_batch(corpus_, cfg_, idx, lo, hi - lo),
                                                                     {hi - lo, cfg_.seq_len + 1}));
      } else {
        a = jnp::array(host_batch(corpus_, cfg_, idx), {cfg_.batch, cfg_.seq_len + 1});
        if (cfg_.layout != Layout::Single) a = device_put(a, sharding_);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_.emplace_back(idx, std::move(a));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    cv_.notify_all();
  }
}

Array Loader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (error_) std::rethrow_exception(error_);
  auto [idx, a] = std::move(ready_.front());
  ready_.pop_front();
  next_index_ = idx + 1;
  lock.unlock();
  cv_.notify_all();
  return a;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

namespace {
// Across processes the checkpoint is a directory beside the file's name (OUT/ckpt/): every process
// writes its own blocks (io::save_sharded).
std::filesystem::path sharded_dir(const std::filesystem::path& path) { return path.parent_path() / path.stem(); }
}  // namespace

void save_checkpoint(const std::filesystem::path& path, const TrainState& state, int64_t step, int64_t data_position,
                     const Config& c) {
  io::Metadata meta = {{"step", std::to_string(step)},
                       {"data_position", std::to_string(data_position)},
                       {"model", "cjax byte transformer"},
                       {"config", c.str()}};
  if (process_count() > 1) {
    io::save_sharded(sharded_dir(path), state, meta);
    return;
  }
  io::remove_stale_temporaries(path);  // left by runs killed while saving
  SingleDeviceSharding one(local_devices()[0]);
  TrainState local = tree::map([&](const Array& a) { return device_put(a, one); }, state);
  io::save_safetensors(path, local, meta);
}

Checkpoint load_checkpoint(const std::filesystem::path& path, const Config& c) {
  namespace fs = std::filesystem;
  // The newer of the two forms: the file (one process) or the directory (several processes).
  fs::path dir = sharded_dir(path), index = dir / "index.json";
  std::error_code ec;
  bool sharded_ckpt = fs::exists(index, ec) &&
                      (!fs::exists(path, ec) || fs::last_write_time(index, ec) > fs::last_write_time(path, ec));
  std::string where = sharded_ckpt ? dir.string() : path.string();
  auto fail = [&](const std::string& what) { throw IoError("checkpoint '" + where + "': " + what); };
  std::map<std::string, AbstractValue> stored;
  std::map<std::string, Array> by_name;
  io::Metadata meta;
  if (sharded_ckpt) {
    for (auto& [name, aval] : io::load_sharded_index(dir)) stored.emplace(name, aval);
    meta = io::load_sharded_metadata(dir);
  } else {
    io::remove_stale_temporaries(path);  // left by runs killed while saving
    for (auto& [name, a] : io::load_safetensors_entries(path)) {
      stored.emplace(name, a.aval());
      by_name.emplace(name, a);
    }
    meta = io::load_safetensors_metadata(path);
  }
  TrainState skel = skeleton_state(c);
  auto paths = tree::leaves_with_path(skel);
  // Expected shapes/dtypes, in leaf order: params, mu, nu (same as params), count.
  std::vector<Kind> kinds = leaf_kinds(c);
  std::vector<PartitionSpec> specs = param_leaf_specs(c);
  Mesh mesh = layout_mesh(c);
  bool sharded = c.layout != Layout::Single;
  std::vector<Array> leaves;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string name = paths[i].first.dotted();
    auto it = stored.find(name);
    if (it == stored.end()) fail("missing tensor '" + name + "' (was it written for another model config?)");
    bool is_count = i + 1 == paths.size();
    Shape want = is_count ? Shape{} : leaf_shape(c, kinds[i % kinds.size()]);
    DType want_dtype = is_count ? DType::int32 : c.param_dtype;
    if (it->second.shape != want || it->second.dtype != want_dtype)
      fail("tensor '" + name + "' is " + it->second.str() + " but the model needs " +
           AbstractValue{want, want_dtype, false, {}}.str());
    std::optional<NamedSharding> target;
    if (sharded) target = NamedSharding(mesh, is_count ? P() : specs[i % kinds.size()]);
    Array a;
    if (sharded_ckpt)  // each process reads the stored blocks its devices' blocks overlap
      a = target ? io::load_sharded(dir, name, *target)
                 : io::load_sharded(dir, name, SingleDeviceSharding(local_devices()[0]));
    else
      a = target ? device_put(by_name.at(name), *target) : by_name.at(name);
    leaves.push_back(a);
  }
  Checkpoint ck;
  ck.state = tree::unflatten(skel, leaves);
  auto num = [&](const char* key) -> int64_t {
    auto it = meta.find(key);
    if (it == meta.end()) fail(std::string("metadata has no '") + key + "'");
    try {
      size_t used = 0;
      int64_t v = std::stoll(it->second, &used);
      if (used != it->second.size() || v < 0) throw std::invalid_argument("x");
      return v;
    } catch (const std::exception&) {
      fail(std::string("metadata '") + key + "' is not a non-negative integer: '" + it->second + "'");
    }
    return 0;
  };
  ck.step = num("step");
  ck.data_position = num("data_position");
  return ck;
}

// ---------------------------------------------------------------------------------------------
// Sampling

std::string generate(const Config& c0, const Params& params, const std::string& prompt, int64_t n, double temperature,
                     uint64_t seed) {
  Config c = c0;
  c.layout = Layout::Single;
  SingleDeviceSharding one(local_devices()[0]);
  Params p = tree::map([&](const Array& a) { return device_put(process_allgather(a), one); }, params);
  auto logits = jit([c](const Params& pp, const Array& ids) { return logits_fn(c, pp, ids); }, {.name = "logits"});
  std::vector<int32_t> toks;
  for (unsigned char ch : prompt) toks.push_back(ch);
  if (toks.empty()) toks.push_back('\n');
  std::mt19937_64 rng(seed);
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    int64_t len = std::min<int64_t>(int64_t(toks.size()), c.seq_len);
    std::vector<int32_t> window(size_t(c.seq_len), 0);
    std::copy(toks.end() - len, toks.end(), window.begin());
    // Causal: the logits at position len-1 do not depend on the zero padding after it.
    std::vector<float> l = logits(p, jnp::array(window, {1, c.seq_len}))[{0, int(len - 1)}].to_vector<float>();
    int32_t next = 0;
    if (temperature <= 0) {
      next = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    } else {
      double mx = *std::max_element(l.begin(), l.end());
      std::vector<double> w(l.size());
      for (size_t k = 0; k < l.size(); ++k) w[k] = std::exp((l[k] - mx) / temperature);
      next = int32_t(std::discrete_distribution<int32_t>(w.begin(), w.end())(rng));
    }
    toks.push_back(next);
    out.push_back(char(next));
  }
  return out;
}

int64_t tree_bytes(const TrainState& s) {
  int64_t total = 0;
  for (const Array& a : tree::leaves(s)) total += a.size() * int64_t(itemsize(a.dtype()));
  return total;
}

}  // namespace cjax::transformer
