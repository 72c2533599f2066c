"""The server through the official OpenAI Python client: every endpoint, streaming and not,
seeds, stop strings, logprobs, n, echo; results checked against `switchyard generate` and
`switchyard logits` on the same ids."""

import array
import json
import math
import subprocess

import openai
import pytest

from conftest import BINARY, TMP

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def test_models_lists_the_served_model(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["sy-test"]
    assert client.models.retrieve("sy-test") == models.data[0]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    status, body, _ = server.request("GET", "/health")
    assert status == 200


def test_greedy_completion_equals_generate(server, client, model_dir):
    prompt = "ROMEO: But soft, what light"
    out = client.completions.create(model="sy-test", prompt=prompt, max_tokens=12, **GREEDY)
    reference = json.loads(subprocess.run(
        [BINARY, "generate", "--model", model_dir, "--prompt", prompt, "--max-tokens", "12",
         "--ignore-eos", "--json"], check=True, capture_output=True, text=True).stdout)
    assert out.choices[0].text == reference["outputs"][0]["text"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 12
    assert out.usage.prompt_tokens == 1 + len(server.request(
        "POST", "/tokenize", {"prompt": prompt, "add_special_tokens": False})[1]["tokens"])


def test_streaming_gives_the_same_text_as_non_streaming(client):
    args = dict(model="sy-test", prompt="KING HENRY:", max_tokens=20, temperature=0.8, seed=7,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].text
    chunks = list(client.completions.create(stream=True, **args))
    assert "".join(c.choices[0].text for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seeds_reproduce_and_differ(client):
    args = dict(model="sy-test", prompt="To be, or not", max_tokens=16, temperature=1.0, top_p=0.95)
    a = client.completions.create(seed=11, **args).choices[0].text
    b = client.completions.create(seed=11, **args).choices[0].text
    c = client.completions.create(seed=12, **args).choices[0].text
    assert a == b
    assert a != c


def test_beam_search_gives_n_ranked_beams_streamed_or_not(client):
    # vLLM's use_beam_search: n is the width; the choices are the n best beams, best first. With
    # ignore_eos every beam has max_tokens tokens, so the ranking is by cumulative log-probability,
    # which the returned token log-probabilities add up to.
    args = dict(model="sy-test", prompt="Once upon a time", max_tokens=10, n=4, logprobs=1,
                extra_body={"use_beam_search": True, "ignore_eos": True})
    out = client.completions.create(**args)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert len({c.text for c in out.choices}) == 4
    assert all(c.finish_reason == "length" for c in out.choices)
    sums = [sum(c.logprobs.token_logprobs) for c in out.choices]
    assert sums == sorted(sums, reverse=True)
    assert out.usage.completion_tokens == 40
    # Deterministic: temperature and seed do not change a search.
    again = client.completions.create(temperature=1.5, seed=3, **args)
    assert [c.text for c in again.choices] == [c.text for c in out.choices]
    # Chat, streamed: each choice's text arrives whole, and equals the unstreamed search's.
    chat = dict(model="sy-test", messages=[{"role": "user", "content": "Speak, friend"}],
                max_tokens=8, n=3, extra_body={"use_beam_search": True})
    whole = client.chat.completions.create(**chat)
    streamed = {}
    finished = {}
    for chunk in client.chat.completions.create(stream=True, **chat):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert [streamed[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert finished == {i: c.finish_reason for i, c in enumerate(whole.choices)}


def vllm_beam_search(client, prompt, width, max_tokens, eos, length_penalty=1.0):
    """vLLM's online beam search (vllm/entrypoints/generate/beam_search/online.py), restated
    step for step, its one-token requests (2W top log-probabilities each, tokens named by id)
    sent to this server: the reference the server's own search must agree with."""
    beams, completed = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        candidates = []
        for tokens, cumulative in beams:
            out = client.completions.create(
                model="sy-test", prompt=tokens, max_tokens=1, temperature=0,
                logprobs=2 * width, extra_body={"return_tokens_as_token_ids": True})
            for key, logprob in out.choices[0].logprobs.top_logprobs[0].items():
                token = int(key.removeprefix("token_id:"))
                if token == eos:
                    completed.append((tokens + [token], cumulative + logprob))
                else:
                    candidates.append((tokens + [token], cumulative + logprob))
        beams = sorted(candidates, key=lambda b: b[1], reverse=True)[:width]
        if not beams:
            break

    def score(beam):
        length = len(beam[0]) - (beam[0][-1] == eos)
        return beam[1] / max(length, 1) ** length_penalty
    ranked = sorted(completed + beams, key=score, reverse=True)[:width]
    return [(tokens[len(prompt):], cumulative) for tokens, cumulative in ranked]


def test_beam_search_agrees_with_vllms_algorithm_on_the_same_steps(server, client):
    eos = server.request("POST", "/tokenize", {"prompt": "<｜end▁of▁sentence｜>",
                                               "add_special_tokens": False})[1]["tokens"][0]
    prompt = server.request("POST", "/tokenize", {"prompt": "The King hath"})[1]["tokens"]
    reference = vllm_beam_search(client, prompt, width=3, max_tokens=6, eos=eos)
    out = client.completions.create(model="sy-test", prompt=prompt, max_tokens=6, n=3,
                                    logprobs=0, extra_body={"use_beam_search": True,
                                                            "return_token_ids": True})
    got = [(c.model_extra["token_ids"], sum(c.logprobs.token_logprobs)) for c in out.choices]
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in reference]
    for (_, mine), (_, theirs) in zip(got, reference):
        assert math.isclose(mine, theirs, rel_tol=1e-9)


def test_stop_strings_end_the_text_and_are_not_returned(client):
    full = client.completions.create(model="sy-test", prompt="HAMLET:", max_tokens=24,
                                     **GREEDY).choices[0].text
    stop = full[8:11]
    assert len(stop) == 3
    out = client.completions.create(model="sy-test", prompt="HAMLET:", max_tokens=24, stop=[stop],
                                    **GREEDY)
    assert out.choices[0].text == full[:full.index(stop)]
    assert out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(
        model="sy-test", prompt="HAMLET:", max_tokens=24, stop=stop, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == full[:full.index(stop)]
    # vLLM's stop_reason: the string that matched (null when the length ran out).
    assert out.choices[0].model_extra["stop_reason"] == stop
    assert chunks[-1].choices[0].model_extra["stop_reason"] == stop


def test_stop_reason_names_the_stop_token_and_not_the_end_of_sequence(server):
    body = {"model": "sy-test", "prompt": "HAMLET:", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True}
    status, full, _ = server.request("POST", "/v1/completions", body)
    assert status == 200 and full["choices"][0]["stop_reason"] is None
    ids = server.request("POST", "/tokenize", {"prompt": full["choices"][0]["text"],
                                               "add_special_tokens": False})[1]["tokens"]
    status, out, _ = server.request("POST", "/v1/completions",
                                    {**body, "stop_token_ids": [ids[1]]})
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["stop_reason"] == ids[1]
    # The end-of-sequence token (1 in the default model) stops with no reason given, in chat too.
    status, out, _ = server.request("POST", "/v1/chat/completions", {
        "model": "sy-test", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "logit_bias": {"1": 100}})
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["stop_reason"] is None


def test_what_is_accepted_and_ignored_and_truncate_prompt_tokens(server, client):
    # Defaults of refused features, and names nobody knows, are accepted (vLLM ignores unknown
    # names too); tools with tool_choice "none" are shown to the model and never called.
    out = client.chat.completions.create(
        model="sy-test", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        response_format={"type": "text"}, tool_choice="none",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        extra_body={"use_beam_search": False, "no_such_parameter": 1, "ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
    # vLLM's truncate_prompt_tokens keeps the prompt's last k tokens (echo returns those).
    ids = server.request("POST", "/tokenize", {"prompt": "Once more unto the breach, dear friends",
                                               "add_special_tokens": False})[1]["tokens"]
    out = client.completions.create(model="sy-test", prompt=ids, max_tokens=1, echo=True,
                                    extra_body={"truncate_prompt_tokens": 3})
    assert out.usage.prompt_tokens == 3
    kept = server.request("POST", "/detokenize", {"tokens": ids[-3:]})[1]["prompt"]
    assert out.choices[0].text.startswith(kept)


def test_completion_logprobs_and_n(client):
    out = client.completions.create(model="sy-test", prompt="Good morrow", max_tokens=5, n=3,
                                    logprobs=2, temperature=1.0, seed=3,
                                    extra_body={"ignore_eos": True})
    assert len(out.choices) == 3
    assert [c.index for c in out.choices] == [0, 1, 2]
    for choice in out.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
        assert all(x <= 0 for x in lp.token_logprobs)
        assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert out.usage.completion_tokens == 15


def log_softmax_rows(model_dir, ids):
    """The logits verb's rows for `ids` (row p predicts token p + 1), as log-probabilities."""
    logits_file = f"{TMP}/logits-{len(ids)}-{ids[-1]}.bin"
    subprocess.run([BINARY, "logits", "--model", model_dir, "--tokens", ",".join(map(str, ids)),
                    "--out", logits_file, "--kv-dtype", "bf16"], check=True, capture_output=True)
    values = array.array("f")
    with open(logits_file, "rb") as f:
        values.frombytes(f.read())
    vocab = len(values) // len(ids)
    rows = []
    for p in range(len(ids)):
        row = values[p * vocab:(p + 1) * vocab]
        top = max(row)
        log_sum = top + math.log(sum(math.exp(x - top) for x in row))
        rows.append([x - log_sum for x in row])
    return rows


def test_echo_prompt_logprobs_equal_the_logits(server, client, model_dir):
    # lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs=1, max_tokens=1.
    ids = [0, 55, 432, 94, 27, 923, 16, 236, 176, 137, 270]
    out = client.completions.create(model="sy-test", prompt=ids, echo=True, logprobs=1,
                                    max_tokens=1, temperature=0)
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1
    assert lp.token_logprobs[0] is None
    rows = log_softmax_rows(model_dir, ids)
    for position in range(1, len(ids)):
        want = rows[position - 1][ids[position]]
        assert abs(lp.token_logprobs[position] - want) < 1e-3, position


def test_vllms_prompt_logprobs_and_token_ids(server, client, model_dir):
    """vLLM's prompt_logprobs (each prompt token's own log-probability and rank, and the top k in
    its place, checked against the logits verb) and return_token_ids (the prompt's and the
    output's ids), on completions and chat, whole and streamed."""
    ids = [0, 55, 432, 94, 27, 923, 16, 236, 176, 137, 270]
    out = client.completions.create(model="sy-test", prompt=ids, max_tokens=3, temperature=0,
                                    extra_body={"prompt_logprobs": 2, "return_token_ids": True,
                                                "ignore_eos": True}).choices[0].model_extra
    assert out["prompt_token_ids"] == ids and len(out["token_ids"]) == 3
    plp = out["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    rows = log_softmax_rows(model_dir, ids)
    for position in range(1, len(ids)):
        row = rows[position - 1]
        own = plp[position][str(ids[position])]
        want = row[ids[position]]
        assert abs(own["logprob"] - want) < 1e-3, position
        # The rank within what the logits' 1e-3 agreement allows.
        above = sum(1 for x in row if x > want + 1e-3)
        near = sum(1 for x in row if x > want - 1e-3)
        assert above + 1 <= own["rank"] <= near + 1, (position, own)
        assert own["decoded_token"] == server.request(
            "POST", "/detokenize", {"tokens": [ids[position]]})[1]["prompt"]
        # The top 2 beside it (itself perhaps one of them), best first.
        ranked = sorted(plp[position].values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked] == sorted({1, 2, own["rank"]}), plp[position]
        assert all(a["logprob"] >= b["logprob"] for a, b in zip(ranked, ranked[1:]))
    messages = [{"role": "user", "content": "Who art thou?"}]
    chat = client.chat.completions.create(model="sy-test", messages=messages, max_tokens=4,
                                          temperature=0,
                                          extra_body={"prompt_logprobs": 0, "ignore_eos": True,
                                                      "return_token_ids": True})
    prompt_ids = server.request("POST", "/tokenize", {"messages": messages})[1]["tokens"]
    assert chat.model_extra["prompt_token_ids"] == prompt_ids
    assert len(chat.model_extra["prompt_logprobs"]) == len(prompt_ids)
    assert all(len(p) == 1 for p in chat.model_extra["prompt_logprobs"][1:])  # its own only
    token_ids = chat.choices[0].model_extra["token_ids"]
    assert len(token_ids) == chat.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(
        model="sy-test", messages=messages, max_tokens=4, stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True}, temperature=0))
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert [t for c in chunks for t in c.choices[0].model_extra["token_ids"]] == token_ids
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="sy-test", prompt="x", stream=True,
                                  extra_body={"prompt_logprobs": 1})
    assert "prompt_logprobs" in str(info.value)


def test_allowed_token_ids_and_bad_words(server, client):
    """vLLM's allowed_token_ids (every output id among them) and bad_words (a word's token
    sequence never completed, and the output changed by it), on completions and chat, streamed
    and not; constraints that leave nothing to sample are a 400 that says so."""
    prompt = "ROMEO: But soft, what light"
    free = client.completions.create(model="sy-test", prompt=prompt, max_tokens=16,
                                     extra_body={"return_token_ids": True, "ignore_eos": True},
                                     temperature=0).choices[0]
    free_ids = free.model_extra["token_ids"]
    allowed = sorted(set(free_ids[1:]) | {5, 40, 300})
    for stream in (False, True):
        args = dict(model="sy-test", prompt=prompt, max_tokens=16, temperature=0.9, seed=3,
                    stream=stream, extra_body={"allowed_token_ids": allowed,
                                               "return_token_ids": True, "ignore_eos": True})
        out = client.completions.create(**args)
        ids = ([t for c in out for t in c.choices[0].model_extra["token_ids"]] if stream
               else out.choices[0].model_extra["token_ids"])
        assert len(ids) == 16 and set(ids) <= set(allowed), ids
    # A word of the free output whose tokens (alone, or after a space) it holds, as a bad word:
    # those never complete, and the output is not the free one.

    def spellings(word):
        return [server.request("POST", "/tokenize", {"prompt": w, "add_special_tokens": False})[1]
                ["tokens"] for w in (word, " " + word)]

    def holds(ids, seq):
        return any(ids[i:i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))

    word = next(w for w in free.text.split() if any(holds(free_ids, s) for s in spellings(w)))
    messages = [{"role": "user", "content": prompt}]
    chat_free = client.chat.completions.create(
        model="sy-test", messages=messages, max_tokens=16, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0]
    for endpoint in ("completions", "chat"):
        extra = {"bad_words": [word], "return_token_ids": True, "ignore_eos": True}
        if endpoint == "completions":
            got = client.completions.create(model="sy-test", prompt=prompt, max_tokens=16,
                                            temperature=0, extra_body=extra).choices[0]
            assert got.model_extra["token_ids"] != free_ids
        else:
            got = client.chat.completions.create(model="sy-test", messages=messages,
                                                 max_tokens=16, temperature=0,
                                                 extra_body=extra).choices[0]
            if word in chat_free.message.content:
                assert got.model_extra["token_ids"] != chat_free.model_extra["token_ids"]
        for seq in spellings(word):
            assert not holds(got.model_extra["token_ids"], seq), (endpoint, word, seq)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="sy-test", prompt=prompt, max_tokens=4,
                                  extra_body={"allowed_token_ids": [1], "min_tokens": 2})
    assert "allowed_token_ids" in info.value.body["message"]
    assert client.completions.create(model="sy-test", prompt=prompt, max_tokens=2).choices


def test_chat_completion_and_stream_with_usage(client):
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Who art thou?"}]
    out = client.chat.completions.create(model="sy-test", messages=messages, max_tokens=6,
                                         logprobs=True, top_logprobs=2, **GREEDY)
    message = out.choices[0].message
    assert message.role == "assistant"
    assert len(out.choices[0].logprobs.content) == 6
    assert all(len(e.top_logprobs) == 2 for e in out.choices[0].logprobs.content)
    chunks = list(client.chat.completions.create(
        model="sy-test", messages=messages, max_tokens=6, stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == message.content
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    # vLLM's continuous_usage_stats: each chunk has the usage so far, the last one the whole.
    chunks = list(client.chat.completions.create(
        model="sy-test", messages=messages, max_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, **GREEDY))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 6, counts
    assert all(c.usage.prompt_tokens == out.usage.prompt_tokens for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_prefix_cache_hits_are_reported_and_change_nothing(client):
    document = "FIRST CITIZEN: Before we proceed any further, hear me speak. " * 12
    first = client.completions.create(model="sy-test", prompt=document + "Q1", max_tokens=8,
                                      **GREEDY)
    second = client.completions.create(model="sy-test", prompt=document + "Q1", max_tokens=8,
                                       **GREEDY)
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.choices[0].text == first.choices[0].text


def test_one_answer_per_request_cached_or_not_streamed_or_not(client):
    """The issue's report: the same greedy chat sent twice (the second streamed, its prefix from
    the cache) gave two answers. Now the text and every log-probability are the same, and so are
    n greedy choices computed side by side in one batch."""
    messages = [{"role": "user", "content": "Speak of the tempest, the island and its spirits "
                 "in 4 lines, as Prospero would. (one-answer test)"}]
    args = dict(model="sy-test", messages=messages, max_tokens=24, logprobs=True, top_logprobs=2,
                **GREEDY)
    first = client.chat.completions.create(**args)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **args))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.choices[0].message.content
    streamed = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    whole = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
             for t in first.choices[0].logprobs.content]
    assert streamed == whole  # exact: the same bits, printed the same way
    several = client.chat.completions.create(n=3, **args)
    for choice in several.choices:
        assert choice.message.content == first.choices[0].message.content
        assert [(t.token, t.logprob) for t in choice.logprobs.content] == \
            [(t, lp) for t, lp, _ in whole]


def test_tokenize_and_detokenize(server):
    status, body, _ = server.request("POST", "/tokenize", {"prompt": "Hello, world"})
    assert status == 200 and body["count"] == len(body["tokens"]) and body["tokens"][0] == 0
    status, back, _ = server.request("POST", "/detokenize", {"tokens": body["tokens"][1:]})
    assert status == 200 and back["prompt"] == "Hello, world"
    status, chat, _ = server.request("POST", "/tokenize",
                                     {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and chat["tokens"][0] == 0
    # A message's text parts are joined by newlines, as vLLM joins them for the DeepSeek
    # templates (which take a string).
    def tokens(content):
        status, out, _ = server.request("POST", "/tokenize",
                                        {"messages": [{"role": "user", "content": content}]})
        assert status == 200, out
        return out["tokens"]
    assert tokens([{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]) == \
        tokens("Hi\nthere") != tokens("Hithere")


def test_http_requests_are_counted_by_route_method_and_status(server, client):
    """http_requests_total: each answer under its endpoint (ids folded into a template, unknown
    paths as "other"), method and status class."""
    def count(handler, method, status):
        return server.metrics().get(
            f'switchyard:http_requests_total{{model_name="sy-test",handler="{handler}",'
            f'method="{method}",status="{status}"}}', 0)
    before = [count("/v1/chat/completions", "POST", "2xx"),
              count("/v1/chat/completions", "POST", "4xx"),
              count("/v1/responses/{id}", "GET", "4xx"), count("other", "GET", "4xx")]
    client.chat.completions.create(model="sy-test", messages=[{"role": "user", "content": "x"}],
                                   max_tokens=1)
    list(client.chat.completions.create(model="sy-test", max_tokens=1, stream=True,
                                        messages=[{"role": "user", "content": "x"}]))
    server.request("POST", "/v1/chat/completions", {"messages": []})
    server.request("GET", "/v1/responses/resp_nowhere")
    server.request("GET", "/no/such/path/42")
    assert [count("/v1/chat/completions", "POST", "2xx"),
            count("/v1/chat/completions", "POST", "4xx"),
            count("/v1/responses/{id}", "GET", "4xx"), count("other", "GET", "4xx")] == [
        before[0] + 2, before[1] + 1, before[2] + 1, before[3] + 1]


def test_continue_final_message_continues_the_assistant(server, client):
    """vLLM's continue_final_message: the prompt ends inside the last message (transformers'
    rendering, checked against it in tokenizer_test), so the answer continues its text."""
    messages = [{"role": "user", "content": "Tell me a tale."},
                {"role": "assistant", "content": "Once upon a"}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    status, tok, _ = server.request("POST", "/tokenize", {"messages": messages, **extra})
    assert status == 200, tok
    status, text, _ = server.request("POST", "/detokenize", {"tokens": tok["tokens"]})
    assert text["prompt"].endswith("<｜Assistant｜>Once upon a"), text
    out = client.chat.completions.create(model="sy-test", messages=messages, max_tokens=8,
                                         temperature=0,
                                         extra_body={**extra, "ignore_eos": True})
    same = client.completions.create(model="sy-test", prompt=tok["tokens"], max_tokens=8,
                                     **GREEDY)
    assert out.choices[0].message.content == same.choices[0].text
    assert out.usage.prompt_tokens == len(tok["tokens"])


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "three"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "prompt"),
    # Fill in the middle needs DeepSeek's FIM tokens, which the default tokenizer lacks.
    ("/v1/completions", {"prompt": "def f():", "suffix": "    return 1"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "x", "thinking_token_budget": -3}, 400,
     "thinking_token_budget"),
    ("/v1/completions", {"prompt": [1, -2]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1000}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "\ud800"}, 400, None),
    ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, 400, "messages[0]"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400,
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 3}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": 5}]}]}, 400,
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
     400, "messages[0].content"),
    # Known to vLLM, changing the output, not implemented here: refused by name, never ignored.
    ("/v1/completions", {"prompt": "x", "guided_whitespace_pattern": " *"}, 400,
     "guided_whitespace_pattern"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400,
     "prompt_logprobs"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": [5, 10 ** 9]}, 400,
     "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "bad_words": ["ok", ""]}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "bad_words": "word"}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "logits_processors": ["f"]}, 400, "logits_processors"),
    # Beam search ranks by the model's own log-probabilities: what would change them is refused.
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "presence_penalty": 0.5}, 400,
     "use_beam_search"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "n": 11}, 400,
     "use_beam_search"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "use_beam_search": True, "response_format": {"type": "json_object"}},
     400, "use_beam_search"),
    ("/v1/completions", {"prompt": "x", "use_beam_search": True, "length_penalty": "long"}, 400,
     "length_penalty"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": 0}, 400,
     "truncate_prompt_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "xml"}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tool_choice"),  # "auto", the default with tools, needs --enable-auto-tool-choice
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "continue_final_message": True}, 400, "continue_final_message"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template": "{{ messages }}"}, 400, "chat_template"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens"),
    ("/tokenize", {"nothing": 1}, 400, "prompt"),
    ("/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    raw = body if isinstance(body, bytes) else None
    got, error, _ = server.request("POST", path, None if raw else body, raw=raw)
    assert got == status, error
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["message"]
    if param:
        assert error["error"]["param"] == param, error


def test_errors_through_the_client_and_the_server_keeps_answering(server, client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="sy-test", prompt="x", max_tokens=-5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    status, error, _ = server.request("POST", "/v1/completions",
                                      raw=b'{"prompt": "' + b"a" * (40 << 20) + b'"}')
    assert status == 413, error
    status, _, _ = server.request("GET", "/v1/completions")
    assert status == 405
    out = client.completions.create(model="sy-test", prompt="Still here?", max_tokens=3, **GREEDY)
    assert out.usage.completion_tokens == 3


def test_an_fp8_cache_serves_one_answer_and_reports_its_configuration(server, model_dir):
    """serve --kv-cache-dtype fp8 (vLLM's spelling of --kv-dtype): the OpenAI client's greedy
    chat is the same cached or not, streamed or not, and /metrics names the cache as vLLM's
    cache_config_info does — with the bytes a token takes (DeepSeek-V3's row: 644 bytes against
    bf16's 1,152)."""
    from conftest import Server
    from openai import OpenAI
    s = Server(model_dir, "--kv-cache-dtype", "fp8", "--kv-cache-tokens", "4096")
    try:
        client = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Speak of the tempest and the island, as "
                     "Prospero would. (fp8 cache test)"}]
        args = dict(model="sy-test", messages=messages, max_tokens=16, logprobs=True, **GREEDY)
        first = client.chat.completions.create(**args)
        chunks = list(client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **args))
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            first.choices[0].message.content
        streamed = [(t.token, t.logprob) for c in chunks if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content]
        assert streamed == [(t.token, t.logprob) for t in first.choices[0].logprobs.content]
        # The bf16 server's answer to the same request has other log-probabilities: the cache
        # here really is fp8.
        bf16 = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        other = bf16.chat.completions.create(**args)
        assert [t.logprob for t in other.choices[0].logprobs.content] != \
            [t.logprob for t in first.choices[0].logprobs.content]
        # A row: the latent's e4m3 codes and one exponent per 128 of them (padded to an even
        # byte), then the rope part in bf16; the bf16 server's row is both parts in bf16.
        with open(f"{model_dir}/config.json") as f:
            config = json.load(f)
        latent, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
        fp8_row = (latent + (latent + 127) // 128 + 1) // 2 * 2 + 2 * rope
        def info(of):
            rows = [name for name in of.metrics() if name.startswith("switchyard:cache_config_info")]
            assert len(rows) == 1, rows
            labels = dict(part.split("=", 1) for part in rows[0][rows[0].index("{") + 1:-1].split(","))
            assert of.metrics()[rows[0]] == 1
            return {key: value.strip('"') for key, value in labels.items()}
        fp8, bf16_info = info(s), info(server)
        assert fp8["cache_dtype"] == "fp8" and bf16_info["cache_dtype"] == "bf16"
        assert fp8["block_size"] == "16"
        assert int(fp8["num_blocks"]) * 16 >= 4096
        assert int(fp8["bytes_per_token"]) * 2 * (latent + rope) == \
            int(bf16_info["bytes_per_token"]) * fp8_row
    finally:
        assert s.stop() == 0


def test_api_key_is_required_when_set(model_dir):
    from conftest import Server
    from openai import OpenAI
    s = Server(model_dir, "--api-key", "sekrit", "--kv-cache-tokens", "4096")
    try:
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0)
        assert good.models.list().data[0].id == "sy-test"
        assert s.request("GET", "/health")[0] == 200  # probes need no key
    finally:
        assert s.stop() == 0


