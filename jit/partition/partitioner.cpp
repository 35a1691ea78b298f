// The partitioner's core (jit/partition/partitioner.h): layouts, the reshard planner and the
// interpreter that stages a jaxpr's per-device program inside one shard_map body.
#include "jit/partition/partitioner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <unordered_map>

#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "cjax/shard_map.h"
#include "core/array/array_impl.h"
#include "core/array/trace.h"
#include "core/array/util.h"
#include "jit/passes/passes.h"
#include "trace/shard_map.h"
#include "trace/source_info.h"

namespace cjax::partition {

namespace jnp = cjax::numpy;

// ---- Layout ----

Layout Layout::of(const PartitionSpec& spec, size_t rank) {
  Layout l = replicated(rank);
  for (size_t d = 0; d < spec.size() && d < rank; ++d) l.dims[d] = spec.entries()[d].names;
  return l;
}

PartitionSpec Layout::spec() const {
  std::vector<PartitionSpec::Entry> entries;
  for (const auto& axes : dims) {
    if (axes.empty())
      entries.emplace_back(None);
    else if (axes.size() == 1)
      entries.emplace_back(axes[0]);
    else
      entries.emplace_back(AxisTuple{axes});
  }
  while (!entries.empty() && entries.back().names.empty()) entries.pop_back();
  return PartitionSpec(std::move(entries));
}

bool Layout::uses(std::string_view axis) const {
  for (const auto& axes : dims)
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) return true;
  return std::find(unreduced.begin(), unreduced.end(), axis) != unreduced.end();
}

bool Layout::split() const {
  return std::any_of(dims.begin(), dims.end(), [](const auto& a) { return !a.empty(); });
}

std::string Layout::str() const {
  std::string s = spec().str();
  if (!unreduced.empty()) s += fmt::format("{{U:{}}}", fmt::join(unreduced, ","));
  return s;
}

std::string at_call_site(const std::shared_ptr<const SourceInfo>& info) {
  if (!info || info->str().empty()) return "";
  return " at " + info->str();
}

std::string InsertedCollective::str() const {
  return fmt::format("{} over ({}) {} -> {} ({} bytes) for {}{}{}", kind, fmt::join(axes, ", "),
                     AbstractValue{in_shape, dtype, false, {}}.str(), AbstractValue{out_shape, dtype, false, {}}.str(),
                     bytes, primitive, at_call_site(source_info), why.empty() ? "" : ": " + why);
}

// ---- rule table ----

namespace {
std::unordered_map<std::string, ShardingRule>& rule_table() {
  static std::unordered_map<std::string, ShardingRule> t;
  return t;
}
}  // namespace

void define_sharding_rule(std::string_view primitive, ShardingRule rule) {
  rule_table()[std::string(primitive)] = std::move(rule);
}

const ShardingRule* find_sharding_rule(const PrimitiveDef& def) {
  auto& t = rule_table();
  auto it = t.find(def.name);
  if (it != t.end()) return &it->second;
  if (def.kind == PrimKind::Elementwise) {
    auto e = t.find("<elementwise>");
    if (e != t.end()) return &e->second;
  }
  return nullptr;
}

// ---- Partitioner ----

Partitioner::Partitioner(Mesh mesh) : mesh_(std::move(mesh)) {}

int64_t Partitioner::size_of(const std::vector<std::string>& axes) const {
  int64_t n = 1;
  for (const std::string& a : axes) n *= mesh_.axis_size(a);
  return n;
}

Layout Partitioner::layout(const PartitionSpec& spec, size_t rank) const {
  Layout l = Layout::of(spec, rank);
  for (auto& axes : l.dims) std::erase_if(axes, [&](const std::string& a) { return mesh_.axis_size(a) == 1; });
  return l;
}

