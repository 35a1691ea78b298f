// cjax::tree — pytrees: nested containers whose leaves are `Array`s (JAX's jax.tree_util).
//
// WHAT IS A TREE
//   * `Array`                                   a leaf
//   * `std::vector<T>`, `std::array<T, N>`      sequences            (TreeDef `[*, *]`, keys `[0]`)
//   * `std::tuple<T...>`, `std::pair<A, B>`     tuples               (TreeDef `(*, *)`, keys `[0]`)
//   * `std::map<std::string, T>`                string-keyed dicts   (TreeDef `{'a': *}`, keys `['a']`)
//   * `cjax::Dict`                              JAX's dot-dict: a leaf, a string-keyed map, an int-keyed
//                                               map ("list"), or None; nestable, value semantics
//   * structs registered with `CJAX_TREE(Type, field, ...)` (TreeDef `CustomNode(Type[('a', 'b')], [*, *])`,
//     keys `.a`)
//   where every T is itself a tree. Everything else (int, float, std::string, configs, a vector<int>) is
//   NOT a tree: transformations treat such arguments as static.
//
//   Dict and std::map children are flattened in SORTED key order, as JAX flattens dicts. A Dict whose
//   int keys are exactly 0..n-1 has the structure of a list (`[*, *]`); other int keys give `{0: *, 5: *}`.
//
// THE COMPILE-TIME PROTOCOL: TreeTraits<T>
//   `is_tree_v<T>` is true iff `TreeTraits<std::remove_cvref_t<T>>::is_tree`. A tree type's traits provide
//
//     static constexpr bool is_tree = true;
//     static void flatten(const T& x, std::vector<Array>& out);          // append leaves, canonical order
//     static TreeDef structure(const T& x);                              // runtime structure
//     static T unflatten(const T& like, tree_detail::LeafCursor& in);    // rebuild: `like` gives the
//                                                                        // structure (vector lengths, Dict
//                                                                        // keys) and the non-tree members
//     template <class V> static void visit(const T& x, KeyPath& path, V& v);   // v(path, leaf) per leaf
//     template <class F, class... R>
//     static /*T*/ auto map(F& f, KeyPath& path, const T& x, const R&... rest);  // R = T; f(path, leaf,
//                                                                        // rest_leaves...) -> new leaf
//
//   Generic code (jit/grad/vmap) uses `is_tree_v<Arg>` to split arguments into traced trees and static
//   values, `tree::flatten(arg)` to get (leaves, TreeDef) — the TreeDef is hashable and part of a cache
//   key — and `tree::unflatten<T>(like, leaves)` to rebuild results of the caller's own types. A user can
//   register another container by specializing `cjax::TreeTraits<C>` with the members above.
//
// MAP SEMANTICS
//   `tree::map(f, tree, rest...)`: for statically typed containers the rest have the same type and the
//   same structure (vector lengths, map keys). At `Dict` nodes JAX's PREFIX rule applies: the first
//   tree's structure is a prefix of the others', and at each leaf of the first tree `f` receives the
//   leaf (`const Array&`) and the others' whole subtrees (`const Dict&`; a Dict converts implicitly to
//   `const Array&` when it is a leaf) — this is how `adam_update(param, grad, state{mu, nu, count})` gets
//   its state. `f` returns an Array (or, at Dict leaves, a Dict, which grafts a subtree). A structure
//   mismatch raises ValueError naming the key path and both sub-structures.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/errors.h"

namespace cjax {

// ------------------------------------------------------------------------------------------------
// Key paths (JAX's DictKey / SequenceKey / GetAttrKey and keystr).

class PathKey {
 public:
  enum class Kind : uint8_t { Key, Index, Attr };  // JAX: DictKey, SequenceKey, GetAttrKey
  static PathKey key(std::string k) { return PathKey(Kind::Key, std::move(k), 0); }
  static PathKey index(int64_t i) { return PathKey(Kind::Index, {}, i); }
  static PathKey attr(std::string name) { return PathKey(Kind::Attr, std::move(name), 0); }
  Kind kind() const { return kind_; }
  const std::string& name() const { return name_; }  // Key and Attr
  int64_t idx() const { return index_; }             // Index
  std::string str() const;                           // "['a']", "[0]", ".x"
  std::string dotted() const;                        // "a", "0", "x"
  bool operator==(const PathKey&) const = default;

