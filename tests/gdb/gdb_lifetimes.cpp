// Arrays in the states a debugger meets that a program never prints: not yet constructed, already
// destroyed, and a call into the library that faults while gdb reports the faulting frame. The gdb
// printer test (run_gdb_test.sh) stops at "BREAK HERE" and prints each one.
#include <cstdint>
#include <cstring>
#include <new>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

// The printer test substitutes this for cjax_debug_string: it faults inside a frame whose
// argument is an Array, which gdb prints (with the cjax printer) when it reports the fault.
[[gnu::noinline]] void fault_while_holding(const Array& a) {
  volatile int* unmapped = reinterpret_cast<volatile int*>(uintptr_t(16));
  if (a.defined()) *unmapped = 1;  // SIGSEGV in this frame
}
extern "C" __attribute__((visibility("default"), used)) const char* cjax_test_faulting_debug_string(const void* array) {
  fault_while_holding(*static_cast<const Array*>(array));
  return "unreachable";
}

alignas(Array) unsigned char g_unconstructed[sizeof(Array)];
alignas(Array) unsigned char g_destroyed[sizeof(Array)];

int main() {
  std::memset(g_unconstructed, 0xA5, sizeof g_unconstructed);  // what an unconstructed local may hold
  Array live = jnp::array({1.f, 2.f, 3.f}, {3});
  Array* d = new (g_destroyed) Array(jnp::arange(5));
  d->~Array();  // the only reference: its impl and control block are freed (and not reused below)
  Array* unconstructed = reinterpret_cast<Array*>(g_unconstructed);
  Array* destroyed = reinterpret_cast<Array*>(g_destroyed);
  volatile bool keep = unconstructed != destroyed;  // BREAK HERE
  (void)keep;
  Array after = live * 2.f;
  return after.size() == 3 ? 0 : 1;
}