def test_priority_scheduling(server, client, model_dir):
    """--scheduling-policy priority with one running slot: an urgent request (priority -1, vLLM's
    field) sent while a long one (priority 1) streams takes its slot and finishes while the long
    one goes on; the long one, preempted and recomputed, loses nothing (its greedy text is what
    it is alone). Under first come, first served a priority is
    refused by name."""
    from conftest import Server
    from openai import OpenAI
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="sy-test", prompt="x", max_tokens=2,
                                  extra_body={"priority": -1})
    assert "--scheduling-policy priority" in str(info.value), info.value
    s = Server(model_dir, "--kv-cache-tokens", "8192", "--max-num-seqs", "1",
               "--scheduling-policy", "priority")
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        long_args = dict(model="sy-test", prompt="ROMEO:", max_tokens=1500, temperature=0,
                         extra_body={"ignore_eos": True, "priority": 1})
        alone = c.completions.create(**long_args).choices[0].text
        preempted = s.metric("num_preemptions_total")
        stream = c.completions.create(**long_args, stream=True)
        text = next(iter(stream)).choices[0].text  # the long request is running
        urgent = c.completions.create(model="sy-test", prompt="JULIET:", max_tokens=4,
                                      temperature=0, extra_body={"ignore_eos": True,
                                                                 "priority": -1})
        assert urgent.usage.completion_tokens == 4
        rest = [chunk.choices[0].text for chunk in stream]
        assert text + "".join(rest) == alone
        # It took the long one's slot (nothing else preempts with this cache) and was done
        # while the long one went on.
        assert s.metric("num_preemptions_total") == preempted + 1 and rest
        # OpenAI's service_tier: "flex" runs after the default tier here, and the response says
        # which tier served it; a server without priorities serves every tier as the default.
        flex = c.chat.completions.create(model="sy-test", messages=[{"role": "user",
                                                                     "content": "hi"}],
                                         max_tokens=2, service_tier="flex")
        assert flex.service_tier == "flex"
        assert client.chat.completions.create(
            model="sy-test", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            service_tier="priority").service_tier == "default"
        assert c.responses.create(model="sy-test", input="hi", max_output_tokens=2,
                                  service_tier="priority").service_tier == "priority"
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_a_queued_stream_gets_keepalive_comments(model_dir):
    """--sse-keepalive-seconds: a stream that waits (here queued behind a long request holding the
    only running slot) gets SSE comment lines until its data comes, and the official client
    skips them: its text is the unqueued request's."""
    import http.client
    from conftest import Server
    from openai import OpenAI
    s = Server(model_dir, "--kv-cache-tokens", "8192", "--max-num-seqs", "1",
               "--sse-keepalive-seconds", "0.1")
    try:
        c = OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=300)
        blocker = dict(model="sy-test", prompt="ROMEO:", max_tokens=1500, temperature=0,
                       extra_body={"ignore_eos": True}, stream=True)
        body = {"model": "sy-test", "prompt": "JULIET:", "max_tokens": 4, "temperature": 0,
                "ignore_eos": True}
        args = {**{k: v for k, v in body.items() if k != "ignore_eos"},
                "extra_body": {"ignore_eos": True}}
        expected = c.completions.create(**args).choices[0].text
        running = c.completions.create(**blocker)
        next(iter(running))  # it holds the slot
        conn = http.client.HTTPConnection(s.host, s.port, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        lines = [line.decode() for line in conn.getresponse()]
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        assert ": keep-alive\n" in lines[:first_data], lines[:first_data + 1]
        text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines
                       if line.startswith("data: {"))
        assert text == expected
        for _ in running:
            pass
        running = c.completions.create(**blocker)
        next(iter(running))
        streamed = c.completions.create(**args, stream=True)
        assert "".join(chunk.choices[0].text for chunk in streamed) == expected
        for _ in running:
            pass
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_bench_serve_reports_vllms_keys(server):
    out = subprocess.run(
        [BINARY, "bench", "serve", "--url", server.url, "--num-prompts", "12", "--input-len", "40",
         "--output-len", "6", "--concurrency", "4", "--dataset", "shared-prefix", "--json",
         "--goodput-e2el-ms", "60000"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out)
    assert result["completed"] == 12
    assert result["total_output_tokens"] == 12 * 6
    for key in ("duration", "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
                "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_e2el_ms", "input_lens",
                "output_lens", "ttfts", "itls", "errors"):
        assert key in result, key
    assert result["request_goodput"] == result["request_throughput"]
    assert 0 < result["median_ttft_ms"] <= result["median_e2el_ms"]
    assert all(e == "" for e in result["errors"])
    # A request the server refuses is reported with the server's own message (ids beyond the
    # model's vocabulary here), not the HTTP reader's.
    out = subprocess.run(
        [BINARY, "bench", "serve", "--url", server.url, "--num-prompts", "2", "--input-len", "8",
         "--output-len", "2", "--vocab-size", "100000", "--seed", "3", "--json"],
        check=True, capture_output=True, text=True).stdout
    refused = json.loads(out)
    assert refused["completed"] == 0
    assert all(e.startswith("HTTP 400: ") and "is not a token id" in e for e in refused["errors"]), \
        refused["errors"]
