#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/quants.gguf: tensors of every GGML type switchyard decodes, made of
random blocks with awkward scales, each beside `NAME.expected`, the float32 values gguf-py's own
numpy dequantizer (`gguf.quants.dequantize`, the independent reference) gives for it. It also
carries metadata of every GGUF value type, nested arrays included, to check the reader against
gguf-py's writer.

usage: make_quant_fixture.py OUT.gguf   (run by tools/gguf/make_fixtures.sh in a pinned venv)
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

# Offsets of the f16 scale fields inside one block of each quantized type (ggml-common.h).
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
# Zero, negative zero, the smallest and largest subnormals, one, the largest finite, negatives.
AWKWARD_HALVES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0xFBFF, 0x8001, 0x0400, 0xBC00]


def finite_half(rng):
    """A random f16 bit pattern: an awkward one a third of the time, else any finite value."""
    if rng.random() < 0.33:
        return int(rng.choice(AWKWARD_HALVES))
    bits = int(rng.integers(0, 1 << 16))
    return bits & ~0x4000 if (bits >> 10) & 0x1F == 0x1F else bits


def quantized_blocks(rng, qtype, n_blocks):
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    blocks[0, :] = 0xFF  # every code at its maximum (and a NaN-free scale, set below)
    if n_blocks > 2:
        blocks[1, :] = 0x00
    for b in range(n_blocks):
        for offset in HALF_FIELDS[qtype]:
            blocks[b, offset:offset + 2] = np.array([finite_half(rng)], dtype="<u2").view(np.uint8)
    return blocks


def float_values(rng, qtype, count):
    """Raw bit patterns of F32/F16/BF16, infinities and quiet NaNs included (signalling NaNs are
    left out: hardware f16 conversion quiets them, so their result is not one value)."""
    if qtype == T.F32:
        values = rng.standard_normal(count).astype(np.float32) * np.float32(1e3)
        values[:6] = [np.inf, -np.inf, np.nan, -0.0, 1e-45, 3.4e38]
        return values
    bits = rng.integers(0, 1 << 16, size=count, dtype=np.uint16)
    if qtype == T.F16:
        nan = ((bits >> 10) & 0x1F) == 0x1F
        bits[nan & ((bits & 0x3FF) != 0)] |= 0x200  # NaNs quiet
        bits[:5] = [0x7C00, 0xFC00, 0x0001, 0x8000, 0x7E01]
        return bits.view(np.float16)
    nan = ((bits >> 7) & 0xFF) == 0xFF
    bits[nan & ((bits & 0x7F) != 0)] |= 0x40
    bits[:4] = [0x7F80, 0xFF80, 0x0001, 0x7FC1]
    return bits  # BF16 as raw uint16


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(20261203)
    writer = gguf.GGUFWriter(out, arch="fixture")
    # Metadata of every value type.
    writer.add_uint8("test.u8", 200)
    writer.add_int8("test.i8", -100)
    writer.add_uint16("test.u16", 60000)
    writer.add_int16("test.i16", -30000)
    writer.add_uint32("test.u32", 4000000000)
    writer.add_int32("test.i32", -2000000000)
    writer.add_float32("test.f32", 0.1)
    writer.add_bool("test.bool", True)
    writer.add_string("test.string", "héllo")
    writer.add_uint64("test.u64", 2**63 + 5)
    writer.add_int64("test.i64", -(2**62))
    writer.add_float64("test.f64", 0.1)
    writer.add_array("test.strings", ["a", "", "ĠĊ"])
    writer.add_array("test.nested", [[1, 2, 3], [4], [5, 6]])

    shapes = {  # numpy shapes (rows..., row length); GGUF dims are these reversed
        "block32": [(4, 96), (2, 3, 64)],
        "block256": [(3, 512), (2, 2, 256)],
        "float": [(3, 40)],
    }
    for qtype in [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                  T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        block_size, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        kind = "float" if block_size == 1 else ("block32" if block_size == 32 else "block256")
        for index, shape in enumerate(shapes[kind]):
            name = f"{qtype.name.lower()}.{index}"
            count = int(np.prod(shape))
            if block_size == 1:
                data = float_values(rng, qtype, count)
                raw = data.reshape(shape)
                if qtype == T.BF16:
                    writer.add_tensor(name, raw, raw_shape=shape, raw_dtype=T.BF16)
                else:
                    writer.add_tensor(name, raw)
                expected = gguf.quants.dequantize(raw.view(np.uint8) if qtype == T.BF16 else raw,
                                                  qtype)
            else:
                blocks = quantized_blocks(rng, qtype, count // block_size)
                raw = blocks.reshape(*shape[:-1], shape[-1] // block_size * block_bytes)
                writer.add_tensor(name, raw, raw_dtype=qtype)
                expected = gguf.quants.dequantize(raw, qtype)
            expected = np.ascontiguousarray(expected, dtype=np.float32).reshape(shape)
            writer.add_tensor(name + ".expected", expected)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
