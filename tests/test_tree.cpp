// Pytrees: Dict, every container kind, TreeDef, map (incl. prefix semantics), map_with_path, unflatten.
#include <doctest/doctest.h>

#include <array>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {

Array f32v(std::vector<float> v) { return jnp::array<float>(v); }
Array f32s(float v) { return jnp::array<float>(std::vector<float>{v}, Shape{}); }
std::vector<float> vals(const Array& a) { return a.to_vector<float>(); }
float val(const Array& a) { return a.item<float>(); }
// Leaves' first values, for order checks.
std::vector<float> firsts(const std::vector<Array>& ls) {
  std::vector<float> out;
  for (const auto& l : ls) out.push_back(l.to_vector<float>().at(0));
  return out;
}
Array plus1(const Array& x) {
  return lax::add(x, jnp::array<float>(std::vector<float>(size_t(x.size()), 1.f), x.shape()));
}

}  // namespace

// A registered struct in a namespace, with a static (unlisted) member.
namespace model {
struct Linear {
  Array w;
  Array b;
  int features = 0;  // static configuration: not a field of the tree
};
CJAX_TREE(Linear, w, b)

struct Net {
  std::vector<Linear> layers;
  Dict extra;
  std::pair<Array, Array> scale;
};
CJAX_TREE(Net, layers, extra, scale)
}  // namespace model

struct Empty {
  int n = 3;
};
CJAX_TREE(Empty)

static_assert(is_tree_v<Array>);
static_assert(is_tree_v<Dict>);
static_assert(is_tree_v<const Dict&>);
static_assert(is_tree_v<std::vector<Array>>);
static_assert(is_tree_v<std::array<Array, 3>>);
static_assert(is_tree_v<std::tuple<Array, std::vector<Array>>>);
static_assert(is_tree_v<std::pair<Array, Dict>>);
static_assert(is_tree_v<std::map<std::string, std::vector<Array>>>);
static_assert(is_tree_v<model::Linear>);
static_assert(is_tree_v<model::Net>);
static_assert(is_tree_v<std::vector<model::Net>>);
static_assert(is_tree_v<Empty>);
static_assert(!is_tree_v<int>);
static_assert(!is_tree_v<float>);
static_assert(!is_tree_v<std::string>);
static_assert(!is_tree_v<std::vector<int>>);
static_assert(!is_tree_v<std::tuple<Array, int>>);
static_assert(!is_tree_v<std::map<int, Array>>);

TEST_CASE("Dict: creation with operator[], nesting, lists, leaves, value semantics") {
  Dict params;
  CHECK(params.is_none());
  params["layers"][0]["mlp"]["w"] = f32v({1, 2});
  params["layers"][1]["mlp"]["w"] = f32v({3});
  params["embed"] = f32v({4, 5, 6});
  CHECK(params.is_map());
  CHECK(params["layers"].is_list());
  CHECK(params["layers"].size() == 2);
  CHECK(params["layers"][1]["mlp"]["w"].is_leaf());
  CHECK(vals(params["layers"][0]["mlp"]["w"].array()) == std::vector<float>{1, 2});
  Array e = params["embed"];  // implicit conversion of a leaf
  CHECK(vals(e) == std::vector<float>{4, 5, 6});
  // Elementwise math directly on leaf nodes (they convert to const Array&).
  CHECK(vals(lax::add(params["embed"], params["embed"])) == std::vector<float>{8, 10, 12});
  CHECK(params["layers"][1]["mlp"]["w"].path().str() == "['layers'][1]['mlp']['w']");
  CHECK(params.str() == "{'embed': f32[3], 'layers': [{'mlp': {'w': f32[2]}}, {'mlp': {'w': f32[1]}}]}");

  // Copies are independent (the Arrays inside are shared handles).
  Dict copy = params;
  copy["embed"] = f32v({0});
  copy["layers"][0]["new"] = f32v({9});
  CHECK(vals(params["embed"]) == std::vector<float>{4, 5, 6});
  CHECK(!params["layers"][0].contains("new"));
  CHECK(copy["layers"][0].contains("new"));

  // Assigning a subtree elsewhere re-paths it.
  Dict other;
  other["x"]["y"] = params["layers"];
  CHECK(other["x"]["y"][0]["mlp"]["w"].path().str() == "['x']['y'][0]['mlp']['w']");
  // Self-assignment from a child.
  Dict s;
  s["a"]["b"] = f32v({7});
  s = s["a"];
  CHECK(s.contains("b"));
  CHECK(vals(s["b"]) == std::vector<float>{7});
  CHECK(s["b"].path().str() == "['b']");

  // Braced construction, list(), append, erase, scalars.
  Dict d{{"lr", 0.5f}, {"steps", Dict::list({f32s(1), f32s(2)})}, {"none", None}};
  CHECK(d["lr"].array().dtype() == f32);
  CHECK(d["lr"].array().weak_type());
  CHECK(d["steps"].size() == 2);
  d["steps"].append(f32s(3));
  CHECK(d["steps"].size() == 3);
  CHECK(val(d["steps"][2]) == 3.f);
  CHECK(d["steps"][2].path().str() == "['steps'][2]");
  CHECK(d["none"].is_none());
  CHECK(d.erase("none"));
  CHECK(!d.contains("none"));
  CHECK(d.keys() == std::vector<std::string>{"lr", "steps"});
  CHECK(d["steps"].keys() == std::vector<std::string>{"0", "1", "2"});
  Dict emp = Dict::map();
  CHECK(emp.is_map());
  CHECK(tree::structure(emp).str() == "PyTreeDef({})");
  CHECK(tree::structure(Dict::list()).str() == "PyTreeDef([])");
}

