# gdb pretty-printer for cjax::Array.
#
# `print x` on a cjax::Array (or a reference / typedef of one) shows its type and values on one
# line, e.g.
#     $1 = f32[2,3] [[1. 2. 3.] [4. 5. 6.]]
# Tracers print as `f32[2,3] <traced>`, default-constructed handles as `Array(empty)`.
#
# Where the text comes from:
#  1. the library itself: the printer calls `cjax_debug_string(&x)` in the inferior (numpy's text,
#     summarised with `...` past 1000 elements; works for every array the library can read). It
#     does so only for an Array it has validated from memory first (its impl has the vtable of a
#     cjax ArrayImpl class, its shared_ptr control block is live with a plausible count, its
#     dtype and shape are plausible): an Array whose constructor has not run yet, or that was
#     destroyed, prints as `cjax::Array <uninitialized or destroyed: ...>` and no code runs;
#  2. when calling into the inferior is not possible (a core file, a process that is not running,
#     or gdb failing to set up the call: gdb 13 cannot on CPUs with AMX and reports "Couldn't
#     write extended state status"), the printer reads the array's metadata and host buffer from
#     memory and formats it with numpy in gdb's Python (same text), or, without numpy, with a
#     plain formatter (same brackets, values with 8 significant digits).
# `set cjax-inferior-calls off` makes it use 2 always (no code runs in the inferior then).
#
# The printer never re-enters itself: while it is calling into the inferior (or reading it), an
# Array that gdb asks it to print (for example an argument of the frame where the call faulted,
# which gdb shows when it reports the fault) prints as a placeholder. If a call faults, gdb
# restores the program (`unwindonsignal`) and the printer stops calling into that process.
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
import struct

import gdb
import gdb.printing
import gdb.types

_ARRAY_TYPE = "cjax::Array"
_MAX_READ_BYTES = 256 << 20  # the memory reader does not copy more than this from the inferior

# cjax::DType enumerator -> (jaxpr short name, item size, struct format; None: bfloat16)
_DTYPES = {
    "bool_": ("bool", 1, "?"),
    "int8": ("i8", 1, "b"),
    "int16": ("i16", 2, "h"),
    "int32": ("i32", 4, "i"),
    "int64": ("i64", 8, "q"),
    "uint8": ("u8", 1, "B"),
    "uint32": ("u32", 4, "I"),
    "bfloat16": ("bf16", 2, None),
    "float16": ("f16", 2, "e"),
    "float32": ("f32", 4, "f"),
    "float64": ("f64", 8, "d"),
}
_NUMPY_DTYPES = {"bool_": "?", "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
                 "uint8": "<u1", "uint32": "<u4", "float16": "<f2", "float32": "<f4",
                 "float64": "<f8"}


class _InferiorCalls(gdb.Parameter):
    """Whether the cjax printer may call cjax_debug_string in the inferior."""

    set_doc = "Set whether the cjax pretty-printer may call into the inferior."
    show_doc = "Show whether the cjax pretty-printer may call into the inferior."

    def __init__(self):
        super().__init__("cjax-inferior-calls", gdb.COMMAND_DATA, gdb.PARAM_BOOLEAN)
        self.value = True

    def get_show_string(self, svalue):
        return "cjax pretty-printer inferior calls: %s" % svalue


try:
    _inferior_calls = gdb.parameter("cjax-inferior-calls")  # already defined: keep the setting
except (gdb.error, RuntimeError):
    _InferiorCalls()

# pids of processes in which a call failed: the printer stops trying there.
_calls_failed = {}
# True while the printer is running: gdb may ask it to print an Array during a call it made (a
# faulting frame's arguments); it must not start another call then.
_busy = False
# The function the printer calls (tests substitute one that faults) and how often it did.
_DEBUG_STRING_FN = "cjax_debug_string"
_calls_made = 0


# ---------------------------------------------------------------------------------------------
# Reading the Array from memory.

def _field(val, *names):
    """The first of `names` that `val` has (libstdc++ / libc++ member names)."""
    for name in names:
        try:
            return val[name]
        except gdb.error:
            continue
    raise gdb.error("no field %s in %s" % ("/".join(names), val.type))


def _shared_ptr_get(sp):
    return _field(sp, "_M_ptr", "__ptr_")


def _vector_items(vec, limit):
    impl = vec["_M_impl"] if _has_field(vec, "_M_impl") else vec
    start = _field(impl, "_M_start", "__begin_")
    finish = _field(impl, "_M_finish", "__end_")
    n = int(finish - start)
    if n < 0 or n > limit:
        raise gdb.error("implausible vector length %d" % n)
    return [(start + i).dereference() for i in range(n)]


def _has_field(val, name):
    try:
        val[name]
        return True
    except gdb.error:
        return False


def _std_string(s):
    try:
        return s["_M_dataplus"]["_M_p"].string()
    except gdb.error:
        return str(s).strip('"')


