#include "jit/executable.h"

#include <fmt/format.h>

#include "core/array_impl.h"
#include "jit/passes.h"
#include "trace/eval_jaxpr.h"
#include "trace/trace.h"

namespace cjax {

Executable::Executable(const ClosedJaxpr& traced) : optimized_(optimize(*traced)), consts_(traced.consts) {}

std::vector<Array> Executable::run(std::span<const Array> args) const {
  TraceScope scope(eval_trace());
  return eval_jaxpr(*optimized_, consts_, args);
}

void delete_array(const Array& a, std::string_view donated_to) {
  ConcreteArray* c = concrete(a);
  if (!c) return;
  (void)donated_to;
  c->buffers.clear();
}

}  // namespace cjax
