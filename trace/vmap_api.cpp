// The non-template parts of cjax/vmap.h.
#include <fmt/format.h>

#include "cjax/vmap.h"
#include "trace/batching.h"

namespace cjax {

std::string AxisSpec::str() const {
  switch (kind_) {
    case Kind::Axis: return std::to_string(axis_);
    case Kind::None: return "None";
    case Kind::List: {
      std::string s = "(";
      for (size_t i = 0; i < list_.size(); ++i) s += (i ? ", " : "") + list_[i].str();
      return s + (list_.size() == 1 ? ",)" : ")");
    }
    case Kind::Dict: {
      std::string s = "{";
      bool first = true;
      for (auto& [k, v] : dict_) {
        s += (first ? "'" : ", '") + k + "': " + v.str();
        first = false;
      }
      return s + "}";
    }
  }
  return "";
}

void AxisSpec::flatten(const TreeDef& t, const std::string& what, std::vector<std::optional<int>>& out) const {
  if (kind_ == Kind::Axis) {
    if (t.kind() == TreeDef::Kind::None)
      throw ValueError(
          fmt::format("vmap: {} is not an Array tree (a static value) but its axis spec is {}; "
                      "use None for static arguments",
                      what, axis_));
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(axis_);
    return;
  }
  if (kind_ == Kind::None) {
    for (size_t i = 0; i < t.num_leaves(); ++i) out.push_back(std::nullopt);
    return;
  }
  auto mismatch = [&] {
    return ValueError(
        fmt::format("vmap: the axis spec {} for {} is not a tree prefix of its structure {}; "
                    "give one entry per child or a single int/None",
                    str(), what, t.node_str()));
  };
  if (kind_ == Kind::List) {
    bool seq = t.kind() == TreeDef::Kind::List || t.kind() == TreeDef::Kind::Tuple ||
               t.kind() == TreeDef::Kind::IntDict || t.kind() == TreeDef::Kind::Struct;
    if (!seq || t.num_children() != list_.size()) throw mismatch();
    for (size_t i = 0; i < list_.size(); ++i) list_[i].flatten(t.children()[i], what, out);
    return;
  }
  if ((t.kind() != TreeDef::Kind::Dict && t.kind() != TreeDef::Kind::Struct) || t.num_children() != dict_.size())
    throw mismatch();
  for (size_t i = 0; i < t.num_children(); ++i) {
    auto it = dict_.find(t.keys()[i]);
    if (it == dict_.end()) throw mismatch();
    it->second.flatten(t.children()[i], what, out);
  }
}

namespace vmap_detail {

void check_in_axes_arity(const AxisSpec& in_axes, size_t num_args) {
  if (in_axes.is_list() && in_axes.list().size() != num_args)
    throw ValueError(
        fmt::format("vmap in_axes must be an int, None, or a list with one entry per argument; got "
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
      throw ValueError(
          fmt::format("vmap was requested to map its argument along axis {}, which implies that its "
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
  if (!size) throw ValueError("vmap must have at least one non-None value in in_axes (or set VmapOptions::axis_size)");
  BatchAxis axis{*size, opts.axis_name, opts.spmd_axis_name};
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
