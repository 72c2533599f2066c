"""OpenAI's Files and Batch APIs through the official client: a JSONL file uploaded with
files.create, a batch run beside live traffic, its output and error files read back; each
line's response equal to the same request sent live (greedy); bad files fail the batch naming
their lines; cancelling keeps what finished; a batch past its completion window expires, keeping what
finished; with --files-dir, files and batches outlive a kill -9 (test_route.py runs a batch
through the router)."""

import io
import json
import os
import time

import anthropic
import openai
import pytest

from conftest import Server

GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


def jsonl(lines):
    return io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode())


def chat_line(custom_id, content, **extra):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "sy-test", "messages": [{"role": "user", "content": content}],
                     **GREEDY, **extra}}


def long_tales_batch(client, count):
    """A chat batch of `count` lines of 400 tokens each, created: long enough to still be running
    when a test cancels it, crowds it out or lets it expire."""
    lines = [chat_line(f"long{i}", f"Tell a long tale, {i}.", max_tokens=400)
             for i in range(count)]
    uploaded = client.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 completion_window="24h")


def wait(client, batch_id, statuses=("completed", "failed", "cancelled"), timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def lines_of(client, file_id):
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_chat_batch_gives_the_live_answers(server, client):
    prompts = ["Who art thou?", "Speak, speak!", "What news?", "Good morrow."]
    lines = [chat_line(f"q{i}", p) for i, p in enumerate(prompts)]
    lines.append(chat_line("two", prompts[0], n=2, temperature=0.8, seed=5))
    lines.append(chat_line("bad", "x", temperature=1e6))
    lines.append(chat_line("streamed", "x", stream=True))
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.filename == "requests.jsonl"
    assert uploaded.bytes == len(jsonl(lines).getvalue())
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch").data]

    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status in ("validating", "in_progress", "completed")
    assert batch.metadata == {"job": "nightly"}
    # Live traffic is served while the batch runs.
    live = client.chat.completions.create(model="sy-test", messages=[
        {"role": "user", "content": prompts[1]}], **{k: v for k, v in GREEDY.items()
                                                     if k != "ignore_eos"},
        extra_body={"ignore_eos": True})
    done = wait(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (7, 5, 2)
    assert done.completed_at >= done.in_progress_at >= done.created_at
    assert batch.id in [b.id for b in client.batches.list().data]

    out = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    assert set(out) == {"q0", "q1", "q2", "q3", "two"}
    for i, prompt in enumerate(prompts):
        want = client.chat.completions.create(
            model="sy-test", messages=[{"role": "user", "content": prompt}], temperature=0,
            max_tokens=8, extra_body={"ignore_eos": True}).choices[0].message.content
        line = out[f"q{i}"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["id"] == line["response"]["request_id"]
        assert body["choices"][0]["message"]["content"] == want
        assert body["usage"]["completion_tokens"] == 8
    assert out["q1"]["response"]["body"]["choices"][0]["message"]["content"] == \
        live.choices[0].message.content
    two = out["two"]["response"]["body"]["choices"]
    assert [c["index"] for c in two] == [0, 1]

    errors = {line["custom_id"]: line for line in lines_of(client, done.error_file_id)}
    assert set(errors) == {"bad", "streamed"}
    assert errors["bad"]["response"]["status_code"] == 400
    assert errors["bad"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"

    # Files go when deleted; a deleted one is a 404.
    assert client.files.delete(done.error_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(done.error_file_id)


def test_a_completions_batch(server, client):
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "sy-test", "prompt": p, **GREEDY}}
             for i, p in enumerate(["ROMEO:", "JULIET:"])]
    uploaded = client.files.create(file=("c.jsonl", jsonl(lines)), purpose="batch")
    done = wait(client, client.batches.create(input_file_id=uploaded.id,
                                              endpoint="/v1/completions",
                                              completion_window="24h").id)
    assert done.status == "completed" and done.error_file_id is None
    for line in lines_of(client, done.output_file_id):
        prompt = "ROMEO:" if line["custom_id"] == "c0" else "JULIET:"
        want = client.completions.create(model="sy-test", prompt=prompt, temperature=0,
                                         max_tokens=8, extra_body={"ignore_eos": True})
        assert line["response"]["body"]["choices"][0]["text"] == want.choices[0].text


def test_a_responses_batch(server, client):
    """/v1/responses lines: each Response object the one the live endpoint gives (stateless:
    store: true and background are refused per line)."""
    inputs = ["Tell me of the king.", "Who comes here?"]
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": "sy-test", "input": text, "max_output_tokens": 6,
                       "temperature": 0, "store": False}}
             for i, text in enumerate(inputs)]
    lines.append({"custom_id": "stored", "method": "POST", "url": "/v1/responses",
                  "body": {"model": "sy-test", "input": "x", "store": True}})
    lines.append({"custom_id": "later", "method": "POST", "url": "/v1/responses",
                  "body": {"model": "sy-test", "input": "x", "background": True,
                           "store": False}})
    uploaded = client.files.create(file=("r.jsonl", jsonl(lines)), purpose="batch")
    done = wait(client, client.batches.create(input_file_id=uploaded.id,
                                              endpoint="/v1/responses",
                                              completion_window="24h").id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    out = {line["custom_id"]: line for line in lines_of(client, done.output_file_id)}
    for i, text in enumerate(inputs):
        body = out[f"r{i}"]["response"]["body"]
        assert body["object"] == "response" and body["id"].startswith("resp_")
        live = client.responses.create(model="sy-test", input=text, max_output_tokens=6,
                                       temperature=0, store=False)
        assert body["status"] == live.status  # "incomplete": max_output_tokens cut it
        assert body["output"][0]["content"][0]["text"] == live.output_text
    errors = {line["custom_id"]: line for line in lines_of(client, done.error_file_id)}
    assert set(errors) == {"stored", "later"}
    assert errors["later"]["response"]["body"]["error"]["param"] == "background"


def test_bad_files_fail_the_batch_naming_their_lines(server, client):
    good = chat_line("a", "hi")
    lines = [good, chat_line("a", "again"), {**chat_line("b", "x"), "url": "/v1/completions"},
             {"custom_id": "c", "method": "GET", "url": "/v1/chat/completions", "body": {}}]
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(
        b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b"not json\n")),
        purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert batch.status == "failed"
    assert [(e.line, e.param) for e in batch.errors.data] == \
        [(2, "custom_id"), (3, "url"), (4, "method"), (5, None)]
    assert batch.request_counts.total == 0
    # Requests refused by field before anything runs.
    for kwargs, param in [({"endpoint": "/v1/embeddings"}, "endpoint"),
                          ({"completion_window": "1h"}, "completion_window"),
                          ({"input_file_id": "file-nothing"}, "input_file_id")]:
        args = dict(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                    completion_window="24h")
        args.update(kwargs)
        with pytest.raises(openai.APIStatusError) as info:
            client.batches.create(**args)
        assert info.value.body["param"] == param, info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", jsonl([good])), purpose="fine-tune")
    assert info.value.body["param"] == "purpose"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nothing")
    status, body, _ = server.request("POST", "/v1/files", raw=b"not multipart")
    assert status == 400 and body["error"]["param"] == "file"


