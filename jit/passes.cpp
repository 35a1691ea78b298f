#include "jit/passes.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "trace/eval_jaxpr.h"
#include "trace/shard_map.h"
#include "core/array/trace.h"

namespace cjax {
namespace {

// Variable renaming applied to equation inputs and outvars.
struct Subst {
  std::unordered_map<const void*, Atom> map;
  Atom operator()(const Atom& a) const {
    if (auto* v = std::get_if<Var>(&a)) {
      auto it = map.find(v->id());
      if (it != map.end()) return it->second;
    }
    return a;
  }
  std::vector<Atom> all(const std::vector<Atom>& as) const {
    std::vector<Atom> out;
    out.reserve(as.size());
    for (const Atom& a : as) out.push_back((*this)(a));
    return out;
  }
};

// The body of a call equation that, at run time, means just its body: a nested jit, a remat
// (rematerialization is decided when the backward pass is built; what runs is the body), and
// custom_jvp_call / custom_vjp_call (their rules only matter to transformations, which are done
// by now). Inlined, their equations fuse with the rest of the program.
const Jaxpr* inlinable_body(const JaxprEqn& e) {
  const std::string& n = e.primitive->name;
  if (n == "jit" || n == "remat2") return e.params.object<JaxprParam>("jaxpr")->jaxpr.get();
  if (n == "custom_jvp_call" || n == "custom_vjp_call") return e.params.object<JaxprParam>("call_jaxpr")->jaxpr.get();
  return nullptr;
}

// Appends `body`'s equations to `out` with its invars bound to `args`, inlining nested jits;
// `results` receives its outvars.
void inline_into(const Jaxpr& body, const std::vector<Atom>& args, std::vector<JaxprEqn>& out,
                 std::vector<Atom>& results) {
  Subst s;
  for (size_t i = 0; i < body.invars().size(); ++i) s.map[body.invars()[i].id()] = args[i];
  for (const JaxprEqn& e : body.eqns()) {
    std::vector<Atom> ins = s.all(e.inputs);
    if (const Jaxpr* inner = inlinable_body(e)) {
      std::vector<Atom> rs;
      inline_into(*inner, ins, out, rs);
      for (size_t i = 0; i < e.outputs.size(); ++i) s.map[e.outputs[i].id()] = rs[i];
      continue;
    }
    JaxprEqn c = e;
    c.inputs = std::move(ins);
    out.push_back(std::move(c));
  }
  results = s.all(body.outvars());
}

size_t atom_hash(const Atom& a) {
  if (auto* v = std::get_if<Var>(&a)) return std::hash<const void*>()(v->id());
  const Literal& l = std::get<Literal>(a);
  return absl::HashOf(l.value_str(), int(l.aval().dtype));
}
bool atom_eq(const Atom& a, const Atom& b) {
  auto* va = std::get_if<Var>(&a);
  auto* vb = std::get_if<Var>(&b);
  if (va || vb) return va && vb && *va == *vb;
  const Literal &la = std::get<Literal>(a), &lb = std::get<Literal>(b);
  return la.aval() == lb.aval() && la.value_str() == lb.value_str();
}

std::unordered_map<const void*, int> count_uses(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses;
  for (const JaxprEqn& e : jaxpr.eqns())
    for (const Atom& a : e.inputs)
      if (auto* v = std::get_if<Var>(&a)) ++uses[v->id()];
  for (const Atom& a : jaxpr.outvars())
    if (auto* v = std::get_if<Var>(&a)) ++uses[v->id()];
  return uses;
}
const PrimitiveDef& dot_general_accumulate() {
  static const PrimitiveDef& def = *find_primitive("dot_general_accumulate");
  return def;
}

}  // namespace

std::shared_ptr<const Jaxpr> inline_calls(const Jaxpr& jaxpr) {
  bool any = false;
  for (const JaxprEqn& e : jaxpr.eqns()) any = any || inlinable_body(e);
  if (!any) return std::make_shared<const Jaxpr>(jaxpr);
  std::vector<Atom> args(jaxpr.invars().begin(), jaxpr.invars().end());  // bound to themselves
  std::vector<JaxprEqn> eqns;
  std::vector<Atom> results;
  inline_into(jaxpr, args, eqns, results);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), std::move(results));
}

