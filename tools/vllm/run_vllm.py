"""vLLM's side of tools/vllm/compare.py: one LLM (offline engine) on the checkpoint, then for each
batch size and repetition a prefill run (max_tokens=1) and a full run (max_tokens=GENERATE), both
greedy with ignore_eos on the same token-id prompts. Prints one line per run, "RESULT " and a JSON
object (vLLM itself prints to stdout too):
  {"sequences", "rep", "load", "prefill_s", "full_s", "decode_tok_s", "peak_rss_kb", "token_ids"}
decode_tok_s = sequences * (GENERATE - 1) / (full_s - prefill_s): the tokens after the first,
over the time the full run took beyond the prefill run. peak_rss_kb: the largest sum of RSS over
this process and its descendants (vLLM's EngineCore and Worker processes), sampled every 0.1 s
during that size's runs (shared pages count once per process, so this overstates a little).
Last, untimed: {"top5": [[[token, logprob] x5] per sequence], "sequences": n} for the first token of
the largest batch.

usage: run_vllm.py MODEL_DIR PROMPTS_JSON GENERATE REPS QUIET_LOAD QUIET_WAIT_REP_S
  PROMPTS_JSON: {"1": [[ids...]], "32": [[ids...], ...]}. vLLM's threads come from the environment
  (VLLM_CPU_OMP_THREADS_BIND etc., set by compare.py).
"""
import json
import os
import sys
import threading
import time

import psutil


class PeakRss:
    """Peak of the summed RSS of this process tree, sampled on a thread."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self):
        me = psutil.Process()
        total = 0
        for p in [me] + me.children(recursive=True):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        self.peak = max(self.peak, total)

    def _run(self):
        while not self._stop.wait(0.1):
            self.sample()

    def reset(self):
        self.peak = 0
        self.sample()


def wait_quiet(label, quiet_load, max_wait):
    waited = 0
    while True:
        load = os.getloadavg()[0]
        if load < quiet_load or waited >= max_wait:
            break
        time.sleep(15)
        waited += 15
    load = os.getloadavg()[0]
    print(f"== vLLM {label}: 1-min load {load:.2f} (waited {waited}s) ==", file=sys.stderr, flush=True)
    return load


def main():
    model, prompts_file, generate, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    quiet_load, quiet_wait = float(sys.argv[5]), int(sys.argv[6])
    prompts = {int(k): v for k, v in json.load(open(prompts_file)).items()}

    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=model, tokenizer=model, dtype="bfloat16", max_model_len=1024, seed=0)
    print(f"== vLLM loaded in {time.perf_counter() - started:.1f} s ==", file=sys.stderr, flush=True)
    rss = PeakRss()

    def run(ids, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        batch = [{"prompt_token_ids": p} for p in ids]
        t = time.perf_counter()
        outputs = llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - t, [list(o.outputs[0].token_ids) for o in outputs]

    # First-call costs (allocations, any lazily compiled shapes) out of the timed runs.
    for n in sorted(prompts):
        run(prompts[n], 1)
        run(prompts[n], generate)
    for n in sorted(prompts):
        rss.reset()
        for rep in range(1, reps + 1):
            load = wait_quiet(f"{n} seq r{rep}", quiet_load, quiet_wait)
            prefill_s, _ = run(prompts[n], 1)
            full_s, token_ids = run(prompts[n], generate)
            decode_s = full_s - prefill_s
            print("RESULT " + json.dumps({
                "sequences": n, "rep": rep, "load": load, "prefill_s": prefill_s, "full_s": full_s,
                "decode_tok_s": n * (generate - 1) / decode_s if decode_s > 0 else float("nan"),
                "peak_rss_kb": rss.peak // 1024, "token_ids": token_ids}), flush=True)
    # Untimed: the first token's top-5 log-probabilities (vLLM's default: log-softmax of the raw
    # logits) for the largest batch, for the agreement check.
    n = max(prompts)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=5)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts[n]], params, use_tqdm=False)
    top5 = [sorted(((t, lp.logprob) for t, lp in o.outputs[0].logprobs[0].items()), key=lambda x: -x[1])[:5]
            for o in outputs]
    print("RESULT " + json.dumps({"top5": top5, "sequences": n}), flush=True)


if __name__ == "__main__":  # vLLM starts its engine processes with spawn: the guard is required
    main()
