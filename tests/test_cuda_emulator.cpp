// The CUDA C++ of jit's fused kernels, run on the CPU emulator (tests/cuda_emulator.h), against
// the LLVM kernels of the same KernelSpecs: every kernel of tests/cuda_jit_corpus.h on random
// operands with edge values, threads in forward and in random order; and two planted faults (a
// missing barrier, a tail overrun) that the emulator must catch. Needs no GPU: runs in CI.
#include <cjax/cjax.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/llvm_codegen.h"
#include "backends/cuda/kernels/codegen.h"
#include "core/array/array_impl.h"
#include "core/array/visit_dtype.h"
#include "core/lax/attention.h"
#include "cuda_emulated_kernels.h"
#include "cuda_emulator.h"
#include "cuda_jit_corpus.h"
#include "jit/executable.h"

using namespace cjax;

namespace {

std::vector<KernelSpec> corpus_specs() {
  std::vector<KernelSpec> specs;
  for (const cuda_corpus::Program& prog : cuda_corpus::programs()) {
    Executable e(make_jaxpr(prog.fn)(prog.args));
    for (const FusedKernel& k : e.plan().kernels) specs.push_back(k.spec);
  }
  return specs;
}

// Elements an input of `spec` spans (its largest offset + 1).
int64_t input_extent(const KernelSpec& spec, const KernelInput& in) {
  if (spec.rows() == 0 || spec.cols == 0) return 0;
  int64_t off = in.col_stride * (spec.cols - 1);
  for (size_t d = 0; d < spec.outer.size(); ++d) off += (spec.outer[d] - 1) * in.outer_strides[d];
  return off + 1;
}

constexpr int64_t kGuard = 512;  // elements of NaN bytes after every buffer

// A buffer of n elements of d plus a guard region, filled with random values and edge cases.
std::vector<unsigned char> random_buffer(DType d, int64_t n, std::mt19937& rng) {
  size_t isz = itemsize(d);
  std::vector<unsigned char> b(size_t(n + kGuard) * isz, 0xff);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::uniform_int_distribution<int> ints(-1000, 1000);
  for (int64_t i = 0; i < n; ++i) {
    double v = i % 97 == 5 ? (i % 2 ? 1e10 : -1e10) : i % 101 == 7 ? 0.0 : normal(rng);
    int64_t iv = ints(rng);
    visit_dtype(d, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T x;
      if constexpr (std::is_same_v<T, bool>)
        x = iv > 0;
      else if constexpr (is_half_v<T>)
        x = T(float(v));
      else if constexpr (std::is_floating_point_v<T>)
        x = T(v);
      else if constexpr (std::is_unsigned_v<T>)
        x = T(iv < 0 ? -iv : iv);
      else
        x = T(iv);
      std::memcpy(b.data() + size_t(i) * isz, &x, isz);
    });
  }
  return b;
}

double element(const std::vector<unsigned char>& b, DType d, int64_t i) {
  double out = 0;
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T x;
    std::memcpy(&x, b.data() + size_t(i) * itemsize(d), sizeof(T));
    if constexpr (is_half_v<T>)
      out = double(float(x));
    else
      out = double(x);
  });
  return out;
}

double tolerance(DType d) {
  return d == DType::bfloat16 || d == DType::float16 ? 1e-2
         : d == DType::float64                       ? 1e-12
         : d == DType::float32                       ? 2e-5
                                                     : 0;
}

bool same(double want, double got, double rtol) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return want == got;
  return std::abs(want - got) <= rtol * (1 + std::max(std::abs(want), std::abs(got)));
}

struct Outcome {
  int64_t mismatches = 0;
  bool guard_damaged = false;
  std::string first;
};

