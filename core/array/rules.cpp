#include "core/array/rules.h"

#include <fmt/format.h>

#include <mutex>
#include <unordered_map>

#include "core/array/array_impl.h"

namespace cjax {
namespace {

struct RuleTable {
  std::mutex mu;
  std::once_flag once;
  std::vector<std::function<void()>> initializers;
  std::unordered_map<std::string, PrimitiveRules> rules;  // node-based: references stay valid
};
RuleTable& rule_table() {
  static RuleTable t;
  return t;
}

// JAX's ad.UndefinedPrimal: the aval of a linear input, with no value.
class UndefinedPrimal final : public ArrayImpl {
 public:
  using ArrayImpl::ArrayImpl;
};

}  // namespace

PrimitiveRules& define_rules(std::string_view name) {
  RuleTable& t = rule_table();
  std::lock_guard lock(t.mu);
  return t.rules[std::string(name)];
}

bool add_rule_initializer(std::function<void()> init) {
  RuleTable& t = rule_table();
  std::lock_guard lock(t.mu);
  t.initializers.push_back(std::move(init));
  return true;
}

const PrimitiveRules* find_rules(const PrimitiveDef& def) {
  RuleTable& t = rule_table();
  std::call_once(t.once, [&] {
    std::vector<std::function<void()>> inits;
    {
      std::lock_guard lock(t.mu);
      inits = t.initializers;
    }
    for (auto& f : inits) f();
  });
  std::lock_guard lock(t.mu);
  auto it = t.rules.find(def.name);
  return it == t.rules.end() ? nullptr : &it->second;
}

Array make_undefined_primal(const AbstractValue& aval) { return Array(std::make_shared<UndefinedPrimal>(aval)); }
bool is_undefined_primal(const Array& x) { return x.defined() && dynamic_cast<UndefinedPrimal*>(x.impl()) != nullptr; }

}  // namespace cjax