Shape Partitioner::local_shape(const Shape& global, const Layout& layout) const {
  Shape s = global;
  for (size_t d = 0; d < s.size() && d < layout.dims.size(); ++d) {
    int64_t n = size_of(layout.dims[d]);
    if (s[d] % n != 0)
      fail(
          fmt::format("dimension {} of a value of shape {} (size {}) is not divisible by the {} devices of mesh axes "
                      "({}); cjax does not pad uneven shards: choose a sharding whose axes divide the dimension",
                      d, shape_str(global), s[d], n, fmt::join(layout.dims[d], ", ")));
    s[d] /= n;
  }
  return s;
}

std::string Partitioner::where() const {
  if (!current) return context.empty() ? "the program" : context;
  return fmt::format("'{}'{}", current->primitive->name, at_call_site(current->source_info));
}

void Partitioner::fail(const std::string& what) const {
  throw ShardingError(fmt::format("sharded jit, {}: {}", where(), what));
}

Array Partitioner::emit(const std::string& kind, const std::vector<std::string>& axes, const Array& in,
                        const std::string& why, const std::function<Array()>& make) {
  Array out = make();
  InsertedCollective c;
  c.kind = kind;
  c.axes = axes;
  c.in_shape = in.shape();
  c.out_shape = out.shape();
  c.dtype = in.dtype();
  c.bytes = in.aval().size() * int64_t(itemsize(in.dtype()));
  if (current) {
    c.primitive = current->primitive->name;
    c.source_info = current->source_info;
  }
  c.why = why + region;
  static const bool log = env_flag("CJAX_LOG_RESHARDS");
  if (log) std::cerr << "cjax reshard: " << c.str() << "\n";
  inserted.push_back(std::move(c));
  return out;
}

void Partitioner::remember_broadcast(const Array& result, const Value& operand, const Params& params) {
  broadcasts_[result.impl()] = Broadcast{operand, params};
  keep_alive_.push_back(result);
}

void Partitioner::remember_source(const Array& value, std::shared_ptr<const SourceInfo> source) {
  if (!source) return;
  sources_[value.impl()] = std::move(source);
  keep_alive_.push_back(value);
}
std::shared_ptr<const SourceInfo> Partitioner::source_of(const Array& value) const {
  auto it = sources_.find(value.impl());
  return it == sources_.end() ? nullptr : it->second;
}

Value Partitioner::reduced(const Value& v) {
  if (v.layout.unreduced.empty()) return v;
  auto it = reduced_to_.find(v.local.impl());
  return reshard(v, it != reduced_to_.end() ? it->second : v.layout.without_pending());
}

Value Partitioner::reduced_for(const Value& v, const void* var) {
  auto peers = reduce_peers.find(var);
  if (v.layout.unreduced.empty() || reduced_to_.count(v.local.impl()) || !env || peers == reduce_peers.end())
    return reduced(v);
  for (const void* peer : peers->second)
    if (auto w = env->find(peer); w != env->end() && w->second.layout.unreduced.empty() && w->second.layout.split())
      return reshard(v, w->second.layout);
  return reduced(v);
}

Value Partitioner::gathered_along(const Value& v, const std::vector<int64_t>& dims) {
  Value r = reduced(v);
  Layout t = r.layout;
  for (int64_t d : dims) t.dims[size_t(d)].clear();
  return reshard(r, t);
}

namespace {
Shape global_shape_of(const Value& v, const Mesh& mesh) {
  Shape s = v.local.shape();
  for (size_t d = 0; d < s.size(); ++d)
    for (const std::string& a : v.layout.dims[d]) s[d] *= mesh.axis_size(a);
  return s;
}
std::vector<std::string> minus(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> r;
  for (const std::string& x : a)
    if (std::find(b.begin(), b.end(), x) == b.end()) r.push_back(x);
  return r;
}
bool starts_with(const std::vector<std::string>& a, const std::vector<std::string>& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}
}  // namespace

Array Partitioner::first_device(const std::vector<std::string>& axes) const {
  Array first = make_scalar(1, DType::bool_);
  for (const std::string& a : axes) first = jnp::logical_and(first, lax::axis_index(a) == Array(0));
  return first;
}