def _impl_pointer(val):
    """The raw ArrayImpl* held by the Array's shared_ptr (a gdb.Value)."""
    return _shared_ptr_get(val["impl_"])


def _symbols_known():
    """True if gdb resolves cjax's vtable symbols (the library is not stripped): then a vtable
    pointer without a symbol is certainly not a live object's."""
    try:
        return int(gdb.parse_and_eval("(long)&'vtable for cjax::ConcreteArray'")) != 0
    except gdb.error:
        return False


def _vtable_symbol(address):
    """The symbol text of the vtable pointer stored at `address`: False if unreadable (or, where
    symbols are known, if it has none: freed memory, garbage), None if gdb cannot tell."""
    try:
        void_pp = gdb.lookup_type("void").pointer().pointer()
        vptr = int(gdb.Value(address).cast(void_pp).dereference())
    except (gdb.MemoryError, gdb.error):
        return False
    try:
        sym = gdb.execute("info symbol 0x%x" % vptr, to_string=True)
    except gdb.error:
        sym = "No symbol"
    if sym.startswith("No symbol"):
        return False if _symbols_known() else None
    return sym


def _looks_like_array_impl(ptr):
    """True if `ptr` points at an object whose vtable is one of cjax's ArrayImpl classes.

    Guards against reading through an uninitialised Array (a breakpoint before the variable's
    constructor ran). None when it cannot tell (no symbols).
    """
    if int(ptr) % 8:
        return False
    sym = _vtable_symbol(int(ptr))
    if sym is False or sym is None:
        return sym
    return "vtable for cjax::" in sym


def _control_block_state(val):
    """The state of the Array's shared_ptr control block: "alive" (a libstdc++ control block with
    a plausible use count), "dead" (unreadable, not a control block, or a zero count: a destroyed
    Array's block was freed and overwritten), "no-symbol" (its vtable pointer has no symbol) or
    "unknown" (another standard library's layout)."""
    try:
        pi = val["impl_"]["_M_refcount"]["_M_pi"]
    except gdb.error:
        return "unknown"
    address = int(pi)
    if address == 0 or address % 8:
        return "dead"
    sym = _vtable_symbol(address)
    if sym is False:
        return "dead"
    if sym is None:
        return "no-symbol"
    if "_Sp_counted" not in sym:
        return "dead"
    try:
        use = int(pi.dereference()["_M_use_count"])
    except (gdb.error, gdb.MemoryError):
        return "dead"
    return "alive" if 1 <= use < (1 << 30) else "dead"


def _looks_dead(val, ptr):
    """True if the Array is certainly not a constructed, live one."""
    impl = _looks_like_array_impl(ptr)
    if impl is False:
        return True
    block = _control_block_state(val)
    # With symbols, a live control block's vtable always has one.
    return block == "dead" or (impl is True and block == "no-symbol")


def _validate(val, ptr):
    """None if the Array may be handed to cjax_debug_string, else why not (a short text).

    Everything is read from memory; nothing runs in the inferior."""
    if _looks_like_array_impl(ptr) is not True:
        return "its impl pointer 0x%x is not a cjax array" % int(ptr)
    if _control_block_state(val) != "alive":
        return "its reference count is not live"
    try:
        _aval(ptr.dereference())
    except (gdb.error, gdb.MemoryError, ValueError) as e:
        return "its type is unreadable (%s)" % e
    return None


def _aval(impl):
    """(dtype enumerator name, shape list, type string like 'f32[2,3]') of an ArrayImpl."""
    aval = impl["aval"]
    dtype = str(aval["dtype"]).split("::")[-1]
    if dtype not in _DTYPES:
        raise gdb.error("unknown dtype %s" % dtype)
    shape = [int(d) for d in _vector_items(aval["shape"], 64)]
    if any(d < 0 for d in shape):
        raise gdb.error("implausible shape %s" % shape)
    text = "%s[%s]" % (_DTYPES[dtype][0], ",".join(str(d) for d in shape))
    try:
        vma = [_std_string(s) for s in _vector_items(aval["vma"], 64)]
    except gdb.error:
        vma = []
    if vma:
        text += "{V:%s}" % ",".join(vma)
    return dtype, shape, text


def _read_text(impl):
    """The debug string built from memory alone."""
    dtype, shape, type_text = _aval(impl)
    dynamic = impl.dynamic_type
    if str(dynamic) != "cjax::ConcreteArray":
        return type_text + " <traced>"
    concrete = impl.cast(dynamic)
    buffers = _vector_items(concrete["buffers"], 1 << 16)
    if len(buffers) != 1:
        return "%s <sharded over %d buffers: not read from memory>" % (type_text, len(buffers))
    buf = _shared_ptr_get(buffers[0]).dereference()
    if str(buf["device_"]["platform_"]).split("::")[-1] != "cpu":
        return type_text + " <device memory: not readable from gdb>"
    size = 1
    for d in shape:
        size *= d
    nbytes = size * _DTYPES[dtype][1]
    if nbytes > _MAX_READ_BYTES:
        return "%s <%d bytes: too large to read from memory>" % (type_text, nbytes)
    raw = bytes(gdb.selected_inferior().read_memory(int(buf["data_"]), nbytes)) if nbytes else b""
    return type_text + " " + _format(raw, dtype, shape)


