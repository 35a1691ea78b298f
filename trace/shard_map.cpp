// shard_map: spec trees and their validation (docs/shard_map.md §1.3, §1.7), the shard_map
// primitive (staging, abstract evaluation, execution through the SPMD runner), input slicing
// and output assembly (§1.4, §1.5) and the out_specs check (§2.4).
#include "trace/shard_map.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/rules.h"
#include "core/array/trace.h"
#include "core/distributed/runtime.h"
#include "core/spmd/collectives.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax {

// ---------------------------------------------------------------------------------------------
// Spec trees

void SpecTree::flatten(const TreeDef& t, const std::string& what,
                       std::vector<std::optional<PartitionSpec>>& out) const {
  if (kind_ == Kind::Spec) {
    if (t.kind() == TreeDef::Kind::None)
      throw SpecError(
          fmt::format("shard_map {} is {} but the corresponding argument is not a tree of Arrays (a "
                      "static value); use None for static arguments",
                      what, spec_.str()));
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(spec_);
    return;
  }
  if (kind_ == Kind::None) {
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(std::nullopt);
    return;
  }
  bool seq = t.kind() == TreeDef::Kind::List || t.kind() == TreeDef::Kind::Tuple ||
             t.kind() == TreeDef::Kind::IntDict || t.kind() == TreeDef::Kind::Struct;
  if (!seq || t.num_children() != list_.size())
    throw SpecError(
        fmt::format("shard_map {} is {}, which is not a tree prefix of the corresponding value's structure {}; give "
                    "one entry "
                    "per child or a single P",
                    what, str(), t.node_str()));
  for (size_t i = 0; i < list_.size(); ++i)
    list_[i].flatten(t.children()[i], what + "[" + std::to_string(i) + "]", out);
}

void SpecTree::all_specs(std::vector<PartitionSpec>& out) const {
  if (kind_ == Kind::Spec) out.push_back(spec_);
  for (const SpecTree& c : list_) c.all_specs(out);
}

