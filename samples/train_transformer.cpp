// train_transformer: trains a byte-level decoder-only transformer with Adam on a mesh of (virtual)
// devices, under one of four layouts (single device, DP, FSDP, FSDP+TP), then prints a sample.
// docs/examples.md §5; run with --help for every flag.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "transformer/transformer.h"

using namespace cjax;
namespace tf = cjax::transformer;

#ifndef CJAX_SAMPLE_DATA
#define CJAX_SAMPLE_DATA "samples/data/kjv.txt"
#endif

namespace {

struct Options {
  tf::Config cfg;
  int64_t steps = 4000;
  std::string data = CJAX_SAMPLE_DATA;
  std::string out = "train_out";
  int64_t checkpoint_every = 250;
  bool resume = false;
  std::optional<std::string> generate;
  int64_t sample_len = 400;
  double temperature = 0.6;
  std::string prompt = "And God said, ";
  int64_t stop_after = -1;  // for tests of --resume: exit (without a final checkpoint) after this step
  bool show_collectives = false;
  std::string platform;  // --platform: the default platform (empty: CJAX_PLATFORM, else cpu)
};

const char* kHelp = R"(usage: train_transformer [flags]

Trains a decoder-only transformer on bytes (vocab 256) with Adam on a mesh of virtual CPU devices
and prints a generated sample. Defaults train in about two minutes on two cores and reach a byte
cross-entropy below 2.5 (from ln 256 = 5.55).

Layout and devices:
  --layout L          single | dp | fsdp | fsdp_tp (default fsdp)
                        single : one device, no shard_map
                        dp     : mesh data=N; params replicated, batch split, gradients all-reduced
                        fsdp   : mesh fsdp=N; params, gradients and Adam state split, weights
                                 all-gathered before use, gradients reduce-scattered
                        fsdp_tp: mesh fsdp=N/T x tensor=T; FSDP plus Megatron tensor parallelism
                                 (heads and MLP hidden split over tensor, 2 all-reduces per block)
  --devices N         virtual CPU devices for the sharded layouts (default 8; CJAX_NUM_CPU_DEVICES
                      overrides the number created)
  --tensor T          size of the tensor axis for fsdp_tp (default 2)
  --platform P        cpu | cuda (default: CJAX_PLATFORM, else cpu). cuda trains on one GPU; the
                      sharded layouts run on --devices virtual devices of it
  --no-regather       FSDP: keep gathered weights for the backward pass instead of re-gathering
  --mode M            shard_map (default: the layouts' explicit collectives) | auto (the one-device
                      program under plain jit over the layout's sharded state and batch: the
                      partitioner inserts the collectives)

Model:
  --layers N          transformer blocks (default 2)
  --d-model D         residual width (default 128)
  --heads N           attention heads (default 8)
  --head-dim H        per-head width (default 16)
  --d-ff F            MLP hidden width (default 512)
  --seq-len S         context length in bytes (default 64)
  --bf16              bfloat16 parameters and Adam moments (default float32)
  --cookbook-norm     the training cookbook's x*rsqrt(||x||+1e-6) instead of RMSNorm

Training:
  --steps N           training steps (default 4000)
  --batch B           global batch in sequences (default 32)
  --lr X              Adam learning rate (default 3e-3)
  --warmup N          linear warmup steps (default 20)
  --seed N            seed of parameters and data order (default 0); runs are deterministic
  --data FILE         training text, any file read as bytes (default: samples/data/kjv.txt,
                      the King James Bible, public domain; see samples/data/SOURCE.md)
                      Training stops (exit 1) if the loss becomes NaN or infinite.

Output:
  --out DIR           output folder (default train_out): log.csv (step, loss, lr, tokens/s,
                      seconds), loss.svg (loss curve, written at the end), ckpt.safetensors
  --checkpoint-every N  save params + Adam state + step + data position every N steps and at
                      the end (default 250; 0: only at the end); written atomically
  --resume            continue from DIR/ckpt.safetensors (same config); losses continue exactly;
                      a run already at --steps reports that it is complete and prints its sample
  --stop-after N      stop after step N without a final checkpoint (to exercise --resume)
  --collectives       print the collectives one training step executes (per device: kind, mesh
                      axes, block shapes, forward or backward), recorded during the second step

Sampling:
  --generate PROMPT   load DIR/ckpt.safetensors, print PROMPT and a sample after it, and exit
  --sample-len N      bytes to generate (default 400)
  --temperature T     sampling temperature, 0 = greedy (default 0.6)
  --prompt PROMPT     prompt of the sample printed after training (default "And God said, ")
  --help              this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "train_transformer: " << msg << "\n(run with --help for the flags)\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  o.cfg.layout = tf::Layout::FSDP;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto num = [&]() -> int64_t {
      std::string v = val();
      try {
        size_t used = 0;
        int64_t x = std::stoll(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return x;
      } catch (const std::exception&) {
        usage_error(a + " expects an integer, got '" + v + "'");
      }
    };
    auto real = [&]() -> double {
      std::string v = val();
      try {
        size_t used = 0;
        double x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        return x;
      } catch (const std::exception&) {
        usage_error(a + " expects a number, got '" + v + "'");
      }
    };
    if (a == "--help" || a == "-h") {
      std::cout << kHelp;
      std::exit(0);
    } else if (a == "--layout") {
      try {
        o.cfg.layout = tf::parse_layout(val());
      } catch (const Error& e) {
        usage_error(e.what());
      }
    } else if (a == "--devices")
      o.cfg.devices = num();
    else if (a == "--tensor")
      o.cfg.tensor = num();
    else if (a == "--platform")
      o.platform = val();
    else if (a == "--no-regather")
      o.cfg.regather = false;
    else if (a == "--mode") {
      std::string m = val();
      if (m != "auto" && m != "shard_map") usage_error("--mode takes shard_map or auto, got '" + m + "'");
      o.cfg.auto_sharding = m == "auto";
    } else if (a == "--layers")
      o.cfg.n_layers = num();
    else if (a == "--d-model")
      o.cfg.d_model = num();
    else if (a == "--heads")
      o.cfg.n_heads = num();
    else if (a == "--head-dim")
      o.cfg.head_dim = num();
    else if (a == "--d-ff")
      o.cfg.d_ff = num();
    else if (a == "--seq-len")
      o.cfg.seq_len = num();
    else if (a == "--bf16")
      o.cfg.param_dtype = DType::bfloat16;
    else if (a == "--cookbook-norm")
      o.cfg.cookbook_norm = true;
    else if (a == "--steps")
      o.steps = num();
    else if (a == "--batch")
      o.cfg.batch = num();
    else if (a == "--lr")
      o.cfg.lr = real();
    else if (a == "--warmup")
      o.cfg.warmup = num();
    else if (a == "--seed")
      o.cfg.seed = uint64_t(num());
    else if (a == "--data")
      o.data = val();
    else if (a == "--out")
      o.out = val();
    else if (a == "--checkpoint-every")
      o.checkpoint_every = num();
    else if (a == "--resume")
      o.resume = true;
    else if (a == "--stop-after")
      o.stop_after = num();
    else if (a == "--collectives")
      o.show_collectives = true;
    else if (a == "--generate")
      o.generate = val();
    else if (a == "--sample-len")
      o.sample_len = num();
    else if (a == "--temperature")
      o.temperature = real();
    else if (a == "--prompt")
      o.prompt = val();
    else
      usage_error("unknown flag '" + a + "'");
  }
  if (o.steps < 1) usage_error("--steps must be >= 1");
  if (o.cfg.layout == tf::Layout::Single) o.cfg.devices = 1;
  return o;
}

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  int64_t t = int64_t(s + 0.5);
  std::ostringstream os;
  if (t >= 3600)
    os << t / 3600 << ":" << std::setw(2) << std::setfill('0') << (t / 60) % 60;
  else
    os << t / 60;
  os << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return os.str();
}

