#include "backends/cuda/kernels/fused.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cuda/kernels/codegen.h"

namespace cjax::cuda {
namespace {

using Op = KernelNode::Op;

constexpr unsigned kElementThreads = 256;
constexpr unsigned kMaxElementsPerThread = 16;
constexpr int64_t kThreadPerRowMaxCols = 32;
// Register budget of a row's cached loads per thread, in 4-byte registers (1024-thread blocks
// have 64 registers a thread).
constexpr int64_t kCachedRegisters = 32;

int avail(const KernelNode& n) { return n.op == Op::Reduce ? n.pass + 1 : n.pass; }

// A compute-typed literal of d.
std::string literal(const KernelNode& n) {
  DType d = n.dtype;
  if (d == DType::bool_) return n.fvalue != 0 || n.ivalue != 0 ? "true" : "false";
  if (is_float(d)) {
    double v = n.fvalue;  // used as given, as by the CPU's code generator
    bool f64 = d == DType::float64;
    if (std::isnan(v)) return f64 ? "__longlong_as_double(0x7ff8000000000000LL)" : "__int_as_float(0x7fc00000)";
    if (std::isinf(v))
      return v > 0 ? highest_literal(f64 ? DType::float64 : DType::float32)
                   : lowest_literal(f64 ? DType::float64 : DType::float32);
    return fmt::format("(({}){:a})", compute_type(d), v);
  }
  if (n.ivalue == std::numeric_limits<int64_t>::min()) return "(-9223372036854775807LL - 1)";
  return fmt::format("(({}){}LL)", compute_type(d), n.ivalue);
}

// f32 -> the half type and back: bf16/f16 values are computed in f32 and rounded per op.
std::string rounded(DType d, const std::string& v) { return is_half(d) ? load(d, store(d, v)) : v; }

std::string reduce_combine(const KernelNode& n, const std::string& a, const std::string& b, std::string* error) {
  static constexpr ScalarOp kOps[] = {ScalarOp::Add, ScalarOp::Mul, ScalarOp::Max, ScalarOp::Min};
  ScalarOp op = kOps[int(n.reduce)];
  if (n.dtype == DType::bool_)
    op = n.reduce == KernelReduce::Sum ? ScalarOp::Or : n.reduce == KernelReduce::Prod ? ScalarOp::And : op;
  std::optional<std::string> e = scalar_expression(op, n.dtype);
  if (!e) {
    *error = fmt::format("reduce of {}", dtype_name(n.dtype));
    return "";
  }
  std::string ct = compute_type(n.dtype);
  return fmt::format("[&] {{ const {0} x = {1}, y = {2}; return ({0})({3}); }}()", ct, a, b, *e);
}

std::string reduce_init(const KernelNode& n) {
  std::string ct = compute_type(n.dtype);
  switch (n.reduce) {
    case KernelReduce::Sum: return n.dtype == DType::bool_ ? "false" : fmt::format("({})0", ct);
    case KernelReduce::Prod: return n.dtype == DType::bool_ ? "true" : fmt::format("({})1", ct);
    case KernelReduce::Max: return lowest_literal(n.dtype);
    case KernelReduce::Min: return highest_literal(n.dtype);
  }
  return "";
}

class Emitter {
 public:
  Emitter(const KernelSpec& spec, FusedLaunchPlan plan) : s_(spec), plan_(plan) {
    int64_t total = spec.rows() * spec.cols;
    int64_t reach = total;
    for (const KernelInput& in : spec.inputs) {
      int64_t off = in.col_stride * std::max<int64_t>(spec.cols - 1, 0);
      for (size_t d = 0; d < spec.outer.size(); ++d)
        off += std::max<int64_t>(spec.outer[d] - 1, 0) * in.outer_strides[d];
      reach = std::max(reach, off + 1);
    }
    index_type_ = reach + int64_t(kElementThreads * kMaxElementsPerThread) < std::numeric_limits<int32_t>::max()
                      ? "int"
                      : "long long";
  }

