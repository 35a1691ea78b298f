// JVP, partial-evaluation and transpose rules of cond, while and scan (JAX's
// jax/_src/lax/control_flow/{conditionals,loops}.py). Each rule transforms the sub-jaxprs by
// re-tracing them under the transformation and binds ONE new equation:
//  * JVP: the equation of the JVP'd jaxprs, tangents as extra operands (scan/while: extra consts
//    and carries, with a fixpoint over which carries get a nonzero tangent);
//  * partial eval (grad): the known part runs under the parent trace and the unknown part is
//    staged, fed by residuals (scan: stacked per iteration; carries that become unknown in the
//    body are found by a fixpoint, as JAX's _scan_partial_eval);
//  * transpose: cond of the transposed branches; scan: a scan in the other direction of the
//    transposed body, the consts' cotangents accumulated in its carry.
// while is forward-mode only: its partial eval and transpose raise ValueError, as in JAX.
#include <fmt/format.h>

#include "autodiff/ad.h"
#include "autodiff/partial_eval.h"
#include "core/array/rules.h"
#include "core/lax/rule_support.h"
#include "trace/control_flow.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax {
namespace {

std::vector<bool> defined_mask(std::span<const Array> xs) {
  std::vector<bool> m;
  for (const Array& x : xs) m.push_back(x.defined());
  return m;
}
template <class T>
std::vector<T> cat(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
template <class T>
std::vector<T> pick(const std::vector<T>& xs, const std::vector<bool>& mask, bool want = true) {
  std::vector<T> out;
  for (size_t i = 0; i < xs.size(); ++i)
    if (mask[i] == want) out.push_back(xs[i]);
  return out;
}
std::vector<bool> or_masks(std::vector<bool> a, const std::vector<bool>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] || b[i];
  return a;
}
template <class T>
std::vector<T> sub(const std::vector<T>& v, size_t lo, size_t hi) {
  return std::vector<T>(v.begin() + std::ptrdiff_t(lo), v.begin() + std::ptrdiff_t(hi));
}
std::vector<AbstractValue> in_avals_of(const Jaxpr& j, size_t lo, size_t hi) { return sub(j.in_avals(), lo, hi); }

// ---- JVP of a jaxpr --------------------------------------------------------------------------------

// fn(primals..., tangents of the `nz` inputs...) -> (primals out..., tangents of the `inst` outputs...).
// `natural` (if given) receives which outputs have a nonzero tangent before instantiation.
FlatFn jvp_fn(JaxprPtr j, std::vector<bool> nz, std::vector<bool> inst, std::vector<bool>* natural = nullptr) {
  return [j, nz, inst, natural](const std::vector<Array>& xs) {
    size_t n = j->invars().size(), k = n;
    std::vector<Array> outs, primals, tangents;
    {
      JVPTrace trace;
      std::vector<Array> in;
      for (size_t i = 0; i < n; ++i) in.push_back(trace.make_tracer(xs[i], nz[i] ? xs[k++] : Array()));
      {
        TraceScope scope(&trace);
        outs = eval_jaxpr(*j, {}, in);
      }
      if (natural) natural->assign(outs.size(), false);
      for (size_t i = 0; i < outs.size(); ++i) {
        auto [p, t] = trace.unpack(outs[i], nullptr);
        if (natural) (*natural)[i] = t.defined();
        primals.push_back(p);
        tangents.push_back(t);
      }
    }
    for (size_t i = 0; i < outs.size(); ++i)
      if (inst[i]) primals.push_back(instantiate_zero(tangents[i], primals[i].aval()));
    return primals;
  };
}

// Which outputs of `j` get a nonzero tangent for nonzero inputs `nz`.
std::vector<bool> jvp_nonzeros(const JaxprPtr& j, const std::vector<bool>& nz) {
  std::vector<AbstractValue> avals = cat(j->in_avals(), pick(j->in_avals(), nz));
  std::vector<bool> natural;
  trace_to_call(jvp_fn(j, nz, std::vector<bool>(j->outvars().size(), false), &natural), avals);
  return natural;
}

JvpOut cond_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  auto branches = cond_branches(p);
  std::vector<Array> ops = slice_of(primals, 1, primals.size());
  std::vector<Array> dots = slice_of(tangents, 1, tangents.size());
  std::vector<bool> nz = defined_mask(dots);
  std::vector<bool> out_nz(branches[0]->outvars().size(), false);
  for (const auto& b : branches) out_nz = or_masks(out_nz, jvp_nonzeros(b, nz));
  std::vector<FlatFn> fns;
  for (const auto& b : branches) fns.push_back(jvp_fn(b, nz, out_nz));
  std::vector<Array> nz_dots = pick(dots, nz);
  TracedBranches tb = trace_branches(fns, cat(avals_of(ops), avals_of(nz_dots)));
  std::vector<Array> outs = bind_cond(primals[0], tb.jaxprs, cat(cat(tb.consts, ops), nz_dots));
  size_t m = out_nz.size(), k = m;
  JvpOut r{slice_of(outs, 0, m), {}};
  for (size_t i = 0; i < m; ++i) r.tangents.push_back(out_nz[i] ? outs[k++] : Array());
  return r;
}