struct Row {
  int64_t step;
  double loss, lr, tok_s, seconds;
};

// The loss curve as a standalone SVG: raw losses (light) and a moving average (dark). Written to a
// temporary named as cjax::io names its own (".loss.svg.cjax-tmp.<pid>.0", so that
// io::remove_stale_temporaries finds one left by a killed run) and renamed over the target.
void write_svg(const std::string& path, const std::vector<Row>& rows, const std::string& title) {
  const double W = 720, H = 400, L = 60, R = 20, T = 40, B = 50;
  double lo = 1e30, hi = -1e30;
  for (const Row& r : rows) lo = std::min(lo, r.loss), hi = std::max(hi, r.loss);
  if (rows.empty()) lo = 0, hi = 1;
  lo = std::floor(std::min(lo, 1.0)), hi = std::ceil(std::max(hi, lo + 1));
  int64_t smax = rows.empty() ? 1 : std::max<int64_t>(1, rows.back().step);
  auto X = [&](double s) { return L + (W - L - R) * s / double(smax); };
  auto Y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
  std::filesystem::path target(path);
  std::filesystem::path tmp =
      target.parent_path() / ("." + target.filename().string() + ".cjax-tmp." + std::to_string(::getpid()) + ".0");
  std::ofstream f(tmp);
  f << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n";
  f << "<rect width='100%' height='100%' fill='white'/>\n";
  f << "<text x='" << W / 2 << "' y='22' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  for (int k = 0; k <= int(hi - lo); ++k) {
    double v = lo + k;
    f << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(v) << "' y2='" << Y(v) << "' stroke='#ddd'/>";
    f << "<text x='" << L - 8 << "' y='" << Y(v) + 4 << "' text-anchor='end'>" << v << "</text>\n";
  }
  for (int k = 0; k <= 5; ++k) {
    double s = double(smax) * k / 5;
    f << "<text x='" << X(s) << "' y='" << H - B + 18 << "' text-anchor='middle'>" << int64_t(s) << "</text>\n";
  }
  f << "<text x='" << W / 2 << "' y='" << H - 10 << "' text-anchor='middle'>step</text>\n";
  f << "<text transform='translate(16," << H / 2
    << ") rotate(-90)' text-anchor='middle'>cross-entropy (nats/byte)</text>\n";
  f << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(lo) << "' y2='" << Y(lo) << "' stroke='black'/>";
  f << "<line x1='" << L << "' x2='" << L << "' y1='" << T << "' y2='" << Y(lo) << "' stroke='black'/>\n";
  auto poly = [&](const std::vector<std::pair<double, double>>& pts, const char* color, double width) {
    f << "<polyline fill='none' stroke='" << color << "' stroke-width='" << width << "' points='";
    for (auto& [s, v] : pts) f << X(s) << "," << Y(v) << " ";
    f << "'/>\n";
  };
  std::vector<std::pair<double, double>> raw, avg;
  double acc = 0;
  size_t win = std::max<size_t>(1, rows.size() / 50);
  for (size_t i = 0; i < rows.size(); ++i) {
    raw.push_back({double(rows[i].step), rows[i].loss});
    acc += rows[i].loss;
    if (i >= win) acc -= rows[i - win].loss;
    avg.push_back({double(rows[i].step), acc / double(std::min(i + 1, win))});
  }
  poly(raw, "#9ecae1", 1);
  poly(avg, "#08519c", 2);
  f << "</svg>\n";
  f.close();
  std::error_code ec;
  if (!f) {
    std::filesystem::remove(tmp, ec);
    throw IoError("cannot write '" + path + "' (through '" + tmp.string() + "')");
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw IoError("cannot rename '" + tmp.string() + "' onto '" + path + "': " + ec.message());
  }
}

