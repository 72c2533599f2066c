#!/usr/bin/env bash
# Builds the transfer message parser's fuzzer with clang (libFuzzer + AddressSanitizer + UBSan)
# and runs it for a bounded time. Usage: run_transfer_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin transfer "$@"
fuzz_build "$src/src/transfer/wire.cc" -lfmt -lxxhash
# Seeds: a rows message (2 rows of 2 layers × 4 bytes) and closing ones (with and without MTP
# drafts), as the sender makes them (checksum 0: the parser reports it wrong and goes on).
python3 - "$corpus" <<'PY'
import struct, sys
def message(kind, first, count, layers, row_bytes, token, payload, rid=b"cmpl-1"):
    head = struct.pack("<IIQQqqiiiIQ", 0x53594b56, kind, 7, 0, first, count, layers, row_bytes,
                       token, len(rid), len(payload))
    return head + rid + payload
open(sys.argv[1] + "/seed-rows", "wb").write(message(1, 0, 2, 2, 4, 0, bytes(range(16))))
open(sys.argv[1] + "/seed-done", "wb").write(message(2, 0, 2, 0, 0, 42, b""))
drafts = struct.pack("<IiI", 1, 5, 2) + struct.pack("<ii", 5, 7) + struct.pack("<dd", 0.75, 0.25)
open(sys.argv[1] + "/seed-done-drafts", "wb").write(message(2, 0, 2, 0, 0, 42, drafts))
PY
fuzz_run 4096