// Grows `carry_nz` until the body's carry outputs have nonzero tangents only where it does.
// The body's inputs are (consts..., carry..., rest...) with nonzero masks `pre` and `post` around the carry.
std::vector<bool> carry_fixpoint(const JaxprPtr& body, const std::vector<bool>& pre, std::vector<bool> carry_nz,
                                 const std::vector<bool>& post) {
  while (true) {
    std::vector<bool> nat = jvp_nonzeros(body, cat(cat(pre, carry_nz), post));
    std::vector<bool> grown = or_masks(carry_nz, sub(nat, 0, carry_nz.size()));
    if (grown == carry_nz) return carry_nz;
    carry_nz = grown;
  }
}

std::vector<Array> instantiate_masked(std::span<const Array> ts, std::span<const Array> ps,
                                      const std::vector<bool>& m) {
  std::vector<Array> out;
  for (size_t i = 0; i < ts.size(); ++i)
    if (m[i]) out.push_back(instantiate_zero(ts[i], ps[i].aval()));
  return out;
}

JvpOut while_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  WhileParams wp = while_params(p);
  size_t nc = size_t(wp.cond_nconsts), nb = size_t(wp.body_nconsts), ncar = primals.size() - nc - nb;
  std::vector<Array> cconsts = slice_of(primals, 0, nc), bconsts = slice_of(primals, nc, nc + nb);
  std::vector<Array> init = slice_of(primals, nc + nb, primals.size());
  std::vector<bool> bnz = defined_mask(tangents.subspan(nc, nb));
  std::vector<bool> carry_nz = carry_fixpoint(wp.body_jaxpr, bnz, defined_mask(tangents.subspan(nc + nb)), {});
  size_t nbd = size_t(std::count(bnz.begin(), bnz.end(), true));
  // The JVP body in while's layout: consts (bconsts, bconst_dots), carry (carry, carry_dots).
  FlatFn jvp_body = jvp_fn(wp.body_jaxpr, cat(bnz, carry_nz), carry_nz);
  FlatFn body = [&](const std::vector<Array>& xs) {
    std::vector<Array> in = slice_of(xs, 0, nb);           // bconsts
    auto carry = slice_of(xs, nb + nbd, nb + nbd + ncar);  // carry
    in.insert(in.end(), carry.begin(), carry.end());
    auto bd = slice_of(xs, nb, nb + nbd), cd = slice_of(xs, nb + nbd + ncar, xs.size());
    in.insert(in.end(), bd.begin(), bd.end());
    in.insert(in.end(), cd.begin(), cd.end());
    return jvp_body(in);
  };
  std::vector<Array> bdots = pick(slice_of(tangents, nc, nc + nb), bnz);
  std::vector<Array> cdots = instantiate_masked(tangents.subspan(nc + nb), primals.subspan(nc + nb), carry_nz);
  std::vector<AbstractValue> carry_avals = avals_of(init);
  TracedCall bj = trace_to_call(body, cat(cat(avals_of(bconsts), avals_of(bdots)), cat(carry_avals, avals_of(cdots))));
  FlatFn cond = [&](const std::vector<Array>& xs) {
    return eval_jaxpr(*wp.cond_jaxpr, {}, slice_of(xs, 0, nc + ncar));
  };
  TracedCall cj = trace_to_call(cond, cat(cat(avals_of(cconsts), carry_avals), avals_of(cdots)));
  std::vector<Array> args = cat(cat(cj.consts, cconsts), cat(cat(bj.consts, bconsts), bdots));
  args = cat(cat(args, init), cdots);
  std::vector<Array> outs =
      bind_while(WhileParams{cj.jaxpr, bj.jaxpr, int64_t(cj.consts.size() + nc), int64_t(bj.consts.size() + nb + nbd)},
                 args);
  JvpOut r{slice_of(outs, 0, ncar), {}};
  size_t k = ncar;
  for (size_t i = 0; i < ncar; ++i) r.tangents.push_back(carry_nz[i] ? outs[k++] : Array());
  return r;
}

