#!/usr/bin/env python3
"""switchyard against llama.cpp on the same DeepSeek-V3-architecture checkpoint, side by side in
one run: prefill tokens/s (one 64-token prompt and 32 of them), and greedy decode tokens/s at 1
and 32 concurrent sequences. Each figure is the median of --repetitions runs, alternating the
two engines so machine noise hits both alike.

usage: compare.py --switchyard BIN --model DIR --gguf FILE --llama-python PYTHON
                  [--switchyard-model FILE.gguf]
With --switchyard-model, switchyard runs that file (the same GGUF llama.cpp runs: its GGML
blocks multiplied natively) instead of DIR's checkpoint, and each engine's peak resident memory
is reported against the file's size.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

PROMPT_LEN, GENERATE = 64, 32


def prompts(count, vocab):
    return ";".join(",".join(str((s * 131 + i * 17 + 3) % vocab) for i in range(PROMPT_LEN)) for s in range(count))


def run_measured(command, env=None):
    """(stdout, peak resident bytes) of a command that must succeed."""
    with tempfile.TemporaryFile(mode="w+") as out, tempfile.TemporaryFile(mode="w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            raise SystemExit(f"{command[0]} failed ({process.returncode}): {err.read()[-2000:]}")
        return out.read(), usage.ru_maxrss * 1024


def run_switchyard(binary, model, sequences, vocab, threads, int8):
    flags = ["--int8-products"] if int8 else []
    out, rss = run_measured([binary, "--threads", str(threads)] + flags + [
        "generate", "--model", model, "--prompt-tokens", prompts(sequences, vocab), "--max-tokens",
        str(GENERATE + 1), "--ignore-eos"])
    prefill = float(re.search(r"prefill ([0-9.]+) s", out).group(1))
    decode = float(re.search(r"decode ([0-9.]+) tok/s", out).group(1))
    return {"prefill_tok_s": sequences * PROMPT_LEN / prefill, "decode_tok_s": decode, "rss": rss}


def run_llama(python, gguf, sequences, threads):
    here = __file__.rsplit("/", 1)[0]
    # LLAMA_OMP_WAIT_POLICY: OMP_WAIT_POLICY for llama.cpp alone (its OpenMP threads spin while
    # they wait; on an oversubscribed machine PASSIVE keeps a descheduled partner from stalling it).
    env = dict(os.environ)
    if os.environ.get("LLAMA_OMP_WAIT_POLICY"):
        env["OMP_WAIT_POLICY"] = os.environ["LLAMA_OMP_WAIT_POLICY"]
    out, rss = run_measured([python, f"{here}/run_llama.py", gguf, str(sequences), str(PROMPT_LEN),
                             str(GENERATE), str(threads)], env)
    return dict(json.loads(out.strip().splitlines()[-1]), rss=rss)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--switchyard", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--llama-python", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--switchyard-model", help="a GGUF for switchyard too (the same file)")
    args = parser.parse_args()
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    if args.switchyard_model:
        return same_file(args, vocab)
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


def same_file(args, vocab):
    """Both engines on one GGUF: every run printed as it ends, then the medians and ratios."""
    size = os.path.getsize(args.gguf)
    rows, rss = [], {"switchyard": [], "llama.cpp": []}
    for sequences in (1, 32):
        ours, theirs = [], []
        for rep in range(args.repetitions):
            ours.append(run_switchyard(args.switchyard, args.switchyard_model, sequences, vocab, args.threads,
                                       False))
            theirs.append(run_llama(args.llama_python, args.gguf, sequences, args.threads))
            for name, run in (("switchyard", ours[-1]), ("llama.cpp", theirs[-1])):
                rss[name].append(run["rss"])
                print(f"run {rep + 1}, {sequences} sequences, {name}: decode {run['decode_tok_s']:.1f} tok/s, "
                      f"prefill {run['prefill_tok_s']:.1f} tok/s, peak resident {run['rss'] / 1e6:.0f} MB",
                      flush=True)
        for key, label in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
            a, c = (statistics.median(r[key] for r in runs) for runs in (ours, theirs))
            spread = [f"{r[key]:.1f}" for r in ours], [f"{r[key]:.1f}" for r in theirs]
            rows.append((f"{label}, {sequences} sequence{'s' if sequences > 1 else ''}", a, c, spread))
    print(f"\nsame file: {args.gguf} ({size / 1e6:.1f} MB), {args.threads} threads, median of {args.repetitions}")
    print("| measure | switchyard tok/s | llama.cpp tok/s | ratio | switchyard runs | llama.cpp runs |")
    print("|---|---:|---:|---:|---|---|")
    for label, a, c, (mine, other) in rows:
        print(f"| {label} | {a:.1f} | {c:.1f} | {a / c:.2f} | {', '.join(mine)} | {', '.join(other)} |")
    for name, values in rss.items():
        peak = statistics.median(values)
        print(f"peak resident, {name}: median {peak / 1e6:.0f} MB over its runs ({peak / size:.2f}x the file)")

if __name__ == "__main__":
    main()
