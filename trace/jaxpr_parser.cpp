#include "trace/jaxpr_parser.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "core/array/array_impl.h"
#include "core/lax/gather_scatter.h"
#include "core/lax/linalg.h"
#include "core/spmd/collectives.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// ---- param values in Python literal syntax: ints, tuples, lists, dotted names, keyword calls ----

struct PyValue {
  enum class Kind : uint8_t { Int, Tuple, List, Name, Call } kind = Kind::Int;
  int64_t i = 0;
  std::string name;               // Name: the dotted name; Call: the callee
  std::vector<PyValue> items;     // Tuple, List; Call: the keyword arguments' values
  std::vector<std::string> keys;  // Call: the keyword arguments' names
};

class PyReader {
 public:
  explicit PyReader(std::string_view s) : s_(s) {}
  // The value that is all of the text, or nullopt where the text is something else.
  std::optional<PyValue> read_all() {
    auto v = value();
    ws();
    if (!v || p_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void ws() {
    while (p_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[p_]))) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < s_.size() && s_[p_] == c) return ++p_, true;
    return false;
  }
  std::string dotted_name() {
    size_t b = p_;
    while (p_ < s_.size() && (is_name_char(s_[p_]) || s_[p_] == '.')) ++p_;
    return std::string(s_.substr(b, p_ - b));
  }
  std::optional<PyValue> value() {
    ws();
    if (p_ >= s_.size()) return std::nullopt;
    char c = s_[p_];
    PyValue v;
    if (c == '(' || c == '[') {
      ++p_;
      char close = c == '(' ? ')' : ']';
      v.kind = c == '(' ? PyValue::Kind::Tuple : PyValue::Kind::List;
      if (eat(close)) return v;
      while (true) {
        auto item = value();
        if (!item) return std::nullopt;
        v.items.push_back(std::move(*item));
        if (eat(close)) return v;
        if (!eat(',')) return std::nullopt;
        if (eat(close)) return v;  // a trailing comma: (1,)
      }
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      auto [end, ec] = std::from_chars(s_.data() + p_, s_.data() + s_.size(), v.i);
      if (ec != std::errc()) return std::nullopt;
      p_ = size_t(end - s_.data());
      return v;
    }
    if (!is_name_start(c)) return std::nullopt;
    v.kind = PyValue::Kind::Name;
    v.name = dotted_name();
    if (!eat('(')) return v;
    v.kind = PyValue::Kind::Call;
    if (eat(')')) return v;
    while (true) {
      ws();
      std::string key = dotted_name();
      if (key.empty() || !eat('=')) return std::nullopt;
      auto arg = value();
      if (!arg) return std::nullopt;
      v.keys.push_back(std::move(key));
      v.items.push_back(std::move(*arg));
      if (eat(')')) return v;
      if (!eat(',')) return std::nullopt;
    }
  }

  std::string_view s_;
  size_t p_ = 0;
};

std::optional<PyValue> read_py(std::string_view text) { return PyReader(text).read_all(); }

std::optional<std::vector<int64_t>> int_sequence(const PyValue& v) {
  if (v.kind != PyValue::Kind::Tuple && v.kind != PyValue::Kind::List) return std::nullopt;
  std::vector<int64_t> out;
  for (const PyValue& x : v.items) {
    if (x.kind != PyValue::Kind::Int) return std::nullopt;
    out.push_back(x.i);
  }
  return out;
}

std::optional<std::vector<std::vector<int64_t>>> int_sequences(const PyValue& v) {
  if (v.kind != PyValue::Kind::Tuple) return std::nullopt;
  std::vector<std::vector<int64_t>> out;
  for (const PyValue& x : v.items) {
    auto ints = int_sequence(x);
    if (!ints) return std::nullopt;
    out.push_back(std::move(*ints));
  }
  return out;
}

// `Callee(k1=(..), k2=(..))` with exactly the keywords `keys`, in order, each an int tuple.
std::optional<std::vector<std::vector<int64_t>>> keyword_int_tuples(std::string_view text, std::string_view callee,
                                                                    std::initializer_list<std::string_view> keys) {
  auto v = read_py(text);
  if (!v || v->kind != PyValue::Kind::Call || v->name != callee || v->keys.size() != keys.size()) return std::nullopt;
  std::vector<std::vector<int64_t>> out;
  size_t i = 0;
  for (std::string_view k : keys) {
    auto ints = int_sequence(v->items[i]);
    if (v->keys[i++] != k || !ints) return std::nullopt;
    out.push_back(std::move(*ints));
  }
  return out;
}