  std::optional<std::string> source(const std::string& name) {
    std::vector<std::string> params;
    std::vector<bool> aliased(s_.inputs.size(), false);
    for (const KernelOutput& o : s_.outputs)
      if (o.in_place_of >= 0) aliased[size_t(o.in_place_of)] = true;
    for (size_t k = 0; k < s_.inputs.size(); ++k)
      params.push_back(
          fmt::format("const {}* {}in{}", storage_type(s_.inputs[k].dtype), aliased[k] ? "" : "__restrict__ ", k));
    for (size_t o = 0; o < s_.outputs.size(); ++o)
      params.push_back(fmt::format("{}* {}out{}", storage_type(s_.outputs[o].dtype),
                                   s_.outputs[o].in_place_of >= 0 ? "" : "__restrict__ ", o));
    std::string body = plan_.kind == FusedLaunchPlan::Kind::Elements ? elements_body() : rows_body();
    if (!error_.empty()) return std::nullopt;
    return fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n{}}}\n", plan_.block, name,
                       fmt::join(params, ", "), body);
  }

 private:
  const KernelSpec& s_;
  FusedLaunchPlan plan_;
  std::string index_type_;
  std::string error_;
  std::string code_;                // statements being emitted
  std::vector<bool> emitted_full_;  // per node, in the current scope
  std::string indent_ = "  ";
  std::string sfx_;             // appended to per-element names (the unrolled elements of a thread)
  bool pair_rounding_ = false;  // bf16 results are rounded two at a time by the caller
  bool cached_loads_ = false;   // full-level loads read the thread's registers (cj_c<node>[cj_j])

  std::string round_result(DType d, const std::string& v) const {
    return pair_rounding_ && d == DType::bfloat16 ? v : rounded(d, v);
  }

  void line(const std::string& l) { code_ += indent_ + l + "\n"; }

  // Statements decomposing `row` into the outer indices that some input's stride needs.
  void row_offsets(const std::string& row) {
    const std::string& I = index_type_;
    size_t D = s_.outer.size();
    std::vector<bool> needed(D, false);
    for (const KernelInput& in : s_.inputs)
      for (size_t d = 0; d < D; ++d) needed[d] = needed[d] || in.outer_strides[d] != 0;
    std::string t = "cj_t" + sfx_;
    if (D > 0) line(fmt::format("{} {} = {};", I, t, row));
    for (size_t d = D; d-- > 0;) {
      bool more = d > 0;
      if (needed[d])
        line(fmt::format("const {} i{}{} = {};", I, d, sfx_, more ? fmt::format("{} % {}", t, s_.outer[d]) : t));
      if (more) line(fmt::format("{} /= {};", t, s_.outer[d]));
    }
    if (D > 0) line(fmt::format("(void){};", t));
    for (size_t k = 0; k < s_.inputs.size(); ++k) {
      std::vector<std::string> terms;
      for (size_t d = 0; d < D; ++d)
        if (s_.inputs[k].outer_strides[d] != 0)
          terms.push_back(fmt::format("i{}{} * {}", d, sfx_, s_.inputs[k].outer_strides[d]));
      line(fmt::format("const {} b{}{} = {};", I, k, sfx_,
                       terms.empty() ? std::string("0") : fmt::format("{}", fmt::join(terms, " + "))));
    }
  }

  std::string name_of(int i) const {
    const KernelNode& n = s_.nodes[size_t(i)];
    return (n.row_level ? "r" : "v") + std::to_string(i) + sfx_;
  }

  // The expression computing node i from its arguments' variables (not a Load or Reduce).
  std::string compute(int i) {
    const KernelNode& n = s_.nodes[size_t(i)];
    std::vector<std::string> a;
    for (int k : n.args) a.push_back(name_of(k));
    auto arg_dtype = [&](size_t k) { return s_.nodes[size_t(n.args[k])].dtype; };
    std::string ct = compute_type(n.dtype);
    switch (n.op) {
      case Op::Const: return literal(n);
      case Op::Scalar: {
        std::optional<std::string> e = scalar_expression(n.scalar_op, arg_dtype(0));
        if (!e) {
          error_ = fmt::format("{} of {}", scalar_op_info(n.scalar_op).name, dtype_name(arg_dtype(0)));
          return "0";
        }
        static constexpr const char* kNames[] = {"x", "y", "z"};
        std::string decls;
        for (size_t k = 0; k < a.size() && k < 3; ++k)
          decls += fmt::format("const {} {} = {}; ", compute_type(arg_dtype(k)), kNames[k], a[k]);
        return round_result(n.dtype, fmt::format("[&] {{ {}return ({})({}); }}()", decls, ct, *e));
      }
      case Op::Convert: return round_result(n.dtype, convert_expr(arg_dtype(0), n.dtype, a[0]));
      case Op::Select: {
        if (arg_dtype(0) == DType::bool_) return fmt::format("({} ? {} : {})", a[0], a[2], a[1]);
        size_t ncases = a.size() - 1;
        std::string r = a[1];
        for (size_t k = 1; k < ncases; ++k)  // out-of-range selectors clamp, as on the CPU
          r = fmt::format("({} {} {} ? {} : {})", a[0], k + 1 == ncases ? ">=" : "==", k, a[k + 1], r);
        return r;
      }
      case Op::IntegerPow: {
        std::optional<std::string> mul = scalar_expression(ScalarOp::Mul, n.dtype);
        if (!mul) {
          error_ = fmt::format("integer_pow of {}", dtype_name(n.dtype));
          return "0";
        }
        auto times = [&](const std::string& p, const std::string& q) {
          return fmt::format("[&] {{ const {0} x = {1}, y = {2}; return ({0})({3}); }}()", ct, p, q, *mul);
        };
        uint64_t e = uint64_t(n.ivalue < 0 ? -n.ivalue : n.ivalue);
        std::string acc, base = a[0];
        std::string body;
        int step = 0;
        while (e) {
          if (e & 1) {
            std::string next = acc.empty() ? base : times(acc, base);
            body += fmt::format("const {} p{} = {}; ", ct, step, next);
            acc = fmt::format("p{}", step++);
          }
          e >>= 1;
          if (e) {
            body += fmt::format("const {} p{} = {}; ", ct, step, times(base, base));
            base = fmt::format("p{}", step++);
          }
        }
        if (acc.empty()) acc = fmt::format("({})1", ct);
        if (n.ivalue < 0 && is_float(n.dtype)) acc = fmt::format("(({})1 / {})", ct, acc);
        return round_result(n.dtype, fmt::format("[&] {{ {}return ({}){}; }}()", body, ct, acc));
      }
      default: error_ = "internal: unexpected kernel node"; return "0";
    }
  }

  std::string load_expr(int i, const std::string& col) {
    const KernelNode& n = s_.nodes[size_t(i)];
    if (cached_loads_ && !n.row_level) return fmt::format("cj_c{}[cj_j]", i);
    const KernelInput& in = s_.inputs[size_t(n.input)];
    std::string at =
        in.col_stride == 0 ? fmt::format("b{}{}", n.input, sfx_) : fmt::format("b{}{} + {}", n.input, sfx_, col);
    return fmt::format("({})({})", compute_type(n.dtype), load(in.dtype, fmt::format("in{}[{}]", n.input, at)));
  }

  // Emits node i (full level) and what it needs that this scope has not computed yet.
  void full_value(int i, const std::string& col) {
    const KernelNode& n = s_.nodes[size_t(i)];
    if (n.row_level || emitted_full_[size_t(i)]) return;
    for (int a : n.args) full_value(a, col);
    emitted_full_[size_t(i)] = true;
    std::string v = n.op == Op::Load ? load_expr(i, col) : compute(i);
    line(fmt::format("const {} {} = {};", compute_type(n.dtype), name_of(i), v));
  }

  // Row-level nodes (not reductions) available at `pass`, in order.
  void row_values(int pass) {
    for (size_t i = 0; i < s_.nodes.size(); ++i) {
      const KernelNode& n = s_.nodes[i];
      if (!n.row_level || n.op == Op::Reduce || n.pass != pass) continue;
      std::string v = n.op == Op::Load ? load_expr(int(i), "0") : compute(int(i));
      line(fmt::format("{} = {};", name_of(int(i)), v));
    }
  }

  void declare_row_values() {
    for (size_t i = 0; i < s_.nodes.size(); ++i)
      if (s_.nodes[i].row_level) line(fmt::format("{} {};", compute_type(s_.nodes[i].dtype), name_of(int(i))));
  }

  // Output o's value (of this element or row) in its storage type.
  std::string stored_value(size_t o) const {
    const KernelOutput& out = s_.outputs[o];
    DType nd = s_.nodes[size_t(out.node)].dtype;
    std::string v = name_of(out.node);
    if (nd != out.dtype) v = convert_expr(nd, out.dtype, v);
    return store(out.dtype, v);
  }
  void store_output(size_t o, const std::string& at) { line(fmt::format("out{}[{}] = {};", o, at, stored_value(o))); }

  // One element's index, row and column, and its inputs' row offsets.
  void element_index(const std::string& e_value) {
    const std::string& I = index_type_;
    line(fmt::format("const {} e{} = {};", I, sfx_, e_value));
    line(fmt::format("const {0} row{1} = e{1} / {2};", I, sfx_, s_.cols));
    line(fmt::format("const {0} col{1} = e{1} - row{1} * {2};", I, sfx_, s_.cols));
    line(fmt::format("(void)col{};", sfx_));
    row_offsets("row" + sfx_);
  }
  // The element's values and stores (its loads may have been emitted already).
  void element_compute() {
    declare_row_values();
    row_values(0);
    for (size_t o = 0; o < s_.outputs.size(); ++o) full_value(s_.outputs[o].node, "col" + sfx_);
    store_element_outputs();
  }
  // The element's stores: full outputs at its index, row outputs once per row.
  void store_element_outputs() {
    for (size_t o = 0; o < s_.outputs.size(); ++o) {
      if (s_.outputs[o].full) {
        store_output(o, "e" + sfx_);
      } else {
        line(fmt::format("if (col{} == 0) {{", sfx_));
        store_output(o, "row" + sfx_);
        line("}");
      }
    }
  }

  // Inputs read through vector accesses in the elements plan (those of full-level loads).
  std::vector<bool> vector_inputs() const {
    std::vector<bool> v(s_.inputs.size(), false);
    for (const KernelNode& n : s_.nodes)
      if (n.op == Op::Load && !n.row_level) v[size_t(n.input)] = true;
    return v;
  }

  // Thread t of a block handles `groups` runs of `vector` consecutive elements, run g starting
  // at block * per_block + g * (block * vector) + t * vector: coalesced, and one 16-byte access
  // per run and operand where the extents allow (fused_launch_plan). A block whose elements are
  // all in range, and whose operands are aligned, loads every run first (several loads in
  // flight), computes node by node across the runs and stores; otherwise its threads go element
  // by element with a bound check.
  std::string elements_body() {
    const std::string& I = index_type_;
    int64_t n = s_.rows() * s_.cols;
    const unsigned B = plan_.block, V = plan_.vector, G = plan_.groups, per_thread = V * G;
    const unsigned per_block = B * per_thread;
    std::vector<bool> vin = vector_inputs();
    line(fmt::format("const {0} cj_base = ({0})blockIdx.x * {1} + ({0})threadIdx.x * {2};", I, per_block, V));
    std::string fast = fmt::format("({0})blockIdx.x * {1} + {1} <= {2}", I, per_block, n);
    if (V > 1) {  // cuMemAllocAsync's blocks are aligned; a misaligned pointer takes the slow path
      std::vector<std::string> misaligned;
      for (size_t k = 0; k < s_.inputs.size(); ++k)
        if (vin[k])
          misaligned.push_back(fmt::format("((unsigned long long)in{} & {})", k, V * itemsize(s_.inputs[k].dtype) - 1));
      for (size_t o = 0; o < s_.outputs.size(); ++o)
        if (s_.outputs[o].full)
          misaligned.push_back(
              fmt::format("((unsigned long long)out{} & {})", o, V * itemsize(s_.outputs[o].dtype) - 1));
      fast += fmt::format(" && ({}) == 0", fmt::join(misaligned, " | "));
    }
    line(fmt::format("if ({}) {{", fast));
    indent_ = "    ";
    auto element_sfx = [](unsigned j) { return fmt::format("_{}", j); };
    for (unsigned g = 0; g < G; ++g) {
      if (V == 1) {
        sfx_ = element_sfx(g);
        element_index(fmt::format("cj_base + {}", g * B));
        for (size_t i = 0; i < s_.nodes.size(); ++i) {
          const KernelNode& nd = s_.nodes[i];
          if (nd.op != Op::Load || nd.row_level) continue;
          line(fmt::format("const {} {} = {};", compute_type(nd.dtype), name_of(int(i)),
                           load_expr(int(i), "col" + sfx_)));
        }
        continue;
      }
      std::string run = fmt::format("_g{}", g);
      sfx_ = run;
      element_index(fmt::format("cj_base + {}", g * B * V));
      for (size_t k = 0; k < s_.inputs.size(); ++k) {
        if (!vin[k]) continue;
        size_t bytes = V * itemsize(s_.inputs[k].dtype);
        line(fmt::format("alignas({}) {} cj_l{}{}[{}];", bytes, storage_type(s_.inputs[k].dtype), k, run, V));
        line(fmt::format("cj_vcopy<{}>(cj_l{}{}, in{} + b{}{} + col{});", bytes, k, run, k, k, run, run));
      }
      for (unsigned u = 0; u < V; ++u) {
        sfx_ = element_sfx(g * V + u);
        line(fmt::format("const {0} e{1} = e{2} + {3}, row{1} = row{2}, col{1} = col{2} + {3};", I, sfx_, run, u));
        line(fmt::format("(void)e{0}; (void)row{0}; (void)col{0};", sfx_));
        for (size_t k = 0; k < s_.inputs.size(); ++k)
          line(fmt::format("const {0} b{1}{2} = b{1}{3};", I, k, sfx_, run));
        for (size_t i = 0; i < s_.nodes.size(); ++i) {
          const KernelNode& nd = s_.nodes[i];
          if (nd.op != Op::Load || nd.row_level) continue;
          std::string raw = fmt::format("cj_l{}{}[{}]", nd.input, run, u);
          line(fmt::format("const {} {} = ({})({});", compute_type(nd.dtype), name_of(int(i)), compute_type(nd.dtype),
                           load(s_.inputs[size_t(nd.input)].dtype, raw)));
        }
      }
    }
    // Node by node across the elements, so that bf16 results round two at a time (one
    // cvt.rn.bf16x2 for two values: conversions issue at a quarter of the FP32 rate).
    pair_rounding_ = true;
    for (size_t i = 0; i < s_.nodes.size(); ++i) {
      const KernelNode& nd = s_.nodes[i];
      if (nd.op == Op::Load && !nd.row_level) continue;
      for (unsigned j = 0; j < per_thread; ++j) {
        sfx_ = element_sfx(j);
        std::string v = nd.op == Op::Load ? load_expr(int(i), "col" + sfx_) : compute(int(i));
        line(fmt::format("{} {} = {};", compute_type(nd.dtype), name_of(int(i)), v));
      }
      if (nd.dtype == DType::bfloat16 && nd.op != Op::Load && nd.op != Op::Const)
        for (unsigned j = 0; j < per_thread; j += 2) {
          sfx_ = element_sfx(j);
          std::string a = name_of(int(i));
          sfx_ = element_sfx(j + 1);
          line(fmt::format("cj_round2_bf16({}, {});", a, name_of(int(i))));
        }
    }
    pair_rounding_ = false;
    for (unsigned g = 0; g < G; ++g) {
      if (V == 1) {
        sfx_ = element_sfx(g);
        store_element_outputs();
        continue;
      }
      std::string run = fmt::format("_g{}", g);
      for (size_t o = 0; o < s_.outputs.size(); ++o) {
        const KernelOutput& out = s_.outputs[o];
        if (!out.full) {
          for (unsigned u = 0; u < V; ++u) {
            sfx_ = element_sfx(g * V + u);
            line(fmt::format("if (col{} == 0) {{", sfx_));
            store_output(o, "row" + sfx_);
            line("}");
          }
          continue;
        }
        size_t bytes = V * itemsize(out.dtype);
        line(fmt::format("alignas({}) {} cj_s{}{}[{}];", bytes, storage_type(out.dtype), o, run, V));
        for (unsigned u = 0; u < V; ++u) {
          sfx_ = element_sfx(g * V + u);
          line(fmt::format("cj_s{}{}[{}] = {};", o, run, u, stored_value(o)));
        }
        line(fmt::format("cj_vcopy<{}>(out{} + e{}, cj_s{}{});", bytes, o, run, o, run));
      }
    }
    sfx_.clear();
    indent_ = "  ";
    line("} else {");
    indent_ = "    ";
    line("#pragma unroll 1");  // the tail: small code beats speed here
    line(fmt::format("for (int cj_u = 0; cj_u < {}; ++cj_u) {{", per_thread));
    indent_ = "      ";
    line(V == 1 ? fmt::format("const {} cj_e = cj_base + cj_u * {};", I, B)
                : fmt::format("const {} cj_e = cj_base + cj_u / {} * {} + cj_u % {};", I, V, B * V, V));
    line(fmt::format("if (cj_e >= {}) break;", n));
    element_index("cj_e");
    emitted_full_.assign(s_.nodes.size(), false);
    element_compute();
    indent_ = "    ";
    line("}");
    indent_ = "  ";
    line("}");
    return code_;
  }

  std::string rows_body() {
    const std::string& I = index_type_;
    bool block_rows = plan_.kind == FusedLaunchPlan::Kind::BlockPerRow;
    std::vector<std::vector<int>> reduces(size_t(s_.num_passes));
    for (size_t i = 0; i < s_.nodes.size(); ++i)
      if (s_.nodes[i].op == Op::Reduce) reduces[size_t(s_.nodes[i].pass)].push_back(int(i));
    size_t max_reduces = 0;
    for (const auto& r : reduces) max_reduces = std::max(max_reduces, r.size());
    unsigned warps = plan_.block / 32;
    if (block_rows) {
      line(fmt::format("CJ_SHARED(unsigned long long, cj_red, [{}][{}]);", std::max<size_t>(max_reduces, 1), warps));
      line("const int cj_tid = threadIdx.x, cj_lane = cj_tid & 31, cj_warp = cj_tid >> 5;");
      line(fmt::format("const {} row = blockIdx.x;", I));
    } else {
      line(fmt::format("const {} row = ({})blockIdx.x * {} + threadIdx.x;", I, I, plan_.block));
      line(fmt::format("if (row >= {}) return;", s_.rows()));
    }
    row_offsets("row");
    declare_row_values();
    const unsigned J = plan_.cached_columns;
    // The loop over this thread's columns (cached rows: unrolled, J of them).
    auto open_columns = [&] {
      if (J > 0) {
        line("#pragma unroll");
        line(fmt::format("for (int cj_j = 0; cj_j < {}; ++cj_j) {{", J));
        line(fmt::format("  const {} col = cj_tid + cj_j * {};", I, plan_.block));
        line(int64_t(J) * plan_.block == s_.cols ? "  {" : fmt::format("  if (col < {}) {{", s_.cols));
      } else if (block_rows) {
        line("#pragma unroll 4");
        line(fmt::format("for ({0} col = cj_tid; col < {1}; col += {2}) {{", I, s_.cols, plan_.block));
      } else {
        line(fmt::format("for ({0} col = 0; col < {1}; ++col) {{", I, s_.cols));
      }
      indent_ = J > 0 ? "      " : "    ";
    };
    auto close_columns = [&] {
      indent_ = "  ";
      line(J > 0 ? "}}" : "}");
    };
    if (J > 0) {  // every load of the thread's columns, issued together
      for (size_t i = 0; i < s_.nodes.size(); ++i)
        if (s_.nodes[i].op == Op::Load && !s_.nodes[i].row_level)
          line(fmt::format("{} cj_c{}[{}];", compute_type(s_.nodes[i].dtype), i, J));
      open_columns();
      for (size_t i = 0; i < s_.nodes.size(); ++i)
        if (s_.nodes[i].op == Op::Load && !s_.nodes[i].row_level)
          line(fmt::format("cj_c{}[cj_j] = {};", i, load_expr(int(i), "col")));
      close_columns();
      cached_loads_ = true;
    }
    for (int p = 0; p < s_.num_passes; ++p) {
      row_values(p);
      for (int r : reduces[size_t(p)])
        line(fmt::format("{} a{} = {};", compute_type(s_.nodes[size_t(r)].dtype), r, reduce_init(s_.nodes[size_t(r)])));
      open_columns();
      emitted_full_.assign(s_.nodes.size(), false);
      for (int r : reduces[size_t(p)]) {
        int arg = s_.nodes[size_t(r)].args[0];
        full_value(arg, "col");
        line(fmt::format("a{} = {};", r,
                         reduce_combine(s_.nodes[size_t(r)], fmt::format("a{}", r), name_of(arg), &error_)));
      }
      for (size_t o = 0; o < s_.outputs.size(); ++o) {
        const KernelOutput& out = s_.outputs[o];
        if (!out.full || avail(s_.nodes[size_t(out.node)]) != p) continue;
        full_value(out.node, "col");
        store_output(o, fmt::format("row * {} + col", s_.cols));
      }
      close_columns();
      for (int r : reduces[size_t(p)]) block_reduce(r, reduces[size_t(p)], block_rows);
      if (block_rows && !reduces[size_t(p)].empty()) line("__syncthreads();");
    }
    row_values(s_.num_passes);
    bool any_row_output = false;
    for (const KernelOutput& o : s_.outputs) any_row_output = any_row_output || !o.full;
    if (any_row_output) {
      if (block_rows) line("if (cj_tid == 0) {");
      for (size_t o = 0; o < s_.outputs.size(); ++o)
        if (!s_.outputs[o].full) store_output(o, "row");
      if (block_rows) line("}");
    }
    return code_;
  }

  // The block's partials of reduction r combined in a fixed order into r's row variable.
  void block_reduce(int r, const std::vector<int>& same_pass, bool block_rows) {
    const KernelNode& n = s_.nodes[size_t(r)];
    std::string ct = compute_type(n.dtype);
    if (!block_rows) {
      line(fmt::format("{} = a{};", name_of(r), r));
      return;
    }
    size_t slot = size_t(std::find(same_pass.begin(), same_pass.end(), r) - same_pass.begin());
    std::string combine = reduce_combine(n, "cj_v", "cj_w", &error_);
    line("{");
    line(fmt::format("  {} cj_v = a{};", ct, r));
    line("#pragma unroll");
    line("  for (int cj_o = 16; cj_o > 0; cj_o >>= 1) {");
    line(fmt::format("    const {} cj_w = cj_shfl_xor(cj_v, cj_o);", ct));
    line(fmt::format("    cj_v = {};", combine));
    line("  }");
    line(fmt::format("  if (cj_lane == 0) reinterpret_cast<{}*>(cj_red[{}])[cj_warp] = cj_v;", ct, slot));
    line("}");
    // Every partial of this pass is written before any thread reads them.
    if (r == same_pass.back()) {
      line("__syncthreads();");
      for (int q : same_pass) {
        const KernelNode& m = s_.nodes[size_t(q)];
        std::string mt = compute_type(m.dtype);
        size_t qs = size_t(std::find(same_pass.begin(), same_pass.end(), q) - same_pass.begin());
        line("{");
        line(fmt::format("  const {0}* cj_p = reinterpret_cast<const {0}*>(cj_red[{1}]);", mt, qs));
        line(fmt::format("  {} cj_v = cj_p[0];", mt));
        line(fmt::format("  for (int cj_k = 1; cj_k < {}; ++cj_k) {{", plan_.block / 32));
        line("    const " + mt + " cj_w = cj_p[cj_k];");
        line(fmt::format("    cj_v = {};", reduce_combine(m, "cj_v", "cj_w", &error_)));
        line("  }");
        line(fmt::format("  {} = cj_v;", name_of(q)));
        line("}");
      }
    }
  }
};

}  // namespace

