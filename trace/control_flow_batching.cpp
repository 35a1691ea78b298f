// Batching rules of cond, while and scan (JAX's _cond_batching_rule, _while_loop_batching_rule,
// _scan_batching_rule). Batched values are moved to axis 0 (scan's xs and ys: axis 1, after the
// scan axis); sub-jaxprs are re-traced under a BatchTrace and one new equation is bound.
//  * cond with a batched index runs every branch on the batch and selects with select_n;
//  * while with a batched predicate runs until every element is done, finished elements frozen
//    by select; otherwise carries that the body makes batched are found by a fixpoint;
//  * scan batches its body, with the same fixpoint over carries.
#include <fmt/format.h>

#include "cjax/lax.h"
#include "core/array/rules.h"
#include "core/lax/rule_support.h"
#include "trace/batching.h"
#include "trace/control_flow.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
namespace {

template <class T>
std::vector<T> cat(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// fn(inputs: batched at axis 0 where `in_b`) -> outputs batched at 0 where batched naturally or
// `force`d (others unbatched); `natural` receives which outputs were batched.
FlatFn batched_fn(JaxprPtr j, std::vector<bool> in_b, std::vector<bool> force, BatchAxis axis,
                  std::vector<bool>* natural = nullptr) {
  return [j, in_b, force, axis, natural](const std::vector<Array>& xs) {
    BatchTrace trace(axis);
    std::vector<Array> in;
    for (size_t i = 0; i < xs.size(); ++i) in.push_back(trace.make_tracer(xs[i], in_b[i] ? 0 : kNotMapped));
    std::vector<Array> outs;
    {
      TraceScope scope(&trace);
      outs = eval_jaxpr(*j, {}, in);
    }
    if (natural) natural->assign(outs.size(), false);
    std::vector<Array> result;
    for (size_t i = 0; i < outs.size(); ++i) {
      auto [v, d] = trace.unpack(outs[i], nullptr);
      if (natural) (*natural)[i] = d != kNotMapped;
      result.push_back(d != kNotMapped || force[i] ? move_bdim(v, d, 0, axis.size) : v);
    }
    return result;
  };
}

std::vector<AbstractValue> batch_avals(std::vector<AbstractValue> avals, const std::vector<bool>& b, int64_t size) {
  for (size_t i = 0; i < avals.size(); ++i)
    if (b[i]) avals[i] = batched_aval(avals[i], 0, size);
  return avals;
}

// Which outputs of `j` are batched for inputs batched where `in_b`.
std::vector<bool> batched_outputs(const JaxprPtr& j, const std::vector<bool>& in_b, const BatchAxis& axis) {
  std::vector<bool> natural;
  trace_to_call(batched_fn(j, in_b, std::vector<bool>(j->outvars().size(), false), axis, &natural),
                batch_avals(j->in_avals(), in_b, axis.size));
  return natural;
}

// Grows `carry_b` (carries at positions [lo, lo + size)) until the body keeps it closed.
std::vector<bool> carry_fixpoint(const JaxprPtr& body, std::vector<bool> in_b, size_t lo, size_t ncar,
                                 const BatchAxis& axis) {
  while (true) {
    std::vector<bool> out = batched_outputs(body, in_b, axis);
    bool grown = false;
    for (size_t c = 0; c < ncar; ++c)
      if (out[c] && !in_b[lo + c]) in_b[lo + c] = grown = true;
    if (!grown) return in_b;
  }
}

// Inputs moved to axis `to` where batched (`b`), broadcast where `b` but unbatched.
std::vector<Array> move_all(std::span<const Array> args, std::span<const int> bdims, const std::vector<bool>& b, int to,
                            int64_t size) {
  std::vector<Array> out;
  for (size_t i = 0; i < args.size(); ++i) out.push_back(b[i] ? move_bdim(args[i], bdims[i], to, size) : args[i]);
  return out;
}

BatchOut cond_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  auto branches = cond_branches(p);
  std::vector<Array> ops = slice_of(args, 1, args.size());
  std::vector<int> op_dims(bdims.begin() + 1, bdims.end());
  if (bdims[0] != kNotMapped) {
    // A batched predicate: every branch runs on the batch; each output selects per example.
    Array index = move_bdim(args[0], bdims[0], 0, axis.size);
    std::vector<std::vector<Array>> outs;
    for (const auto& b : branches)
      outs.push_back(vmap_flat([&](const std::vector<Array>& xs) { return eval_jaxpr(*b, {}, xs); }, ops, op_dims,
                               [](size_t, int) { return 0; }, axis));
    BatchOut r;
    for (size_t i = 0; i < outs[0].size(); ++i) {
      std::vector<Array> cases;
      for (const auto& o : outs) cases.push_back(o[i]);
      Array which = lax::broadcast_in_dim(index, cases[0].shape(), {0});
      r.outs.push_back(lax::select_n(which, cases));
      r.bdims.push_back(0);
    }
    return r;
  }
  std::vector<bool> in_b;
  for (int d : op_dims) in_b.push_back(d != kNotMapped);
  std::vector<FlatFn> fns;
  for (const auto& b : branches) fns.push_back(batched_fn(b, in_b, std::vector<bool>(b->outvars().size(), true), axis));
  std::vector<Array> moved = move_all(ops, op_dims, in_b, 0, axis.size);
  TracedBranches tb = trace_branches(fns, batch_avals(branches[0]->in_avals(), in_b, axis.size));
  std::vector<Array> outs = bind_cond(args[0], tb.jaxprs, cat(tb.consts, moved));
  return BatchOut{outs, std::vector<int>(outs.size(), 0)};
}

BatchOut while_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  WhileParams wp = while_params(p);
  size_t nc = size_t(wp.cond_nconsts), nb = size_t(wp.body_nconsts), ncar = args.size() - nc - nb;
  std::vector<bool> in_b;
  for (int d : bdims) in_b.push_back(d != kNotMapped);
  std::vector<bool> cb(in_b.begin(), in_b.begin() + std::ptrdiff_t(nc));
  std::vector<bool> bb(in_b.begin() + std::ptrdiff_t(nc), in_b.end());  // body consts, carry
  bb = carry_fixpoint(wp.body_jaxpr, bb, nb, ncar, axis);
  std::vector<bool> carry_b(bb.begin() + std::ptrdiff_t(nb), bb.end());
  bool pred_b = batched_outputs(wp.cond_jaxpr, cat(cb, carry_b), axis)[0];
  if (pred_b) carry_b.assign(ncar, true);
  bb = cat(std::vector<bool>(bb.begin(), bb.begin() + std::ptrdiff_t(nb)), carry_b);
  std::vector<bool> all_b = cat(cb, bb);
  std::vector<Array> moved = move_all(args, bdims, all_b, 0, axis.size);
  std::vector<Array> cconsts = slice_of(moved, 0, nc), bconsts = slice_of(moved, nc, nc + nb);
  std::vector<Array> carry = slice_of(moved, nc + nb, moved.size());
  std::vector<AbstractValue> cavals = batch_avals(wp.cond_jaxpr->in_avals(), cat(cb, carry_b), axis.size);
  std::vector<AbstractValue> bavals = batch_avals(wp.body_jaxpr->in_avals(), bb, axis.size);
  FlatFn cond_b = batched_fn(wp.cond_jaxpr, cat(cb, carry_b), {pred_b}, axis);
  FlatFn body_b = batched_fn(wp.body_jaxpr, bb, carry_b, axis);
  TracedCall cj, bj;
  std::vector<Array> args_out;
  if (!pred_b) {
    cj = trace_to_call(cond_b, cavals);
    bj = trace_to_call(body_b, bavals);
    args_out = cat(cat(cat(cj.consts, cconsts), cat(bj.consts, bconsts)), carry);
  } else {
    // Run while any element's predicate holds; finished elements keep their carry.
    cj = trace_to_call([&](const std::vector<Array>&
                               xs) { return std::vector<Array>{lax::reduce_or(cond_b(xs)[0], {0})}; },
                       cavals);
    std::vector<AbstractValue> avals(cavals.begin(), cavals.begin() + std::ptrdiff_t(nc));
    avals = cat(avals, bavals);
    bj = trace_to_call(
        [&](const std::vector<Array>& xs) {
          std::vector<Array> carry_in = slice_of(xs, nc + nb, xs.size());
          Array pred = cond_b(cat(slice_of(xs, 0, nc), carry_in))[0];
          std::vector<Array> next = body_b(slice_of(xs, nc, xs.size()));
          for (size_t i = 0; i < next.size(); ++i)
            next[i] = lax::select(lax::broadcast_in_dim(pred, next[i].shape(), {0}), next[i], carry_in[i]);
          return next;
        },
        avals);
    args_out = cat(cat(cat(cj.consts, cconsts), cat(cat(bj.consts, cconsts), bconsts)), carry);
    nb += nc;
  }
  std::vector<Array> outs =
      bind_while(WhileParams{cj.jaxpr, bj.jaxpr, int64_t(cj.consts.size() + nc), int64_t(bj.consts.size() + nb)},
                 args_out);
  BatchOut r{outs, {}};
  for (bool b : carry_b) r.bdims.push_back(b ? 0 : kNotMapped);
  return r;
}