Value Partitioner::reshard(const Value& v, const Layout& target) {
  if (v.layout == target) return v;
  if (std::vector<std::string> made = minus(target.unreduced, v.layout.unreduced); !made.empty()) {
    Layout kept = target;
    kept.unreduced = minus(target.unreduced, made);
    Value r = reshard(v, kept);
    return Value{jnp::where(first_device(made), r.local, jnp::zeros_like(r.local)), target};
  }
  auto key = std::make_pair(static_cast<const void*>(v.local.impl()), target.str());
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;

  Value r;
  if (auto b = broadcasts_.find(v.local.impl()); b != broadcasts_.end() && target.unreduced == v.layout.unreduced) {
    // Rebuild the broadcast at the target layout from its operand (no data moves).
    const Broadcast& bc = b->second;
    const auto& bdims = bc.params.ints("broadcast_dimensions");
    const Shape& global = bc.params.ints("shape");
    Layout op_target = bc.operand.layout;
    for (size_t i = 0; i < bdims.size(); ++i) {
      size_t od = size_t(bdims[i]);
      bool expanded = bc.operand.local.shape()[i] * size_of(bc.operand.layout.dims[i]) != global[od];
      op_target.dims[i] = expanded ? std::vector<std::string>{} : target.dims[od];
    }
    Value op = reshard(bc.operand, op_target);
    r = Value{lax::broadcast_in_dim(op.local, local_shape(global, target), bdims), target};
    remember_broadcast(r.local, op, bc.params);
    memo_.emplace(key, r);
    return r;
  }

  Array x = v.local;
  Layout cur = v.layout;
  const size_t rank = cur.dims.size();
  std::string why = fmt::format("{} -> {}", v.layout.str(), target.str());

  // 1. Pending sums the target does not keep: a reduce-scatter where the target splits a
  //    dimension on that axis next, else one psum over all the rest.
  std::vector<std::string> to_sum;
  for (const std::string& a : minus(cur.unreduced, target.unreduced)) {
    std::optional<size_t> dim;
    for (size_t d = 0; d < rank && !dim; ++d)
      if (starts_with(target.dims[d], cur.dims[d]) && target.dims[d].size() > cur.dims[d].size() &&
          target.dims[d][cur.dims[d].size()] == a && x.shape()[d] % mesh_.axis_size(a) == 0)
        dim = d;
    if (dim) {
      x = emit("reduce_scatter", {a}, x, why,
               [&] { return lax::psum_scatter(x, a, {.scatter_dimension = int(*dim), .tiled = true}); });
      cur.dims[*dim].push_back(a);
    } else {
      to_sum.push_back(a);
    }
  }
  if (!to_sum.empty()) x = emit("psum", to_sum, x, why, [&] { return lax::psum(x, to_sum); });
  cur.unreduced = target.unreduced;

  // 2. Axes leaving a dimension, minor first: all_to_all into the dimension that takes them next,
  //    else all_gather.
  for (size_t d = 0; d < rank; ++d) {
    size_t keep = 0;
    while (keep < cur.dims[d].size() && keep < target.dims[d].size() && cur.dims[d][keep] == target.dims[d][keep])
      ++keep;
    while (cur.dims[d].size() > keep) {
      std::string a = cur.dims[d].back();
      std::optional<size_t> into;
      for (size_t e = 0; e < rank && !into; ++e)
        if (e != d && starts_with(target.dims[e], cur.dims[e]) && target.dims[e].size() > cur.dims[e].size() &&
            target.dims[e][cur.dims[e].size()] == a && x.shape()[e] % mesh_.axis_size(a) == 0)
          into = e;
      if (into) {
        x = emit("all_to_all", {a}, x, why, [&] { return lax::all_to_all(x, a, int(*into), int(d), {.tiled = true}); });
        cur.dims[*into].push_back(a);
      } else {
        x = emit("all_gather", {a}, x, why, [&] { return lax::all_gather(x, a, {.axis = int(d), .tiled = true}); });
      }
      cur.dims[d].pop_back();
    }
  }

  // 3. Axes joining a dimension: each device keeps its block (a local slice).
  for (size_t d = 0; d < rank; ++d) {
    while (cur.dims[d].size() < target.dims[d].size()) {
      std::string a = target.dims[d][cur.dims[d].size()];
      int64_t n = mesh_.axis_size(a);
      if (x.shape()[d] % n != 0)
        fail(
            fmt::format("dimension {} of a value of shape {} (block size {}) is not divisible by mesh axis '{}' of "
                        "size {}; cjax does not pad uneven shards: choose a sharding whose axes divide the dimension",
                        d, shape_str(global_shape_of(v, mesh_)), x.shape()[d], a, n));
      int64_t chunk = x.shape()[d] / n;
      Array start = lax::axis_index(a) * Array(int(chunk));
      x = lax::dynamic_slice_in_dim(x, start, chunk, int64_t(d));
      cur.dims[d].push_back(a);
    }
  }
  r = Value{x, target};
  if (!v.layout.unreduced.empty() && target.unreduced.empty()) reduced_to_.emplace(v.local.impl(), target);
  memo_.emplace(key, r);
  keep_alive_.push_back(v.local);
  return r;
}

