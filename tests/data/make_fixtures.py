#!/usr/bin/python3
"""Generates the I/O test fixtures with numpy (run from anywhere; writes next to this file).

The .npy files come from numpy.save / numpy.lib.format.write_array. There is no safetensors package in
the build environment, so the .safetensors fixture is written here by hand following the format spec
(8-byte little-endian header length, compact JSON header padded with spaces to 8 bytes, data section);
its data section is laid out in REVERSE name order, unlike cjax's writer, to exercise offset handling.
"""
import json, os, struct
import numpy as np

D = os.path.dirname(os.path.abspath(__file__))
def p(name): return os.path.join(D, name)

np.save(p("f4.npy"), np.array([[1.5, -2.25, 3.0e38], [np.inf, -0.0, 1e-45]], dtype="<f4"))
np.save(p("f8.npy"), np.array([0.1, -1e300, 2.5], dtype="<f8"))
np.save(p("f2.npy"), np.array([1.0, -0.5, 65504.0, 6.103515625e-05], dtype="<f2"))
np.save(p("b1.npy"), np.array([True, False, True], dtype="|b1"))
np.save(p("u1.npy"), np.array([0, 255, 7], dtype="|u1"))
np.save(p("u4.npy"), np.array([0, 4294967295, 123456789], dtype="<u4"))
np.save(p("i1.npy"), np.array([-128, 127, 0], dtype="|i1"))
np.save(p("i2.npy"), np.array([-32768, 32767, -1], dtype="<i2"))
np.save(p("i4.npy"), np.array([-2147483648, 2147483647, 42], dtype="<i4"))
np.save(p("i8.npy"), np.array([-9223372036854775808, 9223372036854775807, 5], dtype="<i8"))
np.save(p("scalar_f8.npy"), np.array(3.5, dtype="<f8"))
np.save(p("empty_f4.npy"), np.zeros((0, 3), dtype="<f4"))
np.save(p("fortran_f4.npy"), np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
np.save(p("fortran_i2.npy"), np.asfortranarray(np.arange(24, dtype="<i2").reshape(2, 3, 4)))
np.save(p("big_endian_i4.npy"), np.array([1, -2, 300], dtype=">i4"))
with open(p("v2_f4.npy"), "wb") as f:
    np.lib.format.write_array(f, np.arange(4, dtype="<f4").reshape(2, 2), version=(2, 0))
np.save(p("c8.npy"), np.array([1 + 2j], dtype="<c8"))  # unsupported dtype

tensors = {
    "layers.0.mlp.w": np.array([[1, 2], [3, 4]], dtype="<f4"),
    "layers.1.mlp.w": np.array([[5, 6], [7, 8]], dtype="<f4"),
    "embed": np.array([0.5, -1.0, 2.0], dtype="<f2"),
    "count": np.array(7, dtype="<i4"),
    "mask": np.array([True, False], dtype="|b1"),
    "big": np.array([-1, 1 << 40], dtype="<i8"),
}
bf16_bits = np.array([0x3F80, 0xC040], dtype="<u2")  # bfloat16 1.0, -3.0
header, data = {"__metadata__": {"format": "np", "step": "12"}}, b""
dt = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32", np.dtype("|b1"): "BOOL",
      np.dtype("<i8"): "I64"}
items = [(k, dt[v.dtype], list(v.shape), v.tobytes()) for k, v in tensors.items()]
items.append(("bf", "BF16", [2], bf16_bits.tobytes()))
for k, dts, shape, raw in sorted(items, key=lambda t: t[0], reverse=True):
    header[k] = {"dtype": dts, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(p("nested.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
print("header:", h.decode())