TEST_CASE("Dict: misuse errors name the key path") {
  Dict p;
  p["layers"][0]["w"] = f32v({1});
  const Dict& cp = p;
  CHECK_THROWS_WITH_AS(cp["layers"][0]["b"], doctest::Contains("no key 'b' at key path ['layers'][0]"), ValueError);
  CHECK_THROWS_WITH_AS(cp["layers"][0]["b"], doctest::Contains("keys ['w']"), ValueError);
  CHECK_THROWS_WITH_AS(cp["layers"][3], doctest::Contains("no key 3 at key path ['layers']"), ValueError);
  CHECK_THROWS_WITH_AS(cp["layers"].array(), doctest::Contains("key path ['layers'] is an int-keyed dict (list)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(cp["layers"].array(), doctest::Contains("not an array leaf"), ValueError);
  CHECK_THROWS_WITH_AS(p["layers"]["x"], doctest::Contains("cannot be indexed with the string key 'x'"), ValueError);
  CHECK_THROWS_WITH_AS(p["layers"][0]["w"]["x"],
                       doctest::Contains("key path ['layers'][0]['w'] is an array leaf f32[1]"), ValueError);
  CHECK_THROWS_WITH_AS(p["layers"][0]["w"][0], doctest::Contains("integer key 0"), ValueError);
  CHECK_THROWS_WITH_AS(p["layers"][-1], doctest::Contains("negative key -1"), ValueError);
  // A never-assigned entry created by non-const operator[] is None.
  Dict& missing = p["typo"];
  CHECK(missing.is_none());
  CHECK_THROWS_WITH_AS(missing.array(), doctest::Contains("key path ['typo'] is None"), ValueError);
  CHECK_THROWS_WITH_AS(Dict().array(), doctest::Contains("the root is None"), ValueError);
  Array a = f32v({1});
  CHECK_THROWS_AS((void)Dict::map().items().at("q"), std::out_of_range);
  CHECK_THROWS_WITH_AS(Dict(a).items(), doctest::Contains("items() needs a string-keyed node"), ValueError);
}

TEST_CASE("Dict flattening is in sorted key order; ints numerically") {
  Dict d;
  d["zeta"] = f32v({1});
  d["alpha"] = f32v({2});
  d["Beta"] = f32v({3});  // uppercase sorts before lowercase, as Python's sorted()
  d["mid"][10] = f32v({4});
  d["mid"][2] = f32v({5});
  d["mid"][0] = f32v({6});
  d["empty"] = None;
  auto [leaves, td] = tree::flatten(d);
  CHECK(firsts(leaves) == std::vector<float>{3, 2, 6, 5, 4, 1});
  CHECK(td.num_leaves() == 6);
  CHECK(td.str() == "PyTreeDef({'Beta': *, 'alpha': *, 'empty': None, 'mid': {0: *, 2: *, 10: *}, 'zeta': *})");
  auto lp = tree::leaves_with_path(d);
  std::vector<std::string> paths;
  for (auto& [p, a] : lp) paths.push_back(p.str());
  CHECK(paths ==
        std::vector<std::string>{"['Beta']", "['alpha']", "['mid'][0]", "['mid'][2]", "['mid'][10]", "['zeta']"});
}

TEST_CASE("every container kind: leaves, structure printing, map, unflatten") {
  Array a = f32v({1}), b = f32v({2}), c = f32v({3});
  SUBCASE("Array") {
    CHECK(tree::structure(a).str() == "PyTreeDef(*)");
    CHECK(vals(tree::map(plus1, a)) == std::vector<float>{2});
  }
  SUBCASE("std::vector") {
    std::vector<Array> v{a, b, c};
    CHECK(tree::structure(v).str() == "PyTreeDef([*, *, *])");
    auto m = tree::map(plus1, v);
    static_assert(std::is_same_v<decltype(m), std::vector<Array>>);
    CHECK(firsts(m) == std::vector<float>{2, 3, 4});
    CHECK(firsts(tree::unflatten(v, {c, b, a})) == std::vector<float>{3, 2, 1});
    CHECK(tree::structure(std::vector<Array>{}).str() == "PyTreeDef([])");
  }
  SUBCASE("std::array") {
    std::array<Array, 2> v{a, b};
    CHECK(tree::structure(v).str() == "PyTreeDef([*, *])");
    auto m = tree::map([](const Array& x, const Array& y) { return lax::add(x, y); }, v, std::array<Array, 2>{c, c});
    CHECK(firsts(std::vector<Array>(m.begin(), m.end())) == std::vector<float>{4, 5});
  }
  SUBCASE("std::tuple and std::pair") {
    std::tuple<Array, std::vector<Array>, std::pair<Array, Array>> t{a, {b, c}, {c, a}};
    CHECK(tree::structure(t).str() == "PyTreeDef((*, [*, *], (*, *)))");
    CHECK(tree::structure(std::tuple<Array>{a}).str() == "PyTreeDef((*,))");
    CHECK(tree::structure(std::tuple<>{}).str() == "PyTreeDef(())");
    CHECK(firsts(tree::leaves(t)) == std::vector<float>{1, 2, 3, 3, 1});
    auto m = tree::map(plus1, t);
    CHECK(val(std::get<0>(m)) == 2);
    CHECK(val(std::get<1>(m)[1]) == 4);
    CHECK(val(std::get<2>(m).second) == 2);
    auto u = tree::unflatten(t, {c, c, c, b, b});
    CHECK(firsts(tree::leaves(u)) == std::vector<float>{3, 3, 3, 2, 2});
  }
  SUBCASE("std::map<std::string, T>") {
    std::map<std::string, std::vector<Array>> m{{"z", {a}}, {"a", {b, c}}};
    CHECK(tree::structure(m).str() == "PyTreeDef({'a': [*, *], 'z': [*]})");
    CHECK(firsts(tree::leaves(m)) == std::vector<float>{2, 3, 1});
    auto r = tree::map(plus1, m);
    CHECK(firsts(r["a"]) == std::vector<float>{3, 4});
  }
  SUBCASE("registered struct") {
    model::Linear l{a, b, 7};
    CHECK(tree::structure(l).str() == "PyTreeDef(CustomNode(Linear[('w', 'b')], [*, *]))");
    auto r = tree::map(plus1, l);
    static_assert(std::is_same_v<decltype(r), model::Linear>);
    CHECK(val(r.w) == 2);
    CHECK(val(r.b) == 3);
    CHECK(r.features == 7);  // unlisted members are carried over
    auto u = tree::unflatten(l, {c, c});
    CHECK(val(u.w) == 3);
    CHECK(u.features == 7);
    CHECK(tree::structure(Empty{}).str() == "PyTreeDef(CustomNode(Empty[()], []))");
    CHECK(tree::leaves(Empty{}).empty());
  }
  SUBCASE("nested mix") {
    model::Net net;
    net.layers = {model::Linear{a, b, 1}, model::Linear{c, a, 2}};
    net.extra["z"] = b;
    net.extra["k"][0] = c;
    net.scale = {a, b};
    CHECK(tree::structure(net).str() ==
          "PyTreeDef(CustomNode(Net[('layers', 'extra', 'scale')], [[CustomNode(Linear[('w', 'b')], [*, *]), "
          "CustomNode(Linear[('w', 'b')], [*, *])], {'k': [*], 'z': *}, (*, *)]))");
    CHECK(firsts(tree::leaves(net)) == std::vector<float>{1, 2, 3, 1, 3, 2, 1, 2});
    auto r = tree::map([](const Array& x, const Array& y) { return lax::mul(x, y); }, net, net);
    CHECK(firsts(tree::leaves(r)) == std::vector<float>{1, 4, 9, 1, 9, 4, 1, 4});
    CHECK(r.layers[1].features == 2);
    std::vector<model::Net> nets{net, net};
    CHECK(tree::structure(nets).num_leaves() == 16);
    auto back = tree::unflatten(nets, tree::leaves(tree::map(plus1, nets)));
    CHECK(val(back[1].extra["k"][0]) == 4);
    CHECK(val(back[1].scale.second) == 3);
  }
}

TEST_CASE("tree::map prefix semantics: Adam state {mu, nu, count} per parameter") {
  Dict params;
  params["w"] = f32v({1, 2});
  params["layers"][0]["k"] = f32v({3});
  Dict grads;
  grads["w"] = f32v({0.5f, -1});
  grads["layers"][0]["k"] = f32v({2});

  // init: each leaf becomes a {mu, nu, count} subtree.
  Dict state = tree::map(
      [](const Array& p) {
        Array z = jnp::array<float>(std::vector<float>(size_t(p.size()), 0.f), p.shape());
        return Dict{{"mu", z}, {"nu", z}, {"count", jnp::array<int32_t>({0}, Shape{})}};
      },
      params);
  CHECK(tree::structure(state).str() ==
        "PyTreeDef({'layers': [{'k': {'count': *, 'mu': *, 'nu': *}}], 'w': {'count': *, 'mu': *, 'nu': *}})");
  CHECK(state["layers"][0]["k"]["mu"].path().str() == "['layers'][0]['k']['mu']");

  // One standard Adam step (lr 0.1, b1 0.9, b2 0.999, eps 1e-8): f receives the whole state subtree.
  auto step = [](const Array& p, const Array& g, const Dict& st) {
    float b1 = 0.9f, b2 = 0.999f;
    auto sc = [&](float v) { return jnp::array<float>(std::vector<float>(size_t(p.size()), v), p.shape()); };
    Array mu = lax::add(lax::mul(sc(b1), st["mu"]), lax::mul(sc(1 - b1), g));
    Array nu = lax::add(lax::mul(sc(b2), st["nu"]), lax::mul(sc(1 - b2), lax::mul(g, g)));
    int count = st["count"].array().item<int32_t>() + 1;
    Array mhat = lax::div(mu, sc(1 - b1));
    Array vhat = lax::div(nu, sc(1 - b2));
    Array upd = lax::div(mhat, lax::add(lax::sqrt(vhat), sc(1e-8f)));
    (void)count;
    return lax::sub(p, lax::mul(sc(0.1f), upd));
  };
  Dict newp = tree::map(step, params, grads, state);
  // After one step Adam moves each coordinate by ~lr * sign(g).
  auto w = vals(newp["w"]);
  CHECK(w[0] == doctest::Approx(0.9f).epsilon(1e-6));
  CHECK(w[1] == doctest::Approx(2.1f).epsilon(1e-6));
  CHECK(vals(newp["layers"][0]["k"])[0] == doctest::Approx(2.9f).epsilon(1e-6));
  CHECK(tree::structure(newp) == tree::structure(params));

  // A function of (Array, Array, Array) also works when the subtrees are leaves (Dict -> const Array&).
  Dict sum = tree::map([](const Array& x, const Array& y) { return lax::add(x, y); }, params, grads);
  CHECK(vals(sum["w"]) == std::vector<float>{1.5f, 1});

  // The prefix rule does not reach below the first tree's non-leaf nodes: keys must match.
  Dict g2 = grads;
  g2["extra"] = f32v({1});
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Dict&) { return x; }, params, g2),
                       doctest::Contains("tree 2 has a different structure than tree 1 at the root: tree 1 has "
                                         "{'layers': [{'k': *}], 'w': *} there, tree 2 has {'extra': *, 'layers': "
                                         "[{'k': *}], 'w': *}"),
                       ValueError);
  Dict g3 = grads;
  g3["layers"][1] = f32v({1});
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Dict&, const Dict&) { return x; }, params, grads, g3),
                       doctest::Contains("tree 3 has a different structure than tree 1 at key path ['layers']: tree 1 "
                                         "has [{'k': *}] there, tree 3 has [{'k': *}, *]"),
                       ValueError);
  Dict g4 = grads;
  g4["layers"] = f32v({1});
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Dict&) { return x; }, params, g4),
                       doctest::Contains("at key path ['layers']: tree 1 has [{'k': *}] there, tree 2 has *"),
                       ValueError);
  // A leaf of the first tree facing a subtree, passed to an Array parameter: the conversion names the path.
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Array&) { return x; }, params, state),
                       doctest::Contains("['layers'][0]['k'] is a string-keyed dict with keys ['count', 'mu', 'nu']"),
                       ValueError);
}

