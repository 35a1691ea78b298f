// The shard_map primitive's own rules (docs/shard_map.md §3.4): JVP (one shard_map over primals
// and tangents), partial evaluation under linearize (a known shard_map that also returns the
// residuals, each laid out by its varying axes, and a staged unknown one), transpose (a
// shard_map of the body's backward pass; with check_vma=false the defensive division of output
// cotangents and psum of input cotangents of JEP 17111) and batching (the batch dimension becomes
// a leading unsplit dimension of every spec).
#include <fmt/format.h>

#include "autodiff/ad.h"
#include "autodiff/partial_eval.h"
#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "core/array/rules.h"
#include "core/lax/rule_support.h"
#include "core/spmd/collectives.h"
#include "trace/batching.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

using Xs = std::vector<Array>;

// Makes each body output vary over the axes its out_spec names (the front end's implicit pvary).
Xs pvary_to_specs(Xs outs, const std::vector<PartitionSpec>& specs, bool check_vma) {
  if (!check_vma) return outs;
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<std::string> missing = vma_minus(spec_vma(specs[k]), outs[k].aval().vma);
    if (!missing.empty()) outs[k] = bind1(g_pvary, {outs[k]}, pvary_params(missing));
  }
  return outs;
}

// Traces `f` as a new body with the manual axes bound; closed-over values become leading P()
// inputs (returned in `consts`).
TracedCall trace_body(const ShardMapInfo& info, const std::vector<AbstractValue>& in_avals, const FlatFn& f) {
  AxisEnvScope env(info.axis_frame());
  return trace_to_call(f, in_avals);
}

// A new shard_map equation over `call` (its consts lead, replicated).
Xs bind_call(ShardMapInfo info, const TracedCall& call, std::vector<PartitionSpec> in_specs,
             std::vector<PartitionSpec> out_specs, std::span<const Array> args) {
  info.body = call.jaxpr;
  info.in_specs.assign(call.consts.size(), PartitionSpec());
  info.in_specs.insert(info.in_specs.end(), in_specs.begin(), in_specs.end());
  info.out_specs = std::move(out_specs);
  Xs all = call.consts;
  all.insert(all.end(), args.begin(), args.end());
  return bind_shard_map(info, all);
}

// ---- JVP ----

JvpOut shard_map_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  ShardMapInfo info = ShardMapInfo::from(p);
  auto body = info.body;
  size_t n = primals.size();
  std::vector<size_t> nz;
  for (size_t i = 0; i < n; ++i)
    if (tangents[i].defined()) nz.push_back(i);
  std::vector<AbstractValue> in_avals = body->in_avals();
  for (size_t i : nz) in_avals.push_back(body->invars()[i].aval());
  std::vector<PartitionSpec> in_specs = info.in_specs;
  for (size_t i : nz) in_specs.push_back(info.in_specs[i]);
  std::vector<PartitionSpec> out_specs = info.out_specs;
  out_specs.insert(out_specs.end(), info.out_specs.begin(), info.out_specs.end());
  TracedCall call = trace_body(info, in_avals, [&](const Xs& xs) {
    Xs ps(xs.begin(), xs.begin() + std::ptrdiff_t(n)), ts(n);
    for (size_t k = 0; k < nz.size(); ++k) ts[nz[k]] = xs[n + k];
    JvpResult r = jvp_flat([&](const Xs& a) { return eval_jaxpr(*body, {}, a); }, ps, ts);
    Xs out = r.primals_out;
    out.insert(out.end(), r.tangents_out.begin(), r.tangents_out.end());
    return pvary_to_specs(std::move(out), out_specs, info.check_vma);
  });
  Xs args(primals.begin(), primals.end());
  for (size_t i : nz) args.push_back(tangents[i]);
  Xs outs = bind_call(info, call, in_specs, out_specs, args);
  size_t m = outs.size() / 2;
  return JvpOut{Xs(outs.begin(), outs.begin() + std::ptrdiff_t(m)), Xs(outs.begin() + std::ptrdiff_t(m), outs.end())};
}

// ---- partial evaluation ----

