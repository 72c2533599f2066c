"""Serving under mpirun: DP groups each with their own engine, rank 0 serving HTTP, all ranks
stepping together. Greedy output must equal the single-process server's; every request of a
concurrent load completes; metrics add up over the groups; SIGTERM stops every rank cleanly."""

import concurrent.futures
import io
import json
import os
import time

import pytest
from openai import OpenAI

from conftest import Server, assert_sigterm_drains

TRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default")
PROMPTS = ["ROMEO: But soft", "KING HENRY:", "To be, or not", "Good morrow, cousin",
           "HAMLET: Words, words", "Once more unto the breach"]


def greedy(client, prompt, **extra):
    return client.completions.create(model="sy-test", prompt=prompt, max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True, **extra}).choices[0].text


def beam_texts(client):
    out = client.completions.create(model="sy-test", prompt=PROMPTS[1], max_tokens=8, n=3,
                                    extra_body={"use_beam_search": True})
    return [c.text for c in out.choices]


# Token constraints cross to the groups (the cluster's own encoding of a request).
CONSTRAINED = dict(bad_words=["the", "and"], allowed_token_ids=list(range(2, 3000)))


@pytest.mark.parametrize("ranks,extra", [(2, []), (4, ["--tp", "2"]), (2, ["--speculative", "mtp"]),
                                         (2, ["--speculative", "ngram"])],
                         ids=["dp2", "dp2_tp2", "dp2_mtp", "dp2_ngram"])
def test_mpi_server_matches_one_process(model_dir, ranks, extra):
    # Both servers keep f32 activations in their products: expert parallelism sums the experts'
    # rows in another order than one process does (and TP splits o_proj's sums over the heads),
    # equal in f32 to ~1e-7, which bf16 activations (the default dot kernel) can turn into a
    # flipped near-tie of this random model. What is compared here is the serving under mpirun.
    extra = extra + ["--f32-products"]
    # The trained default model: the random one's near-ties flip under TP's reassociated o_proj
    # sums even in f32 (which ones depends on the attention forms), the trained one's margins hold.
    model_dir = TRAINED
    reference_server = Server(model_dir, "--kv-cache-tokens", "4096", "--f32-products")
    try:
        client = OpenAI(base_url=reference_server.url + "/v1", api_key="x", max_retries=0,
                        timeout=300)
        reference = [greedy(client, p) for p in PROMPTS]
        constrained = greedy(client, PROMPTS[0], **CONSTRAINED)
        assert constrained != reference[0]
        beams = beam_texts(client)
    finally:
        assert reference_server.stop() == 0
    s = Server(model_dir, "--kv-cache-tokens", "4096", *extra, ranks=ranks, threads=1)
    try:
        mpi_client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        assert [greedy(mpi_client, p) for p in PROMPTS] == reference
        assert greedy(mpi_client, PROMPTS[0], **CONSTRAINED) == constrained
        # A concurrent load spreads over the groups and completes.
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            outs = list(pool.map(lambda i: mpi_client.completions.create(
                model="sy-test", prompt=f"Load {i}", max_tokens=6, temperature=0.7, seed=i,
                stream=i % 2 == 0, extra_body={"ignore_eos": True}), range(16)))
        finished = 0
        for i, out in enumerate(outs):
            if i % 2 == 0:
                chunks = list(out)
                finished += chunks[-1].choices[0].finish_reason == "length"
            else:
                finished += out.choices[0].finish_reason == "length"
        assert finished == 16
        metrics = s.metrics()
        assert metrics['switchyard:generation_tokens_total{model_name="sy-test"}'] == \
            len(PROMPTS) * 10 + 10 + 16 * 6
        assert metrics['switchyard:kv_cache_usage_perc{model_name="sy-test"}'] == 0
        # vLLM's per-request histograms, summed over the groups.
        label = '{model_name="sy-test"}'
        assert metrics[f"switchyard:request_generation_tokens_sum{label}"] == \
            metrics[f'switchyard:generation_tokens_total{label}']
        assert metrics[f"switchyard:request_generation_tokens_count{label}"] == len(PROMPTS) + 1 + 16
        assert metrics[f"switchyard:request_decode_time_seconds_count{label}"] == \
            len(PROMPTS) + 1 + 16
        assert metrics[f"switchyard:iteration_tokens_total_sum{label}"] > 0
        # What stopped a request crosses from its group to rank 0.
        stop = reference[0][2:5]
        out = mpi_client.completions.create(model="sy-test", prompt=PROMPTS[0], max_tokens=10,
                                            temperature=0, stop=[stop],
                                            extra_body={"ignore_eos": True})
        assert out.choices[0].text == reference[0][:reference[0].index(stop)]
        assert out.choices[0].model_extra["stop_reason"] == stop
        # A beam search runs on rank 0, its steps spread over the groups.
        assert beam_texts(mpi_client) == beams
        # A batch's lines (background work in the groups' engines) give the live answers.
        lines = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": "sy-test", "prompt": p, "max_tokens": 10, "temperature": 0,
                           "ignore_eos": True}} for i, p in enumerate(PROMPTS)]
        uploaded = mpi_client.files.create(file=("p.jsonl", io.BytesIO(
            "".join(json.dumps(line) + "\n" for line in lines).encode())), purpose="batch")
        batch = mpi_client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                          completion_window="24h")
        deadline = time.time() + 120
        while batch.status != "completed" and time.time() < deadline:
            time.sleep(0.1)
            batch = mpi_client.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts.completed == len(PROMPTS)
        out = {json.loads(line)["custom_id"]: json.loads(line)["response"]["body"]
               for line in mpi_client.files.content(batch.output_file_id).text.splitlines()}
        assert [out[f"p{i}"]["choices"][0]["text"] for i in range(len(PROMPTS))] == reference
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_sigterm_under_mpirun_drains_and_exits_zero(model_dir):
    assert_sigterm_drains(Server(model_dir, "--kv-cache-tokens", "4096", ranks=2, threads=1), 120)
