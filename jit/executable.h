// Executable: what jit runs for one signature. In this layer it interprets the optimized jaxpr
// (jit/passes.h) with the eager kernels; the compiler replaces the backend behind this interface.
#pragma once
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "trace/jaxpr.h"

namespace cjax {

class Executable {
 public:
  explicit Executable(const ClosedJaxpr& traced);
  // Runs on concrete inputs (one per invar of the traced jaxpr) under the eval trace.
  std::vector<Array> run(std::span<const Array> args) const;
  const Jaxpr& jaxpr() const { return *optimized_; }

 private:
  std::shared_ptr<const Jaxpr> optimized_;
  std::vector<Array> consts_;
};

// Marks a donated array deleted: its buffers are released and later uses raise ValueError.
void delete_array(const Array& a, std::string_view donated_to);

}  // namespace cjax