 private:
  PathKey(Kind k, std::string n, int64_t i) : kind_(k), name_(std::move(n)), index_(i) {}
  Kind kind_;
  std::string name_;
  int64_t index_;
};

class KeyPath {
 public:
  KeyPath() = default;
  KeyPath(std::initializer_list<PathKey> keys) : keys_(keys) {}
  explicit KeyPath(std::vector<PathKey> keys) : keys_(std::move(keys)) {}
  const std::vector<PathKey>& keys() const { return keys_; }
  size_t size() const { return keys_.size(); }
  bool empty() const { return keys_.empty(); }
  const PathKey& operator[](size_t i) const { return keys_[i]; }
  void push(PathKey k) { keys_.push_back(std::move(k)); }
  void pop() { keys_.pop_back(); }
  KeyPath child(PathKey k) const {
    KeyPath p = *this;
    p.push(std::move(k));
    return p;
  }
  std::string str() const;     // JAX's keystr: "['layers'][0]['mlp']['w']" ("" for the root)
  std::string dotted() const;  // "layers.0.mlp.w" (safetensors / flax-style names)
  bool operator==(const KeyPath&) const = default;

 private:
  std::vector<PathKey> keys_;
};
std::string keystr(const KeyPath&);
std::ostream& operator<<(std::ostream&, const KeyPath&);

// ------------------------------------------------------------------------------------------------
// TreeDef: the runtime structure of a tree (JAX's PyTreeDef). Immutable, cheap to copy, hashable.

class TreeDef {
 public:
  enum class Kind : uint8_t { Leaf, None, List, Tuple, Dict, IntDict, Struct };
  struct Node;

  TreeDef();  // a single leaf `*`
  static TreeDef leaf();
  static TreeDef none();
  static TreeDef list(std::vector<TreeDef> children);
  static TreeDef tuple(std::vector<TreeDef> children);
  // Keys are sorted (children permuted along); duplicates raise ValueError.
  static TreeDef dict(std::vector<std::string> keys, std::vector<TreeDef> children);
  static TreeDef int_dict(std::vector<int64_t> keys, std::vector<TreeDef> children);
  static TreeDef struct_node(std::string type_name, std::vector<std::string> fields, std::vector<TreeDef> children);

  Kind kind() const;
  bool is_leaf() const { return kind() == Kind::Leaf; }
  size_t num_leaves() const;
  size_t num_nodes() const;
  size_t num_children() const;
  const std::vector<TreeDef>& children() const;
  const std::vector<std::string>& keys() const;  // Dict keys or Struct field names
  const std::vector<int64_t>& int_keys() const;  // IntDict keys
  const std::string& type_name() const;          // Struct only
  PathKey child_key(size_t i) const;             // the key of child i as it appears in key paths

  std::string str() const;       // "PyTreeDef({'a': *, 'b': [*, *]})"
  std::string node_str() const;  // "{'a': *, 'b': [*, *]}"
  size_t hash() const;
  bool operator==(const TreeDef& o) const;
  // "" when equal; otherwise where the first difference is and both sub-structures:
  // "at key path ['b']: [*, *] vs [*]".
  std::string difference(const TreeDef& other) const;

 private:
  explicit TreeDef(std::shared_ptr<const Node> n) : node_(std::move(n)) {}
  std::shared_ptr<const Node> node_;
};
std::ostream& operator<<(std::ostream&, const TreeDef&);

// ------------------------------------------------------------------------------------------------
// Dict: JAX's dot-dict. A node is None, a leaf (Array), a string-keyed map, or an int-keyed map (a
// "list": `params["layers"][0]["mlp"]["w"]`). Value semantics (Arrays inside are handles). On a
// non-const Dict `operator[]` creates missing entries (a None node becomes a map of the key's kind);
// on a const Dict a missing key raises ValueError naming the key path and the keys present. Every node
// remembers its key path from the root it was created under, so errors name it.

template <class T>
struct TreeTraits;

class Dict {
 public:
  enum class Kind : uint8_t { None, Leaf, Map, List };

