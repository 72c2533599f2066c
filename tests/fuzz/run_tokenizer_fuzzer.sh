#!/usr/bin/env bash
# Builds the tokenizer / chat-template fuzzer with clang (libFuzzer + AddressSanitizer + UBSan)
# and runs it for a bounded time. Usage: run_tokenizer_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin tokenizer "$@"
fuzz_build \
  -DSY_FUZZ_TOKENIZER="\"$src/configs/tokenizer/default/tokenizer.json\"" \
  -DSY_FUZZ_TEMPLATES="\"$src/tests/fixtures/tokenizer/templates\"" \
  \
  "$src/src/tokenizer/bpe.cc" "$src/src/tokenizer/chat_template.cc" "$src/src/tokenizer/deepseek_v32_encoding.cc" "$src"/src/jinja/*.cc \
  "$src/src/tokenizer/pre_tokenizer.cc" "$src/src/tokenizer/tokenizer.cc" \
  "$src/src/tokenizer/unicode.cc" "$src/src/tokenizer/gguf_tokenizer.cc" \
  "$src/src/tokenizer/tiktoken.cc" \
  "$src/src/model/gguf.cc" "$src/src/tensor/ggml_quants.cc" "$src/src/tensor/dtype.cc" \
  "$src/src/base/mapped_file.cc" "$src/src/base/utf8.cc" \
  $(pkg-config --cflags --libs libpcre2-8) -lxxhash -lfmt -lcrypto
# Seeds: a small tokenizer.json (mode 0), corpus texts (1), ids (2), conversations (3), a
# tiktoken.model (4).
python3 - "$src" "$corpus" <<'PY'
import json, pathlib, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
tok = json.loads((src / "configs/tokenizer/default/tokenizer.json").read_text(encoding="utf-8"))
tok["model"]["merges"] = tok["model"]["merges"][:40]
keep = set()
for m in tok["model"]["merges"]:
    a, b = m.split(" ") if isinstance(m, str) else m
    keep |= {a, b, a + b}
tok["model"]["vocab"] = {k: v for k, v in tok["model"]["vocab"].items() if v < 300 or k in keep}
(out / "seed-tokenizer").write_bytes(b"\x00" + json.dumps(tok, ensure_ascii=False).encode())
for i, line in enumerate((src / "tests/fixtures/tokenizer/corpus.jsonl").read_text(encoding="utf-8").splitlines()[:120]):
    (out / f"seed-text-{i}").write_bytes(b"\x01" + json.loads(line)["text"].encode()[:2000])
(out / "seed-ids").write_bytes(b"\x02" + b"".join(i.to_bytes(4, "little") for i in (0, 5, 300, 4095)))
for i, case in enumerate(json.loads((src / "tests/fixtures/tokenizer/chat/conversations.json").read_text(encoding="utf-8"))):
    (out / f"seed-chat-{i}").write_bytes(bytes([3 | 8]) + json.dumps(case["messages"]).encode())
import base64
ranks = [bytes([b]) for b in range(256)] + [b"it", b"'s", b"  ", b"\n\n", b"12", b"123"]
(out / "seed-tiktoken").write_bytes(b"\x04" + b"".join(
    base64.b64encode(t) + b" %d\n" % r for r, t in enumerate(ranks)))
PY
fuzz_run 16384