JvpOut scan_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  ScanParams sp = scan_params(p);
  const Jaxpr& j = *sp.jaxpr;
  size_t nc = size_t(sp.num_consts), ncar = size_t(sp.num_carry), nx = sp.num_xs(), ny = sp.num_ys();
  std::vector<bool> cnz = defined_mask(tangents.subspan(0, nc));
  std::vector<bool> xnz = defined_mask(tangents.subspan(nc + ncar));
  std::vector<bool> carry_nz = carry_fixpoint(sp.jaxpr, cnz, defined_mask(tangents.subspan(nc, ncar)), xnz);
  std::vector<bool> nat = jvp_nonzeros(sp.jaxpr, cat(cat(cnz, carry_nz), xnz));
  std::vector<bool> ynz(nat.begin() + std::ptrdiff_t(ncar), nat.end());
  std::vector<Array> cdots = pick(slice_of(tangents, 0, nc), cnz);
  std::vector<Array> idots = instantiate_masked(tangents.subspan(nc, ncar), primals.subspan(nc, ncar), carry_nz);
  std::vector<Array> xdots = pick(slice_of(tangents, nc + ncar, tangents.size()), xnz);
  size_t ncd = cdots.size(), nid = idots.size();
  FlatFn jvp_body = jvp_fn(sp.jaxpr, cat(cat(cnz, carry_nz), xnz), cat(carry_nz, ynz));
  // scan layout: consts, const_dots | carry, carry_dots | xs, x_dots  ->  (carry, carry_dots, ys, y_dots)
  FlatFn body = [&](const std::vector<Array>& xs) {
    size_t o1 = nc + ncd, o2 = o1 + ncar + nid;
    std::vector<Array> in = cat(cat(slice_of(xs, 0, nc), slice_of(xs, o1, o1 + ncar)), slice_of(xs, o2, o2 + nx));
    in = cat(cat(in, slice_of(xs, nc, o1)), cat(slice_of(xs, o1 + ncar, o2), slice_of(xs, o2 + nx, xs.size())));
    std::vector<Array> out = jvp_body(in);  // carry, ys, carry_dots, y_dots
    size_t t = ncar + ny;
    return cat(cat(sub(out, 0, ncar), sub(out, t, t + nid)), cat(sub(out, ncar, t), sub(out, t + nid, out.size())));
  };
  auto body_in = j.in_avals();
  std::vector<AbstractValue> avals = cat(in_avals_of(j, 0, nc), pick(in_avals_of(j, 0, nc), cnz));
  avals = cat(cat(avals, in_avals_of(j, nc, nc + ncar)), pick(in_avals_of(j, nc, nc + ncar), carry_nz));
  std::vector<AbstractValue> x_avals = in_avals_of(j, nc + ncar, body_in.size());
  avals = cat(cat(avals, x_avals), pick(x_avals, xnz));
  TracedCall bt = trace_to_call(body, avals);
  std::vector<Array> args = cat(cat(bt.consts, slice_of(primals, 0, nc)), cdots);
  args = cat(cat(args, slice_of(primals, nc, nc + ncar)), idots);
  args = cat(cat(args, slice_of(primals, nc + ncar, primals.size())), xdots);
  std::vector<Array> outs = bind_scan(ScanParams{bt.jaxpr, sp.length, int64_t(bt.consts.size() + nc + ncd),
                                                 int64_t(ncar + nid), sp.unroll, sp.reverse},
                                      args);
  JvpOut r{cat(slice_of(outs, 0, ncar), slice_of(outs, ncar + nid, ncar + nid + ny)), {}};
  size_t k = ncar;
  for (size_t i = 0; i < ncar; ++i) r.tangents.push_back(carry_nz[i] ? outs[k++] : Array());
  k = ncar + nid + ny;
  for (size_t i = 0; i < ny; ++i) r.tangents.push_back(ynz[i] ? outs[k++] : Array());
  return r;
}