bool Partitioner::is_zeros(const Value& v) const {
  const Array* a = &v.local;
  if (auto b = broadcasts_.find(a->impl()); b != broadcasts_.end()) a = &b->second.operand.local;
  auto* c = concrete(*a);
  if (!c || !c->ready() || a->aval().size() > (int64_t(1) << 20)) return false;
  TraceScope eager(eval_trace());  // read the constant, do not stage the read
  return !jnp::any(*a != Array(0)).item<bool>();
}

// ---- the interpreter ----

std::vector<Value> run_replicated(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  std::vector<Array> locals;
  bool gathered = false;
  for (Value& v : ins) {
    gathered = gathered || v.layout.split() || !v.layout.unreduced.empty();
    locals.push_back(p.reshard(v, Layout::replicated(v.layout.dims.size())).local);
  }
  if (gathered) {
    static const bool strict = env_flag("CJAX_RESHARD_STRICT");
    std::string msg = fmt::format(
        "'{}' has no sharding rule, so its split operands are gathered and it runs whole on every device (full "
        "rematerialization); split the computation with shard_map, or reshard its operands with "
        "with_sharding_constraint",
        eqn.primitive->name);
    if (strict) p.fail(msg + " (CJAX_RESHARD_STRICT=1)");
    p.run_whole.push_back(p.where());
    std::cerr << "cjax warning: sharded jit, " << p.where() << ": " << msg << "\n";
  }
  std::vector<Array> outs = cjax::bind(*eqn.primitive, locals, eqn.params);
  std::vector<Value> r;
  for (const Array& o : outs) r.push_back(Value{o, Layout::replicated(size_t(o.ndim()))});
  return r;
}