namespace {
// Elements of one 16-byte access of the elements plan: every full-level load and full output
// moves `vector` consecutive elements at once when the columns and the inputs' row strides are
// multiples of it (so that a run never crosses a row and stays aligned); 1 otherwise.
unsigned elements_vector(const KernelSpec& spec) {
  size_t widest = 0;
  std::vector<bool> full_input(spec.inputs.size(), false);
  for (const KernelNode& n : spec.nodes)
    if (n.op == Op::Load && !n.row_level) full_input[size_t(n.input)] = true;
  for (size_t k = 0; k < spec.inputs.size(); ++k)
    if (full_input[k]) {
      if (spec.inputs[k].col_stride != 1) return 1;
      widest = std::max(widest, itemsize(spec.inputs[k].dtype));
    }
  for (const KernelOutput& o : spec.outputs)
    if (o.full) widest = std::max(widest, itemsize(o.dtype));
  if (widest == 0) return 1;
  auto v = unsigned(16 / widest);
  if (spec.cols % v != 0) return 1;
  for (size_t k = 0; k < spec.inputs.size(); ++k)
    if (full_input[k])
      for (int64_t stride : spec.inputs[k].outer_strides)
        if (stride % v != 0) return 1;
  return v;
}

// 4-byte registers a thread needs to hold one column of every full-level load of a row.
int64_t cached_registers_per_column(const KernelSpec& spec) {
  int64_t regs = 0;
  for (const KernelNode& n : spec.nodes)
    if (n.op == Op::Load && !n.row_level) regs += n.dtype == DType::float64 || n.dtype == DType::int64 ? 2 : 1;
  return regs;
}
}  // namespace