namespace {
// out = broadcast_in_dim(src) with broadcast_dimensions `dims`.
JaxprEqn broadcast_eqn(const Atom& src, const Var& out, const std::vector<int64_t>& dims) {
  JaxprEqn b;
  b.primitive = find_primitive("broadcast_in_dim");
  b.inputs = {src};
  b.outputs = {out};
  b.params = Params{{"shape", out.aval().shape}, {"broadcast_dimensions", dims}, {"sharding", std::monostate{}}};
  return b;
}
// Whether `e` is broadcast_in_dim of a variable (not of a literal).
bool broadcasts_a_var(const JaxprEqn& e) {
  return e.primitive->name == "broadcast_in_dim" && std::holds_alternative<Var>(e.inputs[0]);
}
// `out` = broadcast_in_dim of the scalar literal `value` to out's shape.
JaxprEqn splat_eqn(const Literal& value, const Var& out) { return broadcast_eqn(value, out, {}); }
// Records in `splat_of` the vars that broadcast a scalar literal (through pvary too).
void track_splat(const JaxprEqn& e, std::unordered_map<const void*, Literal>& splat_of) {
  const std::string& name = e.primitive->name;
  if (name == "broadcast_in_dim" && std::holds_alternative<Literal>(e.inputs[0]) && atom_aval(e.inputs[0]).ndim() == 0)
    splat_of.emplace(e.outputs[0].id(), std::get<Literal>(e.inputs[0]));
  if (name == "pvary" && e.inputs.size() == 1 && std::holds_alternative<Var>(e.inputs[0]))
    if (auto it = splat_of.find(std::get<Var>(e.inputs[0]).id()); it != splat_of.end())
      splat_of.emplace(e.outputs[0].id(), it->second);
}

// Whether every element of a single-buffer array has the bytes of the first.
bool uniform(const Array& c) {
  ConcreteArray* ca = concrete(c);
  if (!ca || ca->buffers.size() != 1 || c.size() < 2) return false;
  const auto* p = static_cast<const unsigned char*>(ca->buffers[0]->data());
  size_t es = itemsize(c.dtype()), n = size_t(c.size());
  for (size_t i = 1; i < n; ++i)
    if (std::memcmp(p, p + i * es, es) != 0) return false;
  return true;
}
}  // namespace

