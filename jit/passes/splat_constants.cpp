// splat_constants: uniform constants become splats of a scalar literal (jit/passes/passes.h).
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/array/trace.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;
namespace {

// Whether every element of a single-buffer array has the bytes of the first.
bool uniform(const Array& c) {
  ConcreteArray* ca = concrete(c);
  if (!ca || ca->buffers.size() != 1 || c.size() < 2) return false;
  const auto* p = static_cast<const unsigned char*>(ca->buffers[0]->data());
  size_t es = itemsize(c.dtype()), n = size_t(c.size());
  for (size_t i = 1; i < n; ++i)
    if (std::memcmp(p, p + i * es, es) != 0) return false;
  return true;
}

}  // namespace

std::shared_ptr<const Jaxpr> splat_constants(const Jaxpr& jaxpr, const std::vector<Array>& consts) {
  std::vector<JaxprEqn> eqns;
  Subst s;
  for (size_t i = 0; i < jaxpr.constvars().size() && i < consts.size(); ++i) {
    const Var& cv = jaxpr.constvars()[i];
    if (consts[i].ndim() == 0 || cv.aval().shape != consts[i].shape()) continue;
    // A constant on a device (created under CJAX_PLATFORM=cuda) is read through a host copy.
    ConcreteArray* cc = concrete(consts[i]);
    Array c = cc && cc->buffers.size() == 1 && !host_accessible(cc->device()) ? to_host(consts[i]) : consts[i];
    if (!uniform(c)) continue;
    Array scalar;
    {
      TraceScope scope(eval_trace());
      scalar = lax::reshape(lax::slice(c, Shape(size_t(c.ndim()), 0), Shape(size_t(c.ndim()), 1)), {});
    }
    eqns.push_back(splat_eqn(Literal(scalar), Var(cv.aval())));
    s.map[cv.id()] = eqns.back().outputs[0];
  }
  if (eqns.empty()) return std::make_shared<const Jaxpr>(jaxpr);
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

}  // namespace cjax