  Dict() = default;  // None
  Dict(NoneT) {}
  Dict(Array a);  // a leaf (implicit, so `d["w"] = x` works)
  Dict(float v);  // leaves from C++ scalars (weakly typed, like Array(v))
  Dict(double v);
  Dict(int v);
  Dict(int64_t v);
  Dict(std::initializer_list<std::pair<const std::string, Dict>> items);  // {{"a", x}, {"b", y}}
  static Dict map();                                                      // an empty string-keyed node
  static Dict list(std::vector<Dict> items = {});                         // int-keyed node with keys 0..n-1

  Dict(const Dict&);
  Dict(Dict&&) noexcept;
  Dict& operator=(const Dict&);  // replaces the content; this node keeps its own key path
  Dict& operator=(Dict&&);
  ~Dict();

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_leaf() const { return kind_ == Kind::Leaf; }
  bool is_map() const { return kind_ == Kind::Map; }
  bool is_list() const { return kind_ == Kind::List; }
  size_t size() const;  // number of children (0 for None and leaves)
  bool contains(const std::string& key) const;
  bool contains(int64_t key) const;

  Dict& operator[](const std::string& key);
  Dict& operator[](const char* key) { return (*this)[std::string(key)]; }
  Dict& operator[](std::string_view key) { return (*this)[std::string(key)]; }
  template <class I>
  requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) Dict& operator[](I i) { return index_mut(int64_t(i)); }
  const Dict& operator[](const std::string& key) const;
  const Dict& operator[](const char* key) const { return (*this)[std::string(key)]; }
  const Dict& operator[](std::string_view key) const { return (*this)[std::string(key)]; }
  template <class I>
  requires(std::is_integral_v<I> && !std::is_same_v<I, bool>) const Dict& operator[](I i) const {
    return index_const(int64_t(i));
  }
  const Dict& at(const std::string& key) const { return (*this)[key]; }
  const Dict& at(int64_t i) const { return index_const(i); }

  Dict& append(Dict item);  // int-keyed node (or None): adds key max+1; returns the new entry
  bool erase(const std::string& key);
  bool erase(int64_t key);

  // The leaf's Array; ValueError naming this node's key path and what it holds otherwise.
  const Array& array() const;
  operator const Array&() const { return array(); }

  const std::map<std::string, Dict>& items() const;  // Map nodes (ValueError otherwise)
  const std::map<int64_t, Dict>& int_items() const;  // List nodes (ValueError otherwise)
  std::vector<std::string> keys() const;             // Map: keys; List: the ints as strings

  const KeyPath& path() const { return path_; }
  std::string str() const;  // "{'a': f32[2,3], 'layers': [{'w': f32[4]}], 'x': None}"

 private:
  Dict& index_mut(int64_t i);
  const Dict& index_const(int64_t i) const;
  void repath(const KeyPath& p);
  [[noreturn]] void kind_error(const char* wanted) const;
  friend struct TreeTraits<Dict>;

  Kind kind_ = Kind::None;
  Array leaf_;
  std::map<std::string, Dict> map_;
  std::map<int64_t, Dict> list_;
  KeyPath path_;
};
std::ostream& operator<<(std::ostream&, const Dict&);
// Structural comparison of Dicts would silently compare leaves as Arrays (via the implicit
// conversion); compare `tree::structure(a) == tree::structure(b)` or the leaves instead.
bool operator==(const Dict&, const Dict&) = delete;

// ------------------------------------------------------------------------------------------------
// TreeTraits (see the top of this file).

template <class T>
struct TreeTraits {
  static constexpr bool is_tree = false;
};
template <class T>
inline constexpr bool is_tree_v = TreeTraits<std::remove_cvref_t<T>>::is_tree;

