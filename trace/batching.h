// BatchTrace (JAX's vmap, docs/design.md §2): each tracer holds a value with one extra "batch"
// dimension at `bdim`; primitives run through their batching rules (core/array/rules.h) on the parent
// trace, so a vmapped function does one batched operation per primitive, never a loop.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/array/rules.h"
#include "core/array/trace.h"

namespace cjax {

class BatchTracer final : public Tracer {
 public:
  BatchTracer(Array v, int bdim, Trace* trace, std::shared_ptr<const bool> ended);
  bool is_live() const override { return !*ended_; }
  std::string provenance() const override;
  std::string created_at() const override;
  Array val;
  int bdim;

 private:
  std::shared_ptr<const bool> ended_;
};

class BatchTrace final : public Trace {
 public:
  explicit BatchTrace(BatchAxis axis);  // parent: current_trace()
  ~BatchTrace() override { *ended_ = true; }
  BatchTrace(const BatchTrace&) = delete;
  BatchTrace& operator=(const BatchTrace&) = delete;

  // A tracer for `val` batched along `bdim`; `val` itself when bdim is kNotMapped.
  Array make_tracer(Array val, int bdim);
  // (value, bdim) of `x` at this level (kNotMapped for constants).
  std::pair<Array, int> unpack(const Array& x, const PrimitiveDef* def) const;
  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                       const Params& params) override;
  std::string name() const override { return "BatchTrace"; }
  const BatchAxis& axis() const { return axis_; }

 private:
  BatchAxis axis_;
  std::shared_ptr<bool> ended_ = std::make_shared<bool>(false);
};

// True if binding `def` uses the vmapped axis `name`: a collective over it, or a higher-order
// primitive whose sub-jaxprs contain one. Such an equation goes through its batching rule even
// when no operand is batched (JAX's fancy_primitive_batchers): psum(w, 'b') of an unbatched w is
// B * w, axis_index('b') has no operands at all.
bool uses_axis_name(const PrimitiveDef& def, const Params& params, const std::string& name);

// vmap over flat inputs: in_axes[i] is input i's batch dimension (kNotMapped: not batched,
// already normalized to be non-negative), out_axes[j] where output j's batch dimension goes
// (kNotMapped: the output must not depend on the batch). `axis.size` must be set.
std::vector<Array> vmap_flat(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                             std::span<const Array> args, std::span<const int> in_axes,
                             const std::function<int(size_t out_index, int out_rank)>& out_axis, const BatchAxis& axis);

}  // namespace cjax