// ---- partial evaluation ------------------------------------------------------------------------------

// `j` split by unknown inputs. Outputs in `force` are unknown even where the jaxpr computes them
// from known inputs: their known values are passed to the unknown side as extra residuals.
struct Split {
  FlatFn known;    // known inputs -> (known outputs [!out_uk], residuals)
  FlatFn unknown;  // (residuals, unknown inputs) -> unknown outputs [out_uk]
  std::vector<bool> out_uk;
  std::vector<AbstractValue> res_avals;
};

Split make_split(const Jaxpr& j, std::shared_ptr<const PartialEvalResult> pe, const std::vector<bool>& force) {
  Split s;
  const std::vector<bool>& natural = pe->out_unknown;
  s.out_uk = or_masks(natural, force);
  std::vector<AbstractValue> outs = j.out_avals();
  size_t nres = pe->num_residuals;
  s.res_avals = in_avals_of(*pe->unknown, 0, nres);
  std::vector<bool> forced(natural.size());
  for (size_t i = 0; i < natural.size(); ++i) {
    forced[i] = s.out_uk[i] && !natural[i];
    if (forced[i]) s.res_avals.push_back(outs[i]);
  }
  std::vector<bool> out_uk = s.out_uk;
  s.known = [pe, natural, out_uk, nres](const std::vector<Array>& xs) {
    std::vector<Array> r = eval_jaxpr(pe->known, xs);
    size_t nk = r.size() - nres, k = 0;
    std::vector<Array> kept, extra;
    for (size_t i = 0; i < natural.size(); ++i)
      if (!natural[i]) (out_uk[i] ? extra : kept).push_back(r[k++]);
    return cat(cat(kept, slice_of(r, nk, r.size())), extra);
  };
  size_t nforced = s.res_avals.size() - nres;
  s.unknown = [pe, natural, out_uk, nres, nforced](const std::vector<Array>& xs) {
    std::vector<Array> in = cat(slice_of(xs, 0, nres), slice_of(xs, nres + nforced, xs.size()));
    std::vector<Array> u = eval_jaxpr(*pe->unknown, {}, in);
    std::vector<Array> out;
    size_t ui = 0, fi = nres;
    for (size_t i = 0; i < natural.size(); ++i)
      if (out_uk[i]) out.push_back(natural[i] ? u[ui++] : xs[fi++]);
    return out;
  };
  return s;
}

JaxprTrace& staging_trace(const char* prim) {
  auto* staging = dynamic_cast<JaxprTrace*>(current_trace());
  if (!staging) throw Error(fmt::format("internal: {} partial eval outside a JaxprTrace", prim));
  return *staging;
}

std::vector<Array> stage_all(JaxprTrace& staging, const PrimitiveDef& def, std::span<const Array> inputs,
                             const Params& p) {
  return staging.stage(def, inputs, p, infer_avals(def, inputs, p));
}

std::vector<Array> merge(const std::vector<bool>& uk, const std::vector<Array>& known,
                         const std::vector<Array>& unknown) {
  std::vector<Array> out;
  size_t ki = 0, ui = 0;
  for (bool u : uk) out.push_back(u ? unknown[ui++] : known[ki++]);
  return out;
}