TEST_CASE("tree::map: None nodes, typed mismatches") {
  Dict a;
  a["x"] = f32v({1});
  a["n"] = None;
  Dict r = tree::map(plus1, a);
  CHECK(r["n"].is_none());
  CHECK(tree::structure(r).str() == "PyTreeDef({'n': None, 'x': *})");
  Dict b;
  b["x"] = f32v({1});
  b["n"] = f32v({1});
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Dict&) { return x; }, a, b),
                       doctest::Contains("at key path ['n']: tree 1 has None there, tree 2 has *"), ValueError);

  std::vector<std::vector<Array>> v1{{f32v({1})}, {f32v({2}), f32v({3})}};
  std::vector<std::vector<Array>> v2{{f32v({1})}, {f32v({2})}};
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Array&) { return x; }, v1, v2),
                       doctest::Contains("tree 2 has a different structure than tree 1 at key path [1]: tree 1 has "
                                         "[*, *] there, tree 2 has [*]"),
                       ValueError);
  std::map<std::string, Array> m1{{"a", f32v({1})}}, m2{{"b", f32v({1})}};
  CHECK_THROWS_WITH_AS(tree::map([](const Array& x, const Array&) { return x; }, m1, m2),
                       doctest::Contains("at the root: tree 1 has {'a': *} there, tree 2 has {'b': *}"), ValueError);
}

