// The cuda platform on any machine with the CUDA toolkit, GPU or not: device discovery and its
// errors, and every generated elementwise, library and fused (jit) kernel compiled by NVRTC to SASS
// (which needs no driver).
#include <cjax/cjax.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <tuple>

#include "backends/cuda/buffer_communicator.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/kernels/codegen.h"
#include "backends/cuda/kernels/elementwise.h"
#include "backends/cuda/kernels/fused.h"
#include "backends/cuda/nccl.h"
#include "core/array/kernel_table.h"
#include "core/backend/backend.h"
#include "core/backend/kernel_cache.h"
#include "core/distributed/kv_store.h"
#include "cuda_jit_corpus.h"
#include "jit/executable.h"
#include "test_util.h"
#include "trace/jaxpr.h"
#include "transformer/transformer.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
bool in_domain(ScalarDomain dom, DType d) {
  bool fl = d == bf16 || d == f16 || d == f32 || d == f64;
  bool boolean = d == bool_;
  switch (dom) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return fl;
    case ScalarDomain::Int: return !fl && !boolean;
    case ScalarDomain::Num: return !boolean;
    case ScalarDomain::Logic: return !fl;
    case ScalarDomain::Any:
    case ScalarDomain::Cmp: return true;
  }
  return false;
}
DType out_dtype(const ScalarOpInfo& info, DType in) {
  return info.domain == ScalarDomain::Cmp || info.domain == ScalarDomain::Pred ? bool_ : in;
}
// Primitives of `j` and its sub-jaxprs with no cuda kernel. Higher-order primitives run their
// bodies; iota has no operands, so it runs on the host and its result follows (docs/cuda.md).
std::set<std::string> missing_cuda_kernels(const Jaxpr& j) {
  std::set<std::string> missing;
  for (const JaxprEqn& e : j.eqns()) {
    const std::string& name = e.primitive->name;
    // find_implementation: a cuda kernel, or the def's platform-independent impl (views,
    // higher-order primitives).
    if (!find_implementation(*e.primitive, Platform::cuda) && name != "iota") missing.insert(name);
    for (const Jaxpr* sub : jaxprs_in_params(e.params)) missing.merge(missing_cuda_kernels(*sub));
  }
  return missing;
}
}  // namespace

TEST_CASE("without a driver the cuda platform is empty and asking for its device names the reason") {
  if (cuda::driver()) {
    MESSAGE("a driver is loaded here: checked by test_cuda_device instead");
    CHECK(!devices("cuda").empty());
    return;
  }
  CHECK(devices("cuda").empty());
  CHECK(devices("gpu").empty());
  std::string reason = cuda::driver_unavailable_reason();
  CHECK(!reason.empty());
  // The default platform cannot become cuda; the error says why, and the default stays cpu.
  CHECK_THROWS_WITH_AS(config::set_default_platform("cuda"), doctest::Contains(reason.c_str()), BackendError);
  CHECK_THROWS_WITH_AS(config::set_default_platform("tpu"), doctest::Contains("unknown platform 'tpu'"), BackendError);
  CHECK(config::default_platform() == "cpu");
  CHECK(default_device() == Device(Platform::cpu, 0));
  Array x = jnp::arange(4, f32);
  try {
    device_put(x, SingleDeviceSharding(Device(Platform::cuda, 0)));
    FAIL("device_put to cuda:0 succeeded without a GPU");
  } catch (const BackendError& e) {
    std::string msg = e.what();
    CHECK(msg.find("cuda:0") != std::string::npos);
    CHECK(msg.find(reason) != std::string::npos);
  }
  CHECK_THROWS_AS(devices("tpu"), BackendError);
}

TEST_CASE("NVRTC is found and reports its version") {
  REQUIRE(cuda::nvrtc_available());
  const cuda::Nvrtc& rtc = cuda::nvrtc();
  CHECK(rtc.major >= 12);
  MESSAGE("NVRTC " << rtc.major << "." << rtc.minor << " from " << rtc.path);
}

