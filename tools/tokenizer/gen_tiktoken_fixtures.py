#!/usr/bin/env python3
"""Reference fixtures for switchyard's tiktoken tokenizers (src/tokenizer/tiktoken.h).

Writes, under tests/fixtures/tiktoken/:
  tiktoken.model          a tiktoken vocabulary: DeepSeek-V3's byte-level BPE tokens (the
                          committed tests/fixtures/tokenizer/deepseek-v3/tokenizer.json, its
                          added tokens left out) ranked in id order, one "base64 rank" line each
  tokenizer_config.json   Kimi K2's tokenizer class (tokenization_kimi.TikTokenTokenizer) and
                          special-token names, with some reserved ids left unnamed, and Kimi K2's
                          chat template
  corpus-extra.jsonl      inputs beyond tests/fixtures/tokenizer/corpus.jsonl that Kimi's
                          pattern and its run cuts treat specially: {"name", "text"}, and for
                          long ones "repeat" (the input is the text that many times)
  expected.jsonl          per line of corpus.jsonl then corpus-extra.jsonl: {"name", "ids"},
                          and "decoded" where decoding the ids does not give the input back

The reference is the tiktoken library itself (its Rust regex engine runs Kimi's pattern as
written, class intersections and all), driven as Kimi's tokenizer drives it under transformers:
special tokens split out first (leftmost, longest), then each stretch between them cut into
chunks of 400,000 characters and runs of at most 25,000 space or non-space characters, then
encoded. Deterministic; run it via tools/tokenizer/make_tiktoken_fixtures.sh.
"""

import base64
import json
import sys
from pathlib import Path

import tiktoken
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_tokenizer_fixtures import jdump, write_jsonl, write_text  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fixtures" / "tokenizer" / "deepseek-v3" / "tokenizer.json"
CORPUS = REPO / "tests" / "fixtures" / "tokenizer" / "corpus.jsonl"
TEMPLATE = REPO / "tests" / "fixtures" / "jinja" / "templates" / "kimi-k2-instruct.jinja"
OUT = REPO / "tests" / "fixtures" / "tiktoken"

# Kimi K2's pre-tokenizer pattern, in the Rust regex syntax tiktoken compiles.
KIMI_PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
SPECIAL_IDS = 256 + 2
MAX_CHUNK = 400_000
MAX_RUN = 25_000

# Named special tokens by offset after the last rank; the other offsets stay unnamed
# ("<|reserved_token_ID|>").
NAMED = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
         6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
         11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
         13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
         17: "<|im_middle|>", 18: "<|media_start|>", 19: "<|media_content|>",
         20: "<|media_end|>", 21: "<|media_pad|>", 22: "<think>", 23: "</think>",
         254: "[UNK]", 255: "[PAD]"}


def byte_level_decoder():
    """GPT-2's byte-level alphabet, character → byte (transformers' own table)."""
    return {c: b for b, c in bytes_to_unicode().items()}


def ranks_from_deepseek():
    spec = json.loads(SOURCE.read_text(encoding="utf-8"))
    added = {a["id"] for a in spec["added_tokens"]}
    decode = byte_level_decoder()
    by_id = sorted((i, t) for t, i in spec["model"]["vocab"].items() if i not in added)
    return [bytes(decode[c] for c in token) for _, token in by_id]


def is_python_space_runs(text):
    """Kimi's cuts: 400,000-character chunks, then runs of at most 25,000."""
    for at in range(0, len(text), MAX_CHUNK):
        s = text[at:at + MAX_CHUNK]
        run, is_space, start = 0, s[0].isspace() if s else False, 0
        for i, c in enumerate(s):
            now = c.isspace()
            if is_space ^ now:
                run, is_space = 1, now
            else:
                run += 1
                if run > MAX_RUN:
                    yield s[start:i]
                    start, run = i, 1
        yield s[start:]


def encode(enc, specials, text):
    """Specials first (leftmost, longest), then the cuts, then tiktoken."""
    ids, at = [], 0
    ordered = sorted(specials, key=len, reverse=True)
    while at <= len(text):
        best = None
        for name in ordered:
            found = text.find(name, at)
            if found >= 0 and (best is None or found < best[0]):
                best = (found, name)
        end = best[0] if best else len(text)
        for piece in is_python_space_runs(text[at:end]):
            ids.extend(enc.encode_ordinary(piece))
        if not best:
            break
        ids.append(specials[best[1]])
        at = best[0] + len(best[1])
    return ids


def extra_cases():
    cases = [
        ("han_then_latin", "中文English混合テキスト"),
        ("han_script_extensions", "一、二。三「四」〇々〻"),
        ("contractions_caps", "DON'T you've SHE'LL I'M they'D"),
        ("contraction_long_s", "it'ſ fine"),
        ("camel_case_runs", "parseHTTPResponseCode XMLHttpRequest iOS"),
        ("marks_after_han", "漢\u0301字\u0308 e\u0301"),
        ("title_case", "ǅemal ǈubljana ǋ"),
        ("specials_in_text", "[BOS]hi<|im_end|><|im_user|>x<|reserved_token_131000|>y"),
        ("reserved_unnamed", f"a<|reserved_token_{127997 + 5}|>b"),
        ("special_lookalikes", "<|im_end| [BOS <|reserved_token_|>"),
        ("info_separators", "x\x1c\x1d\x1e\x1fy" * 3),
    ]
    out = [{"name": n, "text": t} for n, t in cases]
    # Long inputs as a unit and a count (the text is the unit repeated), to keep the file small.
    repeated = [
        ("run_of_dashes_30k", "-", 30_000),
        ("run_of_spaces_60k", " ", 60_000),
        ("run_boundary_exact", "=", 25_000),
        ("run_boundary_plus_one", "=", 25_001),
        ("spaces_then_words", " " * 100 + "word", 300),
        ("chunk_over_400k", " " * 999 + "y", 400),
    ]
    out += [{"name": n, "text": t, "repeat": k} for n, t, k in repeated]
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ranks = ranks_from_deepseek()
    lines = "".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks))
    write_text(OUT / "tiktoken.model", lines)
    n = len(ranks)
    specials = {NAMED.get(k, f"<|reserved_token_{n + k}|>"): n + k for k in range(SPECIAL_IDS)}

    decoder = {str(n + k): {"content": name, "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False, "special": True}
               for k, name in sorted(NAMED.items())}
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>",
                                      "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                      "<|im_system|>", "<|im_middle|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "model_max_length": 131072,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    write_text(OUT / "tokenizer_config.json", jdump(config, indent=2) + "\n")

    enc = tiktoken.Encoding(name="fixture", pat_str=KIMI_PATTERN,
                            mergeable_ranks={t: r for r, t in enumerate(ranks)},
                            special_tokens=specials)
    extra = extra_cases()
    write_jsonl(OUT / "corpus-extra.jsonl", extra)
    corpus = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    rows = []
    for case in corpus + extra:
        text = case["text"] * case.get("repeat", 1)
        ids = encode(enc, specials, text)
        row = {"name": case["name"], "ids": ids}
        decoded = enc.decode(ids, errors="replace")
        if decoded != text:
            row["decoded"] = decoded
        rows.append(row)
    write_jsonl(OUT / "expected.jsonl", rows)
    print(f"{len(rows)} cases, {n} ranks, tiktoken {tiktoken.__version__}")


if __name__ == "__main__":
    main()
