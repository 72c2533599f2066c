#!/usr/bin/env python3
"""switchyard against vLLM's CPU build (offline engines), same bf16 checkpoint, same seeded random
token-id prompts: PROMPT_LEN-token prompts, GENERATE greedy tokens with ignore_eos, at 1 and 32
sequences, median of --repetitions. One engine at a time (switchyard's runs, then vLLM's), each
after a wait for a quiet machine. Per engine and batch size: decode tok/s (tokens after the first
over the decode time), prefill seconds for the batch, peak RSS; then the switchyard/vLLM ratios
and whether the greedy tokens agree (informative: a random-weight model has near-ties). Both
engines are timed warm: vLLM's process runs each batch once untimed before its timed runs
(run_vllm.py), and each switchyard process does the same (`generate --warmup 1`), so neither
pays its first calls' allocations and page faults in the figures.

usage: compare.py --switchyard BIN --model DIR --vllm-python PYTHON --results DIR
       [--threads 2] [--repetitions 3] [--sizes 1,32] [--quiet-load 1.0] [--quiet-wait 1200]
       [--quiet-wait-rep 300] [--switchyard-flags="--int8-products"]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

PROMPT_LEN, GENERATE, SEED = 64, 32, 1234


def wait_quiet(label, quiet_load, max_wait, log):
    waited = 0
    while True:
        load = os.getloadavg()[0]
        if load < quiet_load:
            print(f"== {label}: machine quiet, 1-min load {load:.2f} (waited {waited}s) ==", flush=True)
            break
        if waited >= max_wait:
            print(f"== {label}: machine NOT quiet after {waited}s (1-min load {load:.2f}): measuring anyway ==",
                  flush=True)
            break
        time.sleep(15)
        waited += 15
    with open(log, "a") as f:
        f.write(f"{label}: waited {waited}s, loadavg at start {open('/proc/loadavg').read().strip()}\n")
    return load


def run_switchyard(binary, flags, model, ids, threads):
    prompt_tokens = ";".join(",".join(map(str, p)) for p in ids)
    proc = subprocess.Popen([binary, "--threads", str(threads), *flags, "generate", "--warmup", "1", "--model", model,
                             "--prompt-tokens", prompt_tokens, "--max-tokens", str(GENERATE), "--ignore-eos", "--json"],
                            stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: ru_maxrss is its VmHWM (KiB)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"compare: switchyard generate exited {proc.returncode}")
    r = json.loads(out)
    return {"prefill_s": r["prefill_seconds"], "decode_tok_s": r["decode_tokens_per_second"],
            "peak_rss_kb": usage.ru_maxrss, "token_ids": [o["token_ids"] for o in r["outputs"]]}


def agreement(a, b):
    """(sequences whose first token agrees, mean length of the common greedy prefix)."""
    first = sum(x[:1] == y[:1] for x, y in zip(a, b))
    common = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        common.append(k)
    return first, statistics.mean(common)


def first_token_margins(args, ids, vllm_top5, vocab):
    """How far apart the two engines' first greedy tokens are, as switchyard scores them: its
    log-probability of its own argmax minus that of vLLM's argmax (0 where they agree), from
    `switchyard logits` on the same prompts; and whether each argmax is in the other's top 5."""
    import array
    out = f"{args.results}/first-token-logits.f32"
    subprocess.run([args.switchyard, "--threads", str(args.threads), *args.switchyard_flags, "logits",
                    "--model", args.model,
                    "--kv-dtype", "bf16", "--tokens", ";".join(",".join(map(str, p)) for p in ids), "--out", out],
                   check=True, capture_output=True)
    logits = array.array("f")
    with open(out, "rb") as f:
        logits.frombytes(f.read())
    os.remove(out)
    margins, in_vllm_top5, in_sy_top5 = [], 0, 0
    for s, top5 in enumerate(vllm_top5):
        row = last_row(logits, s, vocab)
        ours = max(range(vocab), key=row.__getitem__)
        ours_top5 = sorted(range(vocab), key=row.__getitem__, reverse=True)[:5]
        theirs = top5[0][0]
        margins.append(row[ours] - row[theirs])  # logits and log-probabilities differ by a constant
        in_vllm_top5 += ours in [t for t, _ in top5]
        in_sy_top5 += theirs in ours_top5
    n = len(vllm_top5)
    gaps = [a - b for a, b in (sorted(last_row(logits, s, vocab), reverse=True)[:2] for s in range(n))]
    print(f"  first token, {n} sequence{'s' if n > 1 else ''}: switchyard's argmax in vLLM's top 5 in "
          f"{in_vllm_top5}/{n}, vLLM's in switchyard's top 5 in {in_sy_top5}/{n}; switchyard's log-prob margin "
          f"of its argmax over vLLM's: median {statistics.median(margins):.3f}, max {max(margins):.3f} nats "
          f"(its own top-1/top-2 gap: median {statistics.median(gaps):.3f})")