#if CJAX_HAVE_NCCL
TEST_CASE("NCCL loads, its unique id passes through the coordinator's store, and joining stops at the driver") {
  using namespace std::chrono_literals;
  bool installed = std::filesystem::exists("/usr/local/cuda/lib64/libnccl.so.2") || cuda::nccl_available();
  if (!installed) {  // the loader's error names what it tried
    CHECK_THROWS_WITH_AS(cuda::nccl(), doctest::Contains("libnccl.so.2"), BackendError);
    return;
  }
  REQUIRE(cuda::nccl_available());
  CHECK(cuda::nccl().version >= 21800);
  MESSAGE("NCCL version code " << cuda::nccl().version << " from " << cuda::nccl().path);
  // Two processes' clients (threads here): the root makes the id, the other reads it from the store.
  distributed::KvStoreServer server("127.0.0.1", 0, 2);
  std::string address = "127.0.0.1:" + std::to_string(server.port());
  ncclUniqueId ids[2] = {};
  cjax::testing::on_threads(2, [&](int p) {
    distributed::KvStoreClient client(address, p, 2, 5s);
    ids[p] = cuda::share_unique_id(p == 0, &client, "nccl1/0,1", 5s);
    client.barrier("done", 5s);
  });
  CHECK(std::memcmp(ids[0].internal, ids[1].internal, sizeof(ids[0].internal)) == 0);
  CHECK(std::any_of(std::begin(ids[0].internal), std::end(ids[0].internal), [](char c) { return c != 0; }));
  // A non-root process with no coordinator has nowhere to read the id from.
  CHECK_THROWS_AS(cuda::share_unique_id(false, nullptr, "nccl1/0,1", 1s), Error);
  if (!cuda::driver()) {  // without a GPU, joining fails at NCCL's first CUDA call, with NCCL's reason
    // (BackendError where NCCL refuses at once; CollectiveError where its joining thread fails.)
    CHECK_THROWS_WITH_AS(cuda::init_rank(ids[0], 1, 0, 5s), doctest::Contains("rank 0 of 1"), Error);
  }
}
#endif

TEST_CASE("elementwise source follows the CPU semantics in its text") {
  auto div = cuda::elementwise_source(ScalarOp::Div, i32, i32, {false, false});
  REQUIRE(div);
  CHECK(div->find("y == 0 ? (int)-1") != std::string::npos);                   // x / 0 = -1, as XLA
  CHECK(div->find("(-2147483647 - 1) && y == -1) ? x") != std::string::npos);  // INT_MIN / -1 = INT_MIN
  auto add = cuda::elementwise_source(ScalarOp::Add, bf16, bf16, {false, true});
  REQUIRE(add);
  CHECK(add->find("cj_from_bf16(in_1[0])") != std::string::npos);  // a scalar operand is read at 0
  CHECK(add->find("out[i] = cj_to_bf16((x + y))") != std::string::npos);
  CHECK(cuda::elementwise_source(ScalarOp::Add, bool_, bool_, {false, false}) == std::nullopt);
  CHECK(cuda::convert_source(f64, bf16) == std::nullopt);  // would round twice: host fallback
  CHECK(cuda::convert_source(f32, bf16));
}