namespace tree_detail {

// Reads leaves in order during unflatten.
class LeafCursor {
 public:
  LeafCursor(const Array* begin, const Array* end) : it_(begin), end_(end), begin_(begin) {}
  const Array& next();
  size_t consumed() const { return size_t(it_ - begin_); }
  size_t remaining() const { return size_t(end_ - it_); }

 private:
  const Array* it_;
  const Array* end_;
  const Array* begin_;
};

// Raises ValueError: "<fn>: tree <which> has a different structure at key path <path>: expected
// <a> (from tree 1), got <b>".
[[noreturn]] void throw_mismatch(const KeyPath& path, const TreeDef& first, const TreeDef& other, int which);

// Field names of a CJAX_TREE struct, parsed from the macro's stringified field list.
struct StructInfo {
  StructInfo(const char* type_name, const char* field_list);
  std::string name;
  std::vector<std::string> fields;
};

template <class T>
struct is_std_array : std::false_type {};
template <class T, size_t N>
struct is_std_array<std::array<T, N>> : std::true_type {};

}  // namespace tree_detail

// ---- Array: a leaf --------------------------------------------------------------------------------
template <>
struct TreeTraits<Array> {
  static constexpr bool is_tree = true;
  static void flatten(const Array& x, std::vector<Array>& out) { out.push_back(x); }
  static TreeDef structure(const Array&) { return TreeDef::leaf(); }
  static Array unflatten(const Array&, tree_detail::LeafCursor& in) { return in.next(); }
  template <class V>
  static void visit(const Array& x, KeyPath& path, V& v) {
    v(std::as_const(path), x);
  }
  template <class F, class... R>
  static Array map(F& f, KeyPath& path, const Array& x, const R&... rest) {
    return Array(f(std::as_const(path), x, rest...));
  }
};

// ---- std::vector<T> / std::array<T, N> --------------------------------------------------------------
template <class C>
struct SequenceTreeTraits {
  using E = typename C::value_type;
  static constexpr bool is_tree = true;
  static void flatten(const C& x, std::vector<Array>& out) {
    for (const auto& e : x) TreeTraits<E>::flatten(e, out);
  }
  static TreeDef structure(const C& x) {
    std::vector<TreeDef> ch;
    ch.reserve(x.size());
    for (const auto& e : x) ch.push_back(TreeTraits<E>::structure(e));
    return TreeDef::list(std::move(ch));
  }
  static C unflatten(const C& like, tree_detail::LeafCursor& in) {
    C out = like;
    for (size_t i = 0; i < like.size(); ++i) out[i] = TreeTraits<E>::unflatten(like[i], in);
    return out;
  }
  template <class V>
  static void visit(const C& x, KeyPath& path, V& v) {
    for (size_t i = 0; i < x.size(); ++i) {
      path.push(PathKey::index(int64_t(i)));
      TreeTraits<E>::visit(x[i], path, v);
      path.pop();
    }
  }
  template <class F, class... R>
  static C map(F& f, KeyPath& path, const C& x, const R&... rest) {
    int which = 1;
    ((++which,
      rest.size() != x.size() ? tree_detail::throw_mismatch(path, structure(x), structure(rest), which) : void()),
     ...);
    C out = x;
    for (size_t i = 0; i < x.size(); ++i) {
      path.push(PathKey::index(int64_t(i)));
      out[i] = TreeTraits<E>::map(f, path, x[i], rest[i]...);
      path.pop();
    }
    return out;
  }
};
template <class T, class A>
requires is_tree_v<T>
struct TreeTraits<std::vector<T, A>> : SequenceTreeTraits<std::vector<T, A>> {
};
template <class T, size_t N>
requires is_tree_v<T>
struct TreeTraits<std::array<T, N>> : SequenceTreeTraits<std::array<T, N>> {
};

// ---- std::tuple<T...> / std::pair<A, B> ---------------------------------------------------------------
template <class Tup>
struct TupleTreeTraits {
  static constexpr size_t N = std::tuple_size_v<Tup>;
  static constexpr bool is_tree = true;
  template <size_t I>
  using E = std::remove_cvref_t<std::tuple_element_t<I, Tup>>;

