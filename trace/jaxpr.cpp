#include "trace/jaxpr.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <ostream>
#include <set>
#include <stack>
#include <unordered_map>
#include <unordered_set>

#include "core/array/array_impl.h"

namespace cjax {

// ---- values ------------------------------------------------------------------------------------

Literal::Literal(Array value) : value_(std::move(value)) {
  if (!concrete(value_) || value_.ndim() != 0)
    throw Error(fmt::format("internal: a jaxpr Literal must be a concrete rank-0 array, got {}",
                            value_.defined() ? value_.aval().str() : std::string("an empty handle")));
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string s(buf, res.ptr);  // "-1.2345e-05": shortest round-trip digits
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s.erase(0, 1);
  }
  size_t epos = s.find('e');
  int exp = std::stoi(s.substr(epos + 1));
  std::string digits = s.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int n = int(digits.size());
  std::string out;
  if (exp >= -4 && exp < 16) {  // Python's repr: fixed notation in this range
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (exp + 1 >= n) {
      out = digits + std::string(size_t(exp + 1 - n), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return sign + out;
}

std::string Literal::value_str() const {
  DType d = value_.dtype();
  if (d == DType::bool_) return value_.item<bool>() ? "True" : "False";
  if (is_floating(d)) return python_float_repr(value_.item<double>());
  if (is_unsigned_integer(d)) return std::to_string(value_.item<uint64_t>());
  return std::to_string(value_.item<int64_t>());
}

const AbstractValue& atom_aval(const Atom& a) {
  return std::visit([](const auto& x) -> const AbstractValue& { return x.aval(); }, a);
}

std::vector<AbstractValue> Jaxpr::in_avals() const {
  std::vector<AbstractValue> out;
  for (const Var& v : invars_) out.push_back(v.aval());
  return out;
}
std::vector<AbstractValue> Jaxpr::out_avals() const {
  std::vector<AbstractValue> out;
  for (const Atom& a : outvars_) out.push_back(atom_aval(a));
  return out;
}

// ---- pretty printer ------------------------------------------------------------------------------
// A port of JAX's pretty printer (jaxlib/_pretty_printer.cc: Lindig's "strictly pretty" algorithm;
// a group is laid out flat iff all of it fits in the rest of the line) restricted to what jaxprs
// use: text, concatenation, breaks, groups and nesting.
namespace {

struct Doc;
using DocP = std::shared_ptr<const Doc>;
struct Doc {
  enum class Kind : uint8_t { Nil, Text, Concat, Break, Group, Nest } kind;
  std::string text;  // Text; Break: its flat text
  std::vector<DocP> children;
  int indent = 0;  // Nest
};

DocP nil() { return std::make_shared<const Doc>(Doc{Doc::Kind::Nil, {}, {}, 0}); }
DocP text(std::string s) { return std::make_shared<const Doc>(Doc{Doc::Kind::Text, std::move(s), {}, 0}); }
DocP concat(std::vector<DocP> ch) { return std::make_shared<const Doc>(Doc{Doc::Kind::Concat, {}, std::move(ch), 0}); }
DocP brk(std::string s = " ") { return std::make_shared<const Doc>(Doc{Doc::Kind::Break, std::move(s), {}, 0}); }
DocP group(DocP d) { return std::make_shared<const Doc>(Doc{Doc::Kind::Group, {}, {std::move(d)}, 0}); }
DocP nest(int n, DocP d) { return std::make_shared<const Doc>(Doc{Doc::Kind::Nest, {}, {std::move(d)}, n}); }
DocP join(const DocP& sep, const std::vector<DocP>& docs) {
  if (docs.empty()) return nil();
  if (docs.size() == 1) return docs[0];
  std::vector<DocP> xs{docs[0]};
  for (size_t i = 1; i < docs.size(); ++i) {
    xs.push_back(sep);
    xs.push_back(docs[i]);
  }
  return concat(std::move(xs));
}

bool fits(const Doc* doc, int width) {
  std::stack<const Doc*> agenda;
  agenda.push(doc);
  while (width >= 0 && !agenda.empty()) {
    const Doc* d = agenda.top();
    agenda.pop();
    switch (d->kind) {
      case Doc::Kind::Nil: break;
      case Doc::Kind::Text:
      case Doc::Kind::Break: width -= int(d->text.size()); break;
      case Doc::Kind::Concat:
        for (auto it = d->children.rbegin(); it != d->children.rend(); ++it) agenda.push(it->get());
        break;
      case Doc::Kind::Group:
      case Doc::Kind::Nest: agenda.push(d->children[0].get()); break;
    }
  }
  return width >= 0;
}

std::string format(const Doc* root, int width) {
  struct Agendum {
    int indent;
    bool flat;
    const Doc* doc;
  };
  std::stack<Agendum> agenda;
  agenda.push({0, false, root});
  std::string out, line;
  int k = 0;
  bool first_line = true;
  auto end_line = [&] {
    if (!first_line) out += '\n';
    out += line;
    first_line = false;
  };
  while (!agenda.empty()) {
    Agendum a = agenda.top();
    agenda.pop();
    const Doc* d = a.doc;
    switch (d->kind) {
      case Doc::Kind::Nil: break;
      case Doc::Kind::Text:
        line += d->text;
        k += int(d->text.size());
        break;
      case Doc::Kind::Concat:
        for (auto it = d->children.rbegin(); it != d->children.rend(); ++it) agenda.push({a.indent, a.flat, it->get()});
        break;
      case Doc::Kind::Break:
        if (!a.flat) {
          end_line();
          line.assign(size_t(a.indent), ' ');
          k = a.indent;
        } else {
          line += d->text;
          k += int(d->text.size());
        }
        break;
      case Doc::Kind::Group: agenda.push({a.indent, fits(d, width - k), d->children[0].get()}); break;
      case Doc::Kind::Nest: agenda.push({a.indent + d->indent, a.flat, d->children[0].get()}); break;
    }
  }
  end_line();
  return out;
}

std::string encode_digits_alphabetic(int64_t n) {
  std::string s;
  while (s.empty() || n) {
    s.insert(s.begin(), char('a' + n % 26));
    n /= 26;
  }
  return s;
}

// JAX's JaxprPpContext: names are handed out on first use while the document is built.
struct Context {
  bool source_info = false;
  std::unordered_map<const void*, std::string> names;
  std::unordered_map<const Jaxpr*, std::string> shared_jaxprs;
  std::set<std::string> shared_names;
  int64_t counter = 0;
  const std::string& name(const Var& v) {
    auto it = names.find(v.id());
    if (it != names.end()) return it->second;
    std::string n;
    do n = encode_digits_alphabetic(counter++);
    while (shared_names.count(n));
    return names.emplace(v.id(), std::move(n)).first->second;
  }
};

std::string atom_str(const Atom& a, Context& ctx) {
  if (auto* v = std::get_if<Var>(&a)) return ctx.name(*v);
  const Literal& l = std::get<Literal>(a);
  return l.value_str() + ":" + l.aval().str();
}

// pp_vars: nest(2, group(join(sep + group(brk()), vars))).
template <class V>
DocP pp_vars(const std::vector<V>& vs, Context& ctx, const std::string& sep, bool print_shapes) {
  std::vector<DocP> items;
  for (const auto& v : vs) {
    std::string s = atom_str(Atom(v), ctx);
    if (print_shapes) s += ":" + atom_aval(Atom(v)).str();
    items.push_back(text(std::move(s)));
  }
  return nest(2, group(join(concat({text(sep), group(brk())}), items)));
}

DocP pp_jaxpr(const Jaxpr& j, Context& ctx);

// JAX's pp_jaxprs: a tuple of jaxprs, one per line when it does not fit.
DocP pp_jaxprs(const JaxprListParam& jl, Context& ctx) {
  std::vector<DocP> docs;
  for (const auto& j : jl.jaxprs) docs.push_back(pp_jaxpr(*j, ctx));
  return group(concat({nest(2, concat({text("("), brk(""), join(brk(), docs)})), brk(""), text(")")}));
}

DocP pp_kv_pairs(const Params& params, const PrimitiveDef& def, Context& ctx) {
  if (params.empty()) return nil();
  std::vector<DocP> kvs;
  // The primitive's leading params first (JAX's jit prints name= first), then the rest sorted.
  std::vector<std::pair<std::string, ParamValue>> items;
  for (const std::string& k : def.leading_params)
    if (params.has(k)) items.emplace_back(k, params.at(k));
  for (const auto& kv : params.items())
    if (std::find(def.leading_params.begin(), def.leading_params.end(), kv.first) == def.leading_params.end())
      items.push_back(kv);
  for (const auto& [k, v] : items) {
    DocP pv;
    const JaxprParam* jp = nullptr;
    const JaxprListParam* jl = nullptr;
    if (auto* o = std::get_if<std::shared_ptr<const ParamObject>>(&v)) {
      jp = dynamic_cast<const JaxprParam*>(o->get());
      jl = dynamic_cast<const JaxprListParam*>(o->get());
    }
    pv = jp ? pp_jaxpr(*jp->jaxpr, ctx) : jl ? pp_jaxprs(*jl, ctx) : text(param_value_str(v));
    kvs.push_back(concat({text(k + "="), pv}));
  }
  return group(concat({nest(2, concat({text("["), brk(""), join(brk(), kvs)})), brk(""), text("]")}));
}

DocP pp_eqn(const JaxprEqn& e, Context& ctx) {
  DocP lhs = e.outputs.empty() ? nil() : pp_vars(e.outputs, ctx, "", true);
  DocP name = text(e.primitive->name);
  DocP params = pp_kv_pairs(e.params, *e.primitive, ctx);
  DocP rhs = concat({text(" "), pp_vars(e.inputs, ctx, "", false)});
  if (ctx.source_info && e.source_info && !e.source_info->str().empty())
    rhs = concat({rhs, text("  # " + e.source_info->str())});
  if (e.outputs.empty()) return concat({name, params, rhs});
  return concat({lhs, text(" = "), name, params, rhs});
}

DocP pp_skeleton(const Jaxpr& j, Context& ctx) {
  DocP constvars = pp_vars(j.constvars(), ctx, "", true);
  DocP invars = pp_vars(j.invars(), ctx, "", true);
  std::vector<DocP> eqns;
  for (const JaxprEqn& e : j.eqns()) eqns.push_back(pp_eqn(e, ctx));
  DocP eqns_doc = join(brk("; "), eqns);
  DocP outvars = concat({text("("), pp_vars(j.outvars(), ctx, ",", false), text(j.outvars().size() != 1 ? ")" : ",)")});
  return concat({group(nest(2, concat({text("{ "), text("lambda "), constvars, text("; "), invars, text(". "),
                                       text("let"), nest(2, concat({brk(), eqns_doc})), brk(), text("in "), outvars}))),
                 text(" }")});
}

DocP pp_jaxpr(const Jaxpr& j, Context& ctx) {
  auto it = ctx.shared_jaxprs.find(&j);
  if (it != ctx.shared_jaxprs.end()) return text(it->second);
  return pp_skeleton(j, ctx);
}

// JAX's pp_toplevel_jaxpr: unused equation outputs print as `_`; sub-jaxprs used more than once
// (or with more than 10 equations) are hoisted into `let name = { ... } in` before the jaxpr.
std::string pp_toplevel(const Jaxpr& top, int width, bool source_info) {
  Context ctx;
  ctx.source_info = source_info;
  {  // _dropvars
    std::unordered_set<const void*> used;
    for (const Atom& a : top.outvars())
      if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());
    for (auto e = top.eqns().rbegin(); e != top.eqns().rend(); ++e) {
      for (const Var& v : e->outputs)
        if (!used.count(v.id())) ctx.names[v.id()] = "_";
      for (const Atom& a : e->inputs)
        if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());
    }
  }
  std::vector<const Jaxpr*> order;  // insertion order of the counts
  std::unordered_map<const Jaxpr*, int> counts;
  std::unordered_map<const Jaxpr*, std::string> names;
  std::deque<const Jaxpr*> queue{&top};
  while (!queue.empty()) {
    const Jaxpr* j = queue.front();
    queue.pop_front();
    if (!counts.count(j)) order.push_back(j);
    counts[j] += 1;
    if (j != &top && j->eqns().size() > 10) counts[j] += 1;
    for (const JaxprEqn& e : j->eqns()) {
      auto subs = jaxprs_in_params(e.params);
      const std::string* name = nullptr;
      if (e.params.has("name"))
        if (auto* s = std::get_if<std::string>(&e.params.at("name"))) name = s;
      for (const Jaxpr* s : subs) {
        queue.push_back(s);
        if (name) {
          std::string n = *name;  // Python's str.strip("<>")
          size_t b = n.find_first_not_of("<>"), en = n.find_last_not_of("<>");
          n = b == std::string::npos ? std::string() : n.substr(b, en - b + 1);
          names.emplace(s, n);
        }
      }
    }
  }
  std::map<std::string, int> name_counts;
  std::vector<std::pair<std::string, const Jaxpr*>> shared;
  for (const Jaxpr* j : order) {
    if (counts[j] == 1) continue;
    auto it = names.find(j);
    std::string name = it == names.end() ? "jaxpr" : it->second;
    if (int c = name_counts[name]; c > 0) {
      name_counts[name] += 1;
      name += std::to_string(c);
      name_counts[name] += 1;
    } else {
      name_counts[name] += 1;
    }
    ctx.shared_names.insert(name);
    ctx.shared_jaxprs[j] = name;
    shared.emplace_back(name, j);
  }
  std::vector<DocP> docs;
  for (auto& [name, j] : shared)
    docs.push_back(concat({text("let "), text(name), text(" = "), pp_skeleton(*j, ctx), text(" in"), brk()}));
  docs.push_back(pp_jaxpr(top, ctx));
  DocP d = concat(std::move(docs));
  return format(d.get(), width);
}

}  // namespace

std::string Jaxpr::pretty_print(int width, bool source_info) const { return pp_toplevel(*this, width, source_info); }

std::string JaxprListParam::str() const {
  std::string s = "(";
  for (size_t i = 0; i < jaxprs.size(); ++i) s += (i ? " " : "") + jaxprs[i]->pretty_print();
  return s + ")";
}
size_t JaxprListParam::hash() const {
  size_t h = jaxprs.size();
  for (const auto& j : jaxprs) h = h * 31 + std::hash<const void*>()(j.get());
  return h;
}

std::ostream& operator<<(std::ostream& os, const Jaxpr& j) { return os << j.pretty_print(); }
std::string ClosedJaxpr::pretty_print(int width, bool source_info) const {
  if (!jaxpr) throw ValueError("ClosedJaxpr::pretty_print: this ClosedJaxpr is empty (default-constructed)");
  return jaxpr->pretty_print(width, source_info);
}
std::vector<AbstractValue> ClosedJaxpr::in_avals() const { return jaxpr->in_avals(); }
std::vector<AbstractValue> ClosedJaxpr::out_avals() const { return jaxpr->out_avals(); }
std::ostream& operator<<(std::ostream& os, const ClosedJaxpr& j) { return os << j.pretty_print(); }

namespace {
// An effect in the equation or in one of its sub-jaxprs (a debug print inside a cond branch).
bool has_effect(const JaxprEqn& e) {
  if (e.primitive->effectful) return true;
  for (const Jaxpr* sub : jaxprs_in_params(e.params))
    for (const JaxprEqn& inner : sub->eqns())
      if (has_effect(inner)) return true;
  return false;
}
}  // namespace

std::shared_ptr<const Jaxpr> dce(const Jaxpr& jaxpr) {
  std::unordered_set<const void*> used;
  for (const Atom& a : jaxpr.outvars())
    if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());
  std::vector<const JaxprEqn*> keep;
  for (auto it = jaxpr.eqns().rbegin(); it != jaxpr.eqns().rend(); ++it) {
    bool live = it->primitive->kind == PrimKind::Collective || has_effect(*it);  // effects stay
    for (const Var& v : it->outputs) live = live || used.count(v.id());
    if (!live) continue;
    keep.push_back(&*it);
    for (const Atom& a : it->inputs)
      if (auto* v = std::get_if<Var>(&a)) used.insert(v->id());
  }
  std::vector<JaxprEqn> eqns;
  for (auto it = keep.rbegin(); it != keep.rend(); ++it) eqns.push_back(**it);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

std::vector<const Jaxpr*> jaxprs_in_params(const Params& params) {
  std::vector<const Jaxpr*> out;
  for (const auto& [k, v] : params.items())
    if (auto* o = std::get_if<std::shared_ptr<const ParamObject>>(&v)) {
      if (auto* jp = dynamic_cast<const JaxprParam*>(o->get())) out.push_back(jp->jaxpr.get());
      if (auto* jl = dynamic_cast<const JaxprListParam*>(o->get()))
        for (const auto& j : jl->jaxprs) out.push_back(j.get());
    }
  return out;
}

}  // namespace cjax