std::string SpecTree::str() const {
  if (kind_ == Kind::Spec) return spec_.str();
  if (kind_ == Kind::None) return "None";
  std::vector<std::string> parts;
  for (const SpecTree& c : list_) parts.push_back(c.str());
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

namespace {

std::string quoted_set(const std::vector<std::string>& names) {
  std::vector<std::string> q;
  for (const std::string& n : names) q.push_back("'" + n + "'");
  return fmt::format("frozenset({{{}}})", fmt::join(q, ", "));
}

std::vector<std::string> manual_axes_of(const Mesh& mesh, const ShardMapOptions& opts) {
  if (opts.axis_names.empty()) return mesh.axis_names();
  std::vector<std::string> out;
  for (const std::string& a : mesh.axis_names())
    if (std::find(opts.axis_names.begin(), opts.axis_names.end(), a) != opts.axis_names.end()) out.push_back(a);
  return out;
}

std::string mesh_shape_text(const Mesh& mesh) {
  std::vector<std::string> names;
  for (const std::string& n : mesh.axis_names()) names.push_back("'" + n + "'");
  auto tup = [](const auto& v) {
    return v.size() == 1 ? fmt::format("({},)", v[0]) : fmt::format("({})", fmt::join(v, ", "));
  };
  return fmt::format("The mesh given has shape {} with corresponding axis names {}.", tup(mesh.shape()), tup(names));
}

// JAX's layout of several failures: one is written plainly, several as "* " bullets.
std::string bulleted(const std::vector<std::string>& items) {
  return items.size() == 1 ? items[0] : "* " + fmt::format("{}", fmt::join(items, "\n\n* "));
}

int64_t entry_size(const Mesh& mesh, const PartitionSpec::Entry& e) {
  int64_t n = 1;
  for (const std::string& a : e.names) n *= mesh.axis_size(a);
  return n;
}

}  // namespace

namespace shard_map_detail {

void validate_specs(const Mesh& mesh, const SpecTree& in_specs, const SpecTree& out_specs,
                    const ShardMapOptions& opts) {
  if (mesh.size() == 0) throw SpecError("shard_map requires a non-empty mesh; build one with make_mesh");
  for (const std::string& a : opts.axis_names)
    if (mesh.axis_index(a) < 0)
      throw SpecError(fmt::format("shard_map requires axis_names={} to be a subset of mesh.axis_names={}",
                                  quoted_set(opts.axis_names), quoted_set(mesh.axis_names())));
  std::vector<std::string> manual = manual_axes_of(mesh, opts);
  auto check = [&](const SpecTree& tree, const char* which) {
    std::vector<PartitionSpec> specs;
    tree.all_specs(specs);
    for (const PartitionSpec& s : specs) {
      std::set<std::string> seen;
      for (const std::string& a : s.mentioned_axes()) {
        if (std::find(manual.begin(), manual.end(), a) == manual.end())
          throw SpecError(
              fmt::format("shard_map {} argument must refer to an axis marked as manual ({}), but:\n\n  {} {} refers "
                          "to '{}'\n\n"
                          "Check the {} values passed to shard_map.",
                          which, quoted_set(manual), which, s.str(), a, which));
        if (!seen.insert(a).second)
          throw SpecError(
              fmt::format("A single NamedSharding spec specification can map every mesh axis to at most one positional "
                          "dimension, but {} has duplicate entries for `{}` (shard_map {})",
                          s.str(), a, which));
      }
    }
  };
  check(in_specs, "in_specs");
  check(out_specs, "out_specs");
}

void check_in_specs_arity(const SpecTree& in_specs, size_t num_args, const std::string& fn) {
  if (in_specs.is_list() && in_specs.list().size() != num_args)
    throw SpecError(
        fmt::format("shard_map in_specs {} has {} entries but '{}' was called with {} arguments: in_specs must be a "
                    "tree prefix "
                    "of the arguments tuple (one entry per argument, or a single P for all)",
                    in_specs.str(), in_specs.list().size(), fn, num_args));
}

}  // namespace shard_map_detail

// ---------------------------------------------------------------------------------------------
// Parameters

bool MeshParam::equals(const ParamObject& o) const {
  auto* p = dynamic_cast<const MeshParam*>(&o);
  return p && p->mesh == mesh;
}
std::string SpecsParam::str() const {
  std::vector<std::string> parts;
  for (const PartitionSpec& s : specs) parts.push_back(s.str());
  return parts.size() == 1 ? "(" + parts[0] + ",)" : fmt::format("({})", fmt::join(parts, ", "));
}
size_t SpecsParam::hash() const {
  size_t h = 0;
  for (const PartitionSpec& s : specs) h = absl::HashOf(h, s.hash());
  return h;
}
bool SpecsParam::equals(const ParamObject& o) const {
  auto* p = dynamic_cast<const SpecsParam*>(&o);
  return p && p->specs == specs;
}
std::string ManualAxesParam::str() const { return quoted_set(names); }
size_t ManualAxesParam::hash() const { return absl::HashOf(names); }
bool ManualAxesParam::equals(const ParamObject& o) const {
  auto* p = dynamic_cast<const ManualAxesParam*>(&o);
  return p && p->names == names;
}

ShardMapInfo ShardMapInfo::from(const Params& p) {
  ShardMapInfo s;
  s.mesh = p.object<MeshParam>("mesh")->mesh;
  s.in_specs = p.object<SpecsParam>("in_specs")->specs;
  s.out_specs = p.object<SpecsParam>("out_specs")->specs;
  s.body = p.object<JaxprParam>("jaxpr")->jaxpr;
  s.check_vma = p.get<bool>("check_vma");
  s.manual_axes = p.object<ManualAxesParam>("manual_axes")->names;
  return s;
}

Params ShardMapInfo::params() const {
  return {{"mesh", std::make_shared<MeshParam>(mesh)},
          {"in_specs", std::make_shared<SpecsParam>(in_specs)},
          {"out_specs", std::make_shared<SpecsParam>(out_specs)},
          {"jaxpr", std::make_shared<JaxprParam>(body)},
          {"check_vma", check_vma},
          {"manual_axes", std::make_shared<ManualAxesParam>(manual_axes)}};
}

std::vector<ManualAxis> ShardMapInfo::axis_frame() const { return axis_frame(mesh, manual_axes, check_vma); }
std::vector<ManualAxis> ShardMapInfo::axis_frame(const Mesh& mesh, const std::vector<std::string>& manual_axes,
                                                 bool check_vma) {
  std::vector<ManualAxis> out;
  for (const std::string& a : manual_axes) out.push_back({a, mesh.axis_size(a), check_vma});
  return out;
}

// ---------------------------------------------------------------------------------------------
// Blocks

Shape block_shape(const Mesh& mesh, const PartitionSpec& spec, const Shape& global) {
  Shape s = global;
  for (size_t d = 0; d < spec.size() && d < s.size(); ++d) s[d] /= entry_size(mesh, spec.entries()[d]);
  return s;
}
Shape global_shape(const Mesh& mesh, const PartitionSpec& spec, const Shape& block) {
  Shape s = block;
  for (size_t d = 0; d < spec.size() && d < s.size(); ++d) s[d] *= entry_size(mesh, spec.entries()[d]);
  return s;
}
std::vector<std::string> spec_vma(const PartitionSpec& spec) { return sorted_axes(spec.mentioned_axes()); }

const std::shared_ptr<const NamedSharding>& NamedShardings::of(const PartitionSpec& spec) {
  for (const auto& s : made_)
    if (s->spec() == spec) return s;
  return made_.emplace_back(std::make_shared<const NamedSharding>(mesh_, spec));
}

std::vector<Array> slice_blocks(const Array& x, const NamedSharding& sharding) {
  Array placed = device_put(x, sharding);
  ConcreteArray& c = require_concrete(placed, "shard_map");
  AbstractValue block{block_shape(sharding.mesh(), sharding.spec(), x.shape()), x.dtype(), x.weak_type(), {}};
  std::vector<Array> out;
  for (const auto& buf : c.buffers) out.push_back(Array(std::make_shared<ConcreteArray>(block, buf)));
  return out;
}

Array assemble_blocks(std::vector<Array> blocks, const std::shared_ptr<const NamedSharding>& sharding,
                      AbstractValue global) {
  const Mesh& mesh = sharding->mesh();
  const PartitionSpec& spec = sharding->spec();
  global.vma.clear();
  size_t nbytes = size_t(shape_size(block_shape(mesh, spec, global.shape))) * itemsize(global.dtype);
  std::shared_ptr<ConcreteArray> out;
  for (size_t d = 0; d < blocks.size(); ++d) {
    const Device& dev = mesh.devices()[d];
    std::shared_ptr<Buffer> buf;
    if (!blocks[d].defined()) {  // computed by the process that drives dev
      buf = std::make_shared<Buffer>(Buffer::Remote{}, dev, nbytes);
    } else if (buf = require_concrete(blocks[d], "shard_map output").buffer();
               buf->nbytes() != nbytes || !(buf->device() == dev)) {  // a literal or a view: give the device its copy
      auto copy = std::make_shared<Buffer>(dev, nbytes);
      copy_buffer(*buf, *copy, nbytes);
      buf = std::move(copy);
    }
    if (!out)
      out = std::make_shared<ConcreteArray>(global, std::move(buf));
    else
      out->buffers.push_back(std::move(buf));
  }
  out->sharding = sharding;
  return Array(std::move(out));
}

bool contains_collective(const Params& params) {
  for (const Jaxpr* j : jaxprs_in_params(params))
    for (const JaxprEqn& e : j->eqns())
      if (needs_communicator(*e.primitive, e.params)) return true;
  return false;
}

bool needs_communicator(const PrimitiveDef& def, const Params& params) {
  if (def.kind == PrimKind::Collective) return true;
  if (&def == &g_shard_map)  // nested: its out_specs' named dimensions are all_gathers (nested_shard_map_impl)
    for (const PartitionSpec& s : params.object<SpecsParam>("out_specs")->specs)
      if (!s.mentioned_axes().empty()) return true;
  return contains_collective(params);
}

namespace {
std::mutex g_transposed_mu;
std::unordered_map<const Jaxpr*, std::weak_ptr<const Jaxpr>> g_transposed;
}  // namespace

void mark_transposed_body(const std::shared_ptr<const Jaxpr>& body) {
  std::lock_guard lk(g_transposed_mu);
  if (g_transposed.size() > 4096) std::erase_if(g_transposed, [](const auto& kv) { return kv.second.expired(); });
  g_transposed[body.get()] = body;
}
bool is_transposed_body(const Jaxpr* body) {
  std::lock_guard lk(g_transposed_mu);
  auto it = g_transposed.find(body);
  if (it == g_transposed.end()) return false;
  auto live = it->second.lock();
  return live && live.get() == body;
}

// ---------------------------------------------------------------------------------------------
// Checks after tracing the body

void check_out_rank(const std::string& fn, size_t index, const PartitionSpec& spec, const AbstractValue& block) {
  if (int64_t(spec.size()) <= block.ndim()) return;
  std::string scalar_hint =
      block.ndim() == 0
          ? "\n\nThe output is a scalar: use P() for it, and if it is not the same on every device, give it a "
            "singleton axis (x[None]) and name the mesh axis there, e.g. P('i')."
          : "";
  throw SpecError(fmt::format(
      "shard_map applied to the function '{}' was given an out_specs entry which is too long to be compatible with "
      "the corresponding output value from the function:\n\nout_specs[{}] is {} which has length {}, but the "
      "corresponding output {}(*args)[{}] has shape {}, which has rank {} (and {} < {})\n\nEntries in out_specs must "
      "be of length no greater than the number of axes in the corresponding output value.\n\nEither revise the spec "
      "to be shorter, or modify '{}' so that its outputs have sufficient rank.{}",
      fn, index, spec.str(), spec.size(), fn, index, block.str(), block.ndim(), block.ndim(), spec.size(), fn,
      scalar_hint));
}

void check_out_vma(const std::string& fn, const Mesh& mesh, const std::vector<std::string>& manual_axes,
                   const std::vector<PartitionSpec>& out_specs, const std::vector<AbstractValue>& out_avals) {
  std::vector<std::string> bullets;
  for (size_t i = 0; i < out_avals.size(); ++i) {
    std::vector<std::string> mentioned = out_specs[i].mentioned_axes();
    bool bad = false;
    for (const std::string& a : out_avals[i].vma)
      bad = bad || (std::find(manual_axes.begin(), manual_axes.end(), a) != manual_axes.end() &&
                    std::find(mentioned.begin(), mentioned.end(), a) == mentioned.end());
    if (!bad) continue;
    std::vector<std::string> unmentioned, varying;
    for (const std::string& a : manual_axes) {
      if (std::find(mentioned.begin(), mentioned.end(), a) == mentioned.end()) unmentioned.push_back(a);
      if (std::binary_search(out_avals[i].vma.begin(), out_avals[i].vma.end(), a)) varying.push_back(a);
    }
    std::string line;
    if (unmentioned.size() == 1 && mentioned.empty())
      line = fmt::format(
          "{} which implies that the corresponding output value is replicated across mesh axis '{}', "
          "but could not infer replication over any axes",
          out_specs[i].str(), unmentioned[0]);
    else
      line = fmt::format(
          "{} which implies that the corresponding output value is only varying across mesh axes {{{}}} "
          "and not {{{}}}, but it was inferred to be possibly varying over {{{}}}",
          out_specs[i].str(), fmt::join(mentioned, ","), fmt::join(unmentioned, ","), fmt::join(varying, ","));
    bullets.push_back(fmt::format("out_specs[{}] is {}", i, line));
  }
  if (bullets.empty()) return;
  std::string body = bulleted(bullets);
  throw VmaError(fmt::format(
      "shard_map applied to the function '{}' was given out_specs which require replication which can't be "
      "statically inferred given the mesh:\n\n{}\n\n{}\n\nCheck if these output values are meant to be replicated "
      "over those mesh axes. If not, consider revising the corresponding out_specs entries. If so, consider "
      "disabling the check by passing check_vma=false to shard_map.",
      fn, mesh_shape_text(mesh), body));
}

// ---------------------------------------------------------------------------------------------
// The primitive

namespace {

std::vector<AbstractValue> shard_map_abstract_eval(std::span<const Array> in, const Params& p) {
  ShardMapInfo info = ShardMapInfo::from(p);
  const Jaxpr& body = *info.body;
  if (in.size() != body.invars().size() || in.size() != info.in_specs.size())
    throw ValueError(fmt::format("shard_map takes {} inputs (one per in_spec and body input), got {}",
                                 body.invars().size(), in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    Shape want = block_shape(info.mesh, info.in_specs[i], in[i].shape());
    if (want != body.invars()[i].aval().shape || in[i].dtype() != body.invars()[i].aval().dtype)
      throw ShapeError(fmt::format("shard_map input {} of type {} under {} gives blocks {}, but the body takes {}", i,
                                   in[i].aval().str(), info.in_specs[i].str(), shape_str(want),
                                   body.invars()[i].aval().str()));
  }
  std::vector<AbstractValue> outs;
  std::vector<AbstractValue> body_outs = body.out_avals();
  for (size_t i = 0; i < body_outs.size(); ++i) {
    AbstractValue g = body_outs[i];
    g.shape = global_shape(info.mesh, info.out_specs[i], g.shape);
    g.vma = vma_minus(g.vma, info.manual_axes);
    outs.push_back(std::move(g));
  }
  return outs;
}

// A shard_map inside a body that already runs on every device (nesting, docs/shard_map.md §1.9): each device
// takes its own block of its operands along the inner manual axes, runs the body inline, and
// rebuilds the outputs with tiled all_gathers over the axes each out_spec dimension names.
std::vector<Array> nested_shard_map_impl(const ShardMapInfo& info, std::span<const Array> in,
                                         std::span<const AbstractValue> out_avals) {
  const SpmdContext& ctx = *current_spmd();
  if (!(*ctx.mesh == info.mesh))
    throw ShardingError(fmt::format("a nested shard_map must use the enclosing shard_map's mesh {}, got {}",
                                    ctx.mesh->str(), info.mesh.str()));
  std::vector<ManualAxis> frame = info.axis_frame();
  for (ManualAxis& a : frame) a.check_vma = false;  // concrete values: types were checked when tracing
  AxisEnvScope env(frame);
  std::vector<Array> blocks;
  for (size_t i = 0; i < in.size(); ++i) {
    Array x = in[i];
    const auto& entries = info.in_specs[i].entries();
    for (size_t d = 0; d < entries.size(); ++d) {
      if (entries[d].names.empty()) continue;
      int64_t n = entry_size(info.mesh, entries[d]), size = x.shape()[d] / n;
      int64_t k = axis_position(info.mesh, entries[d].names, ctx.device);
      x = lax::slice_in_dim(x, k * size, (k + 1) * size, 1, int64_t(d));
    }
    blocks.push_back(x);
  }
  std::vector<Array> outs = eval_jaxpr(*info.body, {}, blocks);
  for (size_t k = 0; k < outs.size(); ++k) {
    const auto& entries = info.out_specs[k].entries();
    for (size_t d = 0; d < entries.size(); ++d)
      if (!entries[d].names.empty())
        outs[k] = bind1(g_all_gather, {outs[k]},
                        {{"axes", axes_param(entries[d].names)},
                         {"all_gather_dimension", int64_t(d)},
                         {"axis_size", entry_size(info.mesh, entries[d])},
                         {"tiled", true}});
    (void)out_avals;
  }
  return outs;
}

std::vector<Array> shard_map_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                  const Params& p) {
  if (current_spmd()) return nested_shard_map_impl(ShardMapInfo::from(p), in, out_avals);
  // The parameters are read in place, not copied into a ShardMapInfo.
  const Mesh& mesh = p.object<MeshParam>("mesh")->mesh;
  const std::vector<PartitionSpec>& in_specs = p.object<SpecsParam>("in_specs")->specs;
  const std::vector<PartitionSpec>& out_specs = p.object<SpecsParam>("out_specs")->specs;
  size_t n = size_t(mesh.size());
  std::vector<std::vector<Array>> per_device(n);
  NamedShardings shardings(mesh);
  for (size_t i = 0; i < in.size(); ++i) {
    std::vector<Array> blocks = slice_blocks(in[i], *shardings.of(in_specs[i]));
    for (size_t d = 0; d < n; ++d) per_device[d].push_back(std::move(blocks[d]));
  }
  std::vector<std::vector<std::string>> input_axes;
  for (const PartitionSpec& s : in_specs) input_axes.push_back(s.mentioned_axes());
  std::vector<std::vector<Array>> outs =
      spmd_runner()(p.object<JaxprParam>("jaxpr")->jaxpr, mesh,
                    ShardMapInfo::axis_frame(mesh, p.object<ManualAxesParam>("manual_axes")->names,
                                             p.get<bool>("check_vma")),
                    input_axes, std::move(per_device));
  std::vector<Array> result;
  for (size_t k = 0; k < out_avals.size(); ++k) {
    std::vector<Array> blocks;
    for (size_t d = 0; d < n; ++d) blocks.push_back(outs[d].empty() ? Array() : outs[d][k]);  // empty: remote
    result.push_back(assemble_blocks(std::move(blocks), shardings.of(out_specs[k]), out_avals[k]));
  }
  return result;
}

PrimitiveDef make_shard_map_def() {
  PrimitiveDef def;
  def.name = "shard_map";
  def.kind = PrimKind::HigherOrder;
  def.arity = Arity::any();  // checked against the body
  def.abstract_eval = shard_map_abstract_eval;
  def.impl = shard_map_impl;
  def.takes_sharded_operands = true;
  return def;
}

}  // namespace

const PrimitiveDef& g_shard_map = register_primitive(make_shard_map_def());
const bool g_shard_map_axes = add_rule_initializer([] {
  define_rules("shard_map").body_manual_axes = [](const Params& p) { return ShardMapInfo::from(p).axis_frame(); };
});

std::vector<Array> bind_shard_map(const ShardMapInfo& info, std::span<const Array> args) {
  return cjax::bind(g_shard_map, args, info.params());
}

// ---------------------------------------------------------------------------------------------
// The front end

namespace shard_map_detail {
namespace {

// JAX's str(ShapedArray) in messages: int32[2,2].
std::string long_type(const AbstractValue& a) {
  return fmt::format("{}[{}]", dtype_name(a.dtype), fmt::join(a.shape, ","));
}

void check_inputs(const std::string& fn, const Mesh& mesh, const std::vector<Array>& args,
                  const std::vector<PartitionSpec>& specs, const std::vector<std::string>& names) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined()) throw ValueError(fmt::format("shard_map: {} is an empty Array handle", names[i]));
    const PartitionSpec& s = specs[i];
    int64_t rank = args[i].ndim();
    if (int64_t(s.size()) > rank) {
      std::string hint = rank == 0 ? "\n\nThe argument is a scalar: use P() for it." : "";
      throw SpecError(fmt::format(
          "shard_map applied to the function '{}' was given an in_specs entry which is too long to be compatible "
          "with the corresponding input value from the function:\n\nin_specs for {} is {} which has length {}, but "
          "the passed {} has shape {}, which has rank {} (and {} < {})\n\nEntries in in_specs must be of length no "
          "greater than the number of axes in the corresponding input value.\n\nEither revise the spec to be "
          "shorter, or modify '{}' so that its inputs have sufficient rank.{}",
          fn, names[i], s.str(), s.size(), names[i], long_type(args[i].aval()), rank, rank, s.size(), fn, hint));
    }
  }
  std::vector<std::string> bullets;
  for (size_t i = 0; i < args.size(); ++i) {
    const PartitionSpec& s = specs[i];
    for (size_t d = 0; d < s.size(); ++d) {
      const auto& e = s.entries()[d];
      if (e.names.empty()) continue;
      int64_t k = entry_size(mesh, e), size = args[i].shape()[d];
      if (size % k == 0) continue;
      std::string axes = e.names.size() == 1
                             ? fmt::format("mesh axis '{}' (of size {})", e.names[0], k)
                             : fmt::format("mesh axes {} (of total size {})", AxisNames(e.names).str(), k);
      bullets.push_back(
          fmt::format("the passed {} of shape {} corresponds to in_specs entry {}, which maps array axis {} (of size "
                      "{}) to {}, "
                      "but {} does not evenly divide {}",
                      names[i], long_type(args[i].aval()), s.str(), d, size, axes, k, size));
    }
  }
  if (bullets.empty()) return;
  std::string body = bulleted(bullets);
  throw SpecError(fmt::format(
      "shard_map applied to the function '{}' was given argument arrays with axis sizes that are not evenly "
      "divisible by the corresponding mesh axis sizes:\n\n{}\n\n{}\n\nArray arguments' axis sizes must be evenly "
      "divisible by the mesh axis or axes indicated by the corresponding elements of the argument's in_specs entry. "
      "Consider checking that in_specs are correct, and if so consider changing the mesh axis sizes or else padding "
      "the input and adapting '{}' appropriately.",
      fn, mesh_shape_text(mesh), body, fn));
}

}  // namespace

