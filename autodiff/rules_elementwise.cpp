// JVP, transpose and batching rules of the elementwise primitives (core/elementwise.cpp).
#include "autodiff/rule_helpers.h"

namespace cjax {
namespace {

const bool registered = add_rule_initializer([] {
  using namespace rule_helpers;
  def_unary_jvp("neg", [](const Array&, const Array& t) { return lax::neg(t); });
  def_unary_jvp("sin", [](const Array& x, const Array& t) { return lax::mul(t, lax::cos(x)); });
  def_unary_jvp("cos", [](const Array& x, const Array& t) { return lax::mul(t, lax::neg(lax::sin(x))); });
  define_rules("neg").transpose = [](std::span<const Array> cts, std::span<const Array>, const Params&) {
    return std::vector<Array>{lax::neg(cts[0])};
  };
  define_rules("add").jvp = [](std::span<const Array> p, std::span<const Array> t, const Params&) {
    Array out = lax::add(p[0], p[1]);
    Array t0 = t[0].defined() ? broadcast_to_aval(t[0], out.aval()) : Array();
    Array t1 = t[1].defined() ? broadcast_to_aval(t[1], out.aval()) : Array();
    return JvpOut{{out}, {add_tangents(t0, t1)}};
  };
  define_rules("add").transpose = [](std::span<const Array> cts, std::span<const Array> args, const Params&) {
    return std::vector<Array>{is_undefined_primal(args[0]) ? unbroadcast(cts[0], args[0].aval()) : Array(),
                              is_undefined_primal(args[1]) ? unbroadcast(cts[0], args[1].aval()) : Array()};
  };
  define_rules("mul").jvp = [](std::span<const Array> p, std::span<const Array> t, const Params&) {
    Array out = lax::mul(p[0], p[1]);
    Array a = t[0].defined() ? lax::mul(t[0], p[1]) : Array();
    Array b = t[1].defined() ? lax::mul(p[0], t[1]) : Array();
    return JvpOut{{out}, {add_tangents(a, b)}};
  };
  define_rules("mul").transpose = [](std::span<const Array> cts, std::span<const Array> args, const Params&) {
    std::vector<Array> r(2);
    if (is_undefined_primal(args[0])) r[0] = unbroadcast(lax::mul(cts[0], args[1]), args[0].aval());
    if (is_undefined_primal(args[1])) r[1] = unbroadcast(lax::mul(args[0], cts[0]), args[1].aval());
    return r;
  };
  define_rules("stop_gradient").jvp = [](std::span<const Array> p, std::span<const Array>, const Params&) {
    return JvpOut{{lax::stop_gradient(p[0])}, {Array()}};
  };
  for (const PrimitiveDef* def : all_primitives()) {
    if (!def->scalar_op && def->name != "stop_gradient" && def->name != "add_any") continue;
    define_rules(def->name).batch = [def](std::span<const Array> a, std::span<const int> d, const BatchAxis& axis,
                                          const Params& p) { return batch_elementwise(*def, a, d, axis, p); };
  }
});

}  // namespace
}  // namespace cjax
