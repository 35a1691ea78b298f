// Sharding rules of cond, while and scan (docs/sharding.md §2.3), and of debug_print (a cond that
// prints on the first device only). Loop and branch bodies are partitioned by
// the same rules, as sub-programs of the per-device program, so a loop over split values runs
// split and a collective inside a body is one the body needs.
//
// A carried value keeps one layout through the loop. The body is first partitioned with the
// initial values' layouts; where it gives a carried value back laid out otherwise, that layout is
// adopted for the carry and the body partitioned again (a fixed point, found in at most
// kCarryPasses passes; after that the body reshards its results to the carry's layout). A carry
// may stay a pending sum: a gradient accumulated over micro-batches is all-reduced once after the
// loop, not in every iteration. xs are unsplit along the scanned dimension; ys are stacked blocks
// of the body's results (pending sums included: stacking is linear).
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "cjax/lax.h"
#include "jit/partition/partitioner.h"
#include "trace/control_flow.h"

namespace cjax::partition {
namespace {

constexpr int kCarryPasses = 3;

// The records of a pass whose partitioned body is not kept are dropped.
struct Trial {
  Partitioner& p;
  size_t inserted, layouts, run_whole;
  explicit Trial(Partitioner& q)
      : p(q), inserted(q.inserted.size()), layouts(q.layouts.size()), run_whole(q.run_whole.size()) {}
  void discard() const {
    p.inserted.resize(inserted);
    p.layouts.resize(layouts);
    p.run_whole.resize(run_whole);
  }
};

// While a body is partitioned: collectives are reported as inside it, and the equation being
// partitioned is the control-flow one again afterwards.
struct InBody {
  Partitioner& p;
  const JaxprEqn* eqn;
  std::string outer;
  InBody(Partitioner& q, const std::string& region) : p(q), eqn(q.current), outer(q.region) { p.region += region; }
  ~InBody() {
    p.region = outer;
    p.current = eqn;
  }
};

// The first guess of a carry's layout: its initial layout, and for a floating-point carry that
// starts at zero (an accumulator) a sum pending over the mesh axes that do not split it. If the
// body adds pending sums to it, the guess holds and the loop reduces once, after it; otherwise
// the body gives it back reduced and the next pass adopts that.
std::vector<Layout> first_carry_guess(Partitioner& p, const std::vector<Value>& init) {
  std::vector<Layout> r;
  for (const Value& v : init) {
    Layout l = v.layout;
    if (l.unreduced.empty() && is_floating(v.local.dtype()) && p.is_zeros(v))
      for (const std::string& a : p.mesh().axis_names())
        if (!l.uses(a) && p.mesh().axis_size(a) > 1) l.unreduced.push_back(a);
    r.push_back(l);
  }
  return r;
}

AbstractValue local_aval(Partitioner& p, const Atom& global, const Array& like, const Layout& l) {
  AbstractValue a = like.aval();
  a.shape = p.local_shape(atom_aval(global).shape, l);
  return a;
}

std::vector<Value> values(const std::vector<Array>& locals, size_t from, const std::vector<Layout>& layouts) {
  std::vector<Value> r;
  for (size_t i = 0; i < layouts.size(); ++i) r.push_back(Value{locals[from + i], layouts[i]});
  return r;
}
std::vector<Layout> layouts_of(const std::vector<Value>& vs) {
  std::vector<Layout> r;
  for (const Value& v : vs) r.push_back(v.layout);
  return r;
}
void append_locals(std::vector<Array>& to, const std::vector<Value>& vs) {
  for (const Value& v : vs) to.push_back(v.local);
}

// ---- scan ----

std::vector<Value> scan_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  ScanParams sp = scan_params(eqn.params);
  const size_t nc = size_t(sp.num_consts), ncarry = size_t(sp.num_carry), nx = sp.num_xs();
  std::vector<Value> consts, init, xs;
  for (size_t i = 0; i < nc; ++i) consts.push_back(p.reduced(ins[i]));
  for (size_t i = 0; i < ncarry; ++i) init.push_back(ins[nc + i]);
  for (size_t i = 0; i < nx; ++i) xs.push_back(p.gathered_along(ins[nc + ncarry + i], {0}));
  std::vector<Layout> x_slices;
  for (const Value& x : xs) x_slices.push_back(Layout{{x.layout.dims.begin() + 1, x.layout.dims.end()}, {}});

