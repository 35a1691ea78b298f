// The jaxpr IR (docs/design.md §3): typed variables, literals, equations, jaxprs and closed jaxprs.
// Immutable once built. The printer reproduces JAX's text exactly (jax/_src/core.py pp_jaxpr,
// laid out by a port of JAX's pretty printer, jaxlib/_pretty_printer.cc, at width 80):
//
//   { lambda a:f32[3]; b:f32[3] c:f32[]. let
//       d:f32[3] = mul b 2.0:f32[]
//       e:f32[3] = add d a
//     in (e,) }
//
// Variables are named in order of first appearance in the text (constvars, invars, then each
// equation's outputs, params and inputs), a..z, ba, bb, ... as JAX does; an equation output that
// nothing uses prints as `_`.
#pragma once
#include <iosfwd>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "cjax/make_jaxpr.h"  // ClosedJaxpr
#include "core/array/primitive.h"
#include "trace/source_info.h"

namespace cjax {

// A variable: identity is the node's address; it carries its abstract value.
class Var {
 public:
  Var() = default;
  explicit Var(AbstractValue aval) : node_(std::make_shared<const Node>(Node{std::move(aval)})) {}
  const AbstractValue& aval() const { return node_->aval; }
  const void* id() const { return node_.get(); }
  bool defined() const { return node_ != nullptr; }
  bool operator==(const Var& o) const { return node_ == o.node_; }

 private:
  struct Node {
    AbstractValue aval;
  };
  std::shared_ptr<const Node> node_;
};

// A concrete rank-0 value inlined into an equation, as JAX inlines Python and NumPy scalars.
class Literal {
 public:
  explicit Literal(Array value);
  const Array& value() const { return value_; }
  const AbstractValue& aval() const { return value_.aval(); }
  std::string value_str() const;  // JAX's text: str(np.asarray(val).item()): "2.0", "1e-05", "3", "True"

 private:
  Array value_;
};

using Atom = std::variant<Var, Literal>;
const AbstractValue& atom_aval(const Atom& a);

struct JaxprEqn {
  const PrimitiveDef* primitive = nullptr;
  std::vector<Atom> inputs;
  std::vector<Var> outputs;
  Params params;
  // The user's call site (trace/source_info.h); printed only on request, as in JAX.
  std::shared_ptr<const SourceInfo> source_info;
};

class Jaxpr {
 public:
  Jaxpr(std::vector<Var> constvars, std::vector<Var> invars, std::vector<JaxprEqn> eqns, std::vector<Atom> outvars)
      : constvars_(std::move(constvars)),
        invars_(std::move(invars)),
        eqns_(std::move(eqns)),
        outvars_(std::move(outvars)) {}
  const std::vector<Var>& constvars() const { return constvars_; }
  const std::vector<Var>& invars() const { return invars_; }
  const std::vector<JaxprEqn>& eqns() const { return eqns_; }
  const std::vector<Atom>& outvars() const { return outvars_; }
  std::vector<AbstractValue> in_avals() const;
  std::vector<AbstractValue> out_avals() const;
  // JAX's text (str(jaxpr)); `width` is the line width of the layout, 80 as in JAX. With
  // `source_info` each equation ends with `  # file:line (function)` (JAX's print_source_info).
  std::string pretty_print(int width = 80, bool source_info = false) const;

 private:
  std::vector<Var> constvars_, invars_;
  std::vector<JaxprEqn> eqns_;
  std::vector<Atom> outvars_;
};

std::ostream& operator<<(std::ostream&, const Jaxpr&);

// A parameter holding a sub-jaxpr (higher-order primitives: jit, shard_map, cond, scan, ...).
// The printer lays it out inline, sharing the enclosing jaxpr's variable names, as JAX does;
// `str()` prints it on its own.
struct JaxprParam final : ParamObject {
  explicit JaxprParam(std::shared_ptr<const Jaxpr> j) : jaxpr(std::move(j)) {}
  std::shared_ptr<const Jaxpr> jaxpr;
  std::string str() const override { return jaxpr->pretty_print(); }
  size_t hash() const override { return std::hash<const void*>()(jaxpr.get()); }
  bool equals(const ParamObject& o) const override {
    auto* p = dynamic_cast<const JaxprParam*>(&o);
    return p && p->jaxpr == jaxpr;
  }
};

// A parameter holding a tuple of sub-jaxprs (cond's `branches`), printed as JAX's pp_jaxprs:
//   branches=(
//     { lambda ; a:f32[]. let b:f32[] = neg a in (b,) }
//     { lambda ; c:f32[]. let d:f32[] = sin c in (d,) }
//   )
struct JaxprListParam final : ParamObject {
  explicit JaxprListParam(std::vector<std::shared_ptr<const Jaxpr>> js) : jaxprs(std::move(js)) {}
  std::vector<std::shared_ptr<const Jaxpr>> jaxprs;
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& o) const override {
    auto* p = dynamic_cast<const JaxprListParam*>(&o);
    return p && p->jaxprs == jaxprs;
  }
};

// Dead-code elimination: equations none of whose outputs is used are dropped (collectives and
// effectful equations stay). Constvars, invars and outvars are kept.
std::shared_ptr<const Jaxpr> dce(const Jaxpr& jaxpr);

// The sub-jaxprs an equation's params hold (a call's body, cond's branches, ...), in param order.
std::vector<const Jaxpr*> jaxprs_in_params(const Params& params);

// Python's repr of a float ("2.0", "0.10000000149011612", "1e-05", "inf", "nan").
std::string python_float_repr(double v);

}  // namespace cjax