namespace {
// What the elementwise equations of `jaxpr` need: Partitioner::reduced_anyway, and the
// Partitioner::reduce_peers of those variables: a walk along the
// elementwise equations of the variable's shape that read it or what they made of it (at most
// kSteps on), collecting the other variables of that shape they read, each followed by the
// variables of that shape it is made of (a few elementwise equations back: `b1 * m` may be
// traced after `(1 - b1) * g`, while m, an argument, is there from the start).
void look_ahead(Partitioner& p, const Jaxpr& jaxpr) {
  constexpr int kSteps = 4, kBack = 3;
  std::unordered_map<const void*, std::vector<const JaxprEqn*>> readers;
  std::unordered_map<const void*, const JaxprEqn*> maker;
  for (const JaxprEqn& eqn : jaxpr.eqns()) {
    if (eqn.primitive->kind != PrimKind::Elementwise) continue;
    for (size_t i = 0; i < eqn.inputs.size(); ++i)
      if (auto* v = std::get_if<Var>(&eqn.inputs[i]); v && !elementwise_linear_in(eqn, i))
        p.reduced_anyway.insert(v->id());
    if (eqn.outputs.size() != 1) continue;
    maker[eqn.outputs[0].id()] = &eqn;
    for (const Atom& a : eqn.inputs)
      if (auto* v = std::get_if<Var>(&a)) readers[v->id()].push_back(&eqn);
  }
  auto add_with_sources = [&](std::vector<const void*>& peers, const Var& w,
                              const std::unordered_set<const void*>& not_these) {
    std::vector<const void*> level{w.id()};
    peers.push_back(w.id());
    for (int back = 0; back < kBack && !level.empty(); ++back) {
      std::vector<const void*> up;
      for (const void* x : level) {
        auto m = maker.find(x);
        if (m == maker.end()) continue;
        for (const Atom& b : m->second->inputs)
          if (auto* y = std::get_if<Var>(&b); y && !not_these.count(y->id()) && y->aval().shape == w.aval().shape) {
            peers.push_back(y->id());
            up.push_back(y->id());
          }
      }
      level = std::move(up);
    }
  };
  for (const JaxprEqn& eqn : jaxpr.eqns())
    for (const Atom& a : eqn.inputs) {
      auto* g = std::get_if<Var>(&a);
      if (!g || !p.reduced_anyway.count(g->id()) || p.reduce_peers.count(g->id())) continue;
      std::vector<const void*>& peers = p.reduce_peers[g->id()];
      std::unordered_set<const void*> derived{g->id()};
      std::vector<const void*> frontier{g->id()};
      for (int step = 0; step < kSteps && !frontier.empty(); ++step) {
        std::vector<const void*> next;
        for (const void* d : frontier) {
          auto r = readers.find(d);
          if (r == readers.end()) continue;
          for (const JaxprEqn* q : r->second) {
            if (q->outputs[0].aval().shape != g->aval().shape) continue;
            for (const Atom& b : q->inputs)
              if (auto* w = std::get_if<Var>(&b); w && !derived.count(w->id()) && w->aval().shape == g->aval().shape)
                add_with_sources(peers, *w, derived);
            if (derived.insert(q->outputs[0].id()).second) next.push_back(q->outputs[0].id());
          }
        }
        frontier = std::move(next);
      }
    }
}
}  // namespace

std::vector<Value> run_jaxpr(Partitioner& p, const Jaxpr& jaxpr, const std::vector<Value>& consts,
                             const std::vector<Value>& args) {
  std::unordered_map<const void*, Value> env;
  for (size_t i = 0; i < consts.size(); ++i) env[jaxpr.constvars()[i].id()] = consts[i];
  for (size_t i = 0; i < args.size(); ++i) env[jaxpr.invars()[i].id()] = args[i];
  auto read = [&](const Atom& a) -> Value {
    if (auto* l = std::get_if<Literal>(&a)) return Value{l->value(), Layout::replicated(0)};
    return env.at(std::get<Var>(a).id());
  };
  look_ahead(p, jaxpr);
  struct EnvScope {  // a control-flow body's run_jaxpr restores its caller's
    Partitioner& p;
    const std::unordered_map<const void*, Value>* outer;
    ~EnvScope() { p.env = outer; }
  } env_scope{p, p.env};
  p.env = &env;
  for (const JaxprEqn& eqn : jaxpr.eqns()) {
    std::vector<Value> ins;
    for (const Atom& a : eqn.inputs) ins.push_back(read(a));
    SourceInfoOverride source(eqn.source_info);
    p.current = &eqn;
    const ShardingRule* rule = find_sharding_rule(*eqn.primitive);
    std::vector<Value> outs = rule ? (*rule)(p, eqn, ins) : run_replicated(p, eqn, ins);
    EquationLayout el;
    el.primitive = eqn.primitive->name;
    el.source_info = eqn.source_info;
    for (size_t k = 0; k < outs.size(); ++k) {
      const AbstractValue& g = eqn.outputs[k].aval();
      Shape want = p.local_shape(g.shape, outs[k].layout);
      if (outs[k].local.shape() != want || outs[k].local.dtype() != g.dtype)
        throw Error(fmt::format("internal: sharded jit rule of '{}' gave a block {} for {} laid out {} (expected {})",
                                eqn.primitive->name, outs[k].local.aval().str(), g.str(), outs[k].layout.str(),
                                shape_str(want)));
      env[eqn.outputs[k].id()] = outs[k];
      p.remember_source(outs[k].local, eqn.source_info);
      el.global.push_back(g);
      el.layouts.push_back(outs[k].layout);
    }
    p.layouts.push_back(std::move(el));
    p.current = nullptr;
  }
  std::vector<Value> outs;
  for (const Atom& a : jaxpr.outvars()) outs.push_back(read(a));
  return outs;
}