// How a residual leaves the known shard_map: dim 0 split over the axes it varies over (all
// manual axes when varying axes are not tracked), P() if invariant; varying scalars get a
// leading axis of size 1 (blocks of rank 0 cannot be concatenated).
struct ResidualLayout {
  PartitionSpec spec;
  bool promote = false;
};
ResidualLayout residual_layout(const ShardMapInfo& info, const AbstractValue& a) {
  std::vector<std::string> axes;
  for (const std::string& m : info.manual_axes)
    if (!info.check_vma || std::binary_search(a.vma.begin(), a.vma.end(), m)) axes.push_back(m);
  if (axes.empty()) return {PartitionSpec(), false};
  PartitionSpec::Entry e = axes.size() == 1 ? PartitionSpec::Entry(axes[0]) : PartitionSpec::Entry(AxisTuple{axes});
  return {PartitionSpec(std::vector<PartitionSpec::Entry>{e}), a.ndim() == 0};
}

Xs shard_map_partial_eval(std::span<const Array> inputs, std::span<const bool> known, const Params& p) {
  auto* staging = dynamic_cast<JaxprTrace*>(current_trace());
  if (!staging) throw Error("internal: shard_map partial eval outside a JaxprTrace");
  ShardMapInfo info = ShardMapInfo::from(p);
  std::vector<bool> unknown(known.size());
  for (size_t i = 0; i < known.size(); ++i) unknown[i] = !known[i];
  PartialEvalResult pe;
  {
    AxisEnvScope env(info.axis_frame());
    pe = partial_eval_jaxpr(*info.body, unknown);
  }
  const Jaxpr& kj = *pe.known;
  size_t num_known_outs = kj.outvars().size() - pe.num_residuals;
  std::vector<AbstractValue> kouts = kj.out_avals();
  std::vector<ResidualLayout> layouts;
  for (size_t r = 0; r < pe.num_residuals; ++r) layouts.push_back(residual_layout(info, kouts[num_known_outs + r]));

  // Known side: consts (P()), then the known inputs; outputs: known outputs then residuals.
  std::vector<PartitionSpec> kin_specs(pe.known.consts.size(), PartitionSpec()), kout_specs;
  Xs known_in = pe.known.consts;
  std::vector<AbstractValue> kin_avals;
  for (const Var& v : kj.constvars()) kin_avals.push_back(v.aval());
  for (size_t i = 0; i < inputs.size(); ++i)
    if (known[i]) {
      known_in.push_back(inputs[i]);
      kin_specs.push_back(info.in_specs[i]);
      kin_avals.push_back(info.body->invars()[i].aval());
    }
  {
    size_t ko = 0;
    for (size_t j = 0; j < pe.out_unknown.size(); ++j)
      if (!pe.out_unknown[j]) {
        kout_specs.push_back(info.out_specs[j]);
        ++ko;
      }
    (void)ko;
  }
  for (const ResidualLayout& l : layouts) kout_specs.push_back(l.spec);
  auto known_jaxpr = convert_constvars_to_invars(kj);
  TracedCall kcall = trace_body(info, kin_avals, [&](const Xs& xs) {
    Xs outs = eval_jaxpr(*known_jaxpr, {}, xs);
    for (size_t r = 0; r < layouts.size(); ++r)
      if (layouts[r].promote) outs[num_known_outs + r] = lax::reshape(outs[num_known_outs + r], {1});
    return pvary_to_specs(std::move(outs), kout_specs, info.check_vma);
  });
  Xs known_out;
  {
    TraceScope scope(staging->parent());
    known_out = bind_call(info, kcall, kin_specs, kout_specs, known_in);
  }

  // Unknown side: residuals (laid out as above), then the unknown inputs.
  std::vector<PartitionSpec> uin_specs, uout_specs;
  std::vector<AbstractValue> uin_avals;
  Xs staged_in;
  for (size_t r = 0; r < layouts.size(); ++r) {
    AbstractValue a = kouts[num_known_outs + r];
    if (layouts[r].promote) a.shape = {1};
    if (info.check_vma) a.vma = spec_vma(layouts[r].spec);
    uin_avals.push_back(a);
    uin_specs.push_back(layouts[r].spec);
    staged_in.push_back(known_out[num_known_outs + r]);
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!known[i]) {
      uin_specs.push_back(info.in_specs[i]);
      uin_avals.push_back(info.body->invars()[i].aval());
      staged_in.push_back(inputs[i]);
    }
  for (size_t j = 0; j < pe.out_unknown.size(); ++j)
    if (pe.out_unknown[j]) uout_specs.push_back(info.out_specs[j]);
  auto unknown_jaxpr = pe.unknown;
  TracedCall ucall = trace_body(info, uin_avals, [&](const Xs& xs) {
    Xs a = xs;
    for (size_t r = 0; r < layouts.size(); ++r)
      if (layouts[r].promote) a[r] = lax::reshape(a[r], {});
    return pvary_to_specs(eval_jaxpr(*unknown_jaxpr, {}, a), uout_specs, info.check_vma);
  });
  ShardMapInfo uinfo = info;
  uinfo.body = ucall.jaxpr;
  uinfo.in_specs.assign(ucall.consts.size(), PartitionSpec());
  uinfo.in_specs.insert(uinfo.in_specs.end(), uin_specs.begin(), uin_specs.end());
  uinfo.out_specs = uout_specs;
  Xs uargs = ucall.consts;
  uargs.insert(uargs.end(), staged_in.begin(), staged_in.end());
  Params up = uinfo.params();
  Xs unknown_out = staging->stage(g_shard_map, uargs, up, infer_avals(g_shard_map, uargs, up));
  Xs out;
  size_t ki = 0, ui = 0;
  for (bool u : pe.out_unknown) out.push_back(u ? unknown_out[ui++] : known_out[ki++]);
  return out;
}