std::vector<Array> cond_partial_eval(std::span<const Array> inputs, std::span<const bool> known, const Params& p) {
  JaxprTrace& staging = staging_trace("cond");
  if (!known[0]) return stage_all(staging, cond_primitive(), inputs, p);
  auto branches = cond_branches(p);
  std::vector<Array> ops = slice_of(inputs, 1, inputs.size());
  std::vector<bool> in_uk;
  for (size_t i = 1; i < known.size(); ++i) in_uk.push_back(!known[i]);
  std::vector<std::shared_ptr<const PartialEvalResult>> pes;
  std::vector<bool> out_uk(branches[0]->outvars().size(), false);
  for (const auto& b : branches) {
    pes.push_back(std::make_shared<const PartialEvalResult>(partial_eval_jaxpr(*b, in_uk)));
    out_uk = or_masks(out_uk, pes.back()->out_unknown);
  }
  std::vector<Split> splits;
  std::vector<size_t> res_start;
  std::vector<AbstractValue> all_res;
  for (size_t b = 0; b < branches.size(); ++b) {
    splits.push_back(make_split(*branches[b], pes[b], out_uk));
    res_start.push_back(all_res.size());
    all_res = cat(all_res, splits[b].res_avals);
  }
  size_t nb = branches.size();
  std::vector<FlatFn> known_fns, unknown_fns;
  for (size_t b = 0; b < nb; ++b) {
    const Split& s = splits[b];
    size_t nk = size_t(std::count(out_uk.begin(), out_uk.end(), false));
    size_t lo = res_start[b], hi = lo + s.res_avals.size();
    known_fns.push_back([&, b, nk, lo, hi](const std::vector<Array>& xs) {
      std::vector<Array> r = splits[b].known(xs);
      std::vector<Array> out = slice_of(r, 0, nk);
      for (size_t i = 0; i < all_res.size(); ++i)
        out.push_back(i >= lo && i < hi ? r[nk + i - lo] : zeros_like_aval(all_res[i]));
      return out;
    });
    unknown_fns.push_back([&, b, lo, hi](const std::vector<Array>& xs) {
      return splits[b].unknown(cat(slice_of(xs, lo, hi), slice_of(xs, all_res.size(), xs.size())));
    });
  }
  std::vector<Array> known_ops = pick(ops, in_uk, false), unknown_ops = pick(ops, in_uk, true);
  std::vector<Array> known_out;
  {
    TraceScope scope(staging.parent());
    TracedBranches tk = trace_branches(known_fns, avals_of(known_ops));
    known_out = bind_cond(inputs[0], tk.jaxprs, cat(tk.consts, known_ops));
  }
  size_t nk = known_out.size() - all_res.size();
  std::vector<Array> res = slice_of(known_out, nk, known_out.size());
  TracedBranches tu = trace_branches(unknown_fns, cat(all_res, avals_of(unknown_ops)));
  std::vector<Array> staged_in = cat(cat(std::vector<Array>{inputs[0]}, tu.consts), cat(res, unknown_ops));
  std::vector<Array> unknown_out = stage_all(staging, cond_primitive(), staged_in, cond_param_map(tu.jaxprs));
  return merge(out_uk, slice_of(known_out, 0, nk), unknown_out);
}

