#!/usr/bin/env bash
# Builds the Jinja interpreter's fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and
# runs it for a bounded time. Usage: run_jinja_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin jinja "$@"
fuzz_build \
  -DSY_FUZZ_TEMPLATES="\"$src/tests/fixtures/jinja/templates\"" \
  "$src"/src/jinja/*.cc "$src/src/base/utf8.cc" -lfmt
# Seeds: every committed template and language snippet (mode 0), the conversations (mode 1).
python3 - "$src" "$corpus" <<'PY'
import json, pathlib, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for path in sorted((src / "tests/fixtures/jinja/templates").glob("*.jinja")):
    (out / f"seed-template-{path.stem}").write_bytes(b"\x00" + path.read_bytes())
expected = json.loads((src / "tests/fixtures/jinja/expected.json").read_text(encoding="utf-8"))
for snippet in expected["snippets"]:
    (out / f"seed-snippet-{snippet['name']}").write_bytes(b"\x00" + snippet["template"].encode())
chats = json.loads((src / "tests/fixtures/tokenizer/chat/conversations.json").read_text(encoding="utf-8"))
chats += json.loads((src / "tests/fixtures/jinja/conversations.json").read_text(encoding="utf-8"))
for i, case in enumerate(chats):
    (out / f"seed-chat-{i}").write_bytes(b"\x01" + json.dumps(case["messages"]).encode())
PY
fuzz_run 32768