bool contains_primitive(const Jaxpr& jaxpr, std::string_view primitive) {
  for (const JaxprEqn& e : jaxpr.eqns()) {
    if (e.primitive->name == primitive) return true;
    for (const Jaxpr* sub : jaxprs_in_params(e.params))
      if (contains_primitive(*sub, primitive)) return true;
  }
  return false;
}

Partitioned partition(const ClosedJaxpr& jaxpr, const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                      const std::vector<std::optional<PartitionSpec>>& out_specs, const std::string& name) {
  std::shared_ptr<const Jaxpr> flat = inline_calls(*jaxpr);
  Partitioned result;
  std::vector<AbstractValue> in_avals = jaxpr.in_avals();
  std::vector<PartitionSpec> specs_out;
  std::vector<std::string> arg_names;
  for (size_t i = 0; i < in_avals.size(); ++i) arg_names.push_back("argument leaf " + std::to_string(i));
  result.program = jaxpr_detail::trace_flat(
      [&](const std::vector<Array>& xs) {
        shard_map_detail::FlatFn body = [&](const std::vector<Array>& blocks) {
          Partitioner p(mesh);
          std::vector<Value> consts, args;
          for (const Array& c : jaxpr.consts) consts.push_back(Value{c, Layout::replicated(size_t(c.ndim()))});
          for (size_t i = 0; i < blocks.size(); ++i)
            args.push_back(Value{blocks[i], p.layout(in_specs[i], size_t(blocks[i].ndim()))});
          std::vector<Value> outs = run_jaxpr(p, *flat, consts, args);
          std::vector<Array> locals;
          specs_out.clear();
          for (size_t k = 0; k < outs.size(); ++k) {
            Value v = outs[k];
            p.context = fmt::format("output {} ({})", k, jaxpr->out_avals()[k].str());
            std::optional<SourceInfoOverride> source;  // e.g. a gradient's reduce-scatter: backward
            if (auto producer = p.source_of(v.local)) source.emplace(std::move(producer));
            if (k >= out_specs.size() || !out_specs[k]) v = p.reduced(v);
            if (k < out_specs.size() && out_specs[k]) {
              size_t rank = size_t(v.local.ndim());
              if (out_specs[k]->size() > rank)
                throw ShardingError(
                    fmt::format("sharded jit '{}': out_shardings entry {} is {}, longer than the rank "
                                "{} of output {}",
                                name, k, out_specs[k]->str(), rank, k));
              p.current = nullptr;
              v = p.reshard(v, p.layout(*out_specs[k], rank));
            }
            // As asked (the same blocks as the layout, which leaves out axes of size 1).
            specs_out.push_back(k < out_specs.size() && out_specs[k] ? *out_specs[k] : v.layout.spec());
            locals.push_back(v.local);
          }
          result.inserted = std::move(p.inserted);
          result.layouts = std::move(p.layouts);
          result.run_whole = std::move(p.run_whole);
          return locals;
        };
        ShardMapOptions opts;
        opts.check_vma = false;
        opts.name = name;
        return shard_map_detail::shard_map(body, mesh, xs, in_specs, arg_names, specs_out, opts);
      },
      in_avals, "sharded jit '" + name + "'");
  result.out_specs = specs_out;
  return result;
}

}  // namespace cjax::partition