TEST_CASE("tree::map_with_path: keystr and dotted forms") {
  Dict p;
  p["layers"][0]["mlp"]["w"] = f32v({1});
  p["layers"][1]["mlp"]["w"] = f32v({2});
  p["embed"] = f32v({3});
  std::vector<std::string> ks, dots;
  Dict r = tree::map_with_path(
      [&](const KeyPath& path, const Array& x) {
        ks.push_back(keystr(path));
        dots.push_back(path.dotted());
        // Per-parameter rule: freeze the embedding.
        return path.dotted() == "embed" ? x : plus1(x);
      },
      p);
  CHECK(ks == std::vector<std::string>{"['embed']", "['layers'][0]['mlp']['w']", "['layers'][1]['mlp']['w']"});
  CHECK(dots == std::vector<std::string>{"embed", "layers.0.mlp.w", "layers.1.mlp.w"});
  CHECK(val(r["embed"]) == 3);
  CHECK(vals(r["layers"][1]["mlp"]["w"]) == std::vector<float>{3});

  model::Net net;
  net.layers = {model::Linear{f32v({1}), f32v({2}), 0}};
  net.extra["q"] = f32v({3});
  net.scale = {f32v({4}), f32v({5})};
  std::vector<std::string> np;
  tree::map_with_path(
      [&](const KeyPath& path, const Array& x) {
        np.push_back(path.str() + "|" + path.dotted());
        return x;
      },
      net);
  CHECK(np == std::vector<std::string>{".layers[0].w|layers.0.w", ".layers[0].b|layers.0.b", ".extra['q']|extra.q",
                                       ".scale[0]|scale.0", ".scale[1]|scale.1"});
  // Quotes inside keys follow Python's repr.
  KeyPath kp{PathKey::key("it's"), PathKey::index(3), PathKey::attr("f")};
  CHECK(kp.str() == "[\"it's\"][3].f");
  std::ostringstream os;
  os << kp;
  CHECK(os.str() == kp.str());
}

