#!/usr/bin/env python3
"""switchyard against llama.cpp on the same DeepSeek-V3-architecture checkpoint, side by side in
one run: prefill tokens/s (one 64-token prompt and 32 of them), and greedy decode tokens/s at 1
and 32 concurrent sequences. Each figure is the median of --repetitions runs, alternating the
two engines so machine noise hits both alike.

usage: compare.py --switchyard BIN --model DIR --gguf FILE --llama-python PYTHON
"""
import argparse
import json
import re
import statistics
import subprocess
import sys

PROMPT_LEN, GENERATE = 64, 32


def prompts(count, vocab):
    return ";".join(",".join(str((s * 131 + i * 17 + 3) % vocab) for i in range(PROMPT_LEN)) for s in range(count))


def run_switchyard(binary, model, sequences, vocab, threads, int8):
    flags = ["--int8-products"] if int8 else []
    out = subprocess.run([binary, "--threads", str(threads)] + flags + ["generate", "--model", model, "--prompt-tokens",
                          prompts(sequences, vocab), "--max-tokens", str(GENERATE + 1), "--ignore-eos"],
                         check=True, capture_output=True, text=True).stdout
    prefill = float(re.search(r"prefill ([0-9.]+) s", out).group(1))
    decode = float(re.search(r"decode ([0-9.]+) tok/s", out).group(1))
    return {"prefill_tok_s": sequences * PROMPT_LEN / prefill, "decode_tok_s": decode}


def run_llama(python, gguf, sequences, threads):
    here = __file__.rsplit("/", 1)[0]
    out = subprocess.run([python, f"{here}/run_llama.py", gguf, str(sequences), str(PROMPT_LEN), str(GENERATE),
                          str(threads)], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--switchyard", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--llama-python", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    rows = []
    for sequences in (1, 32):
        exact, int8, theirs = [], [], []
        for _ in range(args.repetitions):
            exact.append(run_switchyard(args.switchyard, args.model, sequences, vocab, args.threads, False))
            int8.append(run_switchyard(args.switchyard, args.model, sequences, vocab, args.threads, True))
            theirs.append(run_llama(args.llama_python, args.gguf, sequences, args.threads))
        for key, label in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
            a, b, c = (statistics.median(r[key] for r in runs) for runs in (exact, int8, theirs))
            rows.append((f"{label}, {sequences} sequence{'s' if sequences > 1 else ''}", a, b, c))
    # llama.cpp runs Q8_0 (8-bit weights and activations): --int8-products is the like-for-like
    # column, the exact fp8 products the one without loss.
    print("| measure | switchyard exact tok/s | switchyard --int8-products tok/s | llama.cpp Q8_0 tok/s "
          "| ratio exact | ratio int8 |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, a, b, c in rows:
        print(f"| {label} | {a:.1f} | {b:.1f} | {c:.1f} | {a / c:.2f} | {b / c:.2f} |")

if __name__ == "__main__":
    main()