std::optional<double> full_double(std::string_view text) {
  std::string s(text);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

ParamValue object(std::shared_ptr<const ParamObject> o) { return ParamValue(std::move(o)); }

// ---- the structured params: read by (primitive, param name), built as the primitives build them ----

using ParamReader = std::optional<ParamValue> (*)(std::string_view text);

std::optional<ParamValue> read_dot_dims(std::string_view text) {
  auto v = read_py(text);  // ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))
  if (!v || v->kind != PyValue::Kind::Tuple || v->items.size() != 2) return std::nullopt;
  std::vector<std::vector<int64_t>> parts;
  for (const PyValue& pair : v->items) {
    if (pair.kind != PyValue::Kind::Tuple || pair.items.size() != 2) return std::nullopt;
    for (const PyValue& side : pair.items) {
      auto ints = int_sequence(side);
      if (!ints) return std::nullopt;
      parts.push_back(std::move(*ints));
    }
  }
  auto dn = std::make_shared<DotDimsParam>();
  dn->lhs_contracting = parts[0];
  dn->rhs_contracting = parts[1];
  dn->lhs_batch = parts[2];
  dn->rhs_batch = parts[3];
  return object(std::move(dn));
}

std::optional<ParamValue> read_conv_dims(std::string_view text) {
  auto specs = keyword_int_tuples(text, "ConvDimensionNumbers", {"lhs_spec", "rhs_spec", "out_spec"});
  if (!specs) return std::nullopt;
  auto dn = std::make_shared<ConvDimsParam>();
  dn->lhs_spec = (*specs)[0];
  dn->rhs_spec = (*specs)[1];
  dn->out_spec = (*specs)[2];
  return object(std::move(dn));
}

std::optional<ParamValue> read_gather_dims(std::string_view text) {
  auto d = keyword_int_tuples(text, "GatherDimensionNumbers",
                              {"offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                               "start_indices_batching_dims"});
  if (!d) return std::nullopt;
  lax::GatherDimensionNumbers dn{(*d)[0], (*d)[1], (*d)[2], (*d)[3], (*d)[4]};
  return object(std::make_shared<const GatherDimensionNumbersParam>(std::move(dn)));
}

std::optional<ParamValue> read_scatter_dims(std::string_view text) {
  auto d = keyword_int_tuples(text, "ScatterDimensionNumbers",
                              {"update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                               "operand_batching_dims", "scatter_indices_batching_dims"});
  if (!d) return std::nullopt;
  lax::ScatterDimensionNumbers dn{(*d)[0], (*d)[1], (*d)[2], (*d)[3], (*d)[4]};
  return object(std::make_shared<const ScatterDimensionNumbersParam>(std::move(dn)));
}

std::optional<ParamValue> read_mode(std::string_view text) {
  using M = lax::GatherScatterMode;
  for (M m : {M::clip, M::fill_or_drop, M::promise_in_bounds})
    if (gather_scatter_mode_str(m) == text) return object(std::make_shared<const GatherScatterModeParam>(m));
  return std::nullopt;
}

// Tuples of int tuples, also where empty (`()` reads as an int tuple elsewhere).
std::optional<ParamValue> read_int_tuples(std::string_view text) {
  auto v = read_py(text);
  if (!v) return std::nullopt;
  auto out = int_sequences(*v);
  if (!out) return std::nullopt;
  return ParamValue(std::move(*out));
}

std::optional<ParamValue> read_fill_value(std::string_view text) {
  if (text == "None") return ParamValue(std::monostate{});
  auto d = full_double(text);
  if (!d) return std::nullopt;
  return ParamValue(*d);
}

std::optional<ParamValue> read_text(std::string_view text) { return ParamValue(std::string(text)); }

// ---- shard_map and collective parameters ----

// The quoted names in `text`, in order: ('i', 'j') and frozenset({'i', 'j'}).
std::vector<std::string> quoted_names(std::string_view text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\'') continue;
    size_t j = text.find('\'', i + 1);
    if (j == std::string_view::npos) return {};
    out.emplace_back(text.substr(i + 1, j - i - 1));
    i = j;
  }
  return out;
}

std::optional<ParamValue> read_axes(std::string_view text) {
  auto names = quoted_names(text);
  if (names.empty() || text.front() != '(') return std::nullopt;
  return ParamValue(axes_param(std::move(names)));
}

std::optional<ParamValue> read_manual_axes(std::string_view text) {
  if (text.rfind("frozenset({", 0) != 0) return std::nullopt;
  return ParamValue(std::shared_ptr<const ParamObject>(std::make_shared<ManualAxesParam>(quoted_names(text))));
}

// Mesh('x': 4, 'y': 2): the first devices, as make_mesh lays them out.
std::optional<ParamValue> read_mesh(std::string_view text) {
  if (text.rfind("Mesh(", 0) != 0) return std::nullopt;
  Shape shape;
  std::vector<std::string> names;
  size_t i = 5;
  while (i < text.size() && text[i] == '\'') {
    size_t j = text.find('\'', i + 1);
    if (j == std::string_view::npos || j + 2 >= text.size() || text[j + 1] != ':') return std::nullopt;
    names.emplace_back(text.substr(i + 1, j - i - 1));
    i = j + 2;
    while (i < text.size() && text[i] == ' ') ++i;
    int64_t n = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), n);
    if (ec != std::errc()) return std::nullopt;
    shape.push_back(n);
    i = size_t(end - text.data());
    if (i < text.size() && text[i] == ',') i += 2;
  }
  if (i + 1 != text.size() || text[i] != ')') return std::nullopt;
  return ParamValue(std::shared_ptr<const ParamObject>(std::make_shared<MeshParam>(make_mesh(shape, names))));
}

// (P('x', 'y'), P(('i', 'j'), None), P())
std::optional<ParamValue> read_specs(std::string_view text) {
  std::vector<PartitionSpec> specs;
  size_t i = 0;
  auto skip = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
  };
  auto name = [&]() -> std::optional<std::string> {
    if (i >= text.size() || text[i] != '\'') return std::nullopt;
    size_t j = text.find('\'', i + 1);
    if (j == std::string_view::npos) return std::nullopt;
    std::string n(text.substr(i + 1, j - i - 1));
    i = j + 1;
    return n;
  };
  if (text.empty() || text[i++] != '(') return std::nullopt;
  skip();
  while (i < text.size() && text[i] != ')') {
    if (text.substr(i, 2) != "P(") return std::nullopt;
    i += 2;
    std::vector<PartitionSpec::Entry> entries;
    skip();
    while (i < text.size() && text[i] != ')') {
      if (text.substr(i, 4) == "None") {
        entries.emplace_back(None);
        i += 4;
      } else if (text[i] == '(') {
        ++i;
        std::vector<std::string> names;
        skip();
        while (auto n = name()) {
          names.push_back(*n);
          skip();
        }
        if (i >= text.size() || text[i] != ')') return std::nullopt;
        ++i;
        entries.emplace_back(AxisTuple{names});
      } else if (auto n = name()) {
        entries.emplace_back(*n);
      } else {
        return std::nullopt;
      }
      skip();
    }
    if (i >= text.size()) return std::nullopt;
    ++i;  // ')' of P
    specs.emplace_back(std::move(entries));
    skip();
  }
  if (i + 1 != text.size()) return std::nullopt;
  return ParamValue(std::shared_ptr<const ParamObject>(std::make_shared<SpecsParam>(std::move(specs))));
}