std::shared_ptr<const Jaxpr> splat_constants(const Jaxpr& jaxpr, const std::vector<Array>& consts) {
  std::vector<JaxprEqn> eqns;
  Subst s;
  for (size_t i = 0; i < jaxpr.constvars().size() && i < consts.size(); ++i) {
    const Var& cv = jaxpr.constvars()[i];
    if (consts[i].ndim() == 0 || cv.aval().shape != consts[i].shape()) continue;
    // A constant on a device (created under CJAX_PLATFORM=cuda) is read through a host copy.
    ConcreteArray* cc = concrete(consts[i]);
    Array c = cc && cc->buffers.size() == 1 && !host_accessible(cc->device()) ? to_host(consts[i]) : consts[i];
    if (!uniform(c)) continue;
    Array scalar;
    {
      TraceScope scope(eval_trace());
      scalar = lax::reshape(lax::slice(c, Shape(size_t(c.ndim()), 0), Shape(size_t(c.ndim()), 1)), {});
    }
    eqns.push_back(splat_eqn(Literal(scalar), Var(cv.aval())));
    s.map[cv.id()] = eqns.back().outputs[0];
  }
  if (eqns.empty()) return std::make_shared<const Jaxpr>(jaxpr);
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

std::shared_ptr<const Jaxpr> sink_broadcasts(const Jaxpr& jaxpr) {
  auto elementwise = [](const JaxprEqn& e) {
    const std::string& n = e.primitive->name;
    return e.outputs.size() == 1 && (e.primitive->scalar_op || n == "integer_pow" || n == "convert_element_type" ||
                                     n == "select_n" || n == "add_any");
  };
  std::unordered_map<const void*, JaxprEqn> broadcast_of;  // a var -> the broadcast_in_dim defining it
  std::unordered_map<const void*, Literal> splat_of;        // a var -> the scalar literal it broadcasts
  std::vector<JaxprEqn> eqns;
  std::function<void(JaxprEqn)> emit = [&](JaxprEqn e) {
    if (broadcasts_a_var(e)) broadcast_of[e.outputs[0].id()] = e;
    track_splat(e, splat_of);
    if (elementwise(e)) {
      const JaxprEqn* first = nullptr;
      bool ok = true;
      for (const Atom& a : e.inputs) {
        if (auto* l = std::get_if<Literal>(&a)) {
          ok = ok && l->aval().ndim() == 0;
          continue;
        }
        if (splat_of.count(std::get<Var>(a).id())) continue;
        auto it = broadcast_of.find(std::get<Var>(a).id());
        if (it == broadcast_of.end()) {
          ok = false;
          break;
        }
        const JaxprEqn& b = it->second;
        if (!first) first = &b;
        else ok = ok && b.params == first->params && atom_aval(b.inputs[0]).shape == atom_aval(first->inputs[0]).shape;
      }
      if (ok && first && atom_aval(first->inputs[0]).shape != e.outputs[0].aval().shape) {
        JaxprEqn inner = e;
        for (Atom& a : inner.inputs)
          if (auto* v = std::get_if<Var>(&a)) {
            auto splat = splat_of.find(v->id());
            a = splat != splat_of.end() ? Atom(splat->second) : broadcast_of.at(v->id()).inputs[0];
          }
        AbstractValue av = e.outputs[0].aval();
        av.shape = atom_aval(first->inputs[0]).shape;
        inner.outputs = {Var(av)};
        JaxprEqn outer = *first;
        outer.inputs = {inner.outputs[0]};
        outer.outputs = e.outputs;
        outer.source_info = e.source_info;
        emit(std::move(inner));
        emit(std::move(outer));
        return;
      }
    }
    eqns.push_back(std::move(e));
  };
  for (const JaxprEqn& e : jaxpr.eqns()) emit(e);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

namespace {
// The spec of a broadcast_in_dim operand (shape `src`, dims `dims` into shape `dst`) whose result
// has spec `spec`, when every sharded result dimension is one of the operand's (not expanded):
// the operand's blocks then broadcast to the result's blocks. nullopt otherwise.
std::optional<PartitionSpec> spec_through_broadcast(const PartitionSpec& spec, const Shape& src, const Shape& dst,
                                                    const std::vector<int64_t>& dims) {
  auto entry = [&](size_t d) { return d < spec.size() ? spec.entries()[d] : PartitionSpec::Entry(None); };
  std::vector<PartitionSpec::Entry> out;
  for (size_t k = 0; k < src.size(); ++k) out.push_back(src[k] == dst[size_t(dims[k])] ? entry(size_t(dims[k])) : None);
  for (size_t d = 0; d < dst.size(); ++d) {
    if (entry(d).names.empty()) continue;
    auto k = std::find(dims.begin(), dims.end(), int64_t(d));
    if (k == dims.end() || src[size_t(k - dims.begin())] != dst[d]) return std::nullopt;
  }
  return PartitionSpec(std::move(out));
}
}  // namespace

std::shared_ptr<const Jaxpr> unbroadcast_shard_map_boundaries(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, JaxprEqn> broadcast_of;  // top-level var -> its broadcast_in_dim of a var
  std::unordered_map<const void*, Literal> splat_of;        // top-level var -> the scalar literal it broadcasts
  std::vector<JaxprEqn> eqns;
  bool changed = false;
  for (const JaxprEqn& e0 : jaxpr.eqns()) {
    if (broadcasts_a_var(e0)) broadcast_of[e0.outputs[0].id()] = e0;
    track_splat(e0, splat_of);
    if (e0.primitive != &g_shard_map) {
      eqns.push_back(e0);
      continue;
    }
    JaxprEqn e = e0;
    ShardMapInfo info = ShardMapInfo::from(e.params);
    std::shared_ptr<const Jaxpr> sunk = sink_broadcasts(*info.body);  // broadcasts last, where they can be
    const Jaxpr& body = *sunk;
    std::vector<Var> invars = body.invars();
    std::vector<JaxprEqn> prologue;  // body: broadcasts of the operands' sources
    std::vector<bool> dropped(e.inputs.size(), false);
    // Operands that are broadcasts: the body takes the source's blocks and broadcasts them; a
    // replicated broadcast scalar literal is built in the body and the operand dropped.
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      auto* v = std::get_if<Var>(&e.inputs[i]);
      if (auto splat = v ? splat_of.find(v->id()) : splat_of.end();
          splat != splat_of.end() && spec_vma(info.in_specs[i]).empty() && invars[i].aval().vma.empty()) {
        prologue.push_back(splat_eqn(splat->second, invars[i]));
        dropped[i] = true;
        continue;
      }
      auto it = v ? broadcast_of.find(v->id()) : broadcast_of.end();
      if (it == broadcast_of.end()) continue;
      const JaxprEqn& b = it->second;
      const Var& src = std::get<Var>(b.inputs[0]);
      const auto& dims = b.params.ints("broadcast_dimensions");
      auto src_spec = spec_through_broadcast(info.in_specs[i], src.aval().shape, v->aval().shape, dims);
      if (!src_spec) continue;
      AbstractValue block = invars[i].aval();
      block.shape = block_shape(info.mesh, *src_spec, src.aval().shape);
      block.dtype = src.aval().dtype;
      Var src_block(block);
      prologue.push_back(broadcast_eqn(src_block, invars[i], dims));
      invars[i] = src_block;
      info.in_specs[i] = *src_spec;
      e.inputs[i] = src;
    }
    // Outputs that are broadcasts in the body: the body returns the source; the caller broadcasts.
    std::unordered_map<const void*, const JaxprEqn*> body_broadcast;
    for (const JaxprEqn& be : body.eqns())
      if (broadcasts_a_var(be)) body_broadcast[be.outputs[0].id()] = &be;
    std::vector<Atom> outvars = body.outvars();
    std::vector<JaxprEqn> epilogue;  // caller: broadcasts of the returned sources
    for (size_t j = 0; j < outvars.size(); ++j) {
      auto* o = std::get_if<Var>(&outvars[j]);
      auto it = o ? body_broadcast.find(o->id()) : body_broadcast.end();
      if (it == body_broadcast.end()) continue;
      const Var& src = std::get<Var>(it->second->inputs[0]);
      const auto& dims = it->second->params.ints("broadcast_dimensions");
      auto src_spec = spec_through_broadcast(info.out_specs[j], src.aval().shape, o->aval().shape, dims);
      if (!src_spec) continue;
      std::vector<std::string> named = spec_vma(*src_spec);
      bool covered = true;
      for (const std::string& a : src.aval().vma) covered = covered && std::count(named.begin(), named.end(), a);
      if (!covered) continue;  // the source varies over an axis its spec would not name
      AbstractValue global = e.outputs[j].aval();
      global.shape = global_shape(info.mesh, *src_spec, src.aval().shape);
      global.dtype = src.aval().dtype;
      Var returned(global);
      epilogue.push_back(broadcast_eqn(returned, e.outputs[j], dims));
      e.outputs[j] = returned;
      outvars[j] = src;
      info.out_specs[j] = *src_spec;
    }
    if (prologue.empty() && epilogue.empty()) {
      eqns.push_back(e0);
      continue;
    }
    std::vector<Var> kept_invars;
    std::vector<PartitionSpec> kept_specs;
    std::vector<Atom> kept_inputs;
    for (size_t i = 0; i < e.inputs.size(); ++i)
      if (!dropped[i]) {
        kept_invars.push_back(invars[i]);
        kept_specs.push_back(info.in_specs[i]);
        kept_inputs.push_back(e.inputs[i]);
      }
    std::vector<JaxprEqn> body_eqns = std::move(prologue);
    body_eqns.insert(body_eqns.end(), body.eqns().begin(), body.eqns().end());
    // Nested shard_maps in the body get the same treatment (the splats just built reach them).
    std::shared_ptr<const Jaxpr> new_body = unbroadcast_shard_map_boundaries(
        Jaxpr(body.constvars(), std::move(kept_invars), std::move(body_eqns), std::move(outvars)));
    if (is_transposed_body(info.body.get())) mark_transposed_body(new_body);
    info.body = new_body;
    info.in_specs = std::move(kept_specs);
    e.inputs = std::move(kept_inputs);
    e.params = info.params();
    eqns.push_back(std::move(e));
    for (JaxprEqn& b : epilogue) {
      broadcast_of[b.outputs[0].id()] = b;
      eqns.push_back(std::move(b));
    }
    changed = true;
  }
  if (!changed) return std::make_shared<const Jaxpr>(jaxpr);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

std::shared_ptr<const Jaxpr> fold_constants(const Jaxpr& jaxpr) {
  std::vector<JaxprEqn> eqns;
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    std::vector<Atom> ins = s.all(e.inputs);
    bool foldable = !ins.empty() && e.primitive->kind != PrimKind::HigherOrder &&
                    e.primitive->kind != PrimKind::Collective && !e.primitive->effectful &&
                    find_implementation(*e.primitive, Platform::cpu);
    for (const Atom& a : ins) foldable = foldable && std::holds_alternative<Literal>(a);
    for (const Var& v : e.outputs) foldable = foldable && v.aval().ndim() == 0;
    if (foldable) {
      std::vector<Array> vals;
      for (const Atom& a : ins) vals.push_back(std::get<Literal>(a).value());
      std::vector<Array> outs;
      {
        TraceScope scope(eval_trace());
        outs = cjax::bind(*e.primitive, vals, e.params);
      }
      for (size_t i = 0; i < outs.size(); ++i) s.map[e.outputs[i].id()] = Literal(outs[i]);
      continue;
    }
    JaxprEqn c = e;
    c.inputs = std::move(ins);
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

std::shared_ptr<const Jaxpr> cse(const Jaxpr& jaxpr) {
  struct Key {
    const JaxprEqn* e;
  };
  auto hash = [](const Key& k) {
    size_t h = absl::HashOf(k.e->primitive, k.e->params.hash());
    for (const Atom& a : k.e->inputs) h = absl::HashOf(h, atom_hash(a));
    return h;
  };
  auto eq = [](const Key& a, const Key& b) {
    if (a.e->primitive != b.e->primitive || a.e->inputs.size() != b.e->inputs.size()) return false;
    for (size_t i = 0; i < a.e->inputs.size(); ++i)
      if (!atom_eq(a.e->inputs[i], b.e->inputs[i])) return false;
    return a.e->params == b.e->params;
  };
  std::unordered_map<Key, const JaxprEqn*, decltype(hash), decltype(eq)> seen(16, hash, eq);
  std::vector<JaxprEqn> eqns;
  eqns.reserve(jaxpr.eqns().size());
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    eqns.push_back(std::move(c));
  }
  std::vector<JaxprEqn> kept;
  for (JaxprEqn& e : eqns) {
    e.inputs = s.all(e.inputs);
    bool pure = e.primitive->kind != PrimKind::Collective && !e.primitive->effectful;
    if (pure) {
      auto [it, fresh] = seen.try_emplace(Key{&e}, &e);
      if (!fresh) {
        for (size_t i = 0; i < e.outputs.size(); ++i) s.map[e.outputs[i].id()] = it->second->outputs[i];
        continue;
      }
    }
    kept.push_back(e);
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(kept), s.all(jaxpr.outvars()));
}

std::shared_ptr<const Jaxpr> simplify_transposes(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::vector<JaxprEqn> eqns;
  std::unordered_map<const void*, size_t> dot_of;  // dot_general output -> its index in `eqns`
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    if (c.primitive->name == "transpose") {
      const std::vector<int64_t>& perm = c.params.ints("permutation");
      bool identity = true;
      for (size_t d = 0; d < perm.size(); ++d) identity = identity && perm[d] == int64_t(d);
      if (identity) {
        s.map[c.outputs[0].id()] = c.inputs[0];
        continue;
      }
      auto* v = std::get_if<Var>(&c.inputs[0]);
      auto it = v ? dot_of.find(v->id()) : dot_of.end();
      if (it != dot_of.end() && uses[v->id()] == 1) {
        // dot_general's result is (batch..., lhs free..., rhs free...): a transpose that swaps the
        // two free groups is the dot_general with its operands swapped.
        JaxprEqn& dot = eqns[it->second];
        auto dn = dot.params.object<DotDimsParam>("dimension_numbers");
        int64_t nb = int64_t(dn->lhs_batch.size());
        int64_t fl = atom_aval(dot.inputs[0]).ndim() - nb - int64_t(dn->lhs_contracting.size());
        int64_t fr = atom_aval(dot.inputs[1]).ndim() - nb - int64_t(dn->rhs_contracting.size());
        std::vector<int64_t> swap;
        for (int64_t d = 0; d < nb; ++d) swap.push_back(d);
        for (int64_t d = 0; d < fr; ++d) swap.push_back(nb + fl + d);
        for (int64_t d = 0; d < fl; ++d) swap.push_back(nb + d);
        if (swap == perm) {
          auto swapped = std::make_shared<DotDimsParam>();
          swapped->lhs_contracting = dn->rhs_contracting;
          swapped->rhs_contracting = dn->lhs_contracting;
          swapped->lhs_batch = dn->rhs_batch;
          swapped->rhs_batch = dn->lhs_batch;
          dot.params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(swapped)));
          std::swap(dot.inputs[0], dot.inputs[1]);
          dot.outputs = c.outputs;
          dot_of.erase(it);
          continue;
        }
      }
    }
    if (c.primitive->name == "dot_general") dot_of[c.outputs[0].id()] = eqns.size();
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

std::shared_ptr<const Jaxpr> fuse_gemm_updates(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::unordered_map<const void*, const JaxprEqn*> producer;
  for (const JaxprEqn& e : jaxpr.eqns())
    for (const Var& v : e.outputs) producer[v.id()] = &e;
  // The single-use equation producing `a`, if it is a `name` equation.
  auto single_use = [&](const Atom& a, const char* name) -> const JaxprEqn* {
    auto* v = std::get_if<Var>(&a);
    if (!v || uses[v->id()] != 1) return nullptr;
    auto it = producer.find(v->id());
    return it != producer.end() && it->second->primitive->name == name ? it->second : nullptr;
  };
  auto scalar_literal = [](const Atom& a, double* value) {
    auto* l = std::get_if<Literal>(&a);
    if (!l || l->aval().ndim() != 0 || !is_floating(l->aval().dtype)) return false;
    *value = l->value().item<double>();
    return true;
  };
  // The dot_general_accumulate equation replacing `e`, if `e` is such an update.
  auto fused_update = [&](const JaxprEqn& e) -> std::optional<JaxprEqn> {
    const std::string& name = e.primitive->name;
    if ((name != "sub" && name != "add") || e.inputs.size() != 2) return std::nullopt;
    // acc -/+ dot, acc -/+ dot * s, acc -/+ s * dot (and dot + acc, dot * s + acc for add).
    for (int side = 0; side < (name == "add" ? 2 : 1); ++side) {
      const Atom& acc = e.inputs[size_t(side)];
      const Atom& term = e.inputs[size_t(1 - side)];
      double scale = 1;
      const JaxprEqn* dot = single_use(term, "dot_general");
      if (!dot) {
        const JaxprEqn* mul = single_use(term, "mul");
        if (!mul) continue;
        for (int k = 0; k < 2 && !dot; ++k)
          if (scalar_literal(mul->inputs[size_t(1 - k)], &scale)) dot = single_use(mul->inputs[size_t(k)], "dot_general");
        if (!dot) continue;
      }
      // A broadcast accumulator (a bias) stays with the elementwise kernel that reads it
      // through a strided index map instead of materializing it for BLAS.
      if (auto* v = std::get_if<Var>(&acc);
          v && producer.count(v->id()) && producer[v->id()]->primitive->name == "broadcast_in_dim")
        continue;
      const AbstractValue& out = e.outputs[0].aval();
      DType dt = out.dtype;
      if ((dt != DType::float32 && dt != DType::float64) || atom_aval(acc) != out ||
          dot->outputs[0].aval().shape != out.shape || dot->outputs[0].aval().dtype != dt ||
          atom_aval(dot->inputs[0]).dtype != dt || atom_aval(dot->inputs[1]).dtype != dt)
        continue;
      JaxprEqn fused;
      fused.primitive = &dot_general_accumulate();
      fused.inputs = {dot->inputs[0], dot->inputs[1], acc};
      fused.outputs = e.outputs;
      fused.params.set("dimension_numbers", dot->params.at("dimension_numbers"));
      fused.params.set("alpha", name == "sub" ? -scale : scale);
      fused.source_info = e.source_info;
      return fused;
    }
    return std::nullopt;
  };
  std::vector<JaxprEqn> eqns;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    std::optional<JaxprEqn> fused = fused_update(e);
    eqns.push_back(fused ? std::move(*fused) : e);
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

std::shared_ptr<const Jaxpr> optimize(const Jaxpr& jaxpr) {
  auto j = inline_calls(jaxpr);
  j = unbroadcast_shard_map_boundaries(*j);
  j = sink_broadcasts(*j);
  j = fold_constants(*j);
  j = cse(*j);
  j = simplify_transposes(*j);
  j = fuse_gemm_updates(*j);
  return dce(*j);
}

}  // namespace cjax
