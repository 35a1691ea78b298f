// The debug_print primitive (cjax/debug_print.h): effectful, no outputs; its kernel formats the
// values and writes one line. Its JVP prints the primals; batching prints the batched values.
#include "cjax/debug_print.h"

#include <fmt/format.h>

#include <iostream>
#include <mutex>

#include "core/array/array_impl.h"
#include "core/array/primitive.h"
#include "core/array/rules.h"
#include "core/lax/rule_support.h"

namespace cjax::debug {
namespace {

std::mutex g_mu;
std::ostream* g_stream = nullptr;

size_t count_placeholders(std::string_view f) {
  size_t n = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f.substr(i, 2) == "{{" || f.substr(i, 2) == "}}") {
      ++i;
    } else if (f.substr(i, 2) == "{}") {
      ++n;
      ++i;
    } else if (f[i] == '{' || f[i] == '}') {
      throw ValueError(
          fmt::format("debug::print: format '{}' has a lone brace at position {}; use {{}} for a value "
                      "and {{{{ or }}}} for a literal brace",
                      f, i));
    }
  }
  return n;
}

std::string format_values(std::string_view f, std::span<const Array> values) {
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f.substr(i, 2) == "{{" || f.substr(i, 2) == "}}") {
      out += f[i++];
    } else if (f.substr(i, 2) == "{}") {
      out += to_string(values[k++]);
      ++i;
    } else {
      out += f[i];
    }
  }
  return out;
}

const PrimitiveDef& g_debug_print = register_primitive([] {
  PrimitiveDef def;
  def.name = "debug_print";
  def.kind = PrimKind::Opaque;
  def.arity = Arity::any();
  def.effectful = true;
  def.abstract_eval = [](std::span<const Array>, const Params&) { return std::vector<AbstractValue>{}; };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    std::string line = format_values(p.get<std::string>("fmt"), in);
    std::lock_guard lk(g_mu);
    (g_stream ? *g_stream : std::cout) << line << "\n";
    return std::vector<Array>{};
  };
  return def;
}());

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("debug_print");
  r.jvp = [](std::span<const Array> primals, std::span<const Array>, const Params& p) {
    cjax::bind(g_debug_print, primals, p);
    return JvpOut{{}, {}};
  };
  r.batch = [](std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
    std::vector<Array> moved;
    for (size_t i = 0; i < args.size(); ++i)
      moved.push_back(bdims[i] == kNotMapped ? args[i] : move_bdim(args[i], bdims[i], 0, axis.size));
    cjax::bind(g_debug_print, moved, p);
    return BatchOut{{}, {}};
  };
});

}  // namespace

void print_values(std::string_view f, const std::vector<Array>& values) {
  size_t n = count_placeholders(f);
  if (n != values.size())
    throw ValueError(fmt::format("debug::print: format '{}' has {} placeholder(s) {{}} but {} value(s) were given", f,
                                 n, values.size()));
  for (size_t i = 0; i < values.size(); ++i)
    if (!values[i].defined()) throw ValueError(fmt::format("debug::print: value {} is an empty Array handle", i));
  cjax::bind(g_debug_print, std::span<const Array>(values), {{"fmt", std::string(f)}});
}

void set_print_stream(std::ostream* os) {
  std::lock_guard lk(g_mu);
  g_stream = os;
}

}  // namespace cjax::debug
