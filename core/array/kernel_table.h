// The kernel table: how an eager primitive finds its implementation for a platform, and the
// counted host fallback of a device platform (docs/architecture.md, "How an eager primitive finds
// its kernel").
#pragma once
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "cjax/array.h"
#include "cjax/device.h"
#include "core/array/primitive.h"

namespace cjax {

// Per-platform primitive kernels, keyed by (primitive name, platform): each backend registers
// its kernels at static initialisation (the CPU's in backends/cpu/kernels/, by family). Keyed by
// name so that a backend may register before the primitive's family file does.
using PrimitiveKernel = PrimitiveDef::ImplFn;
void register_kernel(std::string_view primitive, Platform platform, PrimitiveKernel fn);
const PrimitiveKernel* find_kernel(std::string_view primitive, Platform platform);
// How `def` runs eagerly on operands of `platform`: the kernel registered for (primitive,
// platform), else the def's platform-independent impl; nullptr when it has neither.
const PrimitiveKernel* find_implementation(const PrimitiveDef& def, Platform platform);
// The same, raising BackendError ("primitive 'sort' has no kernel for platform 'cuda'") instead.
const PrimitiveKernel& implementation_for(const PrimitiveDef& def, Platform platform);

// Host fallbacks: a primitive with no kernel for its operands' platform runs on the host, its
// operands copied to cpu:0 and its outputs copied back. Never silent: each one is counted
// (profiler::host_fallback_count in cjax/profiler.h) and, with CJAX_LOG_FALLBACKS=1, named on stderr.
// An uncommitted CPU operand copied to a device operand's device (JAX's placement rule): logged
// with CJAX_LOG_FALLBACKS=1 when larger than a scalar, since a large one costs a transfer per use.
void note_follow_transfer(std::string_view primitive, const Array& value, const Device& to);
std::vector<Array> run_on_host(const PrimitiveDef& def, Platform platform, std::span<const Array> in,
                               std::span<const AbstractValue> out_avals, const Params& params);

}  // namespace cjax