def test_cancelling_keeps_what_finished(server, client):
    batch = long_tales_batch(client, 12)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait(client, batch.id, timeout=60)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts.completed < 12
    finished = lines_of(client, done.output_file_id) if done.output_file_id else []
    assert len(finished) == done.request_counts.completed
    with pytest.raises(openai.APIStatusError) as info:
        client.batches.cancel(batch.id)
    assert info.value.status_code == 409
    # The server still answers.
    assert client.completions.create(model="sy-test", prompt="x", max_tokens=2).choices


def test_live_requests_run_before_a_batch(model_dir):
    """A batch's lines run behind live traffic: with every slot taken by long lines, a live
    request takes a line's place (the line is recomputed later, losing nothing) and finishes
    before any line does. /metrics shows the batch's lines running, waiting and ended."""
    server = Server(model_dir, "--max-num-seqs", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                               timeout=120)
        batch = long_tales_batch(client, 4)
        deadline = time.time() + 60
        while server.metric("num_requests_running") < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert server.metric("num_requests_running") == 2
        # /metrics: the batch's lines in the engine and behind it.
        assert server.metric("batches_running") == 1
        assert server.metric("batch_requests_running") == 2
        assert server.metric("batch_requests_waiting") == 2
        live = client.chat.completions.create(
            model="sy-test", messages=[{"role": "user", "content": "Hail!"}], max_tokens=4,
            temperature=0, extra_body={"ignore_eos": True})
        assert live.usage.completion_tokens == 4
        assert client.batches.retrieve(batch.id).request_counts.completed == 0
        assert server.metric("num_preemptions_total") >= 1
        done = wait(client, batch.id)
        assert done.request_counts.completed == 4
        assert server.metric("batch_requests_total", outcome="succeeded") == 4
        assert server.metric("batch_requests_total", outcome="errored") == 0
        assert server.metric("batches_running") == 0
        assert server.metric("batch_requests_running") == 0
        for line in lines_of(client, done.output_file_id):  # the preempted line lost nothing
            assert line["response"]["body"]["usage"]["completion_tokens"] == 400
    finally:
        assert server.stop() == 0