BatchOut scan_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  ScanParams sp = scan_params(p);
  size_t nc = size_t(sp.num_consts), ncar = size_t(sp.num_carry), ny = sp.num_ys();
  std::vector<bool> in_b;
  for (int d : bdims) in_b.push_back(d != kNotMapped);
  in_b = carry_fixpoint(sp.jaxpr, in_b, nc, ncar, axis);
  std::vector<bool> force(ncar + ny, false);
  for (size_t c = 0; c < ncar; ++c) force[c] = in_b[nc + c];
  std::vector<bool> natural;
  FlatFn body = batched_fn(sp.jaxpr, in_b, force, axis, &natural);
  TracedCall bt = trace_to_call(body, batch_avals(sp.jaxpr->in_avals(), in_b, axis.size));
  std::vector<Array> moved;
  for (size_t i = 0; i < args.size(); ++i)
    moved.push_back(in_b[i] ? move_bdim(args[i], bdims[i], i < nc + ncar ? 0 : 1, axis.size) : args[i]);
  std::vector<Array> outs =
      bind_scan(ScanParams{bt.jaxpr, sp.length, int64_t(bt.consts.size() + nc), int64_t(ncar), sp.unroll, sp.reverse},
                cat(bt.consts, moved));
  BatchOut r{outs, {}};
  for (size_t c = 0; c < ncar; ++c) r.bdims.push_back(force[c] ? 0 : kNotMapped);
  for (size_t k = 0; k < ny; ++k) r.bdims.push_back(natural[ncar + k] ? 1 : kNotMapped);
  return r;
}

const bool g_rules = add_rule_initializer([] {
  define_rules("cond").batch = cond_batch;
  define_rules("while").batch = while_batch;
  define_rules("scan").batch = scan_batch;
});

}  // namespace
}  // namespace cjax
