// Eager shard_map (docs/design.md §5.6, docs/shard_map.md §1.11): a ShardMapTrace holds one block per
// mesh device for every value of the body and runs each primitive on every device's block as it
// is bound. Collectives see all blocks at once and compute each group's results directly;
// a higher-order primitive whose sub-jaxprs contain collectives runs through the SPMD runner.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/array/array_impl.h"
#include "core/array/trace.h"
#include "core/spmd/collectives.h"
#include "trace/jaxpr_trace.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

struct EagerContext {
  Mesh mesh;
  std::vector<std::string> manual_axes;
  bool check_vma = true;
  bool alive = true;
  std::vector<ManualAxis> frame() const {
    std::vector<ManualAxis> out;
    for (const std::string& a : manual_axes) out.push_back({a, mesh.axis_size(a), check_vma});
    return out;
  }
};

std::string coords_text(const Mesh& mesh, int64_t d) {
  std::vector<int64_t> c = mesh.coords(d);
  const auto& names = mesh.axis_names();
  if (names.size() == 1) return fmt::format("({},) = ({},)", names[0], c[0]);
  return fmt::format("({}) = ({})", fmt::join(names, ", "), fmt::join(c, ", "));
}

class ShardMapTracer final : public Tracer {
 public:
  ShardMapTracer(AbstractValue a, Trace* t, std::shared_ptr<EagerContext> c, std::vector<Array> b)
      : Tracer(std::move(a), t), ctx(std::move(c)), blocks(std::move(b)) {}
  bool is_live() const override { return ctx->alive; }
  // Python-style control flow on a body value works when it is provably the same everywhere.
  Array concrete_value() const override { return ctx->check_vma && aval.vma.empty() ? blocks[0] : Array(); }
  std::string provenance() const override {
    if (!ctx->check_vma) return "inside shard_map with check_vma=false, where every value may differ between devices";
    return fmt::format(
        "inside shard_map: it varies over mesh axes {{{}}}; only values invariant over every manual "
        "axis (e.g. the result of psum over all of them) can be read as one value",
        fmt::join(aval.vma, ","));
  }
  std::string value_str() const override {
    std::vector<std::string> parts;
    for (size_t d = 0; d < blocks.size(); ++d)
      parts.push_back(fmt::format("On {} at mesh coordinates {}:\n{}", ctx->mesh.devices()[d].str(),
                                  coords_text(ctx->mesh, int64_t(d)), to_string(blocks[d])));
    return fmt::format("{}", fmt::join(parts, "\n\n"));
  }
  std::shared_ptr<EagerContext> ctx;
  std::vector<Array> blocks;  // one per mesh device
};

class ShardMapTrace final : public Trace {
 public:
  ShardMapTrace(Trace* parent, std::shared_ptr<EagerContext> ctx) : Trace(parent), ctx_(std::move(ctx)) {}
  std::string name() const override { return "ShardMapTrace"; }

  Array make_tracer(AbstractValue aval, std::vector<Array> blocks) {
    return Array(std::make_shared<ShardMapTracer>(std::move(aval), this, ctx_, std::move(blocks)));
  }