// ---- transpose ----

int64_t unmentioned_size(const ShardMapInfo& info, const PartitionSpec& spec, std::vector<std::string>* names) {
  std::vector<std::string> m = spec.mentioned_axes();
  int64_t n = 1;
  for (const std::string& a : info.manual_axes)
    if (std::find(m.begin(), m.end(), a) == m.end()) {
      n *= info.mesh.axis_size(a);
      if (names) names->push_back(a);
    }
  return n;
}

Xs shard_map_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  ShardMapInfo info = ShardMapInfo::from(p);
  auto body = info.body;
  std::vector<size_t> linear, nonlin, nz;
  for (size_t i = 0; i < args.size(); ++i) (is_undefined_primal(args[i]) ? linear : nonlin).push_back(i);
  for (size_t k = 0; k < cts.size(); ++k)
    if (cts[k].defined()) nz.push_back(k);
  Xs result(args.size());
  if (nz.empty() || linear.empty()) return result;
  std::vector<AbstractValue> body_outs = body->out_avals();
  std::vector<AbstractValue> in_avals;
  std::vector<PartitionSpec> in_specs, out_specs;
  for (size_t i : nonlin) {
    in_avals.push_back(body->invars()[i].aval());
    in_specs.push_back(info.in_specs[i]);
  }
  for (size_t k : nz) {
    AbstractValue a = body_outs[k];
    a.dtype = cts[k].dtype();
    a.vma = info.check_vma ? spec_vma(info.out_specs[k]) : std::vector<std::string>{};
    in_avals.push_back(a);
    in_specs.push_back(info.out_specs[k]);
  }
  for (size_t i : linear) out_specs.push_back(info.in_specs[i]);
  TracedCall call = trace_body(info, in_avals, [&](const Xs& xs) {
    Xs a(args.size());
    for (size_t k = 0; k < nonlin.size(); ++k) a[nonlin[k]] = xs[k];
    for (size_t i : linear) a[i] = make_undefined_primal(body->invars()[i].aval());
    Xs c(cts.size());
    for (size_t k = 0; k < nz.size(); ++k) {
      Array ct = xs[nonlin.size() + k];
      if (!info.check_vma && is_floating(ct.dtype())) {  // JEP 17111: the output was one copy of n
        int64_t n = unmentioned_size(info, info.out_specs[nz[k]], nullptr);
        if (n > 1) ct = lax::div(ct, make_scalar(double(n), ct.dtype()));
      }
      c[nz[k]] = ct;
    }
    Xs res = backward_pass(*body, {}, a, c);
    Xs out;
    for (size_t i : linear) {
      Array r = instantiate_zero(res[i], body->invars()[i].aval());
      if (!info.check_vma) {
        std::vector<std::string> un;
        unmentioned_size(info, info.in_specs[i], &un);
        if (!un.empty() && is_floating(r.dtype())) r = bind1(g_psum, {r}, {{"axes", axes_param(un)}});
      }
      out.push_back(r);
    }
    return pvary_to_specs(std::move(out), out_specs, info.check_vma);
  });
  mark_transposed_body(call.jaxpr);
  Xs call_args;
  for (size_t i : nonlin) call_args.push_back(args[i]);
  for (size_t k : nz) call_args.push_back(cts[k]);
  Xs outs = bind_call(info, call, in_specs, out_specs, call_args);
  for (size_t k = 0; k < linear.size(); ++k) result[linear[k]] = outs[k];
  return result;
}