// Runs `emulated` over fresh random inputs and compares with the LLVM kernel of `spec`.
// `misaligned`: the kernel's buffers start one element past a 16-byte boundary, so that kernels
// moving 16-byte runs must take their element-by-element path.
Outcome compare(const KernelSpec& spec, const cuda_emulated::Kernel& emulated, uint32_t seed, bool random_order,
                bool misaligned = false) {
  std::mt19937 rng(seed);
  std::vector<std::vector<unsigned char>> inputs;
  for (const KernelInput& in : spec.inputs) inputs.push_back(random_buffer(in.dtype, input_extent(spec, in), rng));
  auto fresh_outputs = [&] {
    std::vector<std::vector<unsigned char>> outs;
    for (const KernelOutput& o : spec.outputs) {
      int64_t n = o.full ? spec.rows() * spec.cols : spec.rows();
      outs.emplace_back(size_t(n + kGuard) * itemsize(o.dtype), 0xff);
    }
    return outs;
  };
  std::vector<std::vector<unsigned char>> want = fresh_outputs(), got = fresh_outputs();
  auto pointers = [&](std::vector<std::vector<unsigned char>>& outs) {
    std::vector<void*> p;
    for (auto& b : inputs) p.push_back(b.data());
    for (auto& b : outs) p.push_back(b.data());
    return p;
  };
  // The emulated kernel's copies of the inputs and outputs, each at a 16-byte boundary plus
  // (misaligned) one element.
  std::vector<std::vector<unsigned char>> shifted;
  std::vector<size_t> shift;
  auto place = [&](const std::vector<unsigned char>& b, size_t isz) {
    shifted.emplace_back(b.size() + 32);
    auto base = reinterpret_cast<uintptr_t>(shifted.back().data());
    size_t at = (16 - base % 16) % 16 + (misaligned ? isz : 0);
    std::memcpy(shifted.back().data() + at, b.data(), b.size());
    shift.push_back(at);
    return static_cast<void*>(shifted.back().data() + at);
  };
  KernelSpec out_of_place = spec;
  for (KernelOutput& o : out_of_place.outputs) o.in_place_of = -1;
  const KernelSpec* one = &out_of_place;
  CompiledKernels llvm = compile_kernels(std::span<const KernelSpec* const>(&one, 1));
  std::vector<double> scratch(size_t(spec.scratch_bytes()) / sizeof(double) + 1);
  std::vector<void*> wp = pointers(want);
  if (spec.rows() > 0) llvm.fns[0](wp.data(), scratch.data(), 0, spec.rows(), 0, spec.cols);
  std::vector<void*> gp;
  shifted.reserve(inputs.size() + got.size());
  for (size_t k = 0; k < inputs.size(); ++k) gp.push_back(place(inputs[k], itemsize(spec.inputs[k].dtype)));
  for (size_t o = 0; o < got.size(); ++o) gp.push_back(place(got[o], itemsize(spec.outputs[o].dtype)));
  std::mt19937 schedule(seed + 1);
  cj_emu::launch(
      emulated.grid, emulated.block, [&] { emulated.entry(gp.data()); }, random_order ? &schedule : nullptr);
  for (size_t o = 0; o < got.size(); ++o) {
    const std::vector<unsigned char>& b = shifted[inputs.size() + o];
    std::copy(b.begin() + std::ptrdiff_t(shift[inputs.size() + o]),
              b.begin() + std::ptrdiff_t(shift[inputs.size() + o] + got[o].size()), got[o].begin());
  }
  Outcome r;
  for (size_t o = 0; o < spec.outputs.size(); ++o) {
    DType d = spec.outputs[o].dtype;
    int64_t n = spec.outputs[o].full ? spec.rows() * spec.cols : spec.rows();
    for (int64_t i = 0; i < n; ++i) {
      double w = element(want[o], d, i), g = element(got[o], d, i);
      if (!same(w, g, tolerance(d)) && r.mismatches++ == 0)
        r.first = fmt::format("output {} [{}]: llvm {} emulated cuda {}", o, i, w, g);
    }
    size_t isz = itemsize(d);
    for (size_t b = size_t(n) * isz; b < got[o].size(); ++b) r.guard_damaged = r.guard_damaged || got[o][b] != 0xff;
  }
  return r;
}

}  // namespace

TEST_CASE("every fused kernel of the corpus: its CUDA source on the CPU emulator matches the LLVM kernel") {
  std::vector<KernelSpec> specs = corpus_specs();
  const auto& kernels = cuda_emulated::corpus_kernels();
  REQUIRE(specs.size() == kernels.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    CAPTURE(k);
    CAPTURE(specs[k].canonical());
    REQUIRE(cuda_emulated::spec_hash(specs[k].canonical()) ==
            kernels[k].spec_hash);  // the build's kernels are this planner's
    for (auto [random_order, misaligned] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
      CAPTURE(random_order);
      CAPTURE(misaligned);
      Outcome r = compare(specs[k], kernels[k], uint32_t(100 + k), random_order, misaligned);
      CHECK_MESSAGE(r.mismatches == 0, r.first);
      CHECK_FALSE(r.guard_damaged);
    }
  }
}

TEST_CASE("the emulator catches a planted missing barrier and a planted tail overrun") {
  std::vector<KernelSpec> specs = corpus_specs();
  const auto& planted = cuda_emulated::planted_faults();
  REQUIRE(planted.size() == 2);
  auto spec_of = [&](uint64_t hash) -> const KernelSpec& {
    for (const KernelSpec& s : specs)
      if (cuda_emulated::spec_hash(s.canonical()) == hash) return s;
    throw std::runtime_error("planted fault of an unknown spec");
  };
  // Without its barriers a row reduction reads partials that are not written yet (poisoned).
  Outcome no_barrier = compare(spec_of(planted[0].spec_hash), planted[0], 7, false);
  CHECK(no_barrier.mismatches > 0);
  // Past the end: the guard region after the output is written.
  Outcome overrun = compare(spec_of(planted[1].spec_hash), planted[1], 8, false);
  CHECK(overrun.guard_damaged);
}