TEST_CASE("every elementwise kernel compiles to SASS for sm_80 and sm_90 without spills") {
  REQUIRE(cuda::nvrtc_available());
  // One program per (op, dtype) would take minutes: concatenate them, each kernel renamed, and
  // compile one program per architecture.
  std::string program;
  int kernels = 0;
  const DType dtypes[] = {bool_, i8, i32, i64, u8, u32, bf16, f16, f32, f64};
  for (const ScalarOpInfo& info : kScalarOps)
    for (DType d : dtypes) {
      if (!in_domain(info.domain, d)) continue;
      std::vector<bool> scalar(size_t(info.arity), false);
      if (info.arity > 1) scalar[1] = true;
      auto src = cuda::elementwise_source(info.op, d, out_dtype(info, d), scalar);
      if (!src) continue;
      std::string name = fmt::format("k{}_{}", kernels++, info.name);
      std::string body = std::regex_replace(*src, std::regex(cuda::kElementwiseKernelName), name);
      // The prelude is shared: keep it once.
      size_t at = body.find("extern \"C\"");
      program += program.empty() ? body : body.substr(at);
    }
  for (DType in : {bool_, i32, bf16, f16, f32})
    for (DType out : {bf16, f16, f32, f64})
      if (auto src = cuda::convert_source(in, out)) {
        std::string name = fmt::format("k{}_convert", kernels++);
        std::string body = std::regex_replace(*src, std::regex(cuda::kElementwiseKernelName), name);
        program += body.substr(body.find("extern \"C\""));
      }
  MESSAGE(kernels << " kernels in one program");
  CHECK(kernels > 300);
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{9, 0}}) {
    std::string log;
    std::vector<char> cubin = cuda::compile_cubin(program, major, minor, &log, /*ptxas_verbose=*/true);
    CHECK(cubin.size() > 1000);
    CHECK(std::string(cubin.data(), 4) ==
          "\x7f"
          "ELF");
    // ptxas reports each kernel: no stack frame and no spills anywhere, registers within 64.
    std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
    std::regex regs(R"(Used (\d+) registers)");
    int reports = 0, max_regs = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), spill); it != std::sregex_iterator(); ++it) {
      ++reports;
      CHECK((*it)[1].str() == "0");
      CHECK((*it)[2].str() == "0");
    }
    for (auto it = std::sregex_iterator(log.begin(), log.end(), regs); it != std::sregex_iterator(); ++it)
      max_regs = std::max(max_regs, std::stoi((*it)[1].str()));
    CHECK(reports >= kernels);  // one per kernel, plus one per non-inlined math helper
    std::regex entry(R"(Compiling entry function '(\w+)')");
    CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), entry), std::sregex_iterator()) == kernels);
    CHECK(max_regs <= 64);
    MESSAGE("sm_" << major << minor << ": " << cubin.size() << " bytes of SASS, at most " << max_regs
                  << " registers per thread");
  }
}

TEST_CASE("the shape and reduction library kernels compile for sm_90") {
  REQUIRE(cuda::nvrtc_available());
  // One program: each source in its own namespace, its extern "C" kernel renamed apart.
  std::string program;
  int kernels = 0;
  auto add = [&](const std::string& src, const char* kernel) {
    std::string name = fmt::format("k{}", kernels++);
    program += "namespace n" + name + " {\n" + std::regex_replace(src, std::regex(kernel), name) + "}\n";
  };
  for (size_t itemsize : {1, 2, 4, 8})
    for (int rank : {1, 3, 8}) add(cuda::strided_copy_source(itemsize, rank), "cj_strided_copy");
  for (const char* r : {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or"})
    for (DType d : {bool_, i8, i32, i64, u8, u32, bf16, f16, f32, f64})
      for (int red : {1, 2})
        if (auto src = cuda::reduce_source(r, d, d, 2, red)) add(*src, "cj_reduce");
  add(cuda::threefry_source({true, true, false, false}), cuda::kElementwiseKernelName);
  for (DType index : {i32, i64, u8, u32})
    for (bool fill : {false, true}) add(cuda::gather_source(4, index, 2, 3, fill), "cj_gather");
  add(cuda::gather_source(2, i32, 1, 2, true), "cj_gather");
  for (DType d : {i8, i32, i64, u8, u32, bf16, f16, f32, f64}) {
    if (auto src = cuda::integer_pow_source(d)) add(*src, cuda::kElementwiseKernelName);
    add(cuda::select_n_source(bool_, d, 2, false), cuda::kElementwiseKernelName);
    add(cuda::select_n_source(i32, d, 3, true), cuda::kElementwiseKernelName);
  }
  // The virtual-device communicator's rank-order reduction, every dtype and operation.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min})
    for (DType d : {bool_, i8, i32, i64, u8, u32, bf16, f16, f32, f64})
      add(cuda::rank_reduce_kernel_source(d, op), "cj_rank_reduce");
  MESSAGE(kernels << " library kernels");
  CHECK(kernels > 90);
  for (DType half : {bf16, f16}) {  // bf16 partial sums in f32, then f32 -> bf16
    add(*cuda::reduce_source("reduce_sum", half, f32, 1, 1), "cj_reduce");
    add(*cuda::reduce_source("reduce_sum", f32, half, 1, 1), "cj_reduce");
  }
  CHECK(cuda::reduce_source("reduce_sum", bool_, bool_, 1, 1) == std::nullopt);  // not in sum's domain
  std::string log;
  std::vector<char> cubin = cuda::compile_cubin(program, 9, 0, &log, true);
  CHECK(cubin.size() > 1000);
  CHECK(log.find("spill stores") != std::string::npos);
  std::regex spill(R"((\d+) bytes spill stores)");
  int reports = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), spill); it != std::sregex_iterator(); ++it, ++reports)
    CHECK((*it)[1].str() == "0");
  CHECK(reports >= kernels);
}

