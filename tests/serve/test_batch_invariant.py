"""--batch-invariant: a request's tokens and log-probabilities are bit-identical whether it runs
alone or among 31 others (decode batches and prefill chunks of every size beside it), in serve and
in generate; on the trained default model, with the bf16 GEMM this CPU may have."""

import concurrent.futures
import json
import os
import subprocess

from openai import OpenAI

from conftest import BINARY, Server

TRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default")


def test_serve_batch_invariant_alone_equals_in_a_crowd():
    s = Server(TRAINED, "--batch-invariant", "--kv-cache-tokens", "32768")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        ask = dict(model="sy-test", prompt="KING HENRY: Now, lords, for France", max_tokens=40,
                   temperature=0.8, seed=5, logprobs=5, extra_body={"ignore_eos": True})

        def probe():
            c = client.completions.create(**ask).choices[0]
            return c.text, c.logprobs.token_logprobs, c.logprobs.top_logprobs

        alone = probe()
        # The crowd: long prompts (prefill chunks of hundreds of rows) and short ones, decoding.
        crowd = [dict(model="sy-test", prompt="ROMEO: " + "But soft, what light " * (i * 7 % 60),
                      max_tokens=40 + i, temperature=0.7, seed=i, extra_body={"ignore_eos": True})
                 for i in range(31)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            others = [pool.submit(client.completions.create, **c) for c in crowd[:16]]
            mine = pool.submit(probe)
            others += [pool.submit(client.completions.create, **c) for c in crowd[16:]]
            among = mine.result()
            for o in others:
                o.result()
        assert among == alone  # text, every log-probability, every top-5 entry, exactly
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_generate_batch_invariant_alone_equals_in_a_batch():
    def run(prompts):
        args = [BINARY, "generate", "--model", TRAINED, "--max-tokens", "48", "--ignore-eos",
                "--batch-invariant", "--json"]
        for p in prompts:
            args += ["--prompt", p]
        out = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["outputs"]

    mine = "To be, or not to be, that is the question"
    alone = run([mine])[0]["token_ids"]
    batch = [f"First Citizen: {'Before we proceed any further, hear me speak. ' * (i % 9)}"
             for i in range(40)]
    among = run(batch[:20] + [mine] + batch[20:])[20]["token_ids"]
    assert among == alone
