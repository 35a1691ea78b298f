// Elementwise primitives on the GPU: one NVRTC kernel per (op, dtypes, scalar operands), cached
// per device (backends/cuda/cuda_backend.cpp), registered as the primitives' cuda kernels.
#include "backends/cuda/kernels/elementwise.h"

#include <fmt/format.h>

#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"

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
  if (in == out) return std::nullopt;
  // f64 -> bf16/f16 would round twice through f32; the CPU rounds once.
  if (in == DType::float64 && is_half(out)) return std::nullopt;
  std::string value = !is_float(out) ? convert_expr(in, out, load(in, "in_0[i]"))  // saturating, NaN -> 0
                      : is_half(out) ? load(in, "in_0[i]")
                                     : fmt::format("({})({})", storage_type(out), load(in, "in_0[i]"));
  return kernel({fmt::format("const {}* __restrict__ in_0", storage_type(in)),
                 fmt::format("{}* __restrict__ out", storage_type(out))},
                fmt::format("      out[i] = {};", store(out, value)));
}

std::string select_n_source(DType which, DType t, size_t ncases, bool scalar_which) {
  std::vector<std::string> params = {fmt::format("const {}* __restrict__ which", storage_type(which))};
  for (size_t c = 0; c < ncases; ++c)
    params.push_back(fmt::format("const {}* __restrict__ case_{}", storage_type(t), c));
  params.push_back(fmt::format("{}* __restrict__ out", storage_type(t)));
  // Out-of-range selectors clamp, as on the CPU.
  std::string body = fmt::format("      long long c = (long long)which[{}];\n", scalar_which ? "0" : "i");
  std::string pick = fmt::format("case_{}[i]", ncases - 1);
  for (size_t c = ncases - 1; c-- > 0;) pick = fmt::format("c <= {} ? case_{}[i] : {}", c, c, pick);
  body += "      out[i] = " + pick + ";";
  return kernel(params, body);
}

std::optional<std::string> integer_pow_source(DType d) {
  std::optional<std::string> mul = scalar_expression(ScalarOp::Mul, d);
  if (!mul || d == DType::bool_) return std::nullopt;
  std::string ct = compute_type(d);
  std::string src = kernel({fmt::format("const {}* __restrict__ in_0", storage_type(d)),
                            fmt::format("{}* __restrict__ out", storage_type(d)), "long long y"},
                           fmt::format(R"(      {0} base = {1}, acc = ({0})1, x, y2;
      unsigned long long e = y < 0 ? (unsigned long long)(-y) : (unsigned long long)y;
      while (e) {{
        if (e & 1) {{ x = acc; y2 = base; acc = cj_mul(x, y2); }}
        x = base; y2 = base; base = cj_mul(x, y2);
        e >>= 1;
      }}
      out[i] = {2};)",
                                       ct, load(d, "in_0[i]"),
                                       store(d, is_float(d) ? "(y < 0 ? (" + ct + ")1 / acc : acc)" : "acc")));
  // cj_mul(x, y) is the table's mul (wrapping for integers); the kernel's own `y` is the exponent.
  std::string helper = fmt::format("__device__ __forceinline__ {0} cj_mul({0} x, {0} y) {{ return {1}; }}\n", ct, *mul);
  size_t at = src.find("extern \"C\"");
  return src.insert(at, helper);
}

std::string threefry_source(const std::vector<bool>& scalar) {
  std::vector<std::string> params;
  for (int k = 0; k < 4; ++k) params.push_back(fmt::format("const unsigned int* __restrict__ in_{}", k));
  params.push_back("unsigned int* __restrict__ out_0");
  params.push_back("unsigned int* __restrict__ out_1");
  auto at = [&](int k) { return fmt::format("in_{}[{}]", k, scalar[size_t(k)] ? "0" : "i"); };
  // Random123 Threefry-2x32, 20 rounds: bit for bit the CPU kernel (core/lax/elementwise.cpp).
  std::string body = fmt::format(R"(      unsigned int k0 = {}, k1 = {}, x0 = {}, x1 = {};
      const unsigned int ks[3] = {{k0, k1, k0 ^ k1 ^ 0x1BD11BDAu}};
      const int rot[2][4] = {{{{13, 15, 26, 6}}, {{17, 29, 16, 24}}}};
      x0 += ks[0];
      x1 += ks[1];
#pragma unroll
      for (int g = 1; g <= 5; ++g) {{
#pragma unroll
        for (int j = 0; j < 4; ++j) {{
          int r = rot[(g - 1) & 1][j];
          x0 += x1;
          x1 = (x1 << r) | (x1 >> (32 - r));
          x1 ^= x0;
        }}
        x0 += ks[g % 3];
        x1 += ks[(g + 1) % 3] + (unsigned int)g;
      }}
      out_0[i] = x0;
      out_1[i] = x1;)",
                                 at(0), at(1), at(2), at(3));
  return kernel(params, body);
}

namespace {

// `extra`: a scalar argument after the pointers (integer_pow's exponent).
void launch_elementwise(const std::string& source, std::span<const Array> in, const Array& out,
                        long long* extra = nullptr) {
  std::vector<void*> ptrs;
  for (const Array& a : in) ptrs.push_back(raw_ptr(a));
  ptrs.push_back(raw_ptr(out));
  long long n = out.size();
  std::vector<void*> args;
  for (void*& p : ptrs) args.push_back(&p);
  if (extra) args.push_back(extra);  // declared before n
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
  register_kernel("select_n", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& params) {
                    if (in[0].dtype() != DType::bool_ && in[0].dtype() != DType::int32)
                      return run_on_host(*find_primitive("select_n"), Platform::cuda, in, out_avals, params);
                    Array out = make_uninitialized(out_avals[0], concrete(in[1])->device());
                    launch_elementwise(select_n_source(in[0].dtype(), out.dtype(), in.size() - 1, in[0].ndim() == 0),
                                       in, out);
                    return std::vector<Array>{out};
                  });
  register_kernel("integer_pow", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& params) {
                    std::optional<std::string> src = integer_pow_source(in[0].dtype());
                    if (!src) return run_on_host(*find_primitive("integer_pow"), Platform::cuda, in, out_avals, params);
                    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
                    long long y = params.i("y");
                    launch_elementwise(*src, in, out, &y);
                    return std::vector<Array>{out};
                  });
  register_kernel("threefry2x32", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    std::vector<bool> scalar;
                    for (const Array& a : in) scalar.push_back(a.ndim() == 0);
                    Device dev = concrete(in[0])->device();
                    Array y0 = make_uninitialized(out_avals[0], dev), y1 = make_uninitialized(out_avals[1], dev);
                    std::vector<void*> ptrs;
                    for (const Array& a : in) ptrs.push_back(raw_ptr(a));
                    ptrs.push_back(raw_ptr(y0));
                    ptrs.push_back(raw_ptr(y1));
                    long long n = y0.size();
                    std::vector<void*> args;
                    for (void*& p : ptrs) args.push_back(&p);
                    args.push_back(&n);
                    long long per_block = kElementwiseThreads * kElementwisePerThread;
                    launch(dev, threefry_source(scalar), kElementwiseKernelName,
                           unsigned((n + per_block - 1) / per_block), kElementwiseThreads, std::move(args));
                    return std::vector<Array>{y0, y1};
                  });
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
                    if (!src)
                      return run_on_host(*find_primitive("convert_element_type"), Platform::cuda, in, out_avals,
                                         params);
                    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
                    launch_elementwise(*src, in, out);
                    return {out};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