TEST_CASE("every primitive of an MLP training step (tanh, relu, softmax cross-entropy) has a cuda kernel") {
  auto loss = [](const std::vector<Array>& p, const Array& x, const Array& labels) {
    Array h = jnp::tanh(jnp::matmul(x, p[0]) + p[1]);
    h = jnp::maximum(jnp::matmul(h, p[2]) + p[3], 0.0f);
    Array logits = jnp::matmul(h, p[4]);
    Array logp = logits - nn::logsumexp(logits, -1, true);
    return -jnp::mean(jnp::sum(logp * labels, -1)) + 1e-3f * jnp::sum(jnp::square(p[0]));
  };
  auto step = [&](const std::vector<Array>& p, const Array& x, const Array& labels) {
    auto [l, g] = value_and_grad(loss)(p, x, labels);
    std::vector<Array> out{l};
    for (size_t i = 0; i < p.size(); ++i) out.push_back(p[i] - 0.1f * g[i]);
    return out;
  };
  std::vector<Array> p = {jnp::ones({8, 16}), jnp::ones({16}), jnp::ones({16, 16}), jnp::ones({16}),
                          jnp::ones({16, 4})};
  ClosedJaxpr j = make_jaxpr(step)(p, jnp::ones({32, 8}), jnp::ones({32, 4}));
  std::set<std::string> missing = missing_cuda_kernels(*j);
  CHECK_MESSAGE(missing.empty(), "no cuda kernel for: " << fmt::format("{}", fmt::join(missing, ", ")));
}

