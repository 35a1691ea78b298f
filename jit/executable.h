// Executable: what jit runs for one signature. In this layer it interprets the optimized jaxpr
// (jit/passes.h) with the eager kernels: the jaxpr is lowered once into a flat list of
// instructions over numbered value slots (inputs, literals and output types resolved ahead of
// time, each slot released after its last use), so a call does no lookups, no abstract
// evaluation and keeps no dead intermediate alive. The compiler replaces this backend behind
// the same interface.
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
  // Runs on concrete inputs (one per invar of the traced jaxpr) on the caller's thread.
  std::vector<Array> run(std::span<const Array> args) const;
  const Jaxpr& jaxpr() const { return *optimized_; }

 private:
  struct Instr {
    const PrimitiveDef* def;
    std::vector<int> inputs;          // slot per input (-1: a literal from `literals`)
    std::vector<Array> literals;      // by input position
    std::vector<AbstractValue> out_avals;
    std::vector<int> outputs;         // slot per output (-1: unused)
    std::vector<int> release;         // slots dead after this instruction
    Params params;
  };
  std::shared_ptr<const Jaxpr> optimized_;
  std::vector<Array> consts_;
  std::vector<Instr> program_;
  std::vector<int> in_slots_;
  std::vector<int> out_slots_;           // -1: literal output
  std::vector<Array> out_literals_;
  std::vector<AbstractValue> in_avals_;
  size_t num_slots_ = 0;
};

// Marks a donated array deleted: its buffers are released and later uses raise ValueError.
void delete_array(const Array& a, std::string_view donated_to);

}  // namespace cjax
