"""switchyard route over three instances (serve --grpc-port), all started here: prefix-aware
routing against round robin on a shared-prefix workload; kill -9 of an instance with streams in
flight, which must all complete with the text they would have had; readmission of the restarted
instance; bad input through the router."""

import concurrent.futures
import json
import os
import random
import signal
import subprocess
import time

import pytest
# Process, free_port and start_instance are imported from here by other tests too.
from conftest import (BINARY, REPO, TRAINED, Process, Server, client_for, free_port,  # noqa: F401
                      start_instance, start_router, streams_interrupted)

@pytest.fixture(scope="module")
def instances():
    ports = [free_port() for _ in range(3)]
    procs = [start_instance(p) for p in ports]
    yield ports, procs
    for p in procs:
        p.stop()


def passages():
    with open(os.path.join(REPO, "configs", "bench", "heldout-prompts.jsonl")) as f:
        return [json.loads(line)["text"] for line in f]


def shared_prefix_run(router, texts, seed):
    """Six documents with four questions each, shuffled, one at a time: (cached share of the
    prompt tokens, prompt tokens computed). One at a time so that the shares follow from the
    order and the policy: three at a time, two questions on one document could both arrive
    before either was cached, and the cache-aware share moved between 0.51 and 0.66 from run to
    run (once under the 0.15 margin); one at a time round robin gives 0.31 every run and cache
    aware 0.62-0.66."""
    docs = [texts[2 * i] + texts[2 * i + 1] for i in range(6)]
    work = [(d, q) for d in range(6) for q in range(4)]
    random.Random(seed).shuffle(work)
    client = client_for(router)

    def ask(item):
        d, q = item
        out = client.completions.create(
            model="sy-test", prompt=docs[d] + f"\nQuestion {q}: who speaks here, and why?\n",
            max_tokens=8, temperature=0)
        return out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens

    usage = [ask(item) for item in work]
    prompt = sum(p for p, _ in usage)
    cached = sum(c for _, c in usage)
    # The questions on a document asked before, and how many of them found it cached (the
    # document is most of the prompt; a miss recomputes all of it).
    repeats = [k for k, (d, _) in enumerate(work) if any(d2 == d for d2, _ in work[:k])]
    hits = sum(1 for k in repeats if usage[k][1] > usage[k][0] // 2)
    return cached / prompt, prompt - cached, hits, len(repeats)


def test_cache_aware_routing_reuses_prefixes_round_robin_does_not(instances):
    """One request at a time, so every instance is idle when the next is routed: cache aware must
    send each question on a document asked before to the instance that holds it, however the
    probes fall (every 0.1 s, or one at the start and none during the run). It once did not: a
    request that had ended since the last probe still weighed on its instance, and the next
    question on its document went elsewhere or not by timing (cached shares 0.47-0.66 where
    every repeat hitting gives 0.70)."""
    ports, _ = instances
    texts = passages()
    results = {}
    # Each run gets its own documents: the instances' caches are shared between the runs.
    for offset, run, policy, probe in [(0, "round_robin", "round_robin", 0.1),
                                       (12, "cache_aware", "cache_aware", 0.1),
                                       (24, "cache_aware, probes 60 s apart", "cache_aware", 60)]:
        router = start_router(ports, policy, probe_interval=probe)
        try:
            results[run] = shared_prefix_run(router, texts[offset:offset + 12], seed=offset)
        finally:
            assert router.stop() == 0, "".join(router.log)
    print("; ".join(f"{run}: cached share {share:.2f}, prompt tokens computed {computed}, repeats "
                    f"cached {hits}/{repeats}" for run, (share, computed, hits, repeats)
                    in results.items()))
    rr_share, rr_computed, _, _ = results["round_robin"]
    for run in ("cache_aware", "cache_aware, probes 60 s apart"):
        share, computed, hits, repeats = results[run]
        assert hits == repeats, run
        assert share > 0.5 and share > rr_share + 0.15, run
        assert computed < rr_computed, run


def readmitted(router, address, timeout=60):
    """Waits for the router's second 'ADDRESS serving' line: the instance is back in use."""
    deadline = time.time() + timeout
    while "".join(router.log).count(f"{address} serving") < 2 and time.time() < deadline:
        time.sleep(0.1)
    return "".join(router.log).count(f"{address} serving") >= 2


def test_kill_9_under_load_loses_nothing_and_the_instance_is_readmitted(instances):
    ports, procs = instances
    router = start_router(ports, "round_robin")  # two streams on each instance, for certain
    try:
        client = client_for(router)
        prompts = ["ROMEO: But soft", "KING HENRY: Now, lords", "To be, or not to be",
                   "JULIET: O Romeo", "HAMLET: Words, words", "First Citizen: Before we"]
        args = dict(model="sy-test", max_tokens=600, temperature=0,
                    extra_body={"ignore_eos": True})
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            reference = list(pool.map(
                lambda p: client.completions.create(prompt=p, **args).choices[0].text, prompts))

        def kill():  # kill -9, streams in flight
            procs[0].process.kill()
            procs[0].process.wait()

        results = streams_interrupted(client, prompts, args, kill)
        for i, (text, finish) in enumerate(results):
            assert finish == "length", i
            assert text == reference[i], f"stream {i} differs after the failover"
        assert "ejected" in "".join(router.log)
        status, _ = http_get(router.url + "/health")
        assert status == 200

        # The instance comes back on its port: the router readmits it and sends it work.
        procs[0] = start_instance(ports[0])
        readmitted(router, f"127.0.0.1:{ports[0]}")
        for i in range(6):
            client.completions.create(model="sy-test", prompt=f"Again {i}", max_tokens=4)
        assert procs[0].metric("generation_tokens_total") > 0
    finally:
        code = router.stop()
        assert code == 0, "".join(router.log)
    assert "failovers" in "".join(router.log) and "(0 failovers)" not in "".join(router.log)


def http_get(url):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_bad_input_through_the_router_gets_the_servers_errors(instances):
    ports, procs = instances
    # One "instance" is an HTTP port, not the gRPC API: it answers garbage to every probe and is
    # never trusted; the three real ones serve.
    router = start_router(ports + [procs[0].port], "cache_aware")
    try:
        import urllib.error
        import urllib.request

        def post(url, body):
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        for body in [{"model": "sy-test", "prompt": [1, 2, 99999], "max_tokens": 2},
                     {"model": "sy-test", "prompt": "hi", "max_tokens": 100000},
                     {"model": "sy-test", "prompt": "hi", "top_p": 0},
                     {"model": "sy-test", "prompt": "hi", "priority": -1}]:  # fcfs instances
            via_router = post(router.url, body)
            direct = post(procs[1].url, body)
            assert via_router[0] == direct[0] == 400, (via_router, direct)
            assert via_router[1]["error"]["message"] == direct[1]["error"]["message"]
        # ignore_eos: each ends by its length (a sampled end-of-sequence token within 3 tokens
        # once made it 5 of 6 "length" below).
        for i in range(6):
            ok = post(router.url, {"model": "sy-test", "prompt": f"ROMEO {i}:", "max_tokens": 3,
                                   "ignore_eos": True})
            assert ok[0] == 200
        # What stopped a request (vLLM's stop_reason) comes through the router as directly.
        greedy = {"model": "sy-test", "prompt": "ROMEO:", "max_tokens": 8, "temperature": 0,
                  "ignore_eos": True}
        text = post(procs[1].url, greedy)[1]["choices"][0]["text"]
        stopped = {**greedy, "stop": [text[2:5]]}
        via_router, direct = post(router.url, stopped), post(procs[1].url, stopped)
        assert via_router[1]["choices"][0]["stop_reason"] == text[2:5]
        assert via_router[1]["choices"][0]["text"] == direct[1]["choices"][0]["text"]
        # The three real ones serve (a probe missed on a loaded machine ejects one for a second).
        deadline = time.time() + 30
        while True:
            status, engines = http_get(router.url + "/admin/engines")
            states = json.loads(engines)["engines"]
            if [e["healthy"] for e in states] == [True, True, True, False] or time.time() > deadline:
                break
            time.sleep(0.2)
        assert [e["healthy"] for e in states] == [True, True, True, False], "".join(router.log)
        assert states[3]["routed_total"] == 0
        # The router's own latency histograms: what its clients saw.
        m = router.metrics()
        assert m['switchyard:time_to_first_token_seconds_count{model_name="sy-test"}'] >= 6
        assert m['switchyard:request_success_total{model_name="sy-test",finished_reason="length"}'] >= 6
    finally:
        assert router.stop() == 0, "".join(router.log)


def test_priorities_pass_through_to_instances_that_schedule_by_them():
    """An instance with --scheduling-policy priority says so in its Health answer; a router whose
    instances all do takes vLLM's priority field and sends it on."""
    port = free_port()
    instance = start_instance(port, "--scheduling-policy", "priority")
    router = start_router([port])
    try:
        out = client_for(router).completions.create(
            model="sy-test", prompt="ROMEO:", max_tokens=3, temperature=0,
            extra_body={"priority": -5, "ignore_eos": True})
        assert out.usage.completion_tokens == 3
        assert instance.metric("request_success_total", finished_reason="length") == 1
    finally:
        router.stop()
        instance.stop()


def test_stored_responses_live_in_the_router(instances):
    """The Responses store belongs to the HTTP front: through the router (round robin, so each
    turn goes to another instance) a previous_response_id chain continues, the same as the
    conversation sent whole, and the stored response is retrieved from the router."""
    ports, _ = instances
    router = start_router(ports, "round_robin")
    try:
        client = client_for(router)
        first = client.responses.create(model="sy-test", input="Tell me of the king.",
                                         max_output_tokens=6, temperature=0)
        second = client.responses.create(model="sy-test", input="And the queen?",
                                          previous_response_id=first.id, max_output_tokens=6,
                                          temperature=0)
        whole = [{"role": "user", "content": "Tell me of the king."}]
        whole += [item.model_dump(exclude_none=True) for item in first.output]
        whole += [{"role": "user", "content": "And the queen?"}]
        stateless = client.responses.create(model="sy-test", input=whole, max_output_tokens=6,
                                            temperature=0, store=False)
        assert second.output_text == stateless.output_text
        assert second.usage.input_tokens == stateless.usage.input_tokens
        assert client.responses.retrieve(second.id).model_dump() == second.model_dump()
    finally:
        router.stop()


def test_a_batch_through_the_router(instances, tmp_path):
    """The Files and Batch APIs belong to the HTTP front too: a batch uploaded to the router runs
    its lines on the instances (round robin), each answer the one the router gives live; so does
    an Anthropic message batch. With --files-dir the next router finds both."""
    import io
    import anthropic
    ports, _ = instances
    keep = str(tmp_path / "kept")
    router = start_router(ports, "round_robin", "--files-dir", keep)
    try:
        client = client_for(router)
        prompts = ["Tell me of the king.", "And the queen?", "Who comes here?"]
        lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": "sy-test", "prompt": p, "max_tokens": 6, "temperature": 0}}
                 for i, p in enumerate(prompts)]
        uploaded = client.files.create(file=("r.jsonl", io.BytesIO(
            "".join(json.dumps(line) + "\n" for line in lines).encode())), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                      completion_window="24h")
        for _ in range(600):
            batch = client.batches.retrieve(batch.id)
            if batch.status not in ("validating", "in_progress", "finalizing"):
                break
            time.sleep(0.1)
        assert batch.status == "completed" and batch.request_counts.completed == 3, batch
        out = {json.loads(line)["custom_id"]: json.loads(line)
               for line in client.files.content(batch.output_file_id).text.splitlines()}
        for i, p in enumerate(prompts):
            live = client.completions.create(model="sy-test", prompt=p, max_tokens=6,
                                             temperature=0)
            assert out[f"r{i}"]["response"]["body"]["choices"][0]["text"] == live.choices[0].text

        claude = anthropic.Anthropic(base_url=router.url, api_key="x", max_retries=0, timeout=120)
        message_batch = claude.messages.batches.create(requests=[
            {"custom_id": f"m{i}", "params": {"model": "sy-test", "max_tokens": 6,
                                              "temperature": 0,
                                              "messages": [{"role": "user", "content": p}]}}
            for i, p in enumerate(prompts)])
        for _ in range(600):
            message_batch = claude.messages.batches.retrieve(message_batch.id)
            if message_batch.processing_status == "ended":
                break
            time.sleep(0.1)
        assert message_batch.request_counts.succeeded == 3, message_batch
        results = {r.custom_id: r.result for r in claude.messages.batches.results(message_batch.id)}
        for i, p in enumerate(prompts):
            live = claude.messages.create(model="sy-test", max_tokens=6, messages=[
                {"role": "user", "content": p}], extra_body={"temperature": 0})
            assert results[f"m{i}"].message.content[0].text == live.content[0].text
    finally:
        router.stop()
    router = start_router(ports, "round_robin", "--files-dir", keep)
    try:
        client = client_for(router)
        assert client.batches.retrieve(batch.id).status == "completed"
        assert len(client.files.content(batch.output_file_id).text.splitlines()) == 3
        claude = anthropic.Anthropic(base_url=router.url, api_key="x", max_retries=0)
        assert sorted(r.custom_id for r in claude.messages.batches.results(message_batch.id)) == \
            ["m0", "m1", "m2"]
    finally:
        router.stop()