struct StructuredParam {
  std::vector<std::string_view> primitives;  // empty: every primitive
  std::string_view param;
  std::string_view example;  // what the value looks like, for the error message
  ParamReader read;
};

const std::vector<std::string_view>
    kCollectives{"psum_invariant",       "psum",           "pmax",     "pmin",       "pvary",      "all_gather",
                 "all_gather_invariant", "reduce_scatter", "ppermute", "all_to_all", "axis_index", "pbroadcast"};
const std::vector<std::string_view> kScatters{"scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max"};

const std::vector<StructuredParam>& structured_params() {
  static const std::vector<StructuredParam> table = [] {
    std::vector<std::string_view> gather_and_scatters = kScatters;
    gather_and_scatters.push_back("gather");
    return std::vector<StructuredParam>{
        {{"dot_general"}, "dimension_numbers", "(([1], [0]), ([], []))", read_dot_dims},
        {{"conv_general_dilated"},
         "dimension_numbers",
         "ConvDimensionNumbers(lhs_spec=(0, 1, 2, 3), rhs_spec=(0, 1, 2, 3), out_spec=(0, 1, 2, 3))",
         read_conv_dims},
        {{"conv_general_dilated"}, "padding", "((0, 0), (1, 1))", read_int_tuples},
        {{"pad"}, "padding_config", "((1, 2, 0),)", read_int_tuples},
        {{"gather"},
         "dimension_numbers",
         "GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,), "
         "operand_batching_dims=(), start_indices_batching_dims=())",
         read_gather_dims},
        {kScatters, "dimension_numbers",
         "ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,), "
         "scatter_dims_to_operand_dims=(0,), operand_batching_dims=(), scatter_indices_batching_dims=())",
         read_scatter_dims},
        {gather_and_scatters, "mode", "GatherScatterMode.FILL_OR_DROP", read_mode},
        {{"gather"}, "fill_value", "None or 0.5", read_fill_value},
        {kCollectives, "axes", "('i', 'j')", read_axes},
        {{"ppermute"}, "perm", "((0, 1), (1, 2))", read_int_tuples},
        {{"shard_map"}, "mesh", "Mesh('x': 4, 'y': 2)", read_mesh},
        {{"shard_map"}, "in_specs", "(P('x', None), P())", read_specs},
        {{"shard_map"}, "out_specs", "(P('x', None),)", read_specs},
        {{"shard_map"}, "manual_axes", "frozenset({'x', 'y'})", read_manual_axes},
        // A call's `name` is text even where it equals a hoisted jaxpr's name (which comes from it).
        {{}, "name", "f", read_text},
    };
  }();
  return table;
}

