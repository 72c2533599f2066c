#!/usr/bin/env bash
# Builds the grammar-engine fuzzer (JSON Schema, regex, GBNF and choice parsers, the automaton
# builder and the recognizer) with clang (libFuzzer + AddressSanitizer + UBSan) and runs it for a
# bounded time. Usage: run_structured_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin structured "$@"
fuzz_build "$src"/src/structured/*.cc "$src/src/base/utf8.cc" \
  -lfmt
# Seeds: schemas from the JSON Schema Test Suite when installed, regexes, GBNF grammars, choices.
python3 - "$corpus" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
suite = pathlib.Path("/usr/share/json-schema-test-suite/tests/draft7")
n = 0
if suite.is_dir():
    for f in sorted(suite.glob("*.json")):
        for group in json.loads(f.read_text(encoding="utf-8")):
            (out / f"seed-schema-{n}").write_bytes(b"\x00" + json.dumps(group["schema"]).encode())
            n += 1
(out / "seed-schema-person").write_bytes(b"\x00" + json.dumps({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 5}, "age": {"type": "integer", "minimum": -3.5},
    "when": {"type": "string", "format": "date-time"}}, "required": ["name"]}).encode())
for i, r in enumerate([r"^[a-z]+\d{2,3}(x|yz)?$", r"\(\d{3}\) \d{3}-\d{4}", r"[^\s\w]*.\u00e9{1,}?",
                       r"(a|b)*a(a|b){3}", r"(?:ab|c)+?[\]\-]"]):
    (out / f"seed-regex-{i}").write_bytes(b"\x01" + r.encode())
for i, g in enumerate(['root ::= expr\nexpr ::= term (("+"|"-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
                       'root ::= ( "a" |\n  [\\x62-\\x63]{2,3} ) "\\n" item?\nitem ::= [^\\n]{0,2} "\\u00e9"\n']):
    (out / f"seed-gbnf-{i}").write_bytes(b"\x02" + g.encode())
(out / "seed-choice").write_bytes(b"\x03yes\nno\nmaybe")
(out / "seed-structural").write_bytes(b"\x04" + json.dumps({"type": "sequence", "elements": [
    {"type": "token", "token": "<｜tool▁calls▁begin｜>"},
    {"type": "repeat", "min": 1, "max": -1, "separator": {"type": "text", "text": "\n"},
     "element": {"type": "alternatives", "elements": [
         {"type": "sequence", "elements": [{"type": "text", "text": "f"},
                                           {"type": "json_schema", "schema": {"type": "object"}}]}]}},
    {"type": "token", "token": "<｜tool▁calls▁end｜>"}]}).encode())
PY
fuzz_run 8192