TEST_CASE("jit's fused kernels of the corpus are emitted as CUDA C++ and compile for sm_80 and sm_90 without spills") {
  REQUIRE(cuda::nvrtc_available());
  std::string program = cuda::fused_prelude();
  int kernels = 0;
  std::set<int> plans;
  std::string softmax_source, chain_source;
  for (const cuda_corpus::Program& prog : cuda_corpus::programs()) {
    CAPTURE(prog.name);
    Executable e(make_jaxpr(prog.fn)(prog.args));
    for (const FusedKernel& k : e.plan().kernels) {
      std::string name = fmt::format("k{}", kernels++);
      std::optional<std::string> src = cuda::fused_kernel_source(k.spec, name);
      REQUIRE_MESSAGE(src.has_value(), k.spec.canonical());
      plans.insert(int(cuda::fused_launch_plan(k.spec).kind));
      program += "\n" + *src;
      if (prog.name == "softmax rows (block per row)" && k.spec.has_reduction) softmax_source = *src;
      if (prog.name == "chain10 f32 (tail)") chain_source = *src;
    }
  }
  MESSAGE(kernels << " fused kernels in one program");
  CHECK(kernels >= 25);
  CHECK(plans.size() == 3);  // elements, thread per row, block per row
  // Golden snippets: extents are literals; a row reduction combines warps with shuffles.
  // Whole aligned blocks move 16-byte runs; the last block goes element by element.
  CHECK(chain_source.find("if ((int)blockIdx.x * 1024 + 1024 <= 37000 && (((unsigned long long)in0 & 15) | "
                          "((unsigned long long)out0 & 15)) == 0) {") != std::string::npos);
  CHECK(chain_source.find("cj_vcopy<16>(cj_l0_g0, in0 + b0_g0 + col_g0);") != std::string::npos);
  CHECK(chain_source.find("cj_vcopy<16>(out0 + e_g0, cj_s0_g0);") != std::string::npos);
  CHECK(chain_source.find("if (cj_e >= 37000) break;") != std::string::npos);
  CHECK(chain_source.find("__launch_bounds__(256)") != std::string::npos);
  std::string chain_ptx = cuda::compile_ptx(cuda::fused_prelude() + chain_source, 9, 0);
  CHECK(std::regex_search(chain_ptx, std::regex(R"(ld\.global(\.nc)?\.v(2\.u64|4\.u32|4\.f32))")));
  CHECK(std::regex_search(chain_ptx, std::regex(R"(st\.global\.v(2\.u64|4\.u32|4\.f32))")));
  // A row that fits in registers is loaded once, up front; the passes read the registers.
  CHECK(softmax_source.find("cj_c0[cj_j] = (float)(in0[b0 + col]);") != std::string::npos);
  CHECK(softmax_source.find("const float v0 = cj_c0[cj_j];") != std::string::npos);
  CHECK(softmax_source.find("col < 129") != std::string::npos);
  CHECK(softmax_source.find("cj_shfl_xor") != std::string::npos);
  CHECK(softmax_source.find("__syncthreads();") != std::string::npos);
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{9, 0}}) {
    std::string log;
    std::vector<char> cubin = cuda::compile_cubin(program, major, minor, &log, /*ptxas_verbose=*/true);
    CHECK(std::string(cubin.data(), 4) ==
          "\x7f"
          "ELF");
    // CJAX_TEST_PTXAS_LOG=1: ptxas's report and the program on stderr, to find a spilling kernel.
    if (getenv("CJAX_TEST_PTXAS_LOG")) std::fprintf(stderr, "%s\n%s\n", log.c_str(), program.c_str());
    std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), spill); it != std::sregex_iterator(); ++it) {
      CHECK((*it)[1].str() == "0");
      CHECK((*it)[2].str() == "0");
    }
    std::regex entry(R"(Compiling entry function '(\w+)')");
    CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), entry), std::sregex_iterator()) == kernels);
    int max_regs = 0;
    std::regex regs(R"(Used (\d+) registers)");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), regs); it != std::sregex_iterator(); ++it)
      max_regs = std::max(max_regs, std::stoi((*it)[1].str()));
    CHECK(max_regs <= 64);  // 1024-thread blocks need <= 64
    MESSAGE("sm_" << major << minor << ": " << cubin.size() << " bytes of SASS, at most " << max_regs << " registers");
  }
}

TEST_CASE("every primitive of the transformer sample's training step has a cuda kernel (iota aside)") {
  transformer::Config c;
  c.layout = transformer::Layout::Single;
  c.n_layers = 1;
  transformer::TrainState s = transformer::init_state(c);
  Array tokens = jnp::zeros({c.batch, c.seq_len + 1}, i32);
  auto step = [&](const transformer::Params& p, const Array& t) {
    return value_and_grad([&](const transformer::Params& q) { return transformer::loss_fn(c, q, t); })(p);
  };
  ClosedJaxpr j = make_jaxpr(step)(s.params, tokens);
  std::set<std::string> missing = missing_cuda_kernels(*j);
  CHECK_MESSAGE(missing.empty(), "no cuda kernel for: " << fmt::format("{}", fmt::join(missing, ", ")));
}

