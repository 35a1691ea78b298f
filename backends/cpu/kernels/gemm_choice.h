// Which library runs a CPU f32/f64 GEMM: LIBXSMM's tiled kernels (gemm_xsmm.h) or OpenBLAS.
//
// Neither wins everywhere. LIBXSMM has no per-call overhead and wins the many small products of
// attention and of an MLP; OpenBLAS's packed, cache-blocked kernels win large products on some
// hosts (3x at 1024^3 on an AVX2 Zen 3) and tie on others (AVX-512 Zen 4). So the choice is
// measured on the host, per shape class, the first time a class is seen: both libraries run the
// call's own operands into scratch memory, taking turns (three runs each, more only while neither
// is 25% faster), and OpenBLAS is chosen where its median time per run is at least 5% under
// LIBXSMM's (in the faster of two measurements). OpenBLAS runs on one thread per call, cjax's
// pool spreading its calls over row or column panels or batch entries (linalg.cpp says why). Decisions are kept in
// memory and in the kernel cache on disk, keyed by CPU model, ISA (CJAX_ISA), thread count and class, and a run uses
// one library per class from start to end. A close decision (the libraries within 25%) is not settled by one
// measurement: a process meeting an unsettled class measures it again at its 64th call (in the steady state, away from
// the first steps' compiles), until three measurements are recorded, the record keeping the least of their medians per
// library. The run that re-measures keeps its library; the next processes read the new record. So one measurement taken
// in a slow moment of a shared host does not decide for good (on a Zen 4 VM, one taken during a transformer's first
// step chose OpenBLAS for the weight gradients' class, where LIBXSMM was 10-15% faster in every later run).
//
// CJAX_GEMM=xsmm or CJAX_GEMM=blas fixes the library for every GEMM (for bit-for-bit comparisons
// across hosts, or to rule one out); CJAX_GEMM=auto, the default, measures. CJAX_LOG_GEMM=1 prints
// each measurement and its decision to stderr.
#pragma once
#include <absl/functional/function_ref.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cjax/dtype.h"

namespace cjax {

enum class GemmEngine : uint8_t { xsmm, blas };

// A shape class: dtype, the operands' transposes, and M, N, K and the batch each rounded up to a
// power of two. Where the GEMM runs (on the pool, or on one thread inside a parallel region) is
// not part of it: one class runs on one library in every context, so a shard_map body gives the
// same bits in lockstep and on one thread per device.
struct GemmClass {
  DType dtype;
  bool a_trans, b_trans;
  uint8_t log_m, log_n, log_k, log_batch;
  uint64_t packed() const;
  std::string str() const;  // "f32 NT m<=1024 n<=1024 k<=1024 batch<=1"
};
GemmClass gemm_class(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, bool a_trans, bool b_trans);

// The engine for class `c`. When the class has no decision yet (in memory or on disk),
// `run_once(e)` is called to run this GEMM once with engine e into scratch memory, and timed.
GemmEngine choose_gemm_engine(const GemmClass& c, absl::FunctionRef<void(GemmEngine)> run_once);

// CJAX_GEMM (xsmm, blas; nullopt: auto), or the override below.
std::optional<GemmEngine> fixed_gemm_engine();
// Tests and benchmarks: fixes the engine for this process (nullopt: back to CJAX_GEMM).
void set_gemm_engine_override(std::optional<GemmEngine> engine);

struct GemmChoiceStats {
  int64_t measured = 0;   // classes measured by this process
  int64_t from_disk = 0;  // classes whose decision came from the kernel cache
};
GemmChoiceStats gemm_choice_stats();
// Forgets the decisions held in memory (tests: the next call reads the disk cache or measures).
void clear_gemm_choices();
// The kernel-cache key of class c's record: "<LIBXSMM s> <OpenBLAS s> <measurements>", the least
// over its measurements of each library's median seconds per run (tests forge records).
std::string gemm_choice_cache_key(const GemmClass& c);

}  // namespace cjax
