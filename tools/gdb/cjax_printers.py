# gdb pretty-printer for cjax::Array.
#
# `print x` on a cjax::Array (or a reference / typedef of one) shows its type and values, e.g.
#     $1 = f32[2,3] [[1. 2. 3.] [4. 5. 6.]]
# The text comes from the library itself: the printer calls `cjax_debug_string(&x)` in the
# inferior (numpy's text, summarised with `...` past 1000 elements), so it needs a live process.
# Tracers print as `f32[2,3] <traced>`, default-constructed handles as `Array(empty)`.
#
# Loading: libcjax.so carries this file in its .debug_gdb_scripts section, so gdb loads it with
# the library once the build (or install) directory is trusted:
#     gdb -ex 'add-auto-load-safe-path /path/to/build' ./program
# or explicitly:  (gdb) source /path/to/cjax/tools/gdb/cjax_printers.py
# (installed copy: <prefix>/share/cjax/gdb/cjax_printers.py). Loading it twice is harmless: the
# printer is registered under the name "cjax" and replaces an earlier registration.
#
# Note: this file is embedded byte for byte in an assembler section; it must stay plain ASCII
# without NUL bytes.

import re

import gdb
import gdb.printing
import gdb.types

_ARRAY_TYPE = "cjax::Array"


def _impl_pointer(val):
    """The raw ArrayImpl* held by the Array's shared_ptr, as an int (0 for an empty handle)."""
    impl = val["impl_"]
    for field in ("_M_ptr", "__ptr_"):  # libstdc++, libc++
        try:
            return int(impl[field])
        except gdb.error:
            continue
    return None  # unknown standard library layout: let the library decide


def _looks_like_array_impl(ptr):
    """True if `ptr` points at an object whose vtable is one of cjax's ArrayImpl classes.

    Guards against calling into the inferior with an uninitialised Array (a breakpoint before
    the variable's constructor ran): its garbage pointer would crash the call. Returns None
    when it cannot tell (no symbols), in which case the caller still tries.
    """
    try:
        vptr = int(gdb.Value(ptr).cast(gdb.lookup_type("void").pointer().pointer()).dereference())
    except (gdb.MemoryError, gdb.error):
        return False
    try:
        sym = gdb.execute("info symbol 0x%x" % vptr, to_string=True)
    except gdb.error:
        return None
    if sym.startswith("No symbol"):
        return None
    return "vtable for cjax::" in sym


def _call_debug_string(address):
    """Evaluates cjax_debug_string(address) in the inferior; returns its text."""
    # If the call faults anyway, unwind back to where the user was instead of leaving the
    # inferior stopped inside the called function.
    old = gdb.parameter("unwindonsignal")
    gdb.execute("set unwindonsignal on", to_string=True)
    try:
        result = gdb.parse_and_eval(
            "(const char*)cjax_debug_string((const void*)0x%x)" % address)
        return result.string()
    finally:
        gdb.execute("set unwindonsignal %s" % ("on" if old else "off"), to_string=True)


class ArrayPrinter:
    """Prints a cjax::Array as '<type> <numpy text on one line>'."""

    def __init__(self, val):
        self.val = val

    def to_string(self):
        try:
            ptr = _impl_pointer(self.val)
        except gdb.error as e:
            return "cjax::Array (no debug info for its members: %s)" % e
        if ptr == 0:
            return "Array(empty)"
        if self.val.address is None:
            return "cjax::Array (not in memory: cannot call cjax_debug_string)"
        if ptr is not None and _looks_like_array_impl(ptr) is False:
            return "cjax::Array (uninitialized: impl=0x%x)" % ptr
        if not gdb.selected_inferior().pid:
            return "cjax::Array (no live process: cannot call cjax_debug_string)"
        try:
            text = _call_debug_string(int(self.val.address))
        except gdb.error as e:
            return "cjax::Array (cjax_debug_string failed: %s)" % e
        # numpy's multi-line layout on one line: "[[1. 2.]\n [3. 4.]]" -> "[[1. 2.] [3. 4.]]".
        return re.sub(r"\n+\s*", " ", text)


class CjaxPrettyPrinter(gdb.printing.PrettyPrinter):
    def __init__(self):
        super().__init__("cjax", [])

    def __call__(self, val):
        if not self.enabled:
            return None
        try:
            basic = gdb.types.get_basic_type(val.type)  # strips references, typedefs, cv
        except gdb.error:
            return None
        if basic.code == gdb.TYPE_CODE_STRUCT and basic.tag == _ARRAY_TYPE:
            return ArrayPrinter(val)
        return None


def register(objfile=None):
    """Registers the printer for `objfile` (None: globally), replacing an earlier copy."""
    gdb.printing.register_pretty_printer(objfile, CjaxPrettyPrinter(), replace=True)


register(gdb.current_objfile())