# ---------------------------------------------------------------------------------------------
# Formatting what was read: numpy's str() when numpy is importable.

def _bf16_values(raw):
    n = len(raw) // 2
    bits = struct.unpack("<%dH" % n, raw)
    return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]


def _g(x):
    """repr() of an ml_dtypes bfloat16 scalar: C++ `ostream << float` ("%g")."""
    return "nan" if x != x else "%g" % x


class _Repr:
    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _format(raw, dtype, shape):
    try:
        import numpy as np
    except ImportError:
        return _format_plain(raw, dtype, shape)
    options = dict(precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False,
                   nanstr="nan", infstr="inf", sign="-", floatmode="maxprec", legacy=False)
    with np.printoptions(**options):
        if dtype == "bfloat16":
            values = [_Repr(_g(v)) for v in _bf16_values(raw)]
            if not shape:
                return values[0].text
            a = np.empty(len(values), dtype=object)
            a[:] = values
            return str(a.reshape(shape))
        a = np.frombuffer(raw, dtype=_NUMPY_DTYPES[dtype]).reshape(shape)
        return str(a)


def _format_plain(raw, dtype, shape):
    """numpy's nesting and summarisation without numpy: values unpadded, 8 significant digits."""
    if dtype == "bfloat16":
        values = [_g(v) for v in _bf16_values(raw)]
    else:
        fmt = _DTYPES[dtype][2]
        values = list(struct.unpack("<%d%s" % (len(raw) // _DTYPES[dtype][1], fmt), raw))
        if fmt == "?":
            values = ["True" if v else "False" for v in values]
        elif fmt in "efd":
            values = [_float_text(v) for v in values]
        else:
            values = [str(v) for v in values]
    if not shape:
        return values[0]
    size = len(values)
    if size == 0:
        return "[]"
    summarise = size > 1000

    def rec(offset, axis):
        n = shape[axis]
        stride = 1
        for d in shape[axis + 1:]:
            stride *= d
        idx = list(range(n))
        if summarise and n > 6:
            idx = [0, 1, 2, None, n - 3, n - 2, n - 1]
        parts = ["..." if i is None else
                 (values[offset + i] if axis + 1 == len(shape) else rec(offset + i * stride, axis + 1))
                 for i in idx]
        return "[" + (" " if axis + 1 == len(shape) else "\n").join(parts) + "]"

    return rec(0, 0)


def _float_text(v):
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    text = "%.8g" % v
    if "e" not in text and "." not in text:
        text += "."
    return text


# ---------------------------------------------------------------------------------------------
# The printer.

def _call_debug_string(address):
    """Evaluates cjax_debug_string(address) in the inferior; returns its text."""
    global _calls_made
    # If the call faults, unwind back to where the user was instead of leaving the inferior
    # stopped inside the called function.
    old = gdb.parameter("unwindonsignal")
    gdb.execute("set unwindonsignal on", to_string=True)
    try:
        _calls_made += 1
        result = gdb.parse_and_eval(
            "(const char*)%s((const void*)0x%x)" % (_DEBUG_STRING_FN, address))
        return result.string()
    finally:
        gdb.execute("set unwindonsignal %s" % ("on" if old else "off"), to_string=True)


class ArrayPrinter:
    """Prints a cjax::Array as '<type> <numpy text on one line>'."""

    def __init__(self, val):
        self.val = val

    def to_string(self):
        global _busy
        if _busy:
            return "cjax::Array <not printed: the cjax printer is busy with another value>"
        _busy = True
        try:
            return self._text()
        finally:
            _busy = False

    def _text(self):
        try:
            ptr = _impl_pointer(self.val)
        except gdb.error as e:
            return "cjax::Array (no debug info for its members: %s)" % e
        if int(ptr) == 0:
            return "Array(empty)"
        if _looks_dead(self.val, ptr):
            return "cjax::Array <uninitialized or destroyed: impl=0x%x>" % int(ptr)
        text = None
        pid = gdb.selected_inferior().pid
        if (pid and pid not in _calls_failed and self.val.address is not None
                and gdb.parameter("cjax-inferior-calls") and _validate(self.val, ptr) is None):
            try:
                text = _call_debug_string(int(self.val.address))
            except gdb.error as e:
                # e.g. gdb 13 on AMX CPUs, or a fault in the call: don't try again in this process
                _calls_failed[pid] = str(e)
        if text is None:
            try:
                text = _read_text(ptr.dereference())
            except (gdb.error, gdb.MemoryError, ValueError) as e:
                return "cjax::Array (cannot read it: %s)" % e
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
