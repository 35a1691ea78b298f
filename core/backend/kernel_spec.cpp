#include "core/backend/kernel_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace cjax {

int64_t KernelSpec::rows() const {
  int64_t r = 1;
  for (int64_t e : outer) r *= e;
  return r;
}

namespace {
int avail(const KernelNode& n) { return n.op == KernelNode::Op::Reduce ? n.pass + 1 : n.pass; }
}  // namespace

void KernelSpec::finalize() {
  using Op = KernelNode::Op;
  has_reduction = false;
  int last_pass = 0;
  for (KernelNode& n : nodes) {
    int p = 0;
    bool row = true;
    for (int a : n.args) {
      p = std::max(p, avail(nodes[size_t(a)]));
      row = row && nodes[size_t(a)].row_level;
    }
    switch (n.op) {
      case Op::Load: row = inputs[size_t(n.input)].col_stride == 0; break;
      case Op::Const: row = true; break;
      case Op::Reduce:
        row = true;
        has_reduction = true;
        break;
      default: break;
    }
    n.row_level = row;
    n.pass = p;  // a Reduce accumulates in the pass its operand is available
    if (!row || n.op == Op::Reduce) last_pass = std::max(last_pass, p);
  }
  for (const KernelOutput& o : outputs)
    if (o.full) last_pass = std::max(last_pass, avail(nodes[size_t(o.node)]));
  num_passes = last_pass + 1;
  // Full-level values (other than loads, which are simply read again) used by a later pass go
  // through a scratch row.
  scratch_slot.assign(nodes.size(), -1);
  num_scratch = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const KernelNode& user = nodes[i];
    for (int a : user.args) {
      const KernelNode& arg = nodes[size_t(a)];
      if (arg.row_level || arg.op == Op::Load || scratch_slot[size_t(a)] >= 0) continue;
      if (user.pass > arg.pass) scratch_slot[size_t(a)] = num_scratch++;
    }
  }
}

std::string KernelSpec::canonical() const {
  std::string s = fmt::format("kernel outer=[{}] cols={}\n", fmt::join(outer, ","), cols);
  for (size_t i = 0; i < inputs.size(); ++i)
    s += fmt::format("  in{}: {} strides=[{}] col={}\n", i, dtype_short_name(inputs[i].dtype),
                     fmt::join(inputs[i].outer_strides, ","), inputs[i].col_stride);
  static constexpr const char* kOps[] = {"load", "const", "scalar", "convert", "select", "integer_pow", "reduce"};
  static constexpr const char* kReduce[] = {"sum", "prod", "max", "min"};
  for (size_t i = 0; i < nodes.size(); ++i) {
    const KernelNode& n = nodes[i];
    s += fmt::format("  %{} = {}:{}", i, kOps[int(n.op)], dtype_short_name(n.dtype));
    switch (n.op) {
      case KernelNode::Op::Load: s += fmt::format(" in{}", n.input); break;
      case KernelNode::Op::Const: s += fmt::format(" {} {}", n.fvalue, n.ivalue); break;
      case KernelNode::Op::Scalar: s += fmt::format(" {}", scalar_op_info(n.scalar_op).name); break;
      case KernelNode::Op::IntegerPow: s += fmt::format(" y={}", n.ivalue); break;
      case KernelNode::Op::Reduce: s += fmt::format(" {}", kReduce[int(n.reduce)]); break;
      default: break;
    }
    for (int a : n.args) s += fmt::format(" %{}", a);
    s += fmt::format("  [{} pass {}]\n", n.row_level ? "row" : "full", n.pass);
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    s += fmt::format("  out{} = %{}:{} {}{}\n", i, outputs[i].node, dtype_short_name(outputs[i].dtype),
                     outputs[i].full ? "full" : "row",
                     outputs[i].in_place_of >= 0 ? fmt::format(" in place of in{}", outputs[i].in_place_of) : "");
  return s;
}

}  // namespace cjax