def last_row(logits, s, vocab):
    """Sequence s's logits at its last prompt position (`switchyard logits` writes every position)."""
    return logits[((s + 1) * PROMPT_LEN - 1) * vocab:(s + 1) * PROMPT_LEN * vocab]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--switchyard", required=True)
    parser.add_argument("--switchyard-flags", default=[], type=str.split,
                        help="switchyard's global flags for every run, e.g. --int8-products")
    parser.add_argument("--model", required=True)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--sizes", default="1,32")
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--quiet-wait", type=int, default=1200)
    parser.add_argument("--quiet-wait-rep", type=int, default=300)
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sizes = [int(s) for s in args.sizes.split(",")]
    vocab = json.load(open(f"{args.model}/config.json"))["vocab_size"]
    rng = random.Random(SEED)
    prompts = {n: [[rng.randrange(16, vocab) for _ in range(PROMPT_LEN)] for _ in range(n)] for n in sizes}
    os.makedirs(args.results, exist_ok=True)
    prompts_file = f"{args.results}/prompts.json"
    json.dump({str(n): p for n, p in prompts.items()}, open(prompts_file, "w"))
    quiet_log = f"{args.results}/quiet.txt"
    open(quiet_log, "w").close()

    runs = {}  # (engine, n) -> list of dicts
    wait_quiet("switchyard", args.quiet_load, args.quiet_wait, quiet_log)
    run_switchyard(args.switchyard, args.switchyard_flags, args.model, prompts[sizes[0]], args.threads)  # page the weights in
    for n in sizes:
        for rep in range(1, args.repetitions + 1):
            load = wait_quiet(f"switchyard {n} seq r{rep}", args.quiet_load, args.quiet_wait_rep, quiet_log)
            r = run_switchyard(args.switchyard, args.switchyard_flags, args.model, prompts[n], args.threads)
            r["load"] = load
            runs.setdefault(("switchyard", n), []).append(r)
            print(f"   switchyard {n} seq r{rep}: decode {r['decode_tok_s']:.1f} tok/s, prefill "
                  f"{r['prefill_s']:.3f} s, peak RSS {r['peak_rss_kb'] / 2**20:.2f} GiB", flush=True)
    json.dump({f"{e}-{n}": v for (e, n), v in runs.items()}, open(f"{args.results}/switchyard.json", "w"))

    wait_quiet("vLLM", args.quiet_load, args.quiet_wait, quiet_log)
    env = dict(os.environ)
    # 2 OpenMP threads bound to cores 0..threads-1. "auto" would reserve a core for vLLM's
    # scheduler process and leave 1 compute thread on this 2-core machine.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    env.setdefault("HF_HUB_OFFLINE", "1")
    vllm_top5 = None
    with open(f"{args.results}/vllm.log", "w") as log:
        proc = subprocess.Popen([args.vllm_python, f"{here}/run_vllm.py", args.model, prompts_file, str(GENERATE),
                                 str(args.repetitions), str(args.quiet_load), str(args.quiet_wait_rep)],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        for line in proc.stdout:
            if not line.startswith("RESULT "):
                log.write(line)
                continue
            r = json.loads(line[len("RESULT "):])
            if "top5" in r:
                vllm_top5 = r["top5"]
                continue
            runs.setdefault(("vLLM", r["sequences"]), []).append(r)
            with open(quiet_log, "a") as f:
                f.write(f"vLLM {r['sequences']} seq r{r['rep']}: 1-min load at start {r['load']:.2f}\n")
            print(f"   vLLM {r['sequences']} seq r{r['rep']}: decode {r['decode_tok_s']:.1f} tok/s, prefill "
                  f"{r['prefill_s']:.3f} s, full {r['full_s']:.3f} s; load at start {r['load']:.2f}", flush=True)
    if proc.wait() != 0:
        sys.exit(f"compare: run_vllm.py exited {proc.returncode}; log {args.results}/vllm.log")
    json.dump({f"{e}-{n}": v for (e, n), v in runs.items() if e == "vLLM"},
              open(f"{args.results}/vllm.json", "w"))

    med = {}
    print(f"\n{'engine':<11} {'seqs':>4} {'decode tok/s':>13} {'prefill s':>10} {'prefill tok/s':>14} "
          f"{'peak RSS GiB':>13}  runs: decode tok/s@1-min load at start")
    for (engine, n), rs in runs.items():
        d = statistics.median(r["decode_tok_s"] for r in rs)
        p = statistics.median(r["prefill_s"] for r in rs)
        m = max(r["peak_rss_kb"] for r in rs) / 2**20
        med[engine, n] = (d, p)
        print(f"{engine:<11} {n:>4} {d:>13.1f} {p:>10.3f} {n * PROMPT_LEN / p:>14.1f} {m:>13.2f}  "
              + " ".join(f"{r['decode_tok_s']:.1f}@{r['load']:.2f}" for r in rs))
    print("\nswitchyard / vLLM (decode tok/s: higher is better for switchyard; prefill seconds: lower is)")
    for n in sizes:
        a, b = med["switchyard", n], med["vLLM", n]
        print(f"  {n:>2} sequence{'s' if n > 1 else ' '}: decode x{a[0] / b[0]:.2f}   "
              f"prefill time x{a[1] / b[1]:.2f}")
    print("\ngreedy agreement (informative only: random weights, near-ties; last repetition of each):")
    for n in sizes:
        first, common = agreement(runs["switchyard", n][-1]["token_ids"], runs["vLLM", n][-1]["token_ids"])
        print(f"  {n:>2} sequence{'s' if n > 1 else ' '}: first token agrees in {first}/{n}; "
              f"mean common prefix {common:.1f}/{GENERATE} tokens")
    if vllm_top5:
        first_token_margins(args, prompts[max(sizes)], vllm_top5, vocab)


if __name__ == "__main__":
    main()