TEST_CASE("flash attention's kernels compile for sm_80 and sm_90 without spills up to the widest head") {
  REQUIRE(cuda::nvrtc_available());
  // Each dtype, both masks and the widest head the kernels take (the register-heaviest); about a
  // second of NVRTC per configuration.
  std::string program = cuda::fused_prelude();
  int configs = 0;
  for (auto [d, head, causal] :
       {std::tuple{f32, cuda::kMaxAttentionHead, true}, std::tuple{bf16, cuda::kMaxAttentionHead, false},
        std::tuple{f16, int64_t(16), true}, std::tuple{f32, int64_t(5), false}})
    program += cuda::attention_source(d, head, causal, fmt::format("a{}", configs++));
  for (auto [major, minor] : {std::pair{8, 0}, std::pair{9, 0}}) {
    std::string log;
    std::vector<char> cubin = cuda::compile_cubin(program, major, minor, &log, /*ptxas_verbose=*/true);
    REQUIRE(cubin.size() > 1000);
    std::regex entry(R"(Compiling entry function '(\w+)')");
    CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), entry), std::sregex_iterator()) == 3 * configs);
    std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
    int reports = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), spill); it != std::sregex_iterator(); ++it, ++reports) {
      CHECK((*it)[1].str() == "0");
      CHECK((*it)[2].str() == "0");
    }
    CHECK(reports >= 3 * configs);
    std::regex regs(R"(Used (\d+) registers)");
    int max_regs = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), regs); it != std::sregex_iterator(); ++it)
      max_regs = std::max(max_regs, std::stoi((*it)[1].str()));
    CHECK(max_regs <= 255);
    MESSAGE("sm_" << major << minor << ": " << 3 * configs << " attention kernels, at most " << max_regs
                  << " registers per thread");
  }
}

TEST_CASE("each flash attention kernel is a program of its own (the GPU compiles the three side by side)") {
  REQUIRE(cuda::nvrtc_available());
  for (const char* kernel : {"forward", "backward_dq", "backward_dkdv"}) {
    CAPTURE(kernel);
    std::string program = cuda::attention_program(bf16, 16, true, kernel), log;
    CHECK(program.find("cj_attention_" + std::string(kernel) + "(") != std::string::npos);
    std::vector<char> cubin = cuda::compile_cubin(program, 9, 0, &log, /*ptxas_verbose=*/true);
    CHECK(cubin.size() > 1000);
    std::regex entry(R"(Compiling entry function '(\w+)')");
    std::smatch m;
    REQUIRE(std::regex_search(log, m, entry));
    CHECK(m[1].str() == "cj_attention_" + std::string(kernel));
    CHECK(std::distance(std::sregex_iterator(log.begin(), log.end(), entry), std::sregex_iterator()) == 1);
  }
  CHECK_THROWS_AS(cuda::attention_program(f32, 16, true, "sideways"), Error);
}

TEST_CASE("library kernels' CUBINs go through the kernel cache: a new process loads them instead of running NVRTC") {
  REQUIRE(cuda::nvrtc_available());
  // A source no earlier run compiled (the comment makes it unique).
  std::string source = cuda::fused_prelude() + cuda::attention_source(f32, 4, true, "cache_probe") +
                       fmt::format("// {}\n", std::chrono::steady_clock::now().time_since_epoch().count());
  KernelCacheStats before = kernel_cache_stats();
  bool from_cache = true;
  std::vector<char> first = cuda::cached_cubin(source, 9, 0, &from_cache);
  CHECK_FALSE(from_cache);
  CHECK(kernel_cache_stats().misses == before.misses + 1);
  std::vector<char> again = cuda::cached_cubin(source, 9, 0, &from_cache);
  CHECK(from_cache);
  CHECK(again == first);
  // What another process sees: the memory cache dropped, the CUBIN read from disk (where the disk
  // cache is on).
  clear_memory_kernel_cache();
  KernelCacheStats mid = kernel_cache_stats();
  std::vector<char> from_disk = cuda::cached_cubin(source, 9, 0, &from_cache);
  CHECK(from_disk == first);
  const char* dir = std::getenv("CJAX_CACHE_DIR");
  if (!dir || *dir) {
    CHECK(from_cache);
    CHECK(kernel_cache_stats().disk_hits == mid.disk_hits + 1);
  } else {
    CHECK_FALSE(from_cache);
  }
  // Another architecture is another entry.
  cuda::cached_cubin(source, 8, 0, &from_cache);
  CHECK_FALSE(from_cache);
}