FusedLaunchPlan fused_launch_plan(const KernelSpec& spec) {
  FusedLaunchPlan p;
  int64_t rows = spec.rows(), cols = spec.cols;
  if (!spec.has_reduction) {
    p.kind = FusedLaunchPlan::Kind::Elements;
    p.block = kElementThreads;
    p.vector = elements_vector(spec);
    // About 16 bytes of every operand in flight per thread, at least 4 elements.
    p.groups = p.vector >= 4 ? 1 : 4 / p.vector;
    int64_t per_block = int64_t(p.block) * p.vector * p.groups;
    p.grid = (rows * cols + per_block - 1) / per_block;
  } else if (cols <= kThreadPerRowMaxCols) {
    p.kind = FusedLaunchPlan::Kind::ThreadPerRow;
    p.block = 128;
    p.grid = (rows + 127) / 128;
  } else {
    p.kind = FusedLaunchPlan::Kind::BlockPerRow;
    // About 4 columns per thread or more (the reduction's fixed cost stays small), 64 to 512
    // threads; a few very wide rows (a whole-array sum) get 1024 threads each.
    unsigned b = 64;
    while (b < 512 && int64_t(b) * 2 * 4 <= cols) b *= 2;
    p.block = rows < 264 && cols >= 16384 ? 1024 : b;
    p.grid = rows;
    // Rows whose loads fit in registers (with up to 1024 threads) are read once, every load of
    // a thread issued together; the passes then compute from registers.
    int64_t per_column = cached_registers_per_column(spec);
    for (unsigned cached_block = p.block; per_column > 0 && cached_block <= 1024; cached_block *= 2) {
      int64_t columns = (cols + cached_block - 1) / cached_block;
      if (columns * per_column <= kCachedRegisters) {
        p.block = cached_block;
        p.cached_columns = unsigned(columns);
        break;
      }
    }
  }
  return p;
}