  static void flatten(const Tup& x, std::vector<Array>& out) {
    [&]<size_t... I>(std::index_sequence<I...>) { (TreeTraits<E<I>>::flatten(std::get<I>(x), out), ...); }
    (std::make_index_sequence<N>{});
  }
  static TreeDef structure(const Tup& x) {
    std::vector<TreeDef> ch;
    ch.reserve(N);
    [&]<size_t... I>(std::index_sequence<I...>) { (ch.push_back(TreeTraits<E<I>>::structure(std::get<I>(x))), ...); }
    (std::make_index_sequence<N>{});
    return TreeDef::tuple(std::move(ch));
  }
  static Tup unflatten(const Tup& like, tree_detail::LeafCursor& in) {
    Tup out = like;
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((std::get<I>(out) = TreeTraits<E<I>>::unflatten(std::get<I>(like), in)), ...);
    }
    (std::make_index_sequence<N>{});
    return out;
  }
  template <class V>
  static void visit(const Tup& x, KeyPath& path, V& v) {
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((path.push(PathKey::index(int64_t(I))), TreeTraits<E<I>>::visit(std::get<I>(x), path, v), path.pop()), ...);
    }
    (std::make_index_sequence<N>{});
  }
  template <size_t I, class F, class... R>
  static void map_one(F& f, KeyPath& path, Tup& out, const Tup& x, const R&... rest) {
    path.push(PathKey::index(int64_t(I)));
    std::get<I>(out) = TreeTraits<E<I>>::map(f, path, std::get<I>(x), std::get<I>(rest)...);
    path.pop();
  }
  template <class F, class... R>
  static Tup map(F& f, KeyPath& path, const Tup& x, const R&... rest) {
    Tup out = x;
    [&]<size_t... I>(std::index_sequence<I...>) { (map_one<I>(f, path, out, x, rest...), ...); }
    (std::make_index_sequence<N>{});
    return out;
  }
};
template <class... T>
requires(is_tree_v<T>&&...) struct TreeTraits<std::tuple<T...>> : TupleTreeTraits<std::tuple<T...>> {
};
template <class A, class B>
requires(is_tree_v<A>&& is_tree_v<B>) struct TreeTraits<std::pair<A, B>> : TupleTreeTraits<std::pair<A, B>> {
};

// ---- std::map<std::string, T> -------------------------------------------------------------------------
template <class T, class Cmp, class A>
requires is_tree_v<T>
struct TreeTraits<std::map<std::string, T, Cmp, A>> {
  using M = std::map<std::string, T, Cmp, A>;
  static constexpr bool is_tree = true;
  static void flatten(const M& x, std::vector<Array>& out) {
    for (const auto& [k, v] : x) TreeTraits<T>::flatten(v, out);
  }
  static TreeDef structure(const M& x) {
    std::vector<std::string> keys;
    std::vector<TreeDef> ch;
    for (const auto& [k, v] : x) {
      keys.push_back(k);
      ch.push_back(TreeTraits<T>::structure(v));
    }
    return TreeDef::dict(std::move(keys), std::move(ch));
  }
  static M unflatten(const M& like, tree_detail::LeafCursor& in) {
    M out = like;
    for (auto& [k, v] : out) v = TreeTraits<T>::unflatten(v, in);
    return out;
  }
  template <class V>
  static void visit(const M& x, KeyPath& path, V& v) {
    for (const auto& [k, e] : x) {
      path.push(PathKey::key(k));
      TreeTraits<T>::visit(e, path, v);
      path.pop();
    }
  }
  static bool same_keys(const M& a, const M& b) {
    if (a.size() != b.size()) return false;
    for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
      if (i->first != j->first) return false;
    return true;
  }
  template <class F, class... R>
  static M map(F& f, KeyPath& path, const M& x, const R&... rest) {
    int which = 1;
    ((++which, !same_keys(x, rest) ? tree_detail::throw_mismatch(path, structure(x), structure(rest), which) : void()),
     ...);
    M out = x;
    for (auto& [k, v] : out) {
      path.push(PathKey::key(k));
      v = TreeTraits<T>::map(f, path, x.at(k), rest.at(k)...);
      path.pop();
    }
    return out;
  }
};

