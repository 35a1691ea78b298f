// Pytrees: key paths, TreeDef (structure, printing, hashing, comparison) and the Dict node.
#include "cjax/tree.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <ostream>

namespace cjax {

namespace {

// Python's repr of a str: single quotes unless the text has ' and no ".
std::string py_repr(std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + char(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  out += q;
  return out;
}

std::string where(const KeyPath& p) { return p.empty() ? std::string("the root") : "key path " + p.str(); }

inline size_t hash_mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// Key paths

std::string PathKey::str() const {
  switch (kind_) {
    case Kind::Key: return "[" + py_repr(name_) + "]";
    case Kind::Index: return fmt::format("[{}]", index_);
    case Kind::Attr: return "." + name_;
  }
  return {};
}
std::string PathKey::dotted() const { return kind_ == Kind::Index ? std::to_string(index_) : name_; }

std::string KeyPath::str() const {
  std::string s;
  for (const auto& k : keys_) s += k.str();
  return s;
}
std::string KeyPath::dotted() const {
  std::string s;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (i) s += '.';
    s += keys_[i].dotted();
  }
  return s;
}
std::string keystr(const KeyPath& p) { return p.str(); }
std::ostream& operator<<(std::ostream& os, const KeyPath& p) { return os << p.str(); }

// ------------------------------------------------------------------------------------------------
// TreeDef

struct TreeDef::Node {
  Kind kind = Kind::Leaf;
  std::vector<TreeDef> children;
  std::vector<std::string> keys;  // Dict keys / Struct fields
  std::vector<int64_t> int_keys;  // IntDict
  std::string type_name;          // Struct
  size_t num_leaves = 1;
  size_t num_nodes = 1;
  size_t hash = 0;
};

namespace {
std::shared_ptr<const TreeDef::Node> finish(std::shared_ptr<TreeDef::Node> n) {
  if (n->kind == TreeDef::Kind::Leaf) {
    n->num_leaves = 1;
  } else {
    n->num_leaves = 0;
    for (const auto& c : n->children) {
      n->num_leaves += c.num_leaves();
      n->num_nodes += c.num_nodes();
    }
  }
  size_t h = std::hash<int>()(int(n->kind));
  for (const auto& k : n->keys) h = hash_mix(h, std::hash<std::string>()(k));
  for (int64_t k : n->int_keys) h = hash_mix(h, std::hash<int64_t>()(k));
  h = hash_mix(h, std::hash<std::string>()(n->type_name));
  for (const auto& c : n->children) h = hash_mix(h, c.hash());
  h = hash_mix(h, n->children.size());
  n->hash = h;
  return n;
}
const std::shared_ptr<const TreeDef::Node>& leaf_node() {
  static const std::shared_ptr<const TreeDef::Node> n = finish(std::make_shared<TreeDef::Node>());
  return n;
}
}  // namespace

TreeDef::TreeDef() : node_(leaf_node()) {}
TreeDef TreeDef::leaf() { return TreeDef(); }
TreeDef TreeDef::none() {
  auto n = std::make_shared<Node>();
  n->kind = Kind::None;
  return TreeDef(finish(n));
}
TreeDef TreeDef::list(std::vector<TreeDef> children) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::List;
  n->children = std::move(children);
  return TreeDef(finish(n));
}
TreeDef TreeDef::tuple(std::vector<TreeDef> children) {
  auto n = std::make_shared<Node>();
  n->kind = Kind::Tuple;
  n->children = std::move(children);
  return TreeDef(finish(n));
}
namespace {
template <class K>
void sort_keys(std::vector<K>& keys, std::vector<TreeDef>& children, const char* fn) {
  if (keys.size() != children.size())
    throw ValueError(
        fmt::format("{}: {} keys but {} children; pass one child per key", fn, keys.size(), children.size()));
  std::vector<size_t> perm(keys.size());
  std::iota(perm.begin(), perm.end(), size_t(0));
  std::stable_sort(perm.begin(), perm.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  std::vector<K> k2;
  std::vector<TreeDef> c2;
  for (size_t i : perm) {
    if (!k2.empty() && k2.back() == keys[i]) {
      if constexpr (std::is_same_v<K, std::string>)
        throw ValueError(fmt::format("{}: duplicate key {}", fn, py_repr(keys[i])));
      else
        throw ValueError(fmt::format("{}: duplicate key {}", fn, keys[i]));
    }
    k2.push_back(keys[i]);
    c2.push_back(children[i]);
  }
  keys = std::move(k2);
  children = std::move(c2);
}
}  // namespace
TreeDef TreeDef::dict(std::vector<std::string> keys, std::vector<TreeDef> children) {
  sort_keys(keys, children, "TreeDef::dict");
  auto n = std::make_shared<Node>();
  n->kind = Kind::Dict;
  n->keys = std::move(keys);
  n->children = std::move(children);
  return TreeDef(finish(n));
}
TreeDef TreeDef::int_dict(std::vector<int64_t> keys, std::vector<TreeDef> children) {
  sort_keys(keys, children, "TreeDef::int_dict");
  auto n = std::make_shared<Node>();
  n->kind = Kind::IntDict;
  n->int_keys = std::move(keys);
  n->children = std::move(children);
  return TreeDef(finish(n));
}
TreeDef TreeDef::struct_node(std::string type_name, std::vector<std::string> fields, std::vector<TreeDef> children) {
  if (fields.size() != children.size())
    throw ValueError(
        fmt::format("TreeDef::struct_node({}): {} fields but {} children", type_name, fields.size(), children.size()));
  auto n = std::make_shared<Node>();
  n->kind = Kind::Struct;
  n->type_name = std::move(type_name);
  n->keys = std::move(fields);
  n->children = std::move(children);
  return TreeDef(finish(n));
}

TreeDef::Kind TreeDef::kind() const { return node_->kind; }
size_t TreeDef::num_leaves() const { return node_->num_leaves; }
size_t TreeDef::num_nodes() const { return node_->num_nodes; }
size_t TreeDef::num_children() const { return node_->children.size(); }
const std::vector<TreeDef>& TreeDef::children() const { return node_->children; }
const std::vector<std::string>& TreeDef::keys() const { return node_->keys; }
const std::vector<int64_t>& TreeDef::int_keys() const { return node_->int_keys; }
const std::string& TreeDef::type_name() const { return node_->type_name; }
size_t TreeDef::hash() const { return node_->hash; }

PathKey TreeDef::child_key(size_t i) const {
  switch (node_->kind) {
    case Kind::Dict: return PathKey::key(node_->keys.at(i));
    case Kind::IntDict: return PathKey::index(node_->int_keys.at(i));
    case Kind::Struct: return PathKey::attr(node_->keys.at(i));
    default: return PathKey::index(int64_t(i));
  }
}

std::string TreeDef::node_str() const {
  const Node& n = *node_;
  auto kids = [&](size_t i) { return n.children[i].node_str(); };
  std::string s;
  switch (n.kind) {
    case Kind::Leaf: return "*";
    case Kind::None: return "None";
    case Kind::List:
      s = "[";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + kids(i);
      return s + "]";
    case Kind::Tuple:
      s = "(";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + kids(i);
      return s + (n.children.size() == 1 ? ",)" : ")");
    case Kind::Dict:
      s = "{";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + py_repr(n.keys[i]) + ": " + kids(i);
      return s + "}";
    case Kind::IntDict:
      s = "{";
      for (size_t i = 0; i < n.children.size(); ++i)
        s += fmt::format("{}{}: {}", i ? ", " : "", n.int_keys[i], kids(i));
      return s + "}";
    case Kind::Struct: {
      std::string fields = "(";
      for (size_t i = 0; i < n.keys.size(); ++i) fields += (i ? ", " : "") + py_repr(n.keys[i]);
      fields += n.keys.size() == 1 ? ",)" : ")";
      s = "CustomNode(" + n.type_name + "[" + fields + "], [";
      for (size_t i = 0; i < n.children.size(); ++i) s += (i ? ", " : "") + kids(i);
      return s + "])";
    }
  }
  return s;
}
std::string TreeDef::str() const { return "PyTreeDef(" + node_str() + ")"; }
std::ostream& operator<<(std::ostream& os, const TreeDef& t) { return os << t.str(); }

namespace {
bool same_node_data(const TreeDef& a, const TreeDef& b) {
  return a.kind() == b.kind() && a.num_children() == b.num_children() && a.keys() == b.keys() &&
         a.int_keys() == b.int_keys() && a.type_name() == b.type_name();
}
}  // namespace

bool TreeDef::operator==(const TreeDef& o) const {
  if (node_ == o.node_) return true;
  if (node_->hash != o.node_->hash || node_->num_leaves != o.node_->num_leaves ||
      node_->num_nodes != o.node_->num_nodes || !same_node_data(*this, o))
    return false;
  for (size_t i = 0; i < node_->children.size(); ++i)
    if (!(node_->children[i] == o.node_->children[i])) return false;
  return true;
}

namespace {
std::string diff_rec(const TreeDef& a, const TreeDef& b, KeyPath& path) {
  if (a == b) return {};
  if (!same_node_data(a, b)) return fmt::format("at {}: {} vs {}", where(path), a.node_str(), b.node_str());
  for (size_t i = 0; i < a.num_children(); ++i) {
    path.push(a.child_key(i));
    std::string d = diff_rec(a.children()[i], b.children()[i], path);
    path.pop();
    if (!d.empty()) return d;
  }
  return {};
}
}  // namespace
std::string TreeDef::difference(const TreeDef& other) const {
  KeyPath p;
  return diff_rec(*this, other, p);
}

// ------------------------------------------------------------------------------------------------
// tree_detail

namespace tree_detail {
const Array& LeafCursor::next() {
  if (it_ == end_)
    throw ValueError(
        fmt::format("tree::unflatten: too few leaves: got {}, but the structure has more; pass one "
                    "leaf per leaf of the structure",
                    consumed()));
  return *it_++;
}

void throw_mismatch(const KeyPath& path, const TreeDef& first, const TreeDef& other, int which) {
  throw ValueError(
      fmt::
          format("tree::map: tree {} has a different structure than tree 1 at {}: tree 1 has {} there, tree {} has {}. "
                 "Tree 1's structure must be a prefix of every other tree's (same containers and keys down to tree 1's "
                 "leaves)",
                 which, where(path), first.node_str(), which, other.node_str()));
}

StructInfo::StructInfo(const char* type_name, const char* field_list) : name(type_name) {
  std::string_view s(field_list);
  while (!s.empty()) {
    size_t c = s.find(',');
    std::string_view f = s.substr(0, c);
    while (!f.empty() && (f.front() == ' ' || f.front() == '\t' || f.front() == '\n')) f.remove_prefix(1);
    while (!f.empty() && (f.back() == ' ' || f.back() == '\t' || f.back() == '\n')) f.remove_suffix(1);
    if (!f.empty()) fields.emplace_back(f);
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
}
}  // namespace tree_detail

// ------------------------------------------------------------------------------------------------
// Dict

Dict::Dict(Array a) : kind_(Kind::Leaf), leaf_(std::move(a)) {}
Dict::Dict(float v) : Dict(Array(v)) {}
Dict::Dict(double v) : Dict(Array(v)) {}
Dict::Dict(int v) : Dict(Array(v)) {}
Dict::Dict(int64_t v) : Dict(Array(v)) {}
Dict::Dict(std::initializer_list<std::pair<const std::string, Dict>> items) : kind_(Kind::Map) {
  for (const auto& [k, v] : items) map_.insert_or_assign(k, v);
  repath(path_);
}
Dict Dict::map() {
  Dict d;
  d.kind_ = Kind::Map;
  return d;
}
Dict Dict::list(std::vector<Dict> items) {
  Dict d;
  d.kind_ = Kind::List;
  for (size_t i = 0; i < items.size(); ++i) d.list_.emplace(int64_t(i), std::move(items[i]));
  d.repath(d.path_);
  return d;
}
Dict::Dict(const Dict&) = default;
Dict::Dict(Dict&&) noexcept = default;
Dict::~Dict() = default;
Dict& Dict::operator=(const Dict& o) {
  if (this == &o) return *this;
  Dict tmp(o);  // o may live inside *this
  return *this = std::move(tmp);
}
Dict& Dict::operator=(Dict&& o) {
  if (this == &o) return *this;
  Dict tmp(std::move(o));  // o may live inside *this
  kind_ = tmp.kind_;
  leaf_ = std::move(tmp.leaf_);
  map_ = std::move(tmp.map_);
  list_ = std::move(tmp.list_);
  repath(path_);
  return *this;
}

void Dict::repath(const KeyPath& p) {
  if (&p != &path_) path_ = p;
  for (auto& [k, v] : map_) v.repath(path_.child(PathKey::key(k)));
  for (auto& [k, v] : list_) v.repath(path_.child(PathKey::index(k)));
}

namespace {
std::string describe(const Dict& d) {
  switch (d.kind()) {
    case Dict::Kind::None: return "None (an entry created by operator[] and never assigned?)";
    case Dict::Kind::Leaf:
      return "an array leaf " + (d.array().defined() ? d.array().aval().str() : std::string("(empty handle)"));
    case Dict::Kind::Map: {
      std::vector<std::string> ks;
      for (const auto& [k, v] : d.items()) ks.push_back(py_repr(k));
      return fmt::format("a string-keyed dict with keys [{}]", fmt::join(ks, ", "));
    }
    case Dict::Kind::List: {
      std::vector<int64_t> ks;
      for (const auto& [k, v] : d.int_items()) ks.push_back(k);
      return fmt::format("an int-keyed dict (list) with keys [{}]", fmt::join(ks, ", "));
    }
  }
  return {};
}
}  // namespace

void Dict::kind_error(const char* wanted) const {
  throw ValueError(fmt::format("Dict: the node at {} is {}; {}", where(path_), describe(*this), wanted));
}

size_t Dict::size() const { return kind_ == Kind::Map ? map_.size() : kind_ == Kind::List ? list_.size() : 0; }
bool Dict::contains(const std::string& key) const { return kind_ == Kind::Map && map_.count(key); }
bool Dict::contains(int64_t key) const { return kind_ == Kind::List && list_.count(key); }

Dict& Dict::operator[](const std::string& key) {
  if (kind_ == Kind::None) kind_ = Kind::Map;
  if (kind_ != Kind::Map) kind_error(fmt::format("it cannot be indexed with the string key {}", py_repr(key)).c_str());
  auto [it, inserted] = map_.try_emplace(key);
  if (inserted) it->second.path_ = path_.child(PathKey::key(key));
  return it->second;
}
Dict& Dict::index_mut(int64_t i) {
  if (kind_ == Kind::None) kind_ = Kind::List;
  if (kind_ != Kind::List) kind_error(fmt::format("it cannot be indexed with the integer key {}", i).c_str());
  if (i < 0)
    throw ValueError(fmt::format("Dict: negative key {} at {}; integer keys of a Dict are >= 0", i, where(path_)));
  auto [it, inserted] = list_.try_emplace(i);
  if (inserted) it->second.path_ = path_.child(PathKey::index(i));
  return it->second;
}
const Dict& Dict::operator[](const std::string& key) const {
  if (kind_ != Kind::Map) kind_error(fmt::format("it cannot be indexed with the string key {}", py_repr(key)).c_str());
  auto it = map_.find(key);
  if (it == map_.end())
    throw ValueError(fmt::format("Dict: no key {} at {}; the node is {}", py_repr(key), where(path_), describe(*this)));
  return it->second;
}
const Dict& Dict::index_const(int64_t i) const {
  if (kind_ != Kind::List) kind_error(fmt::format("it cannot be indexed with the integer key {}", i).c_str());
  auto it = list_.find(i);
  if (it == list_.end())
    throw ValueError(fmt::format("Dict: no key {} at {}; the node is {}", i, where(path_), describe(*this)));
  return it->second;
}
Dict& Dict::append(Dict item) {
  if (kind_ == Kind::None) kind_ = Kind::List;
  if (kind_ != Kind::List) kind_error("append() needs an int-keyed (list) node");
  int64_t k = list_.empty() ? 0 : list_.rbegin()->first + 1;
  Dict& d = index_mut(k);
  d = std::move(item);
  return d;
}
bool Dict::erase(const std::string& key) { return kind_ == Kind::Map && map_.erase(key) > 0; }
bool Dict::erase(int64_t key) { return kind_ == Kind::List && list_.erase(key) > 0; }

const Array& Dict::array() const {
  if (kind_ != Kind::Leaf)
    kind_error("it is not an array leaf; index further into it, or use tree::leaves / tree::map to reach its arrays");
  return leaf_;
}
const std::map<std::string, Dict>& Dict::items() const {
  if (kind_ != Kind::Map) kind_error("items() needs a string-keyed node");
  return map_;
}
const std::map<int64_t, Dict>& Dict::int_items() const {
  if (kind_ != Kind::List) kind_error("int_items() needs an int-keyed (list) node");
  return list_;
}
std::vector<std::string> Dict::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : map_) out.push_back(k);
  for (const auto& [k, v] : list_) out.push_back(std::to_string(k));
  return out;
}

namespace {
bool dense(const std::map<int64_t, Dict>& m) {
  int64_t i = 0;
  for (const auto& [k, v] : m)
    if (k != i++) return false;
  return true;
}
}  // namespace

std::string Dict::str() const {
  std::string s;
  switch (kind_) {
    case Kind::None: return "None";
    case Kind::Leaf: return leaf_.defined() ? leaf_.aval().str() : "<empty Array>";
    case Kind::Map: {
      s = "{";
      bool first = true;
      for (const auto& [k, v] : map_) {
        s += (first ? "" : ", ") + py_repr(k) + ": " + v.str();
        first = false;
      }
      return s + "}";
    }
    case Kind::List: {
      bool d = dense(list_);
      s = d ? "[" : "{";
      bool first = true;
      for (const auto& [k, v] : list_) {
        s += (first ? "" : ", ") + (d ? std::string() : std::to_string(k) + ": ") + v.str();
        first = false;
      }
      return s + (d ? "]" : "}");
    }
  }
  return s;
}
std::ostream& operator<<(std::ostream& os, const Dict& d) { return os << d.str(); }

// ------------------------------------------------------------------------------------------------
// TreeTraits<Dict>

void TreeTraits<Dict>::flatten(const Dict& x, std::vector<Array>& out) {
  switch (x.kind_) {
    case Dict::Kind::None: return;
    case Dict::Kind::Leaf: out.push_back(x.leaf_); return;
    case Dict::Kind::Map:
      for (const auto& [k, v] : x.map_) flatten(v, out);
      return;
    case Dict::Kind::List:
      for (const auto& [k, v] : x.list_) flatten(v, out);
      return;
  }
}
TreeDef TreeTraits<Dict>::structure(const Dict& x) {
  switch (x.kind_) {
    case Dict::Kind::None: return TreeDef::none();
    case Dict::Kind::Leaf: return TreeDef::leaf();
    case Dict::Kind::Map: {
      std::vector<std::string> keys;
      std::vector<TreeDef> ch;
      keys.reserve(x.map_.size());
      ch.reserve(x.map_.size());
      for (const auto& [k, v] : x.map_) {
        keys.push_back(k);
        ch.push_back(structure(v));
      }
      return TreeDef::dict(std::move(keys), std::move(ch));
    }
    case Dict::Kind::List: {
      std::vector<TreeDef> ch;
      ch.reserve(x.list_.size());
      for (const auto& [k, v] : x.list_) ch.push_back(structure(v));
      if (dense(x.list_)) return TreeDef::list(std::move(ch));
      std::vector<int64_t> keys;
      for (const auto& [k, v] : x.list_) keys.push_back(k);
      return TreeDef::int_dict(std::move(keys), std::move(ch));
    }
  }
  return TreeDef::none();
}
Dict TreeTraits<Dict>::unflatten(const Dict& like, tree_detail::LeafCursor& in) {
  Dict out = like;
  struct Filler {
    static void run(Dict& d, tree_detail::LeafCursor& in) {
      if (d.kind_ == Dict::Kind::Leaf) d.leaf_ = in.next();
      for (auto& [k, v] : d.map_) run(v, in);
      for (auto& [k, v] : d.list_) run(v, in);
    }
  };
  Filler::run(out, in);
  return out;
}
Dict TreeTraits<Dict>::from_structure(const TreeDef& td, tree_detail::LeafCursor& in) {
  Dict d;
  switch (td.kind()) {
    case TreeDef::Kind::Leaf:
      d.kind_ = Dict::Kind::Leaf;
      d.leaf_ = in.next();
      return d;
    case TreeDef::Kind::None: return d;
    case TreeDef::Kind::List:
    case TreeDef::Kind::Tuple:
    case TreeDef::Kind::IntDict:
      d.kind_ = Dict::Kind::List;
      for (size_t i = 0; i < td.num_children(); ++i)
        d.list_.emplace(td.child_key(i).idx(), from_structure(td.children()[i], in));
      return d;
    case TreeDef::Kind::Dict:
    case TreeDef::Kind::Struct:
      d.kind_ = Dict::Kind::Map;
      for (size_t i = 0; i < td.num_children(); ++i) d.map_.emplace(td.keys()[i], from_structure(td.children()[i], in));
      return d;
  }
  return d;
}
bool TreeTraits<Dict>::same_node(const Dict& a, const Dict& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Dict::Kind::None:
    case Dict::Kind::Leaf: return true;
    case Dict::Kind::Map: {
      if (a.map_.size() != b.map_.size()) return false;
      for (auto i = a.map_.begin(), j = b.map_.begin(); i != a.map_.end(); ++i, ++j)
        if (i->first != j->first) return false;
      return true;
    }
    case Dict::Kind::List: {
      if (a.list_.size() != b.list_.size()) return false;
      for (auto i = a.list_.begin(), j = b.list_.begin(); i != a.list_.end(); ++i, ++j)
        if (i->first != j->first) return false;
      return true;
    }
  }
  return false;
}

namespace tree {
Dict unflatten(const TreeDef& treedef, const std::vector<Array>& leaves) {
  if (leaves.size() != treedef.num_leaves())
    throw ValueError(
        fmt::format("tree::unflatten: the structure {} has {} leaves but {} were given; pass exactly "
                    "one array per leaf",
                    treedef.str(), treedef.num_leaves(), leaves.size()));
  tree_detail::LeafCursor in(leaves.data(), leaves.data() + leaves.size());
  Dict d;
  d = TreeTraits<Dict>::from_structure(treedef, in);  // assignment sets every node's key path
  return d;
}
}  // namespace tree

}  // namespace cjax
