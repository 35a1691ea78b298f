// debug::print (JAX's jax.debug.print): prints values while the program runs, eagerly, under jit
// (every call of the compiled function prints), under vmap (the batched values), under grad
// (once, the primal values) and inside shard_map (once per device, with that device's block).
//
//   debug::print("step {} loss {}", step, loss);
//
// Each "{}" is replaced by the next value's numpy-style text ("{{" and "}}" print braces); the
// number of "{}" must equal the number of values (ValueError otherwise). Output goes to
// std::cout, or to the stream set with debug::set_print_stream (a mutex keeps lines whole when
// several devices print at once; their order across devices is not specified).
#pragma once
#include <iosfwd>
#include <string_view>
#include <vector>

#include "cjax/array.h"

namespace cjax::debug {

void print_values(std::string_view fmt, const std::vector<Array>& values);
template <class... A>
void print(std::string_view fmt, const A&... values) {
  print_values(fmt, std::vector<Array>{Array(values)...});
}
// nullptr restores std::cout.
void set_print_stream(std::ostream* os);

}  // namespace cjax::debug