std::string fused_prelude() {
  // CJ_SHARED: shared memory declarations go through a macro so that the CPU emulator of the
  // tests (tests/cuda_emulator.h) can poison them before each block.
  return std::string(kPrelude) + R"(
#define CJ_SHARED(type, name, dims) __shared__ type name dims
struct alignas(16) cj_bytes16 { unsigned long long a, b; };
template <int N> struct cj_bytes;
template <> struct cj_bytes<2> { typedef unsigned short type; };
template <> struct cj_bytes<4> { typedef unsigned type; };
template <> struct cj_bytes<8> { typedef unsigned long long type; };
template <> struct cj_bytes<16> { typedef cj_bytes16 type; };
// One N-byte access (ld/st.global.v2.u64 for 16): both pointers N-byte aligned.
template <int N> __device__ __forceinline__ void cj_vcopy(void* to, const void* from) {
  *reinterpret_cast<typename cj_bytes<N>::type*>(to) = *reinterpret_cast<const typename cj_bytes<N>::type*>(from); }
__device__ __forceinline__ void cj_round2_bf16(float& a, float& b) {
  unsigned p; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(b), "f"(a));
  a = __uint_as_float(p << 16); b = __uint_as_float(p & 0xffff0000u); }
__device__ __forceinline__ float cj_shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ double cj_shfl_xor(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ int cj_shfl_xor(int v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ unsigned cj_shfl_xor(unsigned v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ long long cj_shfl_xor(long long v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ bool cj_shfl_xor(bool v, int o) { return __shfl_xor_sync(0xffffffffu, (int)v, o) != 0; }
__device__ __forceinline__ signed char cj_shfl_xor(signed char v, int o) {
  return (signed char)__shfl_xor_sync(0xffffffffu, (int)v, o); }
__device__ __forceinline__ short cj_shfl_xor(short v, int o) { return (short)__shfl_xor_sync(0xffffffffu, (int)v, o); }
__device__ __forceinline__ unsigned char cj_shfl_xor(unsigned char v, int o) {
  return (unsigned char)__shfl_xor_sync(0xffffffffu, (unsigned)v, o); }
)";
}

std::optional<std::string> fused_kernel_source(const KernelSpec& spec, const std::string& name) {
  return Emitter(spec, fused_launch_plan(spec)).source(name);
}

}  // namespace cjax::cuda