def test_files_and_batches_off_and_through_the_router(model_dir):
    off = Server(model_dir, "--files-mb", "0")
    try:
        status, body, _ = off.request("GET", "/v1/batches")
        assert status == 404 and "--files-mb" in body["error"]["message"]
        status, body, _ = off.request("GET", "/v1/messages/batches")  # in Anthropic's shape
        assert status == 404 and body["type"] == "error"
        assert body["error"]["type"] == "not_found_error" and "--files-mb" in body["error"]["message"]
    finally:
        assert off.stop() == 0
    # An upload may be larger than other bodies (32 MiB): up to the files' budget.
    big = Server(model_dir, "--files-mb", "40")
    try:
        client = openai.OpenAI(base_url=big.url + "/v1", api_key="x", max_retries=0, timeout=120)
        size = 36 << 20
        uploaded = client.files.create(file=("big.jsonl", io.BytesIO(b"\n" * size)),
                                       purpose="batch")
        assert uploaded.bytes == size
        assert len(client.files.content(uploaded.id).content) == size
        with pytest.raises(openai.APIStatusError) as info:
            client.files.create(file=("bigger.jsonl", io.BytesIO(b"\n" * (42 << 20))),
                                purpose="batch")
        assert info.value.status_code == 413
        status, body, _ = big.request("POST", "/v1/completions", raw=b" " * (33 << 20))
        assert status == 413 and "files" not in body["error"]["message"]
    finally:
        assert big.stop() == 0
    # A file larger than the budget is refused, saying so.
    small = Server(model_dir, "--files-mb", "0.001")
    try:
        client = openai.OpenAI(base_url=small.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.files.create(file=("big.jsonl", io.BytesIO(b"x" * 5000)), purpose="batch")
        assert info.value.status_code == 413 and "--files-mb" in info.value.body["message"]
        # A message batch's requests count against the same budget.
        with pytest.raises(anthropic.APIStatusError) as info:
            claude_for(small).messages.batches.create(
                requests=[message_request(f"r{i}", "x" * 100) for i in range(20)])
        assert info.value.status_code == 413
        assert info.value.body["error"]["type"] == "request_too_large"
        assert "--files-mb" in info.value.body["error"]["message"]
    finally:
        assert small.stop() == 0


def test_files_and_batches_outlive_the_process(model_dir, tmp_path):
    """--files-dir: after kill -9 mid-batch, a new process reads the files and batches back; the
    batch runs on from its first line without a result, every line answered once and as live
    (greedy); a finished batch's files and a deleted file stay as they were; one process at a
    time holds the directory."""
    keep = str(tmp_path / "kept")
    first = Server(model_dir, "--files-dir", keep, "--max-num-seqs", "2")
    client = openai.OpenAI(base_url=first.url + "/v1", api_key="x", max_retries=0, timeout=120)
    small_input = client.files.create(file=("small.jsonl", jsonl([chat_line("k", "Hail!")])),
                                      purpose="batch")
    gone = client.files.create(file=("gone.jsonl", jsonl([chat_line("g", "Hail!")])),
                               purpose="batch")
    assert client.files.delete(gone.id).deleted
    small = wait(client, client.batches.create(input_file_id=small_input.id,
                                               endpoint="/v1/chat/completions",
                                               completion_window="24h").id)
    assert small.status == "completed"

    prompts = [f"Tell a tale of the {i}th night." for i in range(10)]
    lines = [chat_line(f"t{i}", p, max_tokens=48) for i, p in enumerate(prompts)]
    tales = client.files.create(file=("tales.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=tales.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.time() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 3 and \
            time.time() < deadline:
        time.sleep(0.02)
    first.process.kill()  # kill -9, two lines in flight
    first.process.wait()
    first.stopped = True
    with open(f"{keep}/batches/{batch.id}.json") as f:
        assert json.load(f)["status"] == "in_progress"
    with open(f"{keep}/batches/{batch.id}.lines.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert 3 <= len(logged) < 10, "the batch was not interrupted mid-way"
    # What finished before the kill, by custom_id: its response's id (not run again after).
    before = {entry["record"]["custom_id"]: entry["record"]["response"]["request_id"]
              for entry in logged}

    second = Server(model_dir, "--files-dir", keep)
    try:
        with pytest.raises(AssertionError) as info:
            Server(model_dir, "--files-dir", keep)
        assert "another process keeps its files there" in str(info.value)
        client = openai.OpenAI(base_url=second.url + "/v1", api_key="x", max_retries=0,
                               timeout=120)
        kept = {f.id: f for f in client.files.list().data}
        assert small_input.id in kept and tales.id in kept and gone.id not in kept
        assert kept[tales.id].filename == "tales.jsonl" and kept[tales.id].bytes == \
            len(jsonl(lines).getvalue())
        assert lines_of(client, small.output_file_id)[0]["custom_id"] == "k"
        assert client.batches.retrieve(small.id).status == "completed"

        done = wait(client, batch.id)
        assert done.status == "completed", done
        assert (done.request_counts.total, done.request_counts.completed) == (10, 10)
        out = lines_of(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in out) == sorted(f"t{i}" for i in range(10))
        ids = {line["custom_id"]: line["response"]["request_id"] for line in out}
        assert all(ids[custom_id] == before[custom_id] for custom_id in before)
        for line in out:
            prompt = prompts[int(line["custom_id"][1:])]
            want = client.chat.completions.create(
                model="sy-test", messages=[{"role": "user", "content": prompt}], temperature=0,
                max_tokens=48, extra_body={"ignore_eos": True}).choices[0].message.content
            assert line["response"]["body"]["choices"][0]["message"]["content"] == want
        # A finished batch's log goes; its state stays.
        assert not os.path.exists(f"{keep}/batches/{batch.id}.lines.jsonl")
    finally:
        assert second.stop() == 0

    # Damaged state is named at start, not lost in silence.
    with open(f"{keep}/batches/{batch.id}.json", "w") as f:
        f.write("{not json")
    with pytest.raises(AssertionError) as info:
        Server(model_dir, "--files-dir", keep)
    assert f"{batch.id}.json: not a batch" in str(info.value)


# Anthropic's Message Batches API (client.messages.batches) on the same runner.
GREEDY_MESSAGES = {"temperature": 0}  # not in the SDK's signature: sent as an extra field

def claude_for(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def message_request(custom_id, content, **extra):
    return {"custom_id": custom_id,
            "params": {"model": "sy-test", "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "user", "content": content}], **extra}}


def wait_ended(claude, batch_id, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = claude.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.2)
    raise AssertionError(f"message batch {batch_id} still {batch.processing_status}")


def test_a_message_batch_gives_the_live_answers(server):
    """Each succeeded result is the Message the live endpoint gives (greedy); requests the
    Messages API refuses are errored results in its error shape; the batch is listed, its
    results_url absolute, its files hidden from the Files API, and it goes when deleted."""
    claude = claude_for(server)
    prompts = ["Who art thou?", "Speak, speak!", "What news?"]
    requests = [message_request(f"m{i}", p) for i, p in enumerate(prompts)]
    requests.append(message_request("hot", "x", temperature=1e6))
    requests.append(message_request("streamed", "x", stream=True))
    requests.append(message_request("threaded", "x", thread={"type": "create"}))
    batch = claude.messages.batches.create(requests=requests)
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status in ("in_progress", "ended")
    assert batch.expires_at > batch.created_at and batch.archived_at is None
    counts = batch.request_counts
    assert counts.processing + counts.succeeded + counts.errored + counts.canceled == 6
    # Live traffic is served while the batch runs.
    live = claude.messages.create(model="sy-test", max_tokens=8, messages=[
        {"role": "user", "content": prompts[0]}], extra_body=GREEDY_MESSAGES)
    done = wait_ended(claude, batch.id)
    assert done.ended_at is not None and done.cancel_initiated_at is None
    assert (done.request_counts.processing, done.request_counts.succeeded,
            done.request_counts.errored, done.request_counts.canceled,
            done.request_counts.expired) == (0, 3, 3, 0, 0)
    assert done.results_url == f"{server.url}/v1/messages/batches/{batch.id}/results"
    assert batch.id in [b.id for b in claude.messages.batches.list().data]

    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert set(results) == {"m0", "m1", "m2", "hot", "streamed", "threaded"}
    for i, prompt in enumerate(prompts):
        want = claude.messages.create(model="sy-test", max_tokens=8, messages=[
            {"role": "user", "content": prompt}], extra_body=GREEDY_MESSAGES)
        got = results[f"m{i}"]
        assert got.type == "succeeded"
        assert got.message.id.startswith("msg_") and got.message.model == "sy-test"
        assert [b.text for b in got.message.content] == [b.text for b in want.content]
        assert got.message.stop_reason == want.stop_reason == "max_tokens"
        assert got.message.usage.output_tokens == 8
    assert results["m0"].message.content[0].text == live.content[0].text
    for custom_id, field in [("hot", "temperature"), ("streamed", "stream"),
                             ("threaded", "thread")]:
        assert results[custom_id].type == "errored"
        error = results[custom_id].error
        assert error.type == "error" and error.error.type == "invalid_request_error"
        assert field in error.error.message, (custom_id, error.error.message)

    # Its requests and results are the Message Batches API's, not the Files API's.
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    assert not [f for f in client.files.list().data if f.filename.startswith(batch.id)]

    deleted = claude.messages.batches.delete(batch.id)
    assert deleted.id == batch.id and deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.retrieve(batch.id)
    status, body, _ = server.request("GET", f"/v1/messages/batches/{batch.id}/results")
    assert status == 404 and body["error"]["type"] == "not_found_error"


def test_message_batches_refused_listed_and_cancelled(server):
    """A create body Anthropic would refuse is a 400 naming the request and field, before
    anything runs; the list pages both ways; a cancel stops what has not run, which comes back as
    canceled results; a batch is deleted only once it has ended, and its results come only
    then."""
    claude = claude_for(server)
    good = message_request("a", "hi")
    for requests, where in [([], "requests"),
                            ([good, {**good, "params": {**good["params"]}}], "requests.1.custom_id"),
                            ([{**good, "custom_id": "has space"}], "requests.0.custom_id"),
                            ([{**good, "custom_id": "x" * 65}], "requests.0.custom_id"),
                            ([{"custom_id": "p", "params": "hi"}], "requests.0.params"),
                            ([{**good, "extra": 1}], "requests.0.extra")]:
        with pytest.raises(anthropic.BadRequestError) as info:
            claude.messages.batches.create(requests=requests)
        assert info.value.body["error"]["type"] == "invalid_request_error"
        assert info.value.body["error"]["message"].startswith(where), info.value.body
    status, body, _ = server.request("POST", "/v1/messages/batches", raw=b"{not json")
    assert status == 400 and body["type"] == "error"
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.retrieve("msgbatch_nothing")

    # Three short batches, then a long one to cancel.
    short = [claude.messages.batches.create(requests=[message_request(f"s{i}", "Hail!")]).id
             for i in range(3)]
    long = claude.messages.batches.create(requests=[
        message_request(f"long{i}", f"Tell a long tale, {i}.", max_tokens=400)
        for i in range(12)])
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.batches.delete(long.id)
    assert "cancel it" in info.value.body["error"]["message"]
    status, body, _ = server.request("GET", f"/v1/messages/batches/{long.id}/results")
    assert status == 400 and "still processing" in body["error"]["message"]
    with pytest.raises(anthropic.AnthropicError) as no_results:
        claude.messages.batches.results(long.id)
    assert "results_url" in str(no_results.value)

    newest_first = [long.id] + short[::-1]
    page = claude.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    assert page.first_id == newest_first[0] and page.last_id == newest_first[1]
    older = claude.messages.batches.list(limit=2, after_id=page.last_id)
    assert [b.id for b in older.data] == newest_first[2:4]
    newer = claude.messages.batches.list(limit=1, before_id=newest_first[2])
    assert [b.id for b in newer.data] == [newest_first[1]] and newer.has_more
    # The SDK's auto-pagination walks every page.
    walked = [b.id for b in claude.messages.batches.list(limit=2)]
    assert walked[:4] == newest_first and len(walked) == len(set(walked))

    cancelling = claude.messages.batches.cancel(long.id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    done = wait_ended(claude, long.id, timeout=60)
    counts = done.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.canceled == 12
    assert counts.errored == 0 and counts.processing == 0
    results = list(claude.messages.batches.results(long.id))
    assert sorted(r.custom_id for r in results) == sorted(f"long{i}" for i in range(12))
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    assert claude.messages.batches.cancel(long.id).processing_status == "ended"
    assert claude.messages.batches.delete(long.id).type == "message_batch_deleted"
    for batch_id in short:
        assert wait_ended(claude, batch_id).request_counts.succeeded == 1
    # The server still answers.
    assert claude.messages.create(model="sy-test", max_tokens=2, messages=[
        {"role": "user", "content": "x"}]).content


def test_message_batches_outlive_the_process(model_dir, tmp_path):
    """--files-dir: a message batch killed (-9) mid-way runs on in the next process, each request
    answered once and as live; an ended batch keeps its results and drops its requests; output
    files that an end interrupted before its state was saved are not left behind."""
    keep = str(tmp_path / "kept")
    first = Server(model_dir, "--files-dir", keep, "--max-num-seqs", "2")
    claude = claude_for(first)
    small = wait_ended(claude, claude.messages.batches.create(
        requests=[message_request("k", "Hail!")]).id)
    prompts = [f"Tell a tale of the {i}th night." for i in range(10)]
    batch = claude.messages.batches.create(requests=[
        message_request(f"t{i}", p, max_tokens=48) for i, p in enumerate(prompts)])
    deadline = time.time() + 120
    while claude.messages.batches.retrieve(batch.id).request_counts.succeeded < 3 and \
            time.time() < deadline:
        time.sleep(0.02)
    first.process.kill()
    first.process.wait()
    first.stopped = True
    with open(f"{keep}/batches/{batch.id}.lines.jsonl") as f:
        logged = [json.loads(line) for line in f]
    assert 3 <= len(logged) < 10, "the batch was not interrupted mid-way"
    before = {entry["record"]["custom_id"]: entry["record"]["result"]["message"]["id"]
              for entry in logged}
    # As if the process had died inside the batch's end: its results file written, its state
    # not yet saved.
    with open(f"{keep}/files/file-leftover.content", "w") as f:
        f.write("{}\n")
    with open(f"{keep}/files/file-leftover.json", "w") as f:
        json.dump({"id": "file-leftover", "filename": f"{batch.id}_results.jsonl",
                   "purpose": "message_batch_results", "created_at": 1, "bytes": 3}, f)
    def contents():
        return sum(name.endswith(".content") for name in os.listdir(f"{keep}/files"))

    # The ended batch keeps its results alone (its requests went with its end); the running one
    # its requests; and the leftover.
    assert contents() == 3

    second = Server(model_dir, "--files-dir", keep)
    try:
        assert any("removed file-leftover" in line for line in second.log)
        claude = claude_for(second)
        assert [r.custom_id for r in claude.messages.batches.results(small.id)] == ["k"]
        done = wait_ended(claude, batch.id)
        assert (done.request_counts.succeeded, done.request_counts.errored) == (10, 0)
        results = list(claude.messages.batches.results(batch.id))
        assert sorted(r.custom_id for r in results) == sorted(f"t{i}" for i in range(10))
        ids = {r.custom_id: r.result.message.id for r in results}
        assert all(ids[custom_id] == before[custom_id] for custom_id in before)
        for r in results:
            want = claude.messages.create(model="sy-test", max_tokens=48, messages=[
                {"role": "user", "content": prompts[int(r.custom_id[1:])]}],
                extra_body=GREEDY_MESSAGES)
            assert r.result.message.content[0].text == want.content[0].text
        assert not os.path.exists(f"{keep}/files/file-leftover.json")
        assert contents() == 2  # each ended batch's results, nothing else
    finally:
        assert second.stop() == 0


def test_batches_expire_when_their_window_runs_out(model_dir, tmp_path):
    """--batch-completion-window: a batch still running when its window runs out expires. What
    finished stays in the output (OpenAI) or results (Anthropic); the lines in flight and those
    never started are each reported once — OpenAI's batch_expired error lines, Anthropic's
    "expired" results — and the counts add up. With --files-dir the expired batch is read back
    as it ended."""
    # 64 lines of 400 tokens a batch, two batches sharing one slot: far more than any CPU runs
    # in the two seconds.
    keep = str(tmp_path / "kept")
    server = Server(model_dir, "--batch-completion-window", "2", "--max-num-seqs", "1",
                    "--files-dir", keep)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                               timeout=120)
        batch = long_tales_batch(client, 64)
        assert batch.expires_at == batch.created_at + 2
        claude = claude_for(server)
        message_batch = claude.messages.batches.create(requests=[
            message_request(f"m{i}", f"Tell a tale, {i}.", max_tokens=400) for i in range(64)])
        done = wait(client, batch.id, statuses=("completed", "expired", "failed"), timeout=120)
        assert done.status == "expired", done
        assert done.expired_at >= done.expires_at
        counts = done.request_counts
        assert counts.total == 64 and counts.completed + counts.failed == 64
        assert counts.failed > 0
        finished = lines_of(client, done.output_file_id) if done.output_file_id else []
        assert len(finished) == counts.completed
        for line in finished:  # what finished is whole
            assert line["response"]["body"]["usage"]["completion_tokens"] == 400
        expired = lines_of(client, done.error_file_id)
        assert len(expired) == counts.failed
        for line in expired:
            assert line["response"] is None
            assert line["error"]["code"] == "batch_expired", line
        assert sorted(line["custom_id"] for line in finished + expired) == \
            sorted(f"long{i}" for i in range(64))

        ended = wait_ended(claude, message_batch.id, timeout=120)
        assert ended.request_counts.expired > 0
        assert ended.request_counts.processing == 0
        assert (ended.request_counts.succeeded + ended.request_counts.errored +
                ended.request_counts.canceled + ended.request_counts.expired) == 64
        results = list(claude.messages.batches.results(message_batch.id))
        assert sorted(r.custom_id for r in results) == sorted(f"m{i}" for i in range(64))
        assert sum(r.result.type == "expired" for r in results) == ended.request_counts.expired
        assert server.metric("batch_requests_total", outcome="expired") == \
            counts.failed + ended.request_counts.expired
        # The server still answers.
        assert client.completions.create(model="sy-test", prompt="x", max_tokens=2).choices
    finally:
        assert server.stop() == 0
    again = Server(model_dir, "--files-dir", keep)
    try:
        client = openai.OpenAI(base_url=again.url + "/v1", api_key="x", max_retries=0)
        kept = client.batches.retrieve(batch.id)
        assert kept.status == "expired" and kept.request_counts == done.request_counts
        kept_message = claude_for(again).messages.batches.retrieve(message_batch.id)
        assert kept_message.request_counts == ended.request_counts
    finally:
        assert again.stop() == 0