std::vector<Array> scan_partial_eval(std::span<const Array> inputs, std::span<const bool> known, const Params& p) {
  JaxprTrace& staging = staging_trace("scan");
  ScanParams sp = scan_params(p);
  const Jaxpr& j = *sp.jaxpr;
  size_t nc = size_t(sp.num_consts), ncar = size_t(sp.num_carry), ny = sp.num_ys();
  std::vector<bool> in_uk;
  for (bool k : known) in_uk.push_back(!k);
  // Fixpoint: a carry is unknown if its initial value is or the body makes it so.
  std::shared_ptr<const PartialEvalResult> pe;
  while (true) {
    pe = std::make_shared<const PartialEvalResult>(partial_eval_jaxpr(j, in_uk));
    bool grown = false;
    for (size_t c = 0; c < ncar; ++c)
      if (pe->out_unknown[c] && !in_uk[nc + c]) in_uk[nc + c] = grown = true;
    if (!grown) break;
  }
  std::vector<bool> force(ncar + ny, false);
  for (size_t c = 0; c < ncar; ++c) force[c] = in_uk[nc + c];
  Split s = make_split(j, pe, force);
  auto mask = [&](size_t lo, size_t hi, bool uk) {
    return size_t(std::count(in_uk.begin() + std::ptrdiff_t(lo), in_uk.begin() + std::ptrdiff_t(hi), uk));
  };
  size_t kc = mask(0, nc, false), kcar = mask(nc, nc + ncar, false);
  size_t ucar = ncar - kcar, uc = nc - kc, nres = s.res_avals.size();
  std::vector<Array> ins(inputs.begin(), inputs.end());
  std::vector<AbstractValue> body_avals = j.in_avals();
  // Known scan: (known consts | known carry | known xs) -> (known carry | known ys, residuals).
  std::vector<Array> known_out;
  {
    TraceScope scope(staging.parent());
    TracedCall bk = trace_to_call(s.known, pick(body_avals, in_uk, false));
    known_out =
        bind_scan(ScanParams{bk.jaxpr, sp.length, int64_t(bk.consts.size() + kc), int64_t(kcar), sp.unroll, sp.reverse},
                  cat(bk.consts, pick(ins, in_uk, false)));
  }
  size_t nko = known_out.size() - nres;
  std::vector<Array> res = slice_of(known_out, nko, known_out.size());
  // Unknown scan: (unknown consts | unknown carry | unknown xs, residuals) -> (unknown carry | unknown ys).
  size_t nu = size_t(std::count(in_uk.begin(), in_uk.end(), true));
  FlatFn unknown_body = [&](const std::vector<Array>& xs) {
    return s.unknown(cat(slice_of(xs, nu, xs.size()), slice_of(xs, 0, nu)));
  };
  TracedCall bu = trace_to_call(unknown_body, cat(pick(body_avals, in_uk, true), s.res_avals));
  std::vector<Array> staged_in = cat(cat(bu.consts, pick(ins, in_uk, true)), res);
  ScanParams usp{bu.jaxpr, sp.length, int64_t(bu.consts.size() + uc), int64_t(ucar), sp.unroll, sp.reverse};
  std::vector<Array> unknown_out =
      stage_all(staging, scan_primitive(), staged_in, scan_param_map(usp, staged_in.size()));
  return merge(s.out_uk, slice_of(known_out, 0, nko), unknown_out);
}

// ---- transpose ---------------------------------------------------------------------------------------

std::vector<Array> cond_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  auto branches = cond_branches(p);
  std::vector<size_t> lin, nonlin;
  for (size_t i = 1; i < args.size(); ++i) (is_undefined_primal(args[i]) ? lin : nonlin).push_back(i);
  std::vector<FlatFn> fns;
  for (const auto& b : branches)
    fns.push_back([&, b](const std::vector<Array>& xs) {
      std::vector<Array> a(args.size() - 1);
      for (size_t k = 0; k < nonlin.size(); ++k) a[nonlin[k] - 1] = xs[k];
      for (size_t i : lin) a[i - 1] = make_undefined_primal(args[i].aval());
      std::vector<Array> res = backward_pass(*b, {}, a, slice_of(xs, nonlin.size(), xs.size()));
      std::vector<Array> out;
      for (size_t i : lin) out.push_back(instantiate_zero(res[i - 1], args[i].aval()));
      return out;
    });
  std::vector<Array> nonlin_vals;
  for (size_t i : nonlin) nonlin_vals.push_back(args[i]);
  std::vector<Array> ct_vals(cts.begin(), cts.end());
  TracedBranches tb = trace_branches(fns, cat(avals_of(nonlin_vals), avals_of(ct_vals)));
  std::vector<Array> outs = bind_cond(args[0], tb.jaxprs, cat(cat(tb.consts, nonlin_vals), ct_vals));
  std::vector<Array> result(args.size());
  for (size_t k = 0; k < lin.size(); ++k) result[lin[k]] = outs[k];
  return result;
}