// ---- Dict ---------------------------------------------------------------------------------------------
template <>
struct TreeTraits<Dict> {
  static constexpr bool is_tree = true;
  static void flatten(const Dict& x, std::vector<Array>& out);
  static TreeDef structure(const Dict& x);
  static Dict unflatten(const Dict& like, tree_detail::LeafCursor& in);
  static Dict from_structure(const TreeDef& td, tree_detail::LeafCursor& in);  // see tree::unflatten
  template <class V>
  static void visit(const Dict& x, KeyPath& path, V& v) {
    switch (x.kind()) {
      case Dict::Kind::None: return;
      case Dict::Kind::Leaf: v(std::as_const(path), x.array()); return;
      case Dict::Kind::Map:
        for (const auto& [k, e] : x.items()) {
          path.push(PathKey::key(k));
          visit(e, path, v);
          path.pop();
        }
        return;
      case Dict::Kind::List:
        for (const auto& [k, e] : x.int_items()) {
          path.push(PathKey::index(k));
          visit(e, path, v);
          path.pop();
        }
        return;
    }
  }
  // Prefix semantics: see the top of this file.
  static bool same_node(const Dict& a, const Dict& b);
  template <class F, class... R>
  static Dict map(F& f, KeyPath& path, const Dict& x, const R&... rest) {
    static_assert((std::is_same_v<R, Dict> && ...), "tree::map: at a Dict node the other trees must be Dicts too");
    if (x.is_leaf()) return Dict(f(std::as_const(path), x.array(), rest...));
    int which = 1;
    ((++which, !same_node(x, rest) ? tree_detail::throw_mismatch(path, structure(x), structure(rest), which) : void()),
     ...);
    switch (x.kind()) {
      case Dict::Kind::Map: {
        Dict out = Dict::map();
        for (const auto& [k, e] : x.items()) {
          path.push(PathKey::key(k));
          out[k] = map(f, path, e, rest.items().at(k)...);
          path.pop();
        }
        return out;
      }
      case Dict::Kind::List: {
        Dict out = Dict::list();
        for (const auto& [k, e] : x.int_items()) {
          path.push(PathKey::index(k));
          out[k] = map(f, path, e, rest.int_items().at(k)...);
          path.pop();
        }
        return out;
      }
      default: return Dict();
    }
  }
};

// ---- structs registered with CJAX_TREE ----------------------------------------------------------------
template <class T>
concept registered_tree_struct = requires(const T* p) {
  cjax_tree_fields_(p);
  cjax_tree_info_(p);
};

template <registered_tree_struct T>
struct TreeTraits<T> {
  static constexpr bool is_tree = true;
  static auto fields() { return cjax_tree_fields_(static_cast<const T*>(nullptr)); }
  static const tree_detail::StructInfo& info() { return cjax_tree_info_(static_cast<const T*>(nullptr)); }
  static constexpr size_t N = std::tuple_size_v<decltype(cjax_tree_fields_(static_cast<const T*>(nullptr)))>;
  template <size_t I>
  using FieldT = std::remove_cvref_t<decltype(std::declval<const T&>().*
                                              std::get<I>(cjax_tree_fields_(static_cast<const T*>(nullptr))))>;
  template <class G>
  static void for_each_field(G&& g) {
    auto fs = fields();
    [&]<size_t... I>(std::index_sequence<I...>) {
      static_assert((is_tree_v<FieldT<I>> && ...),
                    "CJAX_TREE: every listed field must be a tree (Array, containers of Arrays, Dict, a "
                    "registered struct); leave static members out of the list");
      (g(std::integral_constant<size_t, I>{}, std::get<I>(fs)), ...);
    }
    (std::make_index_sequence<N>{});
  }