TEST_CASE("TreeDef: printing, equality, hashing, difference") {
  Dict d;
  d["a"] = f32v({1});
  d["b"][0] = f32v({2});
  d["b"][1] = f32v({3});
  TreeDef td = tree::structure(d);
  CHECK(td.str() == "PyTreeDef({'a': *, 'b': [*, *]})");
  std::ostringstream os;
  os << td;
  CHECK(os.str() == td.str());
  CHECK(td.num_leaves() == 3);
  CHECK(td.num_children() == 2);
  CHECK(td.keys() == std::vector<std::string>{"a", "b"});
  CHECK(td.kind() == TreeDef::Kind::Dict);
  CHECK(td.children()[1].kind() == TreeDef::Kind::List);

  // The same structure from different containers and values.
  std::map<std::string, Dict> m{{"b", Dict::list({f32v({0}), f32v({0})})}, {"a", f32v({9, 9})}};
  CHECK(tree::structure(m) == td);
  CHECK(tree::structure(m).hash() == td.hash());
  CHECK(std::hash<TreeDef>()(td) == td.hash());
  CHECK(td.difference(tree::structure(m)).empty());
  // Built by hand (keys given unsorted).
  TreeDef manual = TreeDef::dict({"b", "a"}, {TreeDef::list({TreeDef::leaf(), TreeDef::leaf()}), TreeDef::leaf()});
  CHECK(manual == td);

  Dict d2 = d;
  d2["b"][1] = None;
  TreeDef td2 = tree::structure(d2);
  CHECK(!(td2 == td));
  CHECK(td.difference(td2) == "at key path ['b'][1]: * vs None");
  // Tuples and lists differ; int dicts print with their keys.
  CHECK(!(TreeDef::tuple({TreeDef::leaf()}) == TreeDef::list({TreeDef::leaf()})));
  CHECK(TreeDef::int_dict({5, 0}, {TreeDef::none(), TreeDef::leaf()}).str() == "PyTreeDef({0: *, 5: None})");
  CHECK_THROWS_WITH_AS(TreeDef::dict({"a", "a"}, {TreeDef::leaf(), TreeDef::leaf()}),
                       doctest::Contains("duplicate key 'a'"), ValueError);
  std::unordered_set<TreeDef> set{td, td2, tree::structure(m)};
  CHECK(set.size() == 2);
}

