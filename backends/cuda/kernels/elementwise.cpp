// Elementwise primitives on the GPU: one NVRTC kernel per (op, dtypes, scalar operands), cached
// per device (backends/cuda/cuda_backend.cpp), registered as the primitives' cuda kernels.
#include "backends/cuda/kernels/elementwise.h"

#include <fmt/format.h>

#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array_impl.h"
#include "core/backend.h"
#include "core/primitive.h"

namespace cjax::cuda {
namespace {

// The kernel around `body` (which defines the compute-typed operands and writes out[i]).
std::string kernel(const std::vector<std::string>& params, const std::string& body) {
  return fmt::format(R"({}
extern "C" __global__ void __launch_bounds__({}) {}({}, long long n) {{
  long long base = (long long)blockIdx.x * {} + threadIdx.x;
#pragma unroll
  for (int k = 0; k < {}; ++k) {{
    long long i = base + (long long)k * {};
    if (i < n) {{
{}
    }}
  }}
}}
)",
                     kPrelude, kElementwiseThreads, kElementwiseKernelName, fmt::join(params, ", "),
                     kElementwiseThreads * kElementwisePerThread, kElementwisePerThread, kElementwiseThreads, body);
}

}  // namespace

std::optional<std::string> elementwise_source(ScalarOp op, DType in, DType out, const std::vector<bool>& scalar) {
  std::optional<std::string> expr = scalar_expression(op, in);
  if (!expr) return std::nullopt;
  static constexpr const char* kNames[] = {"x", "y", "z"};
  std::vector<std::string> params;
  std::string body;
  for (size_t k = 0; k < scalar.size(); ++k) {
    params.push_back(fmt::format("const {}* __restrict__ in_{}", storage_type(in), k));
    body += fmt::format("      {} {} = {};\n", compute_type(in), kNames[k],
                        load(in, fmt::format("in_{}[{}]", k, scalar[k] ? "0" : "i")));
  }
  params.push_back(fmt::format("{}* __restrict__ out", storage_type(out)));
  body += fmt::format("      out[i] = {};", store(out, *expr));
  return kernel(params, body);
}

std::optional<std::string> convert_source(DType in, DType out) {
  if (!is_float(out) || (is_float(in) && in == out)) return std::nullopt;
  // f64 -> bf16/f16 would round twice through f32; the CPU rounds once.
  if (in == DType::float64 && is_half(out)) return std::nullopt;
  std::string value = is_half(out) ? load(in, "in_0[i]") : fmt::format("({})({})", storage_type(out), load(in, "in_0[i]"));
  return kernel({fmt::format("const {}* __restrict__ in_0", storage_type(in)),
                 fmt::format("{}* __restrict__ out", storage_type(out))},
                fmt::format("      out[i] = {};", store(out, value)));
}

namespace {

void launch_elementwise(const std::string& source, std::span<const Array> in, const Array& out) {
  std::vector<void*> ptrs;
  for (const Array& a : in) ptrs.push_back(raw_ptr(a));
  ptrs.push_back(raw_ptr(out));
  long long n = out.size();
  std::vector<void*> args;
  for (void*& p : ptrs) args.push_back(&p);
  args.push_back(&n);
  long long per_block = kElementwiseThreads * kElementwisePerThread;
  launch(concrete(out)->device(), source, kElementwiseKernelName, unsigned((n + per_block - 1) / per_block),
         kElementwiseThreads, std::move(args));
}

std::vector<Array> run_scalar_op(ScalarOp op, const char* primitive, std::span<const Array> in,
                                 std::span<const AbstractValue> out_avals, const Params& params) {
  std::vector<bool> scalar;
  for (const Array& a : in) scalar.push_back(a.ndim() == 0);
  std::optional<std::string> src = elementwise_source(op, in[0].dtype(), out_avals[0].dtype, scalar);
  if (!src) return run_on_host(*find_primitive(primitive), Platform::cuda, in, out_avals, params);
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  launch_elementwise(*src, in, out);
  return {out};
}

// Registered by name: the primitives' defs register in other files' static initialisers.
const bool g_registered = [] {
  for (const ScalarOpInfo& info : kScalarOps) {
    register_kernel(info.name, Platform::cuda,
                    [op = info.op, name = info.name.data()](std::span<const Array> in,
                                                           std::span<const AbstractValue> out_avals,
                                                           const Params& params) {
                      return run_scalar_op(op, name, in, out_avals, params);
                    });
  }
  // add_any: autodiff's accumulation of cotangents, an add.
  register_kernel("add_any", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& params) {
                    return run_scalar_op(ScalarOp::Add, "add_any", in, out_avals, params);
                  });
  register_kernel("convert_element_type", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals,
                     const Params& params) -> std::vector<Array> {
                    if (in[0].dtype() == out_avals[0].dtype) return {make_view(in[0], out_avals[0])};
                    std::optional<std::string> src = convert_source(in[0].dtype(), out_avals[0].dtype);
                    if (!src) return run_on_host(*find_primitive("convert_element_type"), Platform::cuda, in, out_avals, params);
                    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
                    launch_elementwise(*src, in, out);
                    return {out};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
