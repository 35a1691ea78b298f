#include "core/array/primitive.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <deque>
#include <mutex>
#include <unordered_map>

namespace cjax {

Params::Params(std::initializer_list<std::pair<std::string, ParamValue>> items) {
  for (auto& [k, v] : items) set(k, v);
}
void Params::set(std::string name, ParamValue v) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& kv, const std::string& n) { return kv.first < n; });
  if (it != items_.end() && it->first == name)
    it->second = std::move(v);
  else
    items_.insert(it, {std::move(name), std::move(v)});
}
const ParamValue* Params::find(std::string_view name) const {
  for (auto& kv : items_)
    if (kv.first == name) return &kv.second;
  return nullptr;
}
const ParamValue& Params::at(std::string_view name) const {
  if (auto* p = find(name)) return *p;
  throw Error(fmt::format("internal: primitive parameter '{}' is missing", name));
}
void Params::bad_type(std::string_view name) const {
  throw Error(fmt::format("internal: primitive parameter '{}' has an unexpected type", name));
}
bool Params::operator==(const Params& o) const {
  if (items_.size() != o.items_.size()) return false;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].first != o.items_[i].first) return false;
    const auto &a = items_[i].second, &b = o.items_[i].second;
    if (a.index() != b.index()) return false;
    if (auto* pa = std::get_if<std::shared_ptr<const ParamObject>>(&a)) {
      auto& pb = std::get<std::shared_ptr<const ParamObject>>(b);
      if (!*pa || !pb ? *pa != pb : !(*pa)->equals(*pb)) return false;
    } else if (a != b) {
      return false;
    }
  }
  return true;
}
size_t Params::hash() const {
  size_t h = items_.size();
  for (auto& [k, v] : items_) {
    size_t hv = std::visit(
        [](const auto& x) -> size_t {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::monostate>)
            return 0;
          else if constexpr (std::is_same_v<T, std::shared_ptr<const ParamObject>>)
            return x ? x->hash() : 0;
          else if constexpr (std::is_same_v<T, DType>)
            return size_t(x) * 31 + 7;
          else
            return absl::HashOf(x);
        },
        v);
    h = absl::HashOf(h, k, hv);
  }
  return h;
}

std::string param_value_str(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>)
          return "None";
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "True" : "False";
        else if constexpr (std::is_same_v<T, int64_t>)
          return std::to_string(x);
        else if constexpr (std::is_same_v<T, double>)
          return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, std::string>)
          return x;
        else if constexpr (std::is_same_v<T, DType>)
          return std::string(dtype_name(x));
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (x.size() == 1) return fmt::format("({},)", x[0]);
          return fmt::format("({})", fmt::join(x, ", "));
        } else if constexpr (std::is_same_v<T, std::vector<std::vector<int64_t>>>) {
          std::string s = "(";
          for (size_t i = 0; i < x.size(); ++i) {
            if (i) s += ", ";
            s += x[i].size() == 1 ? fmt::format("({},)", x[i][0]) : fmt::format("({})", fmt::join(x[i], ", "));
          }
          return s + (x.size() == 1 ? ",)" : ")");
        } else {
          return x ? x->str() : "None";
        }
      },
      v);
}

namespace {
struct Registry {
  std::mutex mu;
  std::deque<PrimitiveDef> defs;
  std::unordered_map<std::string, const PrimitiveDef*> by_name;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

namespace {
void check_count(std::string_view name, const Arity& a, size_t got) {
  if (got >= a.min && got <= a.max) return;
  auto n = [](size_t k) { return fmt::format("{} operand{}", k, k == 1 ? "" : "s"); };
  std::string want = a.min == a.max               ? n(a.min)
                     : a.max == Arity::kUnbounded ? "at least " + n(a.min)
                                                  : fmt::format("{} to {}", a.min, n(a.max));
  throw ValueError(fmt::format("{} takes {}, got {}", name, want, got));
}
}  // namespace

void check_operand_count(const PrimitiveDef& def, size_t n) { check_count(def.name, *def.arity, n); }

const PrimitiveDef& register_primitive(PrimitiveDef def) {
  if (!def.arity) throw Error(fmt::format("internal: primitive '{}' is registered without an arity", def.name));
  if (def.abstract_eval) {
    def.abstract_eval = [name = def.name, arity = *def.arity,
                         eval = std::move(def.abstract_eval)](std::span<const Array> in, const Params& p) {
      check_count(name, arity, in.size());
      return eval(in, p);
    };
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.by_name.count(def.name)) throw Error(fmt::format("internal: primitive '{}' registered twice", def.name));
  r.defs.push_back(std::move(def));
  r.by_name[r.defs.back().name] = &r.defs.back();
  return r.defs.back();
}
const PrimitiveDef* find_primitive(std::string_view name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_name.find(std::string(name));
  return it == r.by_name.end() ? nullptr : it->second;
}
std::vector<const PrimitiveDef*> all_primitives() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const PrimitiveDef*> out;
  for (auto& d : r.defs) out.push_back(&d);
  return out;
}

}  // namespace cjax

namespace cjax {

std::vector<AbstractValue> infer_avals(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params) {
  std::vector<AbstractValue> outs = def.abstract_eval(inputs, params);
  if (!has_standard_vma_rule(def)) return outs;
  const std::vector<std::string>* vma = nullptr;
  for (const Array& x : inputs) {
    if (!vma) {
      vma = &x.aval().vma;
    } else if (x.aval().vma != *vma) {
      std::vector<std::string> sets;
      for (const Array& y : inputs) sets.push_back(fmt::format("{{{}}}", fmt::join(y.aval().vma, ",")));
      throw VmaError(fmt::format(
          "Primitive {} requires varying manual axes to match, but got [{}]. The front end makes operands vary "
          "with pvary before binding; if this comes from a custom rule, apply lax::pvary to the operands that vary "
          "over fewer axes, or pass check_vma=false to shard_map.",
          def.name, fmt::join(sets, ", ")));
    }
  }
  for (AbstractValue& o : outs) o.vma = vma ? *vma : std::vector<std::string>{};
  return outs;
}

}  // namespace cjax