TEST_CASE("unflatten round trips and leaf-count errors") {
  Dict p;
  p["layers"][0]["w"] = f32v({1});
  p["layers"][1]["w"] = f32v({2});
  p["n"] = None;
  p["sparse"][4] = f32v({3});
  auto [leaves, td] = tree::flatten(p);
  Dict back = tree::unflatten(td, leaves);
  CHECK(tree::structure(back) == td);
  CHECK(firsts(tree::leaves(back)) == std::vector<float>{1, 2, 3});
  CHECK(back["layers"][1]["w"].path().str() == "['layers'][1]['w']");
  // Typed unflatten keeps the caller's type.
  Dict back2 = tree::unflatten(p, std::vector<Array>{f32v({7}), f32v({8}), f32v({9})});
  CHECK(val(back2["sparse"][4]) == 9);

  // A TreeDef from typed containers rebuilds a Dict: sequences -> int keys, structs -> field names.
  model::Linear l{f32v({1}), f32v({2}), 0};
  std::tuple<model::Linear, std::vector<Array>> t{l, {f32v({3})}};
  auto [tl, ttd] = tree::flatten(t);
  Dict asdict = tree::unflatten(ttd, tl);
  CHECK(asdict.str() == "[{'b': f32[1], 'w': f32[1]}, [f32[1]]]");
  CHECK(val(asdict[0]["b"]) == 2);
  CHECK(val(asdict[1][0]) == 3);

  CHECK_THROWS_WITH_AS(tree::unflatten(td, {f32v({1})}), doctest::Contains("has 3 leaves but 1 were given"),
                       ValueError);
  CHECK_THROWS_WITH_AS(tree::unflatten(l, {f32v({1})}), doctest::Contains("too few leaves"), ValueError);
  CHECK_THROWS_WITH_AS(tree::unflatten(l, {f32v({1}), f32v({1}), f32v({1})}),
                       doctest::Contains(
                           "got 3 leaves but the structure PyTreeDef(CustomNode(Linear[('w', 'b')], [*, *])) has 2"),
                       ValueError);
}