  static void flatten(const T& x, std::vector<Array>& out) {
    for_each_field([&](auto I, auto mp) { TreeTraits<FieldT<I>>::flatten(x.*mp, out); });
  }
  static TreeDef structure(const T& x) {
    std::vector<TreeDef> ch;
    ch.reserve(N);
    for_each_field([&](auto I, auto mp) { ch.push_back(TreeTraits<FieldT<I>>::structure(x.*mp)); });
    return TreeDef::struct_node(info().name, info().fields, std::move(ch));
  }
  static T unflatten(const T& like, tree_detail::LeafCursor& in) {
    T out = like;
    for_each_field([&](auto I, auto mp) { out.*mp = TreeTraits<FieldT<I>>::unflatten(like.*mp, in); });
    return out;
  }
  template <class V>
  static void visit(const T& x, KeyPath& path, V& v) {
    for_each_field([&](auto I, auto mp) {
      path.push(PathKey::attr(info().fields[I]));
      TreeTraits<FieldT<I>>::visit(x.*mp, path, v);
      path.pop();
    });
  }
  template <class F, class... R>
  static T map(F& f, KeyPath& path, const T& x, const R&... rest) {
    T out = x;
    for_each_field([&](auto I, auto mp) {
      path.push(PathKey::attr(info().fields[I]));
      out.*mp = TreeTraits<FieldT<I>>::map(f, path, x.*mp, rest.*mp...);
      path.pop();
    });
    return out;
  }
};

// ------------------------------------------------------------------------------------------------
// The tree API (JAX's jax.tree).

namespace tree {

// All leaves in canonical order (JAX's tree.leaves). A None node has no leaves.
template <class T>
std::vector<Array> leaves(const T& x) {
  static_assert(is_tree_v<T>, "tree::leaves: the argument is not a tree (see cjax/tree.h)");
  std::vector<Array> out;
  TreeTraits<std::remove_cvref_t<T>>::flatten(x, out);
  return out;
}
template <class T>
TreeDef structure(const T& x) {
  static_assert(is_tree_v<T>, "tree::structure: the argument is not a tree (see cjax/tree.h)");
  return TreeTraits<std::remove_cvref_t<T>>::structure(x);
}
template <class T>
std::pair<std::vector<Array>, TreeDef> flatten(const T& x) {
  return {leaves(x), structure(x)};
}
// (key path, leaf) pairs in canonical order (JAX's tree_util.tree_flatten_with_path).
template <class T>
std::vector<std::pair<KeyPath, Array>> leaves_with_path(const T& x) {
  static_assert(is_tree_v<T>, "tree::leaves_with_path: the argument is not a tree (see cjax/tree.h)");
  std::vector<std::pair<KeyPath, Array>> out;
  KeyPath path;
  auto v = [&](const KeyPath& p, const Array& a) { out.emplace_back(p, a); };
  TreeTraits<std::remove_cvref_t<T>>::visit(x, path, v);
  return out;
}

// Rebuilds a Dict from a structure: lists, tuples and int dicts become int-keyed nodes, dicts and
// structs string-keyed ones (struct fields by name), None stays None. ValueError if the number of
// leaves differs from treedef.num_leaves().
Dict unflatten(const TreeDef& treedef, const std::vector<Array>& leaves);
// Rebuilds a value of the caller's own type with `like`'s structure (and its non-tree members).
template <class T>
requires is_tree_v<T> T unflatten(const T& like, const std::vector<Array>& leaves) {
  tree_detail::LeafCursor in(leaves.data(), leaves.data() + leaves.size());
  T out = TreeTraits<std::remove_cvref_t<T>>::unflatten(like, in);
  if (in.remaining() != 0)
    throw ValueError("tree::unflatten: got " + std::to_string(leaves.size()) + " leaves but the structure " +
                     structure(like).str() + " has " + std::to_string(in.consumed()) +
                     "; pass exactly one leaf per leaf of `like`");
  return out;
}

// JAX's tree.map_with_path: f(const KeyPath&, const Array& leaf, rest...) -> new leaf.
template <class F, class T, class... R>
auto map_with_path(F&& f, const T& x, const R&... rest) {
  static_assert(is_tree_v<T>, "tree::map_with_path: the first argument is not a tree (see cjax/tree.h)");
  static_assert((std::is_same_v<std::remove_cvref_t<T>, std::remove_cvref_t<R>> && ...),
                "tree::map_with_path: the other trees must have the type of the first");
  KeyPath path;
  return TreeTraits<std::remove_cvref_t<T>>::map(f, path, x, rest...);
}
// JAX's tree.map: f(const Array& leaf, rest...) -> new leaf. See "MAP SEMANTICS" above.
template <class F, class T, class... R>
auto map(F&& f, const T& x, const R&... rest) {
  static_assert(is_tree_v<T>, "tree::map: the first argument is not a tree (see cjax/tree.h)");
  static_assert((std::is_same_v<std::remove_cvref_t<T>, std::remove_cvref_t<R>> && ...),
                "tree::map: the other trees must have the type of the first (Dicts: prefix semantics)");
  auto g = [&f](const KeyPath&, const auto&... xs) -> decltype(auto) { return f(xs...); };
  KeyPath path;
  return TreeTraits<std::remove_cvref_t<T>>::map(g, path, x, rest...);
}

}  // namespace tree
}  // namespace cjax