def test_a_beam_search_through_the_router_is_the_instances_own(instances):
    """The router runs a beam search itself, its steps as requests spread over the instances
    (the model's end of sequence learned from their health answers): the beams are those an
    instance's own search finds, ended beams included."""
    ports, procs = instances
    router = start_router(ports, "round_robin")
    try:
        args = dict(model="sy-test", messages=[{"role": "user", "content": "Who is there?"}],
                    max_tokens=24, n=3, extra_body={"use_beam_search": True})
        routed = client_for(router).chat.completions.create(**args)
        direct = client_for(procs[0]).chat.completions.create(**args)
        assert [c.message.content for c in routed.choices] == \
            [c.message.content for c in direct.choices]
        assert [c.finish_reason for c in routed.choices] == \
            [c.finish_reason for c in direct.choices]
        assert len({c.message.content for c in routed.choices}) == 3
    finally:
        router.stop()


def test_anthropic_messages_through_the_router(instances):
    """The router's front is the same HTTP server: Anthropic's Messages API through it, whole and
    streamed, gives the instances' answer, and its errors keep Anthropic's shape."""
    import anthropic
    ports, _ = instances
    router = start_router(ports, "round_robin")
    try:
        claude = anthropic.Anthropic(base_url=router.url, api_key="x", max_retries=0,
                                     timeout=300)
        args = dict(model="sy-test", max_tokens=8, extra_body={"temperature": 0},
                    messages=[{"role": "user", "content": "Tell me of the king."}])
        whole = claude.messages.create(**args)
        with claude.messages.stream(**args) as stream:
            final = stream.get_final_message()
        assert final.content[0].text == whole.content[0].text
        assert whole.stop_reason == final.stop_reason == "max_tokens"
        chat = client_for(router).chat.completions.create(
            model="sy-test", max_tokens=8, temperature=0,
            messages=[{"role": "user", "content": "Tell me of the king."}])
        assert chat.choices[0].message.content == whole.content[0].text
        with pytest.raises(anthropic.NotFoundError) as info:
            claude.messages.create(**{**args, "model": "claude-opus"})
        assert info.value.body["error"]["type"] == "not_found_error"
        # Threads live in the router's front: the tool runner's second turn continues the
        # first whichever instance ran it, and gives the unthreaded runner's replies.
        from test_anthropic import tool_uses, weather_runner
        threaded, calls = weather_runner(claude)
        unthreaded, same_calls = weather_runner(claude, thread=False)
        assert len(calls) == 2 and calls == same_calls
        assert [tool_uses(m) for m in threaded] == [tool_uses(m) for m in unthreaded]
    finally:
        assert router.stop() == 0, "".join(router.log)


