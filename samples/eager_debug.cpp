// Eager cjax under a debugger. Every line runs its operations immediately on the calling thread,
// so each Array holds its values as soon as its line has run: stop anywhere and `print` it.
//
//   gdb -ex 'add-auto-load-safe-path /path/to/build' --args ./samples/eager_debug
//   (gdb) break eager_debug.cpp:28        # the line marked "BREAK HERE"
//   (gdb) run
//   (gdb) print x
//   $1 = f32[2,3] [[1. 2. 3.] [4. 5. 6.]]
//   (gdb) next
//   (gdb) print y
//   $2 = f32[2,3] [[ 2.  4.  6.] [ 8. 10. 12.]]
//
// See docs/gdb.md for the printer and a full session.
#include <iostream>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

int main() {
  Array x = jnp::array({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  Array w = jnp::array({0.5f, -1.f, 2.f}, {3});
  Array mask = jnp::array({true, false, true}, {3});
  Array n = jnp::array({1, 2, 3}, {3});
  Array big = jnp::arange(2000);  // more than 1000 elements: printed summarised with "..."

  Array y = x + x;  // BREAK HERE: print x, then `next` and print y
  Array z = y * w;  // broadcasts w over the rows
  Array e = lax::exp(x * -1.f);
  Array t = lax::tanh(z);
  Array s = Array(0.5f);  // a weakly typed scalar

  std::cout << "x =\n" << x << "\n";
  std::cout << "y = x + x =\n" << y << "\n";
  std::cout << "z = y * w =\n" << z << "\n";
  std::cout << "exp(-x) =\n" << e << "\n";
  std::cout << "tanh(z) =\n" << t << "\n";
  std::cout << "big = " << big << "\n";
  std::cout << "mask = " << mask << ", n = " << n << ", s = " << s << "\n";
  std::cout << "repr(t) = " << repr(t) << "\n";
  std::cout << "repr(s) = " << repr(s) << "\n";
  return 0;  // everything above is computed: a second place to stop
}
