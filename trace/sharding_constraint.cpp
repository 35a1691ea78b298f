// with_sharding_constraint (JAX's jax.lax.with_sharding_constraint, docs/sharding.md §1.3).
// Eagerly it is device_put. Under jit, grad, vmap or make_jaxpr it stages the primitive
//
//   b:f32[8] = sharding_constraint[sharding=NamedSharding(mesh=Mesh('x': 4), spec=P('x',), ...)] a
//
// which is the identity on values with the sharding recorded in its parameters (where a sharding
// propagation pass will read it); when the staged program runs, the kernel reshards its operand
// to that sharding, so the result is laid out as asked. Its JVP and transpose apply the same
// constraint to tangents and cotangents (JAX does too); under vmap the batch dimension leads and
// is not split (a leading None in the spec).
#include "trace/sharding_constraint.h"

#include <fmt/format.h>

#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/array/primitive.h"
#include "core/array/rules.h"
#include "core/array/spmd.h"
#include "core/array/trace.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

struct ShardingParam final : ParamObject {
  explicit ShardingParam(std::shared_ptr<const Sharding> s) : sharding(std::move(s)) {}
  std::shared_ptr<const Sharding> sharding;
  std::string str() const override { return sharding->str(); }
  size_t hash() const override {
    if (auto* n = dynamic_cast<const NamedSharding*>(sharding.get())) return n->hash();
    return std::hash<int>()(static_cast<const SingleDeviceSharding&>(*sharding).device().id());
  }
  bool equals(const ParamObject& o) const override {
    auto* p = dynamic_cast<const ShardingParam*>(&o);
    if (!p) return false;
    auto* a = dynamic_cast<const NamedSharding*>(sharding.get());
    auto* b = dynamic_cast<const NamedSharding*>(p->sharding.get());
    if (a || b) return a && b && *a == *b;
    return static_cast<const SingleDeviceSharding&>(*sharding).device() ==
           static_cast<const SingleDeviceSharding&>(*p->sharding).device();
  }
};

std::shared_ptr<const Sharding> copy_sharding(const Sharding& s) {
  if (auto* n = dynamic_cast<const NamedSharding*>(&s)) return std::make_shared<NamedSharding>(*n);
  if (auto* d = dynamic_cast<const SingleDeviceSharding*>(&s)) return std::make_shared<SingleDeviceSharding>(*d);
  throw ShardingError(fmt::format("with_sharding_constraint: unsupported sharding {}", s.str()));
}

const Sharding& sharding_of(const Params& p) { return *p.object<ShardingParam>("sharding")->sharding; }
Params params_of(std::shared_ptr<const Sharding> s) {
  return {{"sharding", std::make_shared<ShardingParam>(std::move(s))}};
}

PrimitiveDef make_def() {
  PrimitiveDef def;
  def.name = "sharding_constraint";
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    if (auto* n = dynamic_cast<const NamedSharding*>(&sharding_of(p))) n->check_shape(in[0].shape());
    return {in[0].aval()};
  };
  def.takes_sharded_operands = true;  // a reshard: whatever the layout
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    if (current_spmd())  // a per-device block inside a running shard_map body: nothing to place
      return std::vector<Array>{in[0]};
    return std::vector<Array>{device_put(in[0], sharding_of(p))};
  };
  return def;
}

const PrimitiveDef& g_sharding_constraint = register_primitive(make_def());
}  // namespace

const Sharding& sharding_constraint_target(const Params& p) { return sharding_of(p); }

namespace {

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("sharding_constraint");
  r.jvp = [](std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
    std::vector<Array> out = cjax::bind(g_sharding_constraint, primals, p);
    if (!tangents[0].defined()) return JvpOut{out, {Array()}};
    return JvpOut{out, {bind1(g_sharding_constraint, tangents, p)}};
  };
  r.transpose = [](std::span<const Array> cts, std::span<const Array>, const Params& p) -> std::vector<Array> {
    if (!cts[0].defined()) return {Array()};
    return {bind1(g_sharding_constraint, cts, p)};
  };
  r.batch = [](std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
    if (bdims[0] == kNotMapped) return BatchOut{{bind1(g_sharding_constraint, args, p)}, {kNotMapped}};
    Array x = move_bdim(args[0], bdims[0], 0, axis.size);
    std::shared_ptr<const Sharding> s = copy_sharding(sharding_of(p));
    if (auto* n = dynamic_cast<const NamedSharding*>(s.get())) {  // the batch dimension leads, unsplit
      std::vector<PartitionSpec::Entry> entries{PartitionSpec::Entry(None)};
      if (!axis.spmd_axis_name.empty() && n->mesh().axis_index(axis.spmd_axis_name) >= 0)
        entries[0] = PartitionSpec::Entry(axis.spmd_axis_name);
      entries.insert(entries.end(), n->spec().entries().begin(), n->spec().entries().end());
      s = std::make_shared<NamedSharding>(n->mesh(), PartitionSpec(std::move(entries)));
    }
    return BatchOut{{bind1(g_sharding_constraint, {x}, params_of(s))}, {0}};
  };
});

}  // namespace

Array with_sharding_constraint(const Array& x, const Sharding& sharding) {
  if (!x.defined()) throw ValueError("with_sharding_constraint received an empty Array handle");
  if (!manual_axes_in_scope().empty())
    throw ShardingError(
        fmt::format("with_sharding_constraint({}) inside a shard_map body: there every mesh axis of the shard_map is "
                    "manual and "
                    "a value is one device's block; constrain the arguments or results of the shard_map instead",
                    sharding.str()));
  std::shared_ptr<const Sharding> s = copy_sharding(sharding);
  if (current_trace() == eval_trace() && x.impl()->is_concrete()) return device_put(x, *s);
  return bind1(g_sharding_constraint, {x}, params_of(std::move(s)));
}

}  // namespace cjax