std::vector<Row> read_csv(const std::string& path, int64_t before_step) {
  std::vector<Row> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    Row r{};
    if (std::sscanf(line.c_str(), "%ld,%lf,%lf,%lf,%lf", &r.step, &r.loss, &r.lr, &r.tok_s, &r.seconds) == 5 &&
        r.step < before_step)
      rows.push_back(r);
  }
  return rows;
}

void print_sample(const tf::Config& cfg, const tf::Params& params, const std::string& prompt, const Options& o) {
  // Every process takes part in gathering the parameters; process 0 samples and prints.
  tf::Params gathered = tree::map([](const Array& a) { return process_allgather(a); }, params);
  if (process_index() != 0) return;
  std::string text = tf::generate(cfg, gathered, prompt, o.sample_len, o.temperature, cfg.seed);
  std::cout << std::defaultfloat << std::setprecision(6) << "\n---- sample (temperature " << o.temperature << ") ----\n"
            << prompt << text << "\n----\n";
}

int run(const Options& o) {
  namespace fs = std::filesystem;
  const tf::Config& cfg = o.cfg;
  // Across processes (scripts/launch.sh) every process writes its blocks of the checkpoint to
  // OUT/ckpt/ (tf::save_checkpoint), and processes other than 0 keep their logs in a folder of their
  // own.
  fs::path dir =
      process_index() == 0 ? fs::path(o.out) : fs::path(o.out) / ("process" + std::to_string(process_index()));
  fs::path ckpt = fs::path(o.out) / "ckpt.safetensors", csv = dir / "log.csv", svg = dir / "loss.svg";
  if (o.generate) {
    tf::Checkpoint ck = tf::load_checkpoint(ckpt, cfg);
    std::cout << "loaded " << ckpt.string() << " (step " << ck.step << ")\n";
    print_sample(cfg, ck.state.params, *o.generate, o);
    return 0;
  }
  fs::create_directories(dir);
  io::remove_stale_temporaries(svg);  // left by a run killed while writing it (the checkpoint's: in tf::*_checkpoint)
  tf::Corpus corpus = tf::load_corpus(o.data);
  std::cout << "data: " << corpus.path << " (" << corpus.bytes.size() << " bytes)\n";
  std::cout << "layout: " << tf::layout_name(cfg.layout);
  if (cfg.layout != tf::Layout::Single) std::cout << " on " << tf::layout_mesh(cfg).str();
  std::cout << ", " << device_count() << " devices, " << dtype_name(cfg.param_dtype) << " params\n";

  tf::TrainState state;
  int64_t start = 0;
  std::vector<Row> rows;
  if (o.resume) {
    tf::Checkpoint ck = tf::load_checkpoint(ckpt, cfg);
    state = ck.state;
    start = ck.step;
    rows = read_csv(csv.string(), start);
    std::cout << "resumed from " << ckpt.string() << " at step " << start << " (data position " << ck.data_position
              << ")\n";
  } else {
    state = tf::init_state(cfg);
  }
  int64_t nparams = 0;
  for (const Array& a : tree::leaves(state.params)) nparams += a.size();
  if (start >= o.steps) {
    // Nothing left to train: report the finished run as its last invocation did, and sample from it.
    std::cout << "the run is already complete at step " << start << " (--steps " << o.steps
              << "); nothing to train (raise --steps to continue it)\n";
    if (!rows.empty())
      std::cout << "final loss " << std::fixed << std::setprecision(3) << rows.back().loss << " (step "
                << rows.back().step << " of " << csv.string() << ")\n";
    print_sample(cfg, state.params, o.prompt, o);
    return 0;
  }
  std::cout << "model: " << cfg.n_layers << " layers, d_model " << cfg.d_model << ", " << cfg.n_heads << " heads x "
            << cfg.head_dim << ", d_ff " << cfg.d_ff << ", seq " << cfg.seq_len << ", " << nparams
            << " parameters; batch " << cfg.batch << ", " << o.steps << " steps\n";
  {
    std::ofstream f(csv);
    f << "step,loss,lr,tokens_per_s,seconds\n";
    for (const Row& r : rows) f << r.step << "," << r.loss << "," << r.lr << "," << r.tok_s << "," << r.seconds << "\n";
  }
  std::ofstream log(csv, std::ios::app);

  tf::Trainer trainer(cfg);
  tf::Loader loader(corpus, cfg, start);
  // Leaving early (a non-finite loss, a failed save) with steps still dispatched would let exit()
  // tear down the libraries under a running step: wait for the last one whatever happens.
  struct WaitForSteps {
    const tf::TrainState& state;
    ~WaitForSteps() {
      for (const Array& a : tree::leaves(state)) {
        try {
          if (a.defined()) a.block_until_ready();
        } catch (const std::exception&) {  // a failed or donated step: nothing left running for it
        }
      }
    }
  } wait_for_steps{state};
  bool tty = isatty(2);
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  double base_seconds = rows.empty() ? 0 : rows.back().seconds;
  double compile_s = 0;
  int64_t tokens_per_step = cfg.batch * cfg.seq_len;
  struct Pending {
    int64_t step;
    Array loss;
  };
  std::optional<Pending> pending;
  double tok_s = 0;
  auto t_timed = t0;  // tokens/s counts from the end of the first step (which includes compilation)
  auto report = [&](const Pending& p) {
    double loss = p.loss.item<float>();  // step p.step finished long ago (one step late)
    if (!std::isfinite(loss)) {
      log << p.step << "," << loss << "," << trainer.lr_at(p.step) << ",0," << base_seconds << std::endl;
      tf::check_loss(p.step, loss);  // throws: stop with the step and the value (main: exit 1)
    }
    auto now = clock::now();
    double el = std::chrono::duration<double>(now - t0).count();
    if (p.step == start) {
      compile_s = el;
      t_timed = now;
    } else {
      tok_s = double(p.step - start) * double(tokens_per_step) / std::chrono::duration<double>(now - t_timed).count();
    }
    rows.push_back({p.step, loss, trainer.lr_at(p.step), tok_s, base_seconds + el});
    log << p.step << "," << loss << "," << trainer.lr_at(p.step) << "," << tok_s << "," << base_seconds + el
        << std::endl;
    double eta = tok_s > 0 ? double(o.steps - 1 - p.step) * double(tokens_per_step) / tok_s : NAN;
    int width = 30, filled = int(width * double(p.step + 1) / double(o.steps));
    std::ostringstream bar;
    bar << "[" << std::string(size_t(filled), '#') << std::string(size_t(width - filled), '.') << "] step "
        << p.step + 1 << "/" << o.steps << "  loss " << std::fixed << std::setprecision(3) << loss << "  "
        << std::setprecision(0) << tok_s << " tok/s  elapsed " << hms(el) << "  ETA " << hms(eta);
    if (tty)
      std::cerr << "\r" << bar.str() << "   " << std::flush;
    else if ((p.step + 1) % 50 == 0 || p.step + 1 == o.steps)
      std::cerr << bar.str() << "\n";
  };
  for (int64_t s = start; s < o.steps; ++s) {
    Array batch = loader.next();
    std::optional<debug::CollectiveRecorder> recorder;
    if (o.show_collectives && s == start + 1) recorder.emplace();
    Array loss = trainer.step(state, batch, s);  // asynchronous
    if (recorder) {
      loss.block_until_ready();
      std::cerr << "\ncollectives of one step (" << tf::layout_name(cfg.layout) << "):\n";
      for (const auto& r : recorder->records())
        if (r.communicates) std::cerr << "  " << r.str() << "\n";
      recorder.reset();
    }
    if (pending) report(*pending);
    pending = Pending{s, loss};
    bool last = s + 1 == o.steps;
    if (o.stop_after >= 0 && s >= o.stop_after) {
      report(*pending);
      log.flush();
      std::cerr << "\nstopped after step " << s << " (--stop-after)\n";
      return 0;
    }
    if ((o.checkpoint_every > 0 && (s + 1) % o.checkpoint_every == 0) || last) {
      // The loss of the step that produced this state must be finite before the state is saved.
      report(*pending);
      pending.reset();
      tf::save_checkpoint(ckpt, state, s + 1, s + 1, cfg);
    }
  }
  if (pending) report(*pending);
  log.close();
  if (tty) std::cerr << "\n";
  double total = std::chrono::duration<double>(clock::now() - t0).count();
  std::cout << "final loss " << std::fixed << std::setprecision(3) << rows.back().loss << " after " << o.steps
            << " steps in " << hms(total) << " (first step incl. compilation " << std::setprecision(1) << compile_s
            << " s), " << std::setprecision(0) << tok_s << " tokens/s\n";
  std::string title = "byte transformer, " + tf::layout_name(cfg.layout) + ", final loss " +
                      std::to_string(rows.back().loss).substr(0, 5);
  write_svg(svg.string(), rows, title);
  std::cout << "wrote " << csv.string() << ", " << svg.string() << ", "
            << (process_count() > 1 ? (fs::path(o.out) / "ckpt").string() + "/" : ckpt.string()) << "\n";
  print_sample(cfg, state.params, o.prompt, o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  if (!std::getenv("CJAX_NUM_CPU_DEVICES")) config::set_num_cpu_devices(int(std::max<int64_t>(o.cfg.devices, 1)));
  if (o.cfg.layout != transformer::Layout::Single)  // read when the cuda platform starts
    setenv("CJAX_NUM_CUDA_VIRTUAL_DEVICES", std::to_string(std::max<int64_t>(o.cfg.devices, 1)).c_str(), 0);
  try {
    // Started by scripts/launch.sh (or with the variables set by hand): one run over every process's devices.
    bool multi_process = std::getenv("CJAX_COORDINATOR_ADDRESS") != nullptr;
    if (multi_process) distributed::initialize();
    if (!o.platform.empty()) config::set_default_platform(o.platform);
    int rc = run(o);
    if (multi_process) distributed::shutdown();
    return rc;
  } catch (const Error& e) {
    std::cerr << "\ntrain_transformer: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // not cjax's (the standard library's): still a message, not an abort
    std::cerr << "\ntrain_transformer: " << e.what() << "\n";
    return 1;
  }
}