// Carries are taken as linear (a known value there is a zero tangent the body is linear in).
std::vector<Array> scan_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  ScanParams sp = scan_params(p);
  const Jaxpr& j = *sp.jaxpr;
  size_t nc = size_t(sp.num_consts), ncar = size_t(sp.num_carry), n = args.size();
  std::vector<bool> is_lin(n);
  for (size_t i = 0; i < n; ++i) is_lin[i] = is_undefined_primal(args[i]) || (i >= nc && i < nc + ncar);
  std::vector<size_t> lin_c, nl_c, lin_x, nl_x;
  for (size_t i = 0; i < nc; ++i) (is_lin[i] ? lin_c : nl_c).push_back(i);
  for (size_t i = nc + ncar; i < n; ++i) (is_lin[i] ? lin_x : nl_x).push_back(i);
  std::vector<AbstractValue> body_in = j.in_avals(), body_out = j.out_avals();
  size_t nlc = nl_c.size(), nac = lin_c.size(), ny = sp.num_ys();
  // layout: consts (nonlinear consts) | carry (const cts, carry cts) | xs (y cts, nonlinear xs)
  FlatFn body_t = [&](const std::vector<Array>& xs) {
    std::vector<Array> a(n);
    for (size_t k = 0; k < nlc; ++k) a[nl_c[k]] = xs[k];
    for (size_t k = 0; k < nl_x.size(); ++k) a[nl_x[k]] = xs[nlc + nac + ncar + ny + k];
    for (size_t i = 0; i < n; ++i)
      if (is_lin[i]) a[i] = make_undefined_primal(body_in[i]);
    std::vector<Array> ct = slice_of(xs, nlc + nac, nlc + nac + ncar + ny);
    std::vector<Array> res = backward_pass(j, {}, a, ct);
    std::vector<Array> out;
    for (size_t k = 0; k < nac; ++k) out.push_back(add_tangents(xs[nlc + k], res[lin_c[k]]));
    for (size_t c = 0; c < ncar; ++c) out.push_back(instantiate_zero(res[nc + c], body_in[nc + c]));
    for (size_t i : lin_x) out.push_back(instantiate_zero(res[i], body_in[i]));
    return out;
  };
  std::vector<AbstractValue> avals;
  for (size_t i : nl_c) avals.push_back(body_in[i]);
  for (size_t i : lin_c) avals.push_back(body_in[i]);
  avals = cat(cat(avals, sub(body_in, nc, nc + ncar)), sub(body_out, ncar, body_out.size()));
  for (size_t i : nl_x) avals.push_back(body_in[i]);
  TracedCall bt = trace_to_call(body_t, avals);
  std::vector<Array> targs = bt.consts;
  for (size_t i : nl_c) targs.push_back(args[i]);
  for (size_t i : lin_c) targs.push_back(zeros_like_aval(body_in[i]));
  for (size_t i = 0; i < ncar + ny; ++i) {
    AbstractValue a = body_out[i];
    if (i >= ncar) a.shape.insert(a.shape.begin(), sp.length);
    targs.push_back(instantiate_zero(cts[i], a));
  }
  for (size_t i : nl_x) targs.push_back(args[i]);
  std::vector<Array> outs = bind_scan(ScanParams{bt.jaxpr, sp.length, int64_t(bt.consts.size() + nlc),
                                                 int64_t(nac + ncar), sp.unroll, !sp.reverse},
                                      targs);
  std::vector<Array> result(n);
  for (size_t k = 0; k < nac; ++k) result[lin_c[k]] = outs[k];
  for (size_t c = 0; c < ncar; ++c)
    if (is_undefined_primal(args[nc + c])) result[nc + c] = outs[nac + c];
  for (size_t k = 0; k < lin_x.size(); ++k) result[lin_x[k]] = outs[nac + ncar + k];
  return result;
}

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& c = define_rules("cond");
  c.jvp = cond_jvp;
  c.partial_eval = cond_partial_eval;
  c.transpose = cond_transpose;
  PrimitiveRules& w = define_rules("while");
  w.jvp = while_jvp;
  w.partial_eval = [](std::span<const Array>, std::span<const bool>, const Params&) -> std::vector<Array> {
    raise_while_not_reverse_differentiable();
  };
  w.transpose = [](std::span<const Array>, std::span<const Array>, const Params&) -> std::vector<Array> {
    raise_while_not_reverse_differentiable();
  };
  PrimitiveRules& s = define_rules("scan");
  s.jvp = scan_jvp;
  s.partial_eval = scan_partial_eval;
  s.transpose = scan_transpose;
});

}  // namespace
}  // namespace cjax