namespace {
// x's elements (row-major, x is materialised) followed by a guard region of NaN bytes.
std::vector<unsigned char> guarded_bytes(const Array& x) {
  const size_t n = size_t(x.size()) * itemsize(x.dtype());
  std::vector<unsigned char> b(n + size_t(kGuard) * itemsize(x.dtype()), 0xff);
  concrete(x);
  if (n > 0) std::memcpy(b.data(), raw_ptr(x), n);
  return b;
}
std::vector<unsigned char> guarded_output(const Shape& shape, DType d) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return std::vector<unsigned char>(size_t(n + kGuard) * itemsize(d), 0xff);
}
// Mismatches of `got` against the CPU's `want`, the first named; a damaged guard counts as one.
int64_t mismatches(const Array& want, const std::vector<unsigned char>& got, const char* what, std::string& first) {
  std::vector<unsigned char> w = guarded_bytes(want);
  int64_t bad = 0;
  for (int64_t i = 0; i < want.size(); ++i) {
    double a = element(w, want.dtype(), i), b = element(got, want.dtype(), i);
    if (!same(a, b, tolerance(want.dtype())) && bad++ == 0)
      first = fmt::format("{} [{}]: cpu {} emulated cuda {}", what, i, a, b);
  }
  for (size_t k = size_t(want.size()) * itemsize(want.dtype()); k < got.size(); ++k)
    if (got[k] != 0xff) {
      if (bad++ == 0) first = fmt::format("{}: written past its end", what);
      break;
    }
  return bad;
}
}  // namespace

TEST_CASE("flash attention's CUDA kernels on the CPU emulator match the CPU kernels") {
  const auto& configs = cuda_emulated::attention_configs();
  const auto& kernels = cuda_emulated::attention_kernels();
  REQUIRE(configs.size() == kernels.size());
  for (size_t c = 0; c < configs.size(); ++c) {
    const auto [dtype, H, causal, T, S, N, K] = configs[c];
    CAPTURE(dtype_name(dtype));
    CAPTURE(H);
    CAPTURE(causal);
    CAPTURE(T);
    CAPTURE(S);
    const int B = 2;
    const attention::Options o{1.0 / std::sqrt(double(H)), causal};
    auto keys = random::split(random::key(uint64_t(40 + c)), 4);
    Array q = random::normal(keys[0], {B, T, N, H}).astype(dtype),
          k = random::normal(keys[1], {B, S, K, H}).astype(dtype),
          v = random::normal(keys[2], {B, S, K, H}).astype(dtype),
          dout = random::normal(keys[3], {B, T, N, H}).astype(dtype);
    std::vector<Array> fwd = attention::forward(q, k, v, o);
    std::vector<Array> bwd = attention::backward(q, k, v, fwd[0], fwd[1], dout, o);
    std::vector<std::vector<unsigned char>> in;
    for (const Array& x : {q, k, v, fwd[0], fwd[1], dout}) in.push_back(guarded_bytes(x));
    const int dims[4] = {T, S, N, K};
    const float scale = float(o.scale);
    std::vector<std::vector<unsigned char>> first_run;
    for (bool random_order : {false, true}) {
      CAPTURE(random_order);
      std::mt19937 schedule(uint32_t(c + 3));
      auto run = [&](cuda_emulated::AttentionEntry entry, int64_t blocks, std::vector<void*> buffers) {
        cj_emu::launch(
            unsigned(blocks), 64, [&] { entry(buffers.data(), dims, scale); }, random_order ? &schedule : nullptr);
      };
      std::vector<unsigned char> out = guarded_output({B, T, N, H}, dtype), lse = guarded_output({B, N, T}, f32);
      std::vector<unsigned char> dq = guarded_output({B, T, N, H}, dtype), dk = guarded_output({B, S, K, H}, dtype),
                                 dv = guarded_output({B, S, K, H}, dtype);
      run(kernels[c].forward, B * N * cuda::attention_blocks(T),
          {in[0].data(), in[1].data(), in[2].data(), out.data(), lse.data()});
      // The backward kernels read the CPU's forward results: each kernel is compared on its own.
      std::vector<void*> bin;
      for (auto& b : in) bin.push_back(b.data());
      std::vector<void*> dq_buffers = bin, dkdv_buffers = bin;
      dq_buffers.push_back(dq.data());
      dkdv_buffers.push_back(dk.data());
      dkdv_buffers.push_back(dv.data());
      run(kernels[c].backward_dq, B * N * cuda::attention_blocks(T), dq_buffers);
      run(kernels[c].backward_dkdv, B * K * cuda::attention_blocks(S), dkdv_buffers);
      std::string first;
      CHECK_MESSAGE(mismatches(fwd[0], out, "out", first) == 0, first);
      CHECK_MESSAGE(mismatches(fwd[1], lse, "lse", first) == 0, first);
      CHECK_MESSAGE(mismatches(bwd[0], dq, "dq", first) == 0, first);
      CHECK_MESSAGE(mismatches(bwd[1], dk, "dk", first) == 0, first);
      CHECK_MESSAGE(mismatches(bwd[2], dv, "dv", first) == 0, first);
      // No sum depends on the order the threads run in: bitwise the same.
      std::vector<std::vector<unsigned char>> results = {out, lse, dq, dk, dv};
      if (first_run.empty())
        first_run = results;
      else
        CHECK(results == first_run);
    }
  }
}