template <>
struct std::hash<cjax::TreeDef> {
  size_t operator()(const cjax::TreeDef& t) const { return t.hash(); }
};

// ------------------------------------------------------------------------------------------------
// CJAX_TREE(Type, field, ...): registers a struct as a tree node whose children are the listed
// fields (each a tree), in the order given. Use it at namespace scope, in the namespace of Type
// (it defines two functions found by argument-dependent lookup). Members not listed are copied
// from the reference value on unflatten (static configuration). Up to 64 fields.
#define CJAX_TREE_PARENS_ ()
#define CJAX_TREE_EXPAND_(...) \
  CJAX_TREE_EXPAND3_(CJAX_TREE_EXPAND3_(CJAX_TREE_EXPAND3_(CJAX_TREE_EXPAND3_(__VA_ARGS__))))
#define CJAX_TREE_EXPAND3_(...) \
  CJAX_TREE_EXPAND2_(CJAX_TREE_EXPAND2_(CJAX_TREE_EXPAND2_(CJAX_TREE_EXPAND2_(__VA_ARGS__))))
#define CJAX_TREE_EXPAND2_(...) \
  CJAX_TREE_EXPAND1_(CJAX_TREE_EXPAND1_(CJAX_TREE_EXPAND1_(CJAX_TREE_EXPAND1_(__VA_ARGS__))))
#define CJAX_TREE_EXPAND1_(...) __VA_ARGS__
#define CJAX_TREE_FOR_EACH_(macro, arg, ...) \
  __VA_OPT__(CJAX_TREE_EXPAND_(CJAX_TREE_FOR_EACH_HELPER_(macro, arg, __VA_ARGS__)))
#define CJAX_TREE_FOR_EACH_HELPER_(macro, arg, a1, ...) \
  macro(arg, a1) __VA_OPT__(CJAX_TREE_FOR_EACH_AGAIN_ CJAX_TREE_PARENS_(macro, arg, __VA_ARGS__))
#define CJAX_TREE_FOR_EACH_AGAIN_() CJAX_TREE_FOR_EACH_HELPER_
#define CJAX_TREE_FIELD_(Type, field) , std::make_tuple(&Type::field)

#define CJAX_TREE(Type, ...)                                                                         \
  [[maybe_unused]] inline auto cjax_tree_fields_(const Type*) {                                      \
    return std::tuple_cat(std::tuple<> {} CJAX_TREE_FOR_EACH_(CJAX_TREE_FIELD_, Type, __VA_ARGS__)); \
  }                                                                                                  \
  [[maybe_unused]] inline const ::cjax::tree_detail::StructInfo& cjax_tree_info_(const Type*) {      \
    static const ::cjax::tree_detail::StructInfo info(#Type, #__VA_ARGS__);                          \
    return info;                                                                                     \
  }
