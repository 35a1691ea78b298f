// The non-template parts of cjax/vmap.h.
#include <fmt/format.h>

#include "cjax/vmap.h"
#include "trace/batching.h"

namespace cjax {

std::string AxisSpec::str() const {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int>) return std::to_string(x);
        else if constexpr (std::is_same_v<T, NoneT>) return "None";
        else if constexpr (std::is_same_v<T, std::vector<AxisSpec>>) {
          std::string s = "(";
          for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + x[i].str();
          return s + (x.size() == 1 ? ",)" : ")");
        } else {
          std::string s = "{";
          bool first = true;
          for (auto& [k, v] : x) {
            s += (first ? "'" : ", '") + k + "': " + v.str();
            first = false;
          }
          return s + "}";
        }
      },
      v_);
}

void AxisSpec::flatten(const TreeDef& t, const std::string& what, std::vector<std::optional<int>>& out) const {
  if (auto* a = std::get_if<int>(&v_)) {
    if (t.kind() == TreeDef::Kind::None)
      throw ValueError(fmt::format("vmap: {} is not an Array tree (a static value) but its axis spec is {}; "
                                   "use None for static arguments",
                                   what, *a));
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(*a);
    return;
  }
  if (std::holds_alternative<NoneT>(v_)) {
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(std::nullopt);
    return;
  }
  auto mismatch = [&] {
    return ValueError(fmt::format("vmap: the axis spec {} for {} is not a tree prefix of its structure {}; "
                                  "give one entry per child or a single int/None",
                                  str(), what, t.node_str()));
  };
  if (auto* l = std::get_if<std::vector<AxisSpec>>(&v_)) {
    bool seq = t.kind() == TreeDef::Kind::List || t.kind() == TreeDef::Kind::Tuple ||
               t.kind() == TreeDef::Kind::IntDict || t.kind() == TreeDef::Kind::Struct;
    if (!seq || t.num_children() != l->size()) throw mismatch();
    for (size_t i = 0; i < l->size(); ++i) (*l)[i].flatten(t.children()[i], what, out);
    return;
  }
  auto& m = std::get<std::map<std::string, AxisSpec>>(v_);
  if ((t.kind() != TreeDef::Kind::Dict && t.kind() != TreeDef::Kind::Struct) || t.num_children() != m.size())
    throw mismatch();
  for (size_t i = 0; i < t.num_children(); ++i) {
    auto it = m.find(t.keys()[i]);
    if (it == m.end()) throw mismatch();
    it->second.flatten(t.children()[i], what, out);
  }
}

namespace vmap_detail {

void check_in_axes_arity(const AxisSpec& in_axes, size_t num_args) {
  if (in_axes.is_list() && in_axes.list().size() != num_args)
    throw ValueError(fmt::format("vmap in_axes must be an int, None, or a list with one entry per argument; got "
                                 "{} entries {} for {} arguments",
                                 in_axes.list().size(), in_axes.str(), num_args));
}

std::vector<Array> vmap(const FlatFn& f, const std::vector<Array>& args, const std::vector<std::optional<int>>& in_axes,
                        const std::vector<std::optional<int>>& out_axes, const VmapOptions& opts) {
  std::vector<int> axes;
  std::optional<int64_t> size = opts.axis_size;
  std::string size_from;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!in_axes[i]) {
      axes.push_back(kNotMapped);
      continue;
    }
    int nd = args[i].ndim(), a = *in_axes[i];
    if (a < -nd || a >= nd)
      throw ValueError(fmt::format("vmap was requested to map its argument along axis {}, which implies that its "
                                   "rank should be at least {}, but is only {} (its shape is {})",
                                   a, a < 0 ? -a : a + 1, nd, args[i].aval().str()));
    if (a < 0) a += nd;
    axes.push_back(a);
    int64_t n = args[i].shape()[size_t(a)];
    std::string from = fmt::format("leaf {} of type {} has size {} along axis {}", i, args[i].aval().str(), n, a);
    if (!size) {
      size = n;
      size_from = from;
    } else if (*size != n) {
      throw ValueError(fmt::format("vmap got inconsistent sizes for the array axes to be mapped: {}{}", from,
                                   size_from.empty() ? fmt::format(" but axis_size is {}", *size)
                                                     : fmt::format(", while {}", size_from)));
    }
  }
  if (!size)
    throw ValueError("vmap must have at least one non-None value in in_axes (or set VmapOptions::axis_size)");
  BatchAxis axis{*size, opts.axis_name};
  auto out_axis = [&](size_t j, int rank) -> int {
    if (j >= out_axes.size()) throw Error("internal: vmap out_axes shorter than the outputs");
    if (!out_axes[j]) return kNotMapped;
    int a = *out_axes[j];
    if (a < -(rank + 1) || a > rank)
      throw ValueError(fmt::format("vmap out_axes {} is out of range for output {} of rank {}", a, j, rank));
    return a < 0 ? a + rank + 1 : a;
  };
  return vmap_flat(f, args, axes, out_axis, axis);
}

}  // namespace vmap_detail
}  // namespace cjax
