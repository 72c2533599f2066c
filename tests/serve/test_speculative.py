"""Speculative decoding in the server — MTP drafts and n-gram lookup drafts — on the trained default
model (models/default), whose MTP drafts are often right and whose greedy output repeats itself:
greedy output equals the plain server's, streamed or not; seeded sampling is reproducible; the
spec-decode counters Prometheus scrapes add up."""

import concurrent.futures
import os

import pytest
from openai import OpenAI

from conftest import Server

TRAINED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "default")
PROMPTS = ["ROMEO: But soft, what light", "KING HENRY: Now, lords", "To be, or not to be",
           "JULIET: O Romeo, Romeo", "First Citizen: Before we proceed", "HAMLET: Words"]


def completion(client, prompt, stream=False, **kw):
    args = dict(model="sy-test", prompt=prompt, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True})
    args.update(kw)
    if not stream:
        return client.completions.create(**args).choices[0].text
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **args)
                   if c.choices)


@pytest.fixture(scope="module")
def plain():
    s = Server(TRAINED, "--kv-cache-tokens", "8192")
    yield s, OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
    assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize("method,k", [("mtp", 1), ("mtp", 3), ("ngram", 4)])
def test_speculative_server_greedy_equals_plain_and_counts_drafts(plain, method, k):
    plain_server, plain_client = plain
    reference = [completion(plain_client, p) for p in PROMPTS]
    s = Server(TRAINED, "--kv-cache-tokens", "8192", "--speculative", method,
               "--num-speculative-tokens", str(k))
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        # Concurrently (drafts verified in one batch), half of them streamed.
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            got = list(pool.map(lambda i: completion(client, PROMPTS[i], stream=i % 2 == 0),
                                range(len(PROMPTS))))
        assert got == reference
        seeded = [completion(client, "ROMEO:", temperature=0.8, seed=11) for _ in range(2)]
        assert seeded[0] == seeded[1]

        m = s.metrics()
        label = 'model_name="sy-test"'
        drafts = m[f"switchyard:spec_decode_num_drafts_total{{{label}}}"]
        draft_tokens = m[f"switchyard:spec_decode_num_draft_tokens_total{{{label}}}"]
        accepted = m[f"switchyard:spec_decode_num_accepted_tokens_total{{{label}}}"]
        # MTP drafts K every step; n-gram lookup as many as its matches earn, at most K.
        keys = [f'switchyard:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{j}"}}'
                for j in range(k)]
        per_position = [m[key] for key in keys if key in m]
        assert len(per_position) == k if method == "mtp" else 1 <= len(per_position) <= k
        assert drafts > 0 and 0 < accepted <= draft_tokens <= k * drafts
        assert sum(per_position) == accepted
        assert per_position == sorted(per_position, reverse=True)
        # Fewer steps than tokens: drafts were kept.
        generated = m[f"switchyard:generation_tokens_total{{{label}}}"]
        assert generated == len(PROMPTS) * 24 + 2 * 24
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_mtp_needs_its_module_and_ngram_needs_none(tmp_path):
    import json
    import shutil
    import subprocess
    from conftest import BINARY
    # The default model without its MTP module: config says 0 layers, the tensors stay unused.
    model = tmp_path / "no-mtp"
    shutil.copytree(TRAINED, model)
    config = json.loads((model / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (model / "config.json").write_text(json.dumps(config))
    out = subprocess.run([BINARY, "serve", "--model", str(model), "--port", "0",
                          "--speculative", "mtp"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "MTP" in out.stderr, out.stderr
    # N-gram drafting needs no module: the same checkpoint serves with it, drafts kept.
    s = Server(str(model), "--speculative", "ngram")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert len(completion(client, "KING HENRY: Now, lords", max_tokens=48)) > 0
        m = s.metrics()
        assert m['switchyard:spec_decode_num_accepted_tokens_total{model_name="sy-test"}'] > 0
    finally:
        assert s.stop() == 0, "".join(s.log)