  std::vector<Layout> carry = first_carry_guess(p, init), y_layouts;
  const std::string region = fmt::format(" (in a scan body: runs {} times)", sp.length);
  TracedCall body;
  for (int pass = 1;; ++pass) {
    Trial trial(p);
    std::vector<Layout> produced(ncarry);
    std::vector<AbstractValue> in_avals;
    for (const Value& c : consts) in_avals.push_back(c.local.aval());
    for (size_t k = 0; k < ncarry; ++k) in_avals.push_back(local_aval(p, eqn.inputs[nc + k], init[k].local, carry[k]));
    for (const Value& x : xs) {
      AbstractValue a = x.local.aval();
      a.shape.erase(a.shape.begin());
      in_avals.push_back(a);
    }
    body = trace_to_call(
        [&](const std::vector<Array>& in) {
          InBody scope(p, region);
          std::vector<Value> args = values(in, 0, layouts_of(consts));
          for (Value& v : values(in, nc, carry)) args.push_back(v);
          for (Value& v : values(in, nc + ncarry, x_slices)) args.push_back(v);
          std::vector<Value> outs = run_jaxpr(p, *sp.jaxpr, {}, args);
          p.current = scope.eqn;
          std::vector<Array> r;
          y_layouts.clear();
          for (size_t k = 0; k < outs.size(); ++k) {
            if (k < ncarry) {
              produced[k] = outs[k].layout;
              r.push_back(p.reshard(outs[k], carry[k]).local);
            } else {
              y_layouts.push_back(outs[k].layout);
              r.push_back(outs[k].local);
            }
          }
          return r;
        },
        in_avals);
    if (produced == carry || pass == kCarryPasses) break;
    trial.discard();
    carry = produced;
  }

  std::vector<Array> args = body.consts;
  append_locals(args, consts);
  for (size_t k = 0; k < ncarry; ++k) args.push_back(p.reshard(init[k], carry[k]).local);
  append_locals(args, xs);
  ScanParams local = sp;
  local.jaxpr = body.jaxpr;
  local.num_consts = int64_t(body.consts.size() + nc);
  std::vector<Array> outs = bind_scan(local, args);
  std::vector<Value> r = values(outs, 0, carry);
  for (size_t j = 0; j < y_layouts.size(); ++j) {
    Layout stacked = y_layouts[j];
    stacked.dims.insert(stacked.dims.begin(), std::vector<std::string>{});
    r.push_back(Value{outs[ncarry + j], stacked});
  }
  return r;
}

// ---- while ----

std::vector<Value> while_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  WhileParams wp = while_params(eqn.params);
  const size_t ncc = size_t(wp.cond_nconsts), nbc = size_t(wp.body_nconsts), ncarry = ins.size() - ncc - nbc;
  std::vector<Value> cond_consts, body_consts, init;
  for (size_t i = 0; i < ncc; ++i) cond_consts.push_back(p.reduced(ins[i]));
  for (size_t i = 0; i < nbc; ++i) body_consts.push_back(p.reduced(ins[ncc + i]));
  for (size_t i = 0; i < ncarry; ++i) init.push_back(ins[ncc + nbc + i]);

  std::vector<Layout> carry = first_carry_guess(p, init);
  TracedCall cond, body;
  for (int pass = 1;; ++pass) {
    Trial trial(p);
    std::vector<Layout> produced(ncarry);
    std::vector<AbstractValue> carry_avals;
    for (size_t k = 0; k < ncarry; ++k)
      carry_avals.push_back(local_aval(p, eqn.inputs[ncc + nbc + k], init[k].local, carry[k]));
    auto traced = [&](const std::vector<Value>& consts, const Jaxpr& jaxpr, const std::string& region,
                      const std::function<std::vector<Array>(std::vector<Value>&)>& finish) {
      std::vector<AbstractValue> in_avals;
      for (const Value& c : consts) in_avals.push_back(c.local.aval());
      in_avals.insert(in_avals.end(), carry_avals.begin(), carry_avals.end());
      return trace_to_call(
          [&](const std::vector<Array>& in) {
            InBody scope(p, region);
            std::vector<Value> args = values(in, 0, layouts_of(consts));
            for (Value& v : values(in, consts.size(), carry)) args.push_back(v);
            std::vector<Value> outs = run_jaxpr(p, jaxpr, {}, args);
            p.current = scope.eqn;
            return finish(outs);
          },
          in_avals);
    };
    cond = traced(cond_consts, *wp.cond_jaxpr, " (in a while_loop condition: runs every iteration)",
                  [&](std::vector<Value>& outs) { return std::vector<Array>{p.reduced(outs[0]).local}; });
    body = traced(body_consts, *wp.body_jaxpr, " (in a while_loop body: runs every iteration)",
                  [&](std::vector<Value>& outs) {
                    std::vector<Array> r;
                    for (size_t k = 0; k < ncarry; ++k) {
                      produced[k] = outs[k].layout;
                      r.push_back(p.reshard(outs[k], carry[k]).local);
                    }
                    return r;
                  });
    if (produced == carry || pass == kCarryPasses) break;
    trial.discard();
    carry = produced;
  }