def test_a_hung_instance_is_ejected_its_streams_move_and_it_comes_back(instances):
    ports, procs = instances
    router = start_router(ports, "round_robin")
    try:
        client = client_for(router)
        prompts = ["JULIET: O Romeo", "HAMLET: Words", "KING HENRY: Now"]
        args = dict(model="sy-test", max_tokens=500, temperature=0, extra_body={"ignore_eos": True})
        reference = [client.completions.create(prompt=p, **args).choices[0].text for p in prompts]
        try:  # hangs: no probe answers, no tokens
            results = streams_interrupted(
                client, prompts, args, lambda: procs[2].process.send_signal(signal.SIGSTOP))
        finally:
            procs[2].process.send_signal(signal.SIGCONT)
        assert [text for text, _ in results] == reference
        assert f"127.0.0.1:{ports[2]} ejected" in "".join(router.log)
        assert "probes in a row" in "".join(router.log)  # the default --probe-failures 3
        assert readmitted(router, f"127.0.0.1:{ports[2]}"), (
            "".join(router.log) + f"\ninstance (exit {procs[2].process.poll()}):\n"
            + "".join(procs[2].log[-40:]))
    finally:
        assert router.stop() == 0, "".join(router.log)


def test_a_paused_instance_gets_no_new_requests_and_keeps_its_stream(instances):
    """A probe missed (an instance paused, as a loaded machine or a long GC pauses it) keeps new
    requests away while the others serve, and does not eject it: its stream waits and continues
    there, without a failover. --probe-failures 1000 and --stall-timeout 600: however slow the
    machine, no pause in this test reaches them."""
    ports, procs = instances
    router = start_router(ports, "round_robin", "--probe-timeout", "0.3",
                          "--probe-failures", "1000", "--stall-timeout", "600")

    def engines():
        return json.loads(http_get(router.url + "/admin/engines")[1])["engines"]

    def wait_for(predicate):
        deadline = time.time() + 60
        while not predicate() and time.time() < deadline:
            time.sleep(0.05)
        return predicate()

    paused = None
    try:
        client = client_for(router)
        assert wait_for(lambda: all(e["healthy"] for e in engines()))
        args = dict(model="sy-test", prompt="ROMEO:", max_tokens=300, temperature=0,
                    extra_body={"ignore_eos": True})
        reference = client.completions.create(**args).choices[0].text
        chunks = iter(client.completions.create(stream=True, **args))
        text = "".join(next(chunks).choices[0].text for _ in range(5))
        holder = next(i for i, e in enumerate(engines()) if e["in_flight"] == 1)
        paused = procs[holder].process
        paused.send_signal(signal.SIGSTOP)
        assert wait_for(lambda: engines()[holder]["missed_probes"] >= 1), "".join(router.log)
        routed = engines()[holder]["routed_total"]
        for i in range(6):
            out = client.completions.create(model="sy-test", prompt=f"Meanwhile {i}",
                                            max_tokens=3, extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 3
        assert engines()[holder]["routed_total"] == routed  # all went to the other two
        paused.send_signal(signal.SIGCONT)
        paused = None
        rest = list(chunks)
        assert text + "".join(c.choices[0].text for c in rest) == reference
        assert rest[-1].choices[0].finish_reason == "length"
        state = engines()[holder]
        assert state["failovers_from"] == 0 and state["healthy"], state
        assert "ejected" not in "".join(router.log)
        assert "missed a probe" in "".join(router.log)
        # Its probes answer again: it takes requests again.
        assert wait_for(lambda: engines()[holder]["missed_probes"] == 0)
        for i in range(6):
            client.completions.create(model="sy-test", prompt=f"Back {i}", max_tokens=3)
        assert engines()[holder]["routed_total"] > routed
    finally:
        if paused is not None:
            paused.send_signal(signal.SIGCONT)
        assert router.stop() == 0, "".join(router.log)


def test_overload_gets_503_with_retry_after(instances):
    ports, _ = instances
    engines = ",".join(f"127.0.0.1:{p}" for p in ports)
    router = Process("route", "--engines", engines, "--port", "0", "--max-requests", "2",
                     "--served-model-name", "sy-test")
    try:
        client = client_for(router)
        args = dict(model="sy-test", prompt="ROMEO:", max_tokens=1500, temperature=0,
                    extra_body={"ignore_eos": True})
        streams = [client.completions.create(stream=True, **args) for _ in range(2)]
        next(iter(streams[0]))
        next(iter(streams[1]))
        import urllib.error
        import urllib.request
        req = urllib.request.Request(router.url + "/v1/completions",
                                     data=json.dumps({"model": "sy-test", "prompt": "x",
                                                      "max_tokens": 2}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=60)
        assert refused.value.code == 503
        assert refused.value.headers.get("Retry-After")
        for s in streams:
            s.close()
    finally:
        assert router.stop() == 0, "".join(router.log)


def test_an_mpirun_job_of_two_dp_groups_behind_the_router(instances):
    ports, procs = instances
    job = start_instance(None, "--batch-invariant", "--wire-dtype", "f32", ranks=2)
    try:
        assert "".join(job.log).count("grpc://") == 2  # group g on port + g
        router = start_router(job.grpc, "cache_aware")
        try:
            via_job = client_for(router)
            direct = client_for(procs[1])
            for p in ["ROMEO: But soft", "To be, or not to be", "KING HENRY:", "JULIET:"]:
                args = dict(model="sy-test", prompt=p, max_tokens=24, temperature=0)
                assert (via_job.completions.create(**args).choices[0].text ==
                        direct.completions.create(**args).choices[0].text)
            # Each group's cache reaches the router through the job's gather: a long prompt asked
            # again lands on the group that holds it.
            document = passages()[0] * 2
            first = via_job.completions.create(model="sy-test", prompt=document, max_tokens=2)
            time.sleep(0.5)
            again = via_job.completions.create(model="sy-test", prompt=document + " Again?",
                                               max_tokens=2)
            assert first.usage.prompt_tokens_details.cached_tokens == 0
            assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16
            status, engines = http_get(router.url + "/admin/engines")
            routed = [e["routed_total"] for e in json.loads(engines)["engines"]]
            assert len(routed) == 2 and min(routed) > 0, routed  # both groups used
        finally:
            assert router.stop() == 0, "".join(router.log)
    finally:
        job.stop()  # SIGTERM to rank 0: it drains and stops every rank


def test_drain_lets_running_requests_finish_and_sends_nothing_new(instances):
    ports, procs = instances
    router = start_router(ports, "round_robin")
    engine0 = f"127.0.0.1:{ports[0]}"

    def admin(method, path, body=None):
        import urllib.error
        import urllib.request
        req = urllib.request.Request(router.url + path, method=method,
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        client = client_for(router)
        # Round robin's first request goes to the first instance: a long stream there.
        stream = client.completions.create(model="sy-test", prompt="ROMEO:", max_tokens=400,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = [next(chunks) for _ in range(5)]
        assert admin("POST", "/admin/drain", {"engine": engine0}) == \
            (200, {"engine": engine0, "draining": True})
        for i in range(6):
            client.completions.create(model="sy-test", prompt=f"Drained {i}", max_tokens=3)
        rest = list(chunks)
        assert rest[-1].choices[0].finish_reason == "length"  # finished where it ran
        assert len(first) + len(rest) >= 400
        status, engines = admin("GET", "/admin/engines")
        assert status == 200
        assert [e["draining"] for e in engines["engines"]] == [True, False, False]
        assert engines["engines"][0]["routed_total"] == 1
        assert admin("POST", "/admin/drain", {"engine": "nowhere:1"})[0] == 404
        assert admin("POST", "/admin/drain", {"nope": 1})[0] == 400
        assert admin("POST", "/admin/resume", {"engine": engine0})[0] == 200
        for i in range(6):
            client.completions.create(model="sy-test", prompt=f"Back {i}", max_tokens=3)
        assert admin("GET", "/admin/engines")[1]["engines"][0]["routed_total"] > 1
    finally:
        assert router.stop() == 0, "".join(router.log)


def test_instances_on_two_emulated_hosts_and_the_router_on_a_third():
    """scripts/netns-cluster.sh: three network namespaces on a bridge, real TCP between them."""
    netns = os.path.join(REPO, "scripts", "netns-cluster.sh")
    up = subprocess.run(["bash", netns, "up", "3"], capture_output=True, text=True)
    if up.returncode != 0:
        pytest.skip("cannot create network namespaces: " + up.stderr[-300:])
    procs = []
    try:
        def on(host, *args):
            return Server(None, command=["ip", "netns", "exec", f"sy-host{host}", BINARY, *args])

        for h in (0, 1):
            procs.append(on(h, "--threads", "1", "serve", "--model", TRAINED, "--host",
                            f"10.77.0.{h + 1}", "--port", "0", "--grpc-port", "50051",
                            "--batch-invariant", "--served-model-name", "sy-test"))
        router = on(2, "route", "--engines", "10.77.0.1:50051,10.77.0.2:50051", "--host",
                    "10.77.0.3", "--port", "0", "--served-model-name", "sy-test",
                    "--probe-interval", "0.1", "--policy", "round_robin")
        procs.append(router)
        client = client_for(router)
        direct = client_for(procs[1])
        prompts = ["ROMEO: But soft", "KING HENRY: Now, lords", "To be, or not to be",
                   "JULIET: O Romeo"]
        args = dict(model="sy-test", max_tokens=300, temperature=0, extra_body={"ignore_eos": True})
        reference = [direct.completions.create(prompt=p, **args).choices[0].text for p in prompts]
        # Host 0's instance dies; its streams cross to host 1.
        results = streams_interrupted(client, prompts, args, procs[0].process.kill)
        assert [text for text, _ in results] == reference
        assert "10.77.0.1:50051 ejected" in "".join(router.log)
    finally:
        for p in procs:
            p.stop()
        subprocess.run(["bash", netns, "down", "3"], capture_output=True)
