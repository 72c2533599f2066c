#!/usr/bin/env bash
# Builds the moving-expert wire form fuzzer (tests/fuzz/expert_wire_fuzzer.cc) with clang
# (libFuzzer + AddressSanitizer + UBSan) and runs it for a bounded time.
# Usage: run_expert_wire_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin expert_wire "$@"
fuzz_build "$src/src/model/expert_wire.cc" \
  "$src/src/tensor/packed_matrix.cc" "$src/src/tensor/ggml_quants.cc" "$src/src/tensor/dtype.cc" \
  "$src/src/base/thread_pool.cc" \
  -lfmt -pthread
# Seeds: a 3×5 expert (width 3, hidden 5) as f32 rows, as f32 panels, and as fp8 rows with block
# scales; a 32×32 one as Q8_0 blocks (a GGUF's) in rows and in GGML panels, and as bf16 panels laid
# out as AMX tiles (pairs); in the layout expert_wire.cc writes.
python3 - "$corpus" <<'PY'
import struct, sys
W, H = 3, 5
def rows_f32(r, c):
    return (struct.pack("<B5q", 0, r, c, 0, 0, 0) + b"\0" + struct.pack("<Q", r * c * 4)
            + bytes(range(r * c * 4 % 256)) * 0 + b"\x01" * (r * c * 4) + struct.pack("<qQ", 0, 0))
def panels_f32(r, c):
    panels = (r + 15) // 16
    n = panels * c * 16 * 4
    return (struct.pack("<B5q", 0, r, c, 0, 0, 0) + b"\x01" + struct.pack("<BB7q", 0, 0, r, c, panels, 0, 0, 0, 0)
            + struct.pack("<Q", n) + b"\x02" * n + struct.pack("<QQQ", 0, 0, 0))
def pairs_bf16(r, c):
    panels = (r + 15) // 16
    n = panels * c * 16 * 2
    return (struct.pack("<B5q", 2, r, c, 0, 0, 0) + b"\x01" + struct.pack("<BB7q", 2, 1, r, c, panels, 0, 0, 0, 0)
            + struct.pack("<Q", n) + bytes(i % 251 for i in range(n)) + struct.pack("<QQQ", 0, 0, 0))
def rows_fp8(r, c):
    scales = ((r + 1) // 2) * 1
    return (struct.pack("<B5q", 3, r, c, 2, 8, 1) + b"\0" + struct.pack("<Q", r * c) + b"\x30" * (r * c)
            + struct.pack("<qQ", 0, scales) + struct.pack("<f", 0.5) * scales)
def ggml_head(r, c):
    return struct.pack("<B5qI", 12, r, c, 0, 0, 0, 8)  # kGgml, then Q8_0's type id
def rows_q8_0(r, c):
    n = r * (c // 32) * 34
    return ggml_head(r, c) + b"\0" + struct.pack("<Q", n) + b"\x03" * n + struct.pack("<qQ", 0, 0)
def panels_q8_0(r, c):
    panels = (r + 15) // 16
    n, d = panels * c * 16, panels * (c // 32) * 16
    return (ggml_head(r, c) + b"\x01" + struct.pack("<BB7q", 12, 0, r, c, panels, 0, 0, 0, 0)
            + struct.pack("<Q", n) + b"\x04" * n + struct.pack("<QQQ", 0, 0, 0)
            + struct.pack("<QQQ", 0, 0, d) + b"\x00\x3c" * d + struct.pack("<Q", 0))
magic = struct.pack("<I", 0x58455953)
for name, m, w, h in (("rows", rows_f32, W, H), ("panels", panels_f32, W, H),
                      ("fp8", rows_fp8, W, H), ("q8_0-rows", rows_q8_0, 32, 32),
                      ("q8_0-panels", panels_q8_0, 32, 32), ("bf16-pairs", pairs_bf16, 32, 32)):
    open(f"{sys.argv[1]}/seed-{name}", "wb").write(bytes([w - 1, h - 1]) + magic + m(w, h) + m(w, h) + m(h, w))
PY
fuzz_run 16384