  std::vector<Array> args = cond.consts;
  append_locals(args, cond_consts);
  args.insert(args.end(), body.consts.begin(), body.consts.end());
  append_locals(args, body_consts);
  for (size_t k = 0; k < ncarry; ++k) args.push_back(p.reshard(init[k], carry[k]).local);
  std::vector<Array> outs = bind_while(WhileParams{cond.jaxpr, body.jaxpr, int64_t(cond.consts.size() + ncc),
                                                   int64_t(body.consts.size() + nbc)},
                                       args);
  return values(outs, 0, carry);
}

// ---- cond ----

// The branches' results take the layouts the first branch gives them (pending sums reduced);
// the other branches reshard theirs to match.
std::vector<Value> cond_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  std::vector<JaxprPtr> branches = cond_branches(eqn.params);
  Value index = p.reduced(ins[0]);
  std::vector<Value> ops;
  for (size_t i = 1; i < ins.size(); ++i) ops.push_back(p.reduced(ins[i]));
  std::vector<AbstractValue> in_avals;
  for (const Value& v : ops) in_avals.push_back(v.local.aval());
  const std::string region = " (in a cond branch)";

  auto branch = [&](const JaxprPtr& jaxpr, std::vector<Layout>* chosen, const std::vector<Layout>* wanted) -> FlatFn {
    return [&, jaxpr, chosen, wanted](const std::vector<Array>& in) {
      InBody scope(p, region);
      std::vector<Value> outs = run_jaxpr(p, *jaxpr, {}, values(in, 0, layouts_of(ops)));
      p.current = scope.eqn;
      std::vector<Array> r;
      for (size_t k = 0; k < outs.size(); ++k) {
        if (chosen) chosen->push_back(outs[k].layout.without_pending());
        r.push_back(wanted ? p.reshard(outs[k], (*wanted)[k]).local : p.reduced(outs[k]).local);
      }
      return r;
    };
  };
  std::vector<Layout> out_layouts;
  {
    Trial trial(p);
    trace_to_call(branch(branches[0], &out_layouts, nullptr), in_avals);
    trial.discard();
  }
  std::vector<FlatFn> fns;
  for (const JaxprPtr& j : branches) fns.push_back(branch(j, nullptr, &out_layouts));
  TracedBranches traced = trace_branches(fns, in_avals);
  std::vector<Array> args = traced.consts;
  append_locals(args, ops);
  return values(bind_cond(index.local, traced.jaxprs, args), 0, out_layouts);
}

// ---- debug_print ----

// Prints the global values once, as JAX's debug.print(partitioned=False) does: the operands are
// gathered, and only the first device of the mesh prints (a cond on its coordinates).
std::vector<Value> debug_print_rule(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins) {
  std::vector<Array> whole;
  for (Value& v : ins) whole.push_back(p.reshard(p.reduced(v), Layout::replicated(v.layout.dims.size())).local);
  FlatFn silent = [](const std::vector<Array>&) { return std::vector<Array>{}; };
  FlatFn print = [&](const std::vector<Array>& xs) { return cjax::bind(*eqn.primitive, xs, eqn.params); };
  TracedBranches branches = trace_branches({silent, print}, avals_of(whole));
  std::vector<Array> args = branches.consts;
  args.insert(args.end(), whole.begin(), whole.end());
  bind_cond(lax::convert_element_type(p.first_device(p.mesh().axis_names()), DType::int32), branches.jaxprs, args);
  return {};
}

const bool g_rules = [] {
  define_sharding_rule("debug_print", debug_print_rule);
  define_sharding_rule("scan", scan_rule);
  define_sharding_rule("while", while_rule);
  define_sharding_rule("cond", cond_rule);
  return true;
}();

}  // namespace
}  // namespace cjax::partition