// ---- batching ----

PartitionSpec with_leading(const PartitionSpec& s, const std::string& axis) {
  std::vector<PartitionSpec::Entry> e;
  if (axis.empty())
    e.emplace_back(None);
  else
    e.emplace_back(axis);
  e.insert(e.end(), s.entries().begin(), s.entries().end());
  return PartitionSpec(std::move(e));
}

// vmap of a shard_map: the batch dimension leads every block, unsplit (or split over the
// vmap's spmd_axis_name, which then must not appear in the specs).
BatchOut shard_map_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis,
                         const Params& p) {
  ShardMapInfo info = ShardMapInfo::from(p);
  auto body = info.body;
  const std::string& spmd = axis.spmd_axis_name;
  BatchAxis inner = axis;
  inner.spmd_axis_name.clear();
  if (!spmd.empty()) {
    if (!axis.name.empty() && uses_axis_name(g_shard_map, p, axis.name))
      throw ValueError(fmt::format(
          "vmap with spmd_axis_name '{}' and axis_name '{}': the shard_map's body has a collective over '{}', whose "
          "batch is split over mesh axis '{}'; that is not supported. Drop spmd_axis_name, or apply the collective "
          "over '{}' outside the shard_map",
          spmd, axis.name, axis.name, spmd, axis.name));
    if (std::find(info.manual_axes.begin(), info.manual_axes.end(), spmd) == info.manual_axes.end())
      throw SpecError(
          fmt::format("vmap spmd_axis_name '{}' is not a manual axis of the shard_map over {} (manual axes {})", spmd,
                      info.mesh.str(), AxisNames(info.manual_axes).str()));
    for (const auto* specs : {&info.in_specs, &info.out_specs})
      for (const PartitionSpec& s : *specs) {
        auto m = s.mentioned_axes();
        if (std::find(m.begin(), m.end(), spmd) != m.end())
          throw SpecError(
              fmt::format("vmap spmd_axis_name cannot appear in shard_map in_specs or out_specs, but '{}' "
                          "appears in {}",
                          spmd, s.str()));
      }
    int64_t n = info.mesh.axis_size(spmd);
    if (axis.size % n != 0)
      throw SpecError(fmt::format("vmap with spmd_axis_name '{}' (size {}) needs a batch size divisible by it, got {}",
                                  spmd, n, axis.size));
    inner.size = axis.size / n;
  }
  std::vector<std::string> spmd_vma =
      spmd.empty() || !info.check_vma ? std::vector<std::string>{} : std::vector<std::string>{spmd};
  Xs moved;
  std::vector<int> in_bdims;
  std::vector<AbstractValue> in_avals;
  std::vector<PartitionSpec> in_specs;
  for (size_t i = 0; i < args.size(); ++i) {
    AbstractValue a = body->invars()[i].aval();
    if (bdims[i] == kNotMapped) {
      moved.push_back(args[i]);
      in_bdims.push_back(kNotMapped);
      in_specs.push_back(info.in_specs[i]);
    } else {
      moved.push_back(move_bdim(args[i], bdims[i], 0, axis.size));
      in_bdims.push_back(0);
      in_specs.push_back(with_leading(info.in_specs[i], spmd));
      a.shape.insert(a.shape.begin(), inner.size);
      a.vma = vma_union(a.vma, spmd_vma);
    }
    in_avals.push_back(a);
  }
  std::vector<PartitionSpec> out_specs;
  for (const PartitionSpec& s : info.out_specs) out_specs.push_back(with_leading(s, spmd));
  TracedCall call = trace_body(info, in_avals, [&](const Xs& xs) {
    Xs outs = vmap_flat([&](const Xs& a) { return eval_jaxpr(*body, {}, a); }, xs, in_bdims,
                        [](size_t, int) { return 0; }, inner);
    return pvary_to_specs(std::move(outs), out_specs, info.check_vma);
  });
  Xs outs = bind_call(info, call, in_specs, out_specs, moved);
  return BatchOut{outs, std::vector<int>(outs.size(), 0)};
}

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("shard_map");
  r.jvp = shard_map_jvp;
  r.partial_eval = shard_map_partial_eval;
  r.transpose = shard_map_transpose;
  r.batch = shard_map_batch;
});

}  // namespace
}  // namespace cjax