  // The per-device blocks and the type of `x` at this level (a value from outside is the same
  // on every device and invariant).
  std::pair<std::vector<Array>, AbstractValue> lift(const Array& x, const PrimitiveDef* def) {
    if (!x.defined())
      throw ValueError(fmt::format("'{}' received an empty Array handle", def ? def->name : "shard_map"));
    if (auto* t = dynamic_cast<const ShardMapTracer*>(x.impl())) {
      if (t->ctx == ctx_ && ctx_->alive) return {t->blocks, t->aval};
      if (def) raise_escaped_tracer(x, *def);
      throw EscapedTracerError("shard_map: an output is a value from a finished shard_map");
    }
    if (!x.impl()->is_concrete()) {
      if (def) raise_escaped_tracer(x, *def);
      throw EscapedTracerError("shard_map: an output is a value from a finished transformation");
    }
    AbstractValue a = x.aval();
    a.vma.clear();
    if (!in_device_memory(ctx_->mesh)) return {std::vector<Array>(size_t(ctx_->mesh.size()), x), a};
    // Device memory (virtual GPU devices): each device computes on its own copy, so that its
    // results live on it.
    std::vector<Array> copies;
    for (const Device& d : ctx_->mesh.devices()) copies.push_back(device_put(x, SingleDeviceSharding(d)));
    return {copies, a};
  }

  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                       const Params& params) override {
    size_t n = size_t(ctx_->mesh.size());
    std::vector<std::vector<Array>> blocks;
    std::vector<AbstractValue> avals;
    for (const Array& x : inputs) {
      auto [b, a] = lift(x, &def);
      blocks.push_back(std::move(b));
      avals.push_back(std::move(a));
    }
    if (has_standard_vma_rule(def)) {  // auto-pvary: free at run time, only the types change
      std::vector<std::string> all;
      for (const AbstractValue& a : avals) all = vma_union(all, a.vma);
      for (AbstractValue& a : avals) a.vma = all;
    }
    std::vector<Array> abstract;
    for (const AbstractValue& a : avals) abstract.push_back(make_abstract(a));
    std::vector<AbstractValue> out_avals = infer_avals(def, abstract, params);

    std::vector<std::vector<Array>> outs(n);
    if (def.kind == PrimKind::Collective) {
      TraceScope eval(eval_trace());
      std::vector<std::vector<Array>> per_device(n);
      if (!blocks.empty())
        for (size_t d = 0; d < n; ++d) per_device[d] = {blocks[0][d]};
      outs = run_collective_on_all_devices(def, params, per_device, out_avals, ctx_->mesh, false, false);
    } else if (def.kind == PrimKind::HigherOrder && needs_communicator(def, params)) {
      outs = run_spmd(def, params, avals, blocks);
    } else {
      TraceScope scope(parent());
      for (size_t d = 0; d < n; ++d) {
        std::vector<Array> ins;
        for (auto& b : blocks) ins.push_back(b[d]);
        outs[d] = cjax::bind(def, ins, params);
      }
    }
    std::vector<Array> result;
    for (size_t k = 0; k < out_avals.size(); ++k) {
      std::vector<Array> per_device;
      for (size_t d = 0; d < n; ++d) per_device.push_back(outs[d][k]);
      result.push_back(make_tracer(out_avals[k], std::move(per_device)));
    }
    return result;
  }

 private:
  // One equation, staged and run SPMD: its collectives need every device at once.
  std::vector<std::vector<Array>> run_spmd(const PrimitiveDef& def, const Params& params,
                                           const std::vector<AbstractValue>& avals,
                                           const std::vector<std::vector<Array>>& blocks) {
    TracedCall call;
    {
      AxisEnvScope env(ctx_->frame());
      call = trace_to_call([&](const std::vector<Array>& xs) { return cjax::bind(def, xs, params); }, avals);
    }
    size_t n = size_t(ctx_->mesh.size());
    std::vector<std::vector<Array>> per_device(n);
    for (size_t d = 0; d < n; ++d) {
      per_device[d] = call.consts;
      for (auto& b : blocks) per_device[d].push_back(b[d]);
    }
    return spmd_runner()(call.jaxpr, ctx_->mesh, ctx_->frame(), {}, std::move(per_device));
  }
  std::shared_ptr<EagerContext> ctx_;
};

}  // namespace

std::vector<Array> eager_shard_map(const shard_map_detail::FlatFn& f, const Mesh& mesh, const std::vector<Array>& args,
                                   const std::vector<PartitionSpec>& in_specs, std::vector<PartitionSpec>& out_specs,
                                   const ShardMapOptions& opts, const std::vector<std::string>& manual_axes) {
  auto ctx = std::make_shared<EagerContext>();
  ctx->mesh = mesh;
  ctx->manual_axes = manual_axes;
  ctx->check_vma = opts.check_vma;
  struct End {
    EagerContext& c;
    ~End() { c.alive = false; }
  } end{*ctx};
  ShardMapTrace trace(eval_trace(), ctx);
  AxisEnvScope env(ctx->frame());
  std::vector<Array> tracers;
  NamedShardings shardings(mesh);
  for (size_t i = 0; i < args.size(); ++i) {
    std::vector<Array> blocks = slice_blocks(args[i], *shardings.of(in_specs[i]));
    AbstractValue a = blocks[0].aval();
    a.vma = opts.check_vma ? spec_vma(in_specs[i]) : std::vector<std::string>{};
    tracers.push_back(trace.make_tracer(std::move(a), std::move(blocks)));
  }
  std::vector<Array> outs;
  {
    TraceScope scope(&trace);
    outs = f(tracers);
  }
  if (out_specs.size() != outs.size())
    throw SpecError(fmt::format("shard_map out_specs give {} specs for {} outputs of '{}'", out_specs.size(),
                                outs.size(), opts.name));
  std::vector<std::vector<Array>> blocks;
  std::vector<AbstractValue> avals;
  for (size_t k = 0; k < outs.size(); ++k) {
    auto [b, a] = trace.lift(outs[k], nullptr);
    check_out_rank(opts.name, k, out_specs[k], a);
    blocks.push_back(std::move(b));
    avals.push_back(std::move(a));
  }
  if (opts.check_vma) check_out_vma(opts.name, mesh, manual_axes, out_specs, avals);
  std::vector<Array> result;
  for (size_t k = 0; k < outs.size(); ++k) {
    AbstractValue g = avals[k];
    g.shape = global_shape(mesh, out_specs[k], g.shape);
    g.vma.clear();
    result.push_back(assemble_blocks(std::move(blocks[k]), shardings.of(out_specs[k]), std::move(g)));
  }
  return result;
}

}  // namespace cjax