const StructuredParam* find_structured(std::string_view primitive, std::string_view param) {
  for (const StructuredParam& s : structured_params()) {
    if (s.param != param) continue;
    if (s.primitives.empty()) return &s;
    for (std::string_view p : s.primitives)
      if (p == primitive) return &s;
  }
  return nullptr;
}

// Any other param, by its text.
ParamValue generic_param(std::string_view text) {
  if (text == "True") return true;
  if (text == "False") return false;
  if (text == "None") return std::monostate{};
  int64_t i = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
  if (ec == std::errc() && end == text.data() + text.size()) return i;
  if (text.find_first_of(".eEn") != std::string_view::npos &&
      text.find_first_of("0123456789n") != std::string_view::npos)
    if (auto d = full_double(text)) return *d;
  if (auto d = dtype_from_name(text); d && dtype_name(*d) == text) return *d;
  if (auto v = read_py(text); v && v->kind == PyValue::Kind::Tuple) {
    if (auto ints = int_sequence(*v)) return std::move(*ints);
    if (auto nested = int_sequences(*v)) return std::move(*nested);
  }
  return std::string(text);
}

// ---- the parser ------------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  // [let name = { ... } in]* { ... }
  std::shared_ptr<const Jaxpr> parse() {
    // Hoisted sub-jaxprs are located first and parsed where referenced: one may refer to another
    // printed after it.
    while (eat_keyword("let")) {
      skip_ws();
      size_t name_at = pos_;
      std::string name = read_name();
      if (name.empty()) expected("a name after 'let'");
      expect('=', fmt::format("after 'let {}'", name));
      skip_ws();
      if (!at('{')) expected(fmt::format("'{{' starting the jaxpr '{}'", name));
      if (hoisted_.count(name)) fail_at(name_at, fmt::format("the hoisted jaxpr '{}' is defined twice", name));
      hoisted_[name].start = pos_;
      skip_braces();
      expect_keyword("in", fmt::format("after the hoisted jaxpr '{}'", name));
    }
    if (!at('{')) expected("'{' starting a jaxpr (or 'let name = { ... } in')");
    auto top = parse_jaxpr();
    skip_ws();
    if (pos_ != s_.size()) expected("the end of the text after the jaxpr's closing '}'");
    for (auto& [name, h] : hoisted_)
      if (!h.jaxpr) hoisted_jaxpr(name, h.start);  // unreferenced ones are still checked
    return top;
  }

 private:
  using Scope = std::unordered_map<std::string, Var>;
  struct Hoisted {
    size_t start = 0;
    std::shared_ptr<const Jaxpr> jaxpr;
    bool parsing = false;
  };
  struct Binder {
    std::string name;
    size_t at;
    AbstractValue aval;
  };

  // ---- errors ----
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n')
        ++line, col = 1;
      else
        ++col;
    }
    throw ValueError(fmt::format("parse_jaxpr: line {}, column {}: {}", line, col, what));
  }
  // What the text has at `at`: "'f32'", "'='", "the end of the text".
  std::string found(size_t at) const {
    if (at >= s_.size()) return "the end of the text";
    size_t e = at;
    if (is_name_char(s_[e]))
      while (e < s_.size() && is_name_char(s_[e]) && e - at < 24) ++e;
    else
      ++e;
    return fmt::format("'{}'", s_.substr(at, e - at));
  }
  // Reported where the next token starts.
  [[noreturn]] void expected(const std::string& what) const {
    size_t at = pos_;
    while (at < s_.size() && std::isspace(static_cast<unsigned char>(s_[at]))) ++at;
    fail_at(at, fmt::format("expected {}, found {}", what, found(at)));
  }

  // ---- lexing ----
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool at(char c) {
    skip_ws();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool eat(char c) {
    if (!at(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const std::string& context) {
    if (!eat(c)) expected(fmt::format("'{}' {}", c, context));
  }
  // A name at the cursor ([A-Za-z_][A-Za-z0-9_]*, with '-' too for primitives: scatter-add), or "".
  std::string read_name(bool allow_dash = false) {
    size_t b = pos_;
    if (pos_ < s_.size() && is_name_start(s_[pos_]))
      while (pos_ < s_.size() && (is_name_char(s_[pos_]) || (allow_dash && s_[pos_] == '-'))) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }
  std::string peek_name() {
    skip_ws();
    size_t save = pos_;
    std::string n = read_name();
    pos_ = save;
    return n;
  }
  bool eat_keyword(std::string_view kw) {
    if (peek_name() != kw) return false;
    pos_ += kw.size();
    return true;
  }
  void expect_keyword(std::string_view kw, const std::string& context) {
    if (!eat_keyword(kw)) expected(fmt::format("'{}' {}", kw, context));
  }
  // At `name:` (a typed variable), without consuming it.
  bool at_binder() {
    skip_ws();
    size_t save = pos_;
    bool yes = !read_name().empty() && pos_ < s_.size() && s_[pos_] == ':';
    pos_ = save;
    return yes;
  }
  // At the keyword `in` that precedes a jaxpr's outputs `(...)`.
  bool at_outputs_in() {
    skip_ws();
    size_t save = pos_;
    bool yes = read_name() == "in" && at('(');
    pos_ = save;
    return yes;
  }
  void skip_braces() {
    size_t open = pos_;
    int depth = 0;
    char quote = 0;
    for (; pos_ < s_.size(); ++pos_) {
      char c = s_[pos_];
      if (quote) {
        if (c == quote) quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        ++pos_;
        return;
      }
    }
    fail_at(open, "this '{' has no matching '}'");
  }

  // ---- types and atoms ----
  // f32[8,16], bool[], f32[2]{V:x,y}
  AbstractValue parse_type() {
    skip_ws();
    size_t start = pos_;
    std::string name = read_name();
    auto d = dtype_from_name(name);
    if (!d || dtype_short_name(*d) != name)
      fail_at(start, fmt::format("expected a type like f32[3] or bool[], found {}",
                                 name.empty() ? found(start) : "'" + name + "'"));
    AbstractValue aval{{}, *d, false, {}};
    if (pos_ >= s_.size() || s_[pos_] != '[') expected(fmt::format("'[' after the dtype '{}'", name));
    ++pos_;
    if (!eat(']')) {
      while (true) {
        skip_ws();
        int64_t n = 0;
        auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + s_.size(), n);
        if (ec != std::errc() || n < 0) expected(fmt::format("a dimension size in the type {}[...]", name));
        pos_ = size_t(end - s_.data());
        aval.shape.push_back(n);
        if (eat(']')) break;
        expect(',', "or ']' between dimension sizes");
      }
    }
    if (s_.substr(pos_, 3) == "{V:") {  // varying manual axes (inside shard_map)
      pos_ += 3;
      do {
        skip_ws();
        std::string axis = read_name();
        if (axis.empty()) expected("a mesh axis name in {V:...}");
        aval.vma.push_back(std::move(axis));
      } while (eat(','));
      expect('}', "closing {V:...}");
    }
    return aval;
  }

  // 2.0:f32[], -inf:f32[], nan:f32[], True:bool[], 3:i32[]
  Literal parse_literal() {
    skip_ws();
    size_t start = pos_;
    while (pos_ < s_.size() && (is_name_char(s_[pos_]) || s_[pos_] == '.' || s_[pos_] == '-' || s_[pos_] == '+'))
      ++pos_;
    std::string value(s_.substr(start, pos_ - start));
    if (value.empty()) expected("a literal like 2.0:f32[]");
    if (pos_ >= s_.size() || s_[pos_] != ':') expected(fmt::format("':' and a type after the literal '{}'", value));
    ++pos_;
    size_t type_at = pos_;
    AbstractValue aval = parse_type();
    if (!aval.shape.empty())
      fail_at(type_at, fmt::format("the literal '{}' must have a rank-0 type like {}[], got {}", value,
                                   dtype_short_name(aval.dtype), aval.str()));
    DType dt = aval.dtype;
    auto bad = [&]() -> Literal {
      fail_at(start, fmt::format("'{}' is not a {} literal (write e.g. {})", value, dtype_name(dt),
                                 dt == bool_       ? "True:bool[]"
                                 : is_floating(dt) ? "2.0:f32[]"
                                                   : "3:i32[]"));
    };
    if (dt == bool_) {
      if (value != "True" && value != "False") return bad();
      return Literal(make_scalar(value == "True" ? 1.0 : 0.0, dt));
    }
    if (is_floating(dt)) {
      auto d = full_double(value);
      if (!d) return bad();
      return Literal(make_scalar(*d, dt));
    }
    if (is_unsigned_integer(dt)) {
      uint64_t u = 0;
      auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), u);
      uint64_t max = dt == u8 ? std::numeric_limits<uint8_t>::max() : std::numeric_limits<uint32_t>::max();
      if (ec != std::errc() || end != value.data() + value.size() || u > max) return bad();
      return Literal(make_scalar(double(u), dt));
    }
    int64_t i = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), i);
    int64_t bits = int64_t(itemsize(dt)) * 8;
    if (ec != std::errc() || end != value.data() + value.size()) return bad();
    if (bits < 64 && (i < -(int64_t(1) << (bits - 1)) || i >= (int64_t(1) << (bits - 1)))) return bad();
    if (dt == i64) return Literal(make_from_host(&i, aval, host_device()));  // exact beyond 2^53
    return Literal(make_scalar(double(i), dt));
  }

  // After `inf:` or `nan:` in an equation's inputs: the next equation's outputs (`nan:f32[] = ...`)?
  bool starts_binders() {
    size_t save = pos_;
    bool yes = false;
    try {
      while (at_binder()) {
        read_name();
        ++pos_;  // ':'
        parse_type();
        if (at('=')) {
          yes = true;
          break;
        }
      }
    } catch (const ValueError&) {}
    pos_ = save;
    return yes;
  }

  const Var* find_var(const std::string& name) const {
    auto it = scopes_.back().find(name);
    return it == scopes_.back().end() ? nullptr : &it->second;
  }
  Var use_var(const std::string& name, size_t at) const {
    if (const Var* v = find_var(name)) return *v;
    fail_at(at, fmt::format("undefined variable '{}'", name));
  }
  void define(const std::string& name, size_t at, const Var& v) {
    if (name == "_") return;
    if (!scopes_.back().emplace(name, v).second) fail_at(at, fmt::format("variable '{}' is defined twice", name));
  }

  Binder parse_binder() {
    skip_ws();
    size_t at = pos_;
    std::string name = read_name();
    if (name.empty()) expected("a variable name");
    if (pos_ >= s_.size() || s_[pos_] != ':') expected(fmt::format("':' after variable '{}'", name));
    ++pos_;
    return {std::move(name), at, parse_type()};
  }
  std::vector<Var> parse_binders(char end, const std::string& context) {
    std::vector<Var> vars;
    while (!at(end)) {
      if (pos_ >= s_.size() || !is_name_start(s_[pos_])) expected(fmt::format("'{}' {}", end, context));
      Binder b = parse_binder();
      vars.emplace_back(b.aval);
      define(b.name, b.at, vars.back());
    }
    ++pos_;
    return vars;
  }

  // One input of an equation, or nullopt at its end (';', the next equation, `in (`).
  std::optional<Atom> parse_eqn_input() {
    skip_ws();
    if (pos_ >= s_.size()) return std::nullopt;
    char c = s_[pos_];
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return parse_literal();
    if (!is_name_start(c)) return std::nullopt;
    size_t save = pos_;
    std::string name = read_name();
    if (pos_ < s_.size() && s_[pos_] == ':') {
      pos_ = save;
      if (name == "True" || name == "False" || ((name == "inf" || name == "nan") && !starts_binders()))
        return parse_literal();
      return std::nullopt;  // the next equation's outputs
    }
    pos_ = save;
    if (name == "in" && at_outputs_in()) return std::nullopt;
    if (const Var* v = find_var(name)) {
      pos_ += name.size();
      return *v;
    }
    if (find_primitive(name) || starts_equation_line(save)) return std::nullopt;  // the next equation
    fail_at(save, fmt::format("undefined variable '{}'", name));
  }

  // `at` begins a line that has an '=': an equation (one with a malformed output, if we got here),
  // not the continuation of a long input list.
  bool starts_equation_line(size_t at) const {
    size_t b = s_.rfind('\n', at);
    b = b == std::string_view::npos ? 0 : b + 1;
    for (size_t i = b; i < at; ++i)
      if (!std::isspace(static_cast<unsigned char>(s_[i]))) return false;
    size_t e = s_.find('\n', at);
    return s_.substr(at, e == std::string_view::npos ? std::string_view::npos : e - at).find('=') !=
           std::string_view::npos;
  }

  Atom parse_output_atom() {
    skip_ws();
    if (pos_ < s_.size() && (s_[pos_] == '-' || std::isdigit(static_cast<unsigned char>(s_[pos_]))))
      return parse_literal();
    size_t at = pos_;
    std::string name = read_name();
    if (name.empty()) expected("an output variable or literal");
    if (pos_ < s_.size() && s_[pos_] == ':') {
      pos_ = at;
      return parse_literal();
    }
    return use_var(name, at);
  }

  // ---- params ----
  std::shared_ptr<const Jaxpr> hoisted_jaxpr(const std::string& name, size_t ref_at) {
    Hoisted& h = hoisted_.at(name);
    if (h.jaxpr) return h.jaxpr;
    if (h.parsing) fail_at(ref_at, fmt::format("the hoisted jaxpr '{}' refers to itself", name));
    h.parsing = true;
    size_t save = pos_;
    pos_ = h.start;
    h.jaxpr = parse_jaxpr();
    pos_ = save;
    h.parsing = false;
    return h.jaxpr;
  }

  ParamValue parse_param_value(const PrimitiveDef& prim, const std::string& key) {
    if (pos_ < s_.size() && s_[pos_] == '{') return object(std::make_shared<const JaxprParam>(parse_jaxpr()));
    if (at_jaxpr_tuple()) return object(std::make_shared<const JaxprListParam>(parse_jaxpr_tuple()));
    size_t start = pos_;
    std::string open;  // the brackets still open, innermost last
    char quote = 0;
    auto unbalanced = [&] { fail_at(start, fmt::format("the value of parameter '{}' has unbalanced brackets", key)); };
    for (; pos_ < s_.size(); ++pos_) {
      char c = s_[pos_];
      if (quote) {
        if (c == quote) quote = 0;
        continue;
      }
      if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '(' || c == '[' || c == '{') {
        open += c == '(' ? ')' : c == '[' ? ']' : '}';
      } else if (c == ')' || c == ']' || c == '}') {
        if (open.empty()) break;
        if (open.back() != c) unbalanced();
        open.pop_back();
      } else if (open.empty() && std::isspace(static_cast<unsigned char>(c))) {
        break;
      }
    }
    if (!open.empty() || quote) unbalanced();
    std::string_view text = s_.substr(start, pos_ - start);
    if (text.empty()) expected(fmt::format("a value for parameter '{}'", key));
    if (const StructuredParam* sp = find_structured(prim.name, key)) {
      if (auto v = sp->read(text)) return *v;
      fail_at(start, fmt::format("expected {}'s {} like {}, found '{}'", prim.name, key, sp->example, text));
    }
    if (hoisted_.count(std::string(text)))
      return object(std::make_shared<const JaxprParam>(hoisted_jaxpr(std::string(text), start)));
    return generic_param(text);
  }

  // At `(` opening a tuple of jaxprs (cond's branches): its first item is `{` or a hoisted jaxpr's name.
  bool at_jaxpr_tuple() {
    if (pos_ >= s_.size() || s_[pos_] != '(') return false;
    size_t save = pos_++;
    bool yes = at('{');
    if (!yes) yes = hoisted_.count(read_name()) > 0;
    pos_ = save;
    return yes;
  }
  // ( { lambda ... } name ... )
  std::vector<std::shared_ptr<const Jaxpr>> parse_jaxpr_tuple() {
    ++pos_;  // '('
    std::vector<std::shared_ptr<const Jaxpr>> out;
    while (!eat(')')) {
      if (at('{')) {
        out.push_back(parse_jaxpr());
        continue;
      }
      size_t name_at = pos_;
      std::string name = read_name();
      if (name.empty() || !hoisted_.count(name)) {
        pos_ = name_at;
        expected("a jaxpr '{ lambda ... }', a hoisted jaxpr's name or ')' in the tuple of jaxprs");
      }
      out.push_back(hoisted_jaxpr(name, name_at));
    }
    return out;
  }

  Params parse_params(const PrimitiveDef& prim) {
    ++pos_;  // '['
    Params params;
    while (!eat(']')) {
      size_t key_at = pos_;
      std::string key = read_name();
      if (key.empty()) expected(fmt::format("a parameter name or ']' closing {}'s params", prim.name));
      if (params.has(key)) fail_at(key_at, fmt::format("parameter '{}' is given twice", key));
      if (pos_ >= s_.size() || s_[pos_] != '=') expected(fmt::format("'=' after parameter '{}'", key));
      ++pos_;
      params.set(key, parse_param_value(prim, key));
    }
    return params;
  }

  // ---- equations and jaxprs ----
  // [outs =] prim[params] inputs
  JaxprEqn parse_eqn() {
    std::vector<Binder> outs;
    // Outputs first, unless the equation starts with a primitive's name (an equation without outputs).
    skip_ws();
    size_t save = pos_;
    bool has_outputs = !find_primitive(read_name(/*allow_dash=*/true));
    pos_ = save;
    if (at_binder() || has_outputs) {
      while (!at('=')) {
        if (pos_ >= s_.size() || !is_name_start(s_[pos_])) expected("'=' after the equation's output variables");
        outs.push_back(parse_binder());
      }
      ++pos_;
    }
    skip_ws();
    size_t prim_at = pos_;
    std::string name = read_name(/*allow_dash=*/true);
    if (name.empty()) expected("a primitive name");
    JaxprEqn eqn;
    eqn.primitive = find_primitive(name);
    if (!eqn.primitive) fail_at(prim_at, fmt::format("unknown primitive '{}'", name));
    if (pos_ < s_.size() && s_[pos_] == '[') eqn.params = parse_params(*eqn.primitive);
    while (auto a = parse_eqn_input()) eqn.inputs.push_back(std::move(*a));
    try {
      check_operand_count(*eqn.primitive, eqn.inputs.size());
    } catch (const ValueError& e) {
      fail_at(prim_at, e.what());
    }
    infer_weak_types(eqn, outs);
    for (Binder& b : outs) {
      eqn.outputs.emplace_back(b.aval);
      define(b.name, b.at, eqn.outputs.back());
    }
    return eqn;
  }

  // Weak types are not printed: an output is weak where the primitive's abstract evaluation of the
  // inputs says so (and otherwise agrees with the printed type). check_jaxpr reports disagreements.
  static void infer_weak_types(const JaxprEqn& eqn, std::vector<Binder>& outs) {
    if (!eqn.primitive->abstract_eval) return;
    std::vector<Array> ins;
    for (const Atom& a : eqn.inputs) {
      if (auto* l = std::get_if<Literal>(&a))
        ins.push_back(l->value());
      else
        ins.push_back(make_abstract(std::get<Var>(a).aval()));
    }
    std::vector<AbstractValue> want;
    try {
      want = infer_avals(*eqn.primitive, std::span<const Array>(ins), eqn.params);
    } catch (const std::exception&) {
      return;
    }
    if (want.size() != outs.size()) return;
    for (size_t i = 0; i < outs.size(); ++i) {
      AbstractValue& got = outs[i].aval;
      if (got.shape == want[i].shape && got.dtype == want[i].dtype && got.vma == want[i].vma)
        got.weak_type = want[i].weak_type;
    }
  }

  // { lambda constvars; invars. let eqns in (outs) }
  std::shared_ptr<const Jaxpr> parse_jaxpr() {
    expect('{', "starting a jaxpr");
    expect_keyword("lambda", "after '{'");
    scopes_.emplace_back();
    std::vector<Var> constvars = parse_binders(';', "after the constvars (`{ lambda ; a:f32[]. ...` when none)");
    std::vector<Var> invars = parse_binders('.', "after the input variables");
    expect_keyword("let", "after the input variables' '.'");
    std::vector<JaxprEqn> eqns;
    while (!at_outputs_in()) {
      if (pos_ >= s_.size() || at('}')) expected("an equation or 'in (...)' with the jaxpr's outputs");
      eqns.push_back(parse_eqn());
      eat(';');
    }
    pos_ += 2;  // "in"
    expect('(', "starting the jaxpr's outputs");
    std::vector<Atom> outvars;
    while (!eat(')')) {
      outvars.push_back(parse_output_atom());
      if (eat(')')) break;
      expect(',', "or ')' between the jaxpr's outputs");
    }
    expect('}', "closing the jaxpr");
    scopes_.pop_back();
    return std::make_shared<const Jaxpr>(std::move(constvars), std::move(invars), std::move(eqns), std::move(outvars));
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::vector<Scope> scopes_;  // one per jaxpr being read: jaxprs are closed
  std::map<std::string, Hoisted, std::less<>> hoisted_;
};

}  // namespace

std::shared_ptr<const Jaxpr> parse_jaxpr(std::string_view text) { return Parser(text).parse(); }

ClosedJaxpr parse_closed_jaxpr(std::string_view text, std::vector<Array> consts) {
  auto jaxpr = parse_jaxpr(text);
  const auto& cvs = jaxpr->constvars();
  if (consts.size() != cvs.size())
    throw ValueError(
        fmt::format("parse_closed_jaxpr: the jaxpr has {} constvars, but {} consts were passed; pass "
                    "one Array per constvar",
                    cvs.size(), consts.size()));
  for (size_t i = 0; i < consts.size(); ++i) {
    if (!consts[i].defined())
      throw ValueError(fmt::format("parse_closed_jaxpr: const {} is an empty Array handle; pass a defined Array", i));
    const AbstractValue &want = cvs[i].aval(), &got = consts[i].aval();
    if (got.shape != want.shape || got.dtype != want.dtype)
      throw ValueError(
          fmt::format("parse_closed_jaxpr: const {} has type {}, but its constvar has type {}; pass an "
                      "array of the constvar's shape and dtype",
                      i, got.str(), want.str()));
  }
  return ClosedJaxpr{std::move(jaxpr), std::move(consts)};
}

}  // namespace cjax