std::vector<Array> shard_map(const FlatFn& f, const Mesh& mesh, const std::vector<Array>& args,
                             const std::vector<PartitionSpec>& in_specs, const std::vector<std::string>& arg_names,
                             std::vector<PartitionSpec>& out_specs, const ShardMapOptions& opts) {
  std::vector<std::string> manual = manual_axes_of(mesh, opts);
  check_inputs(opts.name, mesh, args, in_specs, arg_names);
  // Across processes the body is staged and each process runs its own devices' part (as JAX runs
  // every multi-process computation): no process can step through another's blocks.
  if (current_trace() == eval_trace() && !current_spmd() && !distributed::spans_processes(mesh.devices()))
    return eager_shard_map(f, mesh, args, in_specs, out_specs, opts, manual);

  ShardMapInfo info;
  info.mesh = mesh;
  info.check_vma = opts.check_vma;
  info.manual_axes = manual;
  std::vector<AbstractValue> block_avals;
  for (size_t i = 0; i < args.size(); ++i) {
    AbstractValue a = args[i].aval();
    a.shape = block_shape(mesh, in_specs[i], a.shape);
    if (opts.check_vma) a.vma = vma_union(a.vma, spec_vma(in_specs[i]));
    block_avals.push_back(std::move(a));
  }
  TracedCall call;
  {
    AxisEnvScope env(info.axis_frame());
    call = trace_to_call(
        [&](const std::vector<Array>& xs) {
          std::vector<Array> outs = f(xs);
          if (out_specs.size() != outs.size())
            throw SpecError(fmt::format("shard_map out_specs give {} specs for {} outputs of '{}'", out_specs.size(),
                                        outs.size(), opts.name));
          std::vector<AbstractValue> avals;
          for (size_t k = 0; k < outs.size(); ++k) {
            check_out_rank(opts.name, k, out_specs[k], outs[k].aval());
            avals.push_back(outs[k].aval());
          }
          if (opts.check_vma) {
            check_out_vma(opts.name, mesh, manual, out_specs, avals);
            for (size_t k = 0; k < outs.size(); ++k) {  // implicit pvary over the named axes (§1.5)
              std::vector<std::string> missing = vma_minus(spec_vma(out_specs[k]), outs[k].aval().vma);
              if (!missing.empty()) outs[k] = bind1(g_pvary, {outs[k]}, pvary_params(missing));
            }
          }
          return outs;
        },
        block_avals);
  }
  info.body = call.jaxpr;
  info.in_specs.assign(call.consts.size(), PartitionSpec());
  info.in_specs.insert(info.in_specs.end(), in_specs.begin(), in_specs.end());
  info.out_specs = out_specs;
  std::vector<Array> all = call.consts;
  all.insert(all.end(), args.begin(), args.end());
  return bind_shard_map(info, all);
}

}  // namespace shard_map_detail
}  // namespace cjax
