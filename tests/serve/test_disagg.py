"""Prefill/decode disaggregation (serve --role, route --prefill-engines/--decode-engines), every
process started here on the trained default model: the disaggregated output equals the colocated
output (greedy text and log-probability bits, chat and completions, streamed and not; MTP on,
greedy and seeded; prefill and decode jobs of other mpirun layouts); a corrupted transfer is
refused and redone; kill -9 of a prefill and of a decode instance under
load loses nothing; the transfer and per-pool metrics count what happened."""

import concurrent.futures
import os
import signal
import time

import pytest

from conftest import (BINARY, REPO, TRAINED, Server, client_for, start_instance, start_router,
                      stop_all, streams_interrupted)


def instance(role, *extra, env=None):
    """(process, gRPC address) of a one-process serve instance of `role`."""
    s = start_instance(None, *extra, role=role, env=env)
    return s, s.grpc[0]


PROMPTS = ["ROMEO: But soft, what light through yonder window breaks?", "KING HENRY:",
           "To be, or not to be, that is the question: " * 12, "JULIET: O Romeo, Romeo!"]


def answers(client, logprobs=True):
    """Each prompt's greedy answer four ways: completions and chat, streamed and not."""
    out = []
    for p in PROMPTS:
        args = dict(model="sy-test", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
        c = client.completions.create(prompt=p, logprobs=2 if logprobs else None, **args)
        choice = c.choices[0]
        out.append(("completion", choice.text,
                    choice.logprobs.token_logprobs if logprobs else None,
                    choice.logprobs.top_logprobs if logprobs else None))
        text = "".join(ch.choices[0].text for ch in
                       client.completions.create(prompt=p, stream=True, **args))
        out.append(("completion streamed", text))
        messages = [{"role": "user", "content": p}]
        chat = client.chat.completions.create(messages=messages, logprobs=logprobs or None,
                                              top_logprobs=2 if logprobs else None, **args)
        entries = chat.choices[0].logprobs.content if logprobs else []
        out.append(("chat", chat.choices[0].message.content,
                    [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                     for e in entries]))
        text = ""
        for ch in client.chat.completions.create(messages=messages, stream=True, **args):
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
        out.append(("chat streamed", text))
    return out


def colocated_and_split(procs, *flags):
    """A colocated instance behind a router of its own, and a prefill and a decode instance
    behind theirs, all with `flags` and added to procs (the caller stops them): (prefill, decode,
    the split router, the colocated one's router)."""
    colocated, c_addr = instance("both", *flags)
    procs.append(colocated)
    prefill, p_addr = instance("prefill", *flags)
    procs.append(prefill)
    decode, d_addr = instance("decode", *flags)
    procs.append(decode)
    split = start_router(prefill=[p_addr], decode=[d_addr])
    procs.append(split)
    together = start_router([c_addr])
    procs.append(together)
    return prefill, decode, split, together


@pytest.mark.parametrize("mode", [[], ["--batch-invariant"]], ids=["default", "batch-invariant"])
def test_disaggregated_output_equals_colocated(mode):
    procs = []
    try:
        prefill, decode, split, together = colocated_and_split(procs, *mode)
        want = answers(client_for(together))
        got = answers(client_for(split))
        for w, g in zip(want, got):
            assert g == w, f"{w[0]}: disaggregated {g[1:]!r} vs colocated {w[1:]!r}"
        # Every request went through a transfer, counted on both sides and by the router.
        sent = prefill.metric("kv_transfers_total", side="send")
        received = decode.metric("kv_transfers_total", side="receive")
        assert sent == received == len(want), (sent, received, "".join(split.log),
                                               "".join(decode.log), "".join(prefill.log))
        assert decode.metric("kv_transfer_bytes_total", side="receive") > 0
        assert decode.metric("kv_transfers_refused_total", side="receive") == 0
        m = split.metrics()
        assert m['switchyard:router_time_to_first_token_seconds_count{model_name="sy-test",'
                 'pool="prefill"}'] == len(want)
        assert m['switchyard:router_inter_token_latency_seconds_count{model_name="sy-test",'
                 'pool="decode"}'] == len(want) * 22  # 24 tokens: the first from the prefill
        assert decode.metric("generation_tokens_total") == len(want) * 23
    finally:
        stop_all(procs)


def seeded(client):
    """Each prompt sampled with a seed (temperature, top-p, a presence penalty), as completions
    and as a streamed chat, all at once (each request's draws depend on its seed alone)."""
    def one(item):
        i, p = item
        args = dict(model="sy-test", max_tokens=24, temperature=0.8, top_p=0.95, seed=100 + i,
                    presence_penalty=0.3, extra_body={"ignore_eos": True})
        text = client.completions.create(prompt=p, **args).choices[0].text
        chat = ""
        for ch in client.chat.completions.create(messages=[{"role": "user", "content": p}],
                                                 stream=True, **args):
            if ch.choices and ch.choices[0].delta.content:
                chat += ch.choices[0].delta.content
        return text, chat
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, enumerate(PROMPTS)))


def greedy_at_once(client, logprobs=False):
    """Each prompt's greedy completion (with its log-probabilities), all at once."""
    args = dict(model="sy-test", max_tokens=24, temperature=0, extra_body={"ignore_eos": True},
                logprobs=2 if logprobs else None)

    def one(p):
        c = client.completions.create(prompt=p, **args).choices[0]
        return (c.text, c.logprobs.token_logprobs, c.logprobs.top_logprobs) if logprobs else c.text
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, PROMPTS))


MTP = ["--speculative", "mtp", "--num-speculative-tokens", "2"]


def test_mtp_on_both_sides_gives_the_colocated_output_greedy_and_seeded():
    """The prefill instance's drafts travel with the rows: the decode instance verifies them in its
    first step as the colocated engine does, so seeded sampling draws the colocated tokens."""
    procs = []
    try:
        prefill, decode, split, together = colocated_and_split(procs, *MTP)
        want = answers(client_for(together), logprobs=False)
        assert answers(client_for(split), logprobs=False) == want
        want = seeded(client_for(together))
        got = seeded(client_for(split))
        for i, (w, g) in enumerate(zip(want, got)):
            assert g == w, f"prompt {i}: disaggregated {g!r} vs colocated {w!r}"
        assert decode.metric("spec_decode_num_accepted_tokens_total") > 0
    finally:
        stop_all(procs)


# Prefill and decode as jobs of other layouts: an mpirun job of 2 ranks (expert parallelism, a DP
# group per rank, each group's gRPC port its own instance to the router) on one side, one process
# on the other. Every process keeps f32 products and exchanges f32 rows: expert parallelism sums
# the experts' rows in another order than one process does, equal in f32 to ~1e-7
# (test_mpi_serving.py), so tokens are compared across layouts in the default mode; under
# --batch-invariant the log-probability bits are compared too (the last four cases, two with MTP:
# its drafts are verified in steps whose rows are computed as in any other step). TP layouts are
# compared in tokens only: a TP group sums each product's partial sums across its ranks, in
# another order than one process's single sum, so their last bits differ from a TP 1 colocated
# process's by design, and equal to a colocated TP 2 group's (the last case).
# The TP cases: one DP group of TP 2, whose two ranks both install the received rows (decode)
# or whose first rank reports the rows both computed (prefill).
@pytest.mark.parametrize("prefill_ranks,prefill_tp,decode_ranks,decode_tp,extra", [
    (2, 1, 1, 1, []), (1, 1, 2, 1, MTP), (2, 1, 1, 1, MTP), (2, 1, 2, 2, []), (2, 2, 2, 1, []),
    (2, 1, 1, 1, ["--batch-invariant"]), (1, 1, 2, 1, ["--batch-invariant"]),
    (2, 1, 1, 1, [*MTP, "--batch-invariant"]), (1, 1, 2, 1, [*MTP, "--batch-invariant"]),
    (2, 2, 2, 2, [*MTP, "--batch-invariant"])],
    ids=["prefill_ep2-decode_1", "prefill_1-decode_ep2-mtp", "prefill_ep2-decode_1-mtp",
         "prefill_ep2-decode_tp2", "prefill_tp2-decode_ep2", "prefill_ep2-decode_1-bits",
         "prefill_1-decode_ep2-bits", "prefill_ep2-decode_1-mtp-bits",
         "prefill_1-decode_ep2-mtp-bits", "prefill_tp2-decode_tp2-mtp-bits-against_tp2"])
def test_prefill_and_decode_jobs_of_other_layouts_give_the_colocated_output(
        prefill_ranks, prefill_tp, decode_ranks, decode_tp, extra):
    exact = ["--f32-products", "--wire-dtype", "f32", *extra]
    procs = []
    try:
        # TP 2 on both sides is compared with a colocated TP 2 group: the same sums, so the
        # same bits.
        tp2 = prefill_tp == decode_tp == 2
        colocated = start_instance(None, *exact, role="both", ranks=2 if tp2 else 1,
                                   tp=2 if tp2 else 1)
        procs.append(colocated)
        prefill = start_instance(None, *exact, role="prefill", ranks=prefill_ranks, tp=prefill_tp)
        procs.append(prefill)
        decode = start_instance(None, *exact, role="decode", ranks=decode_ranks, tp=decode_tp)
        procs.append(decode)
        split = start_router(policy="round_robin", prefill=prefill.grpc, decode=decode.grpc)
        together = start_router(colocated.grpc)
        procs += [split, together]
        bits = "--batch-invariant" in extra
        want = greedy_at_once(client_for(together), bits), seeded(client_for(together))
        got = greedy_at_once(client_for(split), bits), seeded(client_for(split))
        assert got[0] == want[0], "greedy (and log-probability bits): disaggregated vs colocated"
        assert got[1] == want[1], "seeded: disaggregated vs colocated"
        # Every DP group of the job took part: its rows left from, or reached, its own engine.
        status, engines, _ = split.request("GET", "/admin/engines")
        routed = {e["engine"]: e["routed_total"] for e in engines["engines"]}
        assert min(routed.values()) > 0, routed
        # A decode job's groups each receive their own rows: one listener per group (on its
        # first rank), never one for the whole job.
        receivers = [e.get("transfer_address") for e in engines["engines"]
                     if e["pool"] == "decode"]
        assert len(receivers) == decode_ranks // decode_tp and all(receivers), engines
        assert len(set(receivers)) == len(receivers), receivers
        requests = len(PROMPTS) * 3
        assert prefill.metric("kv_transfers_total", side="send") == requests
        assert decode.metric("kv_transfers_total", side="receive") == requests
        assert decode.metric("kv_transfers_refused_total", side="receive") == 0
        if "mtp" in extra:
            assert decode.metric("spec_decode_num_accepted_tokens_total") > 0
    finally:
        stop_all(procs)


# Also into a decode job of two DP groups, each receiving on its first rank: a refused transfer
# ends its decode call ABORTED from there too.
@pytest.mark.parametrize("decode_ranks", [1, 2], ids=["decode_1", "decode_ep2"])
def test_a_corrupted_transfer_is_refused_and_redone(decode_ranks):
    procs = []
    try:
        colocated, c_addr = instance("both")
        # The test hook: this prefill instance flips a byte in its first two rows messages.
        prefill, p_addr = instance("prefill", env={"SWITCHYARD_TEST_CORRUPT_TRANSFERS": "2"})
        decode = start_instance(None, role="decode", ranks=decode_ranks)
        procs += [colocated, prefill, decode]
        split = start_router(prefill=[p_addr], decode=decode.grpc)
        procs.append(split)
        args = dict(model="sy-test", prompt=PROMPTS[2], max_tokens=30, temperature=0,
                    extra_body={"ignore_eos": True})
        want = client_for(colocated).completions.create(**args).choices[0].text
        assert client_for(split).completions.create(**args).choices[0].text == want
        assert decode.metric("kv_transfers_refused_total", side="receive") >= 2
        assert split.metrics()['switchyard:router_kv_transfers_redone_total{model_name="sy-test",'
                               'pool="decode"}'] == 2
        assert "checksum" in "".join(decode.log)
    finally:
        stop_all(procs)


def test_a_decode_job_lets_go_of_a_request_cancelled_while_its_rows_are_awaited():
    """A decode job's group waits for a request's rows on its first rank; the client goes away
    meanwhile (the prefill instance is stopped, so no row comes): the request leaves the job, the
    rows that come later are dropped, and the job serves the next request as before."""
    procs = []
    try:
        prefill, p_addr = instance("prefill")
        decode = start_instance(None, role="decode", ranks=2)
        procs += [prefill, decode]
        # A stall check shorter than the wait: a group awaiting rows runs no step, and must not
        # look stalled for it.
        split = start_router((), None, "--stall-timeout", "1", prefill=[p_addr],
                             decode=decode.grpc)
        procs.append(split)
        args = dict(model="sy-test", prompt=PROMPTS[2], max_tokens=20, temperature=0,
                    extra_body={"ignore_eos": True})
        want = client_for(split).completions.create(**args).choices[0].text
        prefill.process.send_signal(signal.SIGSTOP)
        try:
            impatient = client_for(split).with_options(timeout=4, max_retries=0)
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                call = pool.submit(lambda: impatient.completions.create(**args))
                deadline = time.time() + 4
                awaited = lambda: decode.metric("kv_transfers_awaited", side="receive")
                while awaited() == 0 and time.time() < deadline:
                    time.sleep(0.05)
                assert awaited() == 1, "the rows were never awaited"
                # Not waiting to be admitted: no step can serve it yet, and a router that saw
                # waiting requests and no steps would eject the job as stalled.
                assert decode.metric("num_requests_waiting") == 0
                with pytest.raises(Exception):
                    call.result()
            deadline = time.time() + 10
            while awaited() > 0 and time.time() < deadline:
                time.sleep(0.05)
            assert awaited() == 0, "the cancelled request stayed"
            assert decode.metric("num_requests_waiting") == 0
        finally:
            prefill.process.send_signal(signal.SIGCONT)
        deadline = time.time() + 30
        while True:  # the router takes the prefill instance back once its probes answer
            try:
                got = client_for(split).completions.create(**args).choices[0].text
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        assert got == want
        assert decode.metric("kv_transfers_total", side="receive") >= 2
        log = "".join(split.log)
        assert not any(f"{a} ejected" in log for a in decode.grpc), log
    finally:
        stop_all(procs)


def test_kill_9_of_a_prefill_and_of_a_decode_instance_under_load_loses_nothing():
    procs = []
    try:
        colocated, c_addr = instance("both")
        p1, p1_addr = instance("prefill")
        p2, p2_addr = instance("prefill")
        d1, d1_addr = instance("decode")
        d2, d2_addr = instance("decode")
        procs += [colocated, p1, p2, d1, d2]
        split = start_router(policy="round_robin", prefill=[p1_addr, p2_addr],
                             decode=[d1_addr, d2_addr])
        procs.append(split)
        client = client_for(split)
        prompts = [f"{name}: " + "Now is the winter of our discontent " * (8 + 3 * i)
                   for i, name in enumerate(["ROMEO", "KING HENRY", "JULIET", "HAMLET", "LEAR",
                                             "OTHELLO"])]
        args = dict(model="sy-test", max_tokens=300, temperature=0,
                    extra_body={"ignore_eos": True})
        with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
            reference = list(pool.map(
                lambda p: client_for(colocated).completions.create(prompt=p, **args)
                .choices[0].text, prompts))

        def kill(p):
            p.process.kill()
            p.process.wait()

        # A decode instance dies with streams in flight on it.
        results = streams_interrupted(client, prompts, args, lambda: kill(d1), 5)
        for i, (text, finish) in enumerate(results):
            assert finish == "length", i
            assert text == reference[i], f"stream {i} differs after the decode instance died"
        assert f"{d1_addr} ejected" in "".join(split.log)
        # A prefill instance dies with prompts on it: stopped first (SIGSTOP), so that they are
        # certainly there when it is killed.
        p1.process.send_signal(signal.SIGSTOP)

        def kill_when_busy():
            deadline = time.time() + 60
            while time.time() < deadline:
                _, engines, _ = split.request("GET", "/admin/engines")
                if next(e for e in engines["engines"] if e["engine"] == p1_addr)["in_flight"] > 0:
                    break
                time.sleep(0.01)
            kill(p1)

        results = streams_interrupted(client, prompts, args, kill_when_busy, 0)
        for i, (text, finish) in enumerate(results):
            assert finish == "length", i
            assert text == reference[i], f"stream {i} differs after the prefill instance died"
        assert f"{p1_addr} ejected" in "".join(split.log)
    finally:
        stop_all(procs)
    assert "(0 failovers)" not in "".join(split.log)


def test_roles_are_checked():
    procs = []
    try:
        colocated, c_addr = instance("both")
        decode, d_addr = instance("decode")
        procs += [colocated, decode]
        # A colocated instance in the prefill pool is never used: the router names why.
        import subprocess
        out = subprocess.run([BINARY, "route", "--port", "0", "--prefill-engines", c_addr,
                              "--decode-engines", d_addr, "--wait", "2"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        assert "--role both" in out.stderr and "--prefill-engines" in out.stderr, out.stderr
        out = subprocess.run([BINARY, "serve", "--role", "decode", "--port", "0"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "--grpc-port" in out.stderr, out.stderr
    finally:
        stop_all(procs)


def test_prefill_on_one_emulated_host_decode_on_another_router_on_a_third():
    """scripts/netns-cluster.sh: three network namespaces on a bridge; the rows cross real TCP
    links (UCX_TLS=tcp: the namespaces share one kernel, whose shared memory UCX would use)."""
    import subprocess
    netns = os.path.join(REPO, "scripts", "netns-cluster.sh")
    up = subprocess.run(["bash", netns, "up", "3"], capture_output=True, text=True)
    if up.returncode != 0:
        pytest.skip("cannot create network namespaces: " + up.stderr[-300:])
    procs = []
    try:
        def on(host, *args):
            return Server(None, command=["ip", "netns", "exec", f"sy-host{host}", "env",
                                         "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0", BINARY, *args])

        for h, role in ((0, "prefill"), (1, "decode")):
            procs.append(on(h, "--threads", "1", "serve", "--model", TRAINED, "--host",
                            f"10.77.0.{h + 1}", "--port", "0", "--grpc-port", "50051",
                            "--role", role, "--served-model-name", "sy-test"))
        assert "ucx://10.77.0.2:" in "".join(procs[1].log)
        split = on(2, "route", "--prefill-engines", "10.77.0.1:50051", "--decode-engines",
                   "10.77.0.2:50051", "--host", "10.77.0.3", "--port", "0",
                   "--served-model-name", "sy-test", "--probe-interval", "0.1")
        procs.append(split)
        colocated, _ = instance("both")
        procs.append(colocated)
        args = dict(model="sy-test", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
        for p in PROMPTS:
            want = client_for(colocated).completions.create(prompt=p, **args).choices[0].text
            assert client_for(split).completions.create(prompt=p, **args).choices[0].text == want
        assert procs[1].metric("kv_transfers_total", side="receive") == len(PROMPTS)
    finally:
        stop_all(procs)
        subprocess.run(["bash", netns, "down", "3"], capture_output=True)


def test_a_decode_job_across_two_emulated_hosts_receives_each_groups_rows_on_its_host():
    """A decode job of two ranks, one per emulated host (scripts/netns-cluster.sh mpirun): each DP
    group's first rank listens on its own host — rank 1 cannot bind rank 0's --transfer-host and
    takes its own address toward it — so the prefill instance on a third host sends group 1's
    rows straight to host 1, not through rank 0."""
    import subprocess
    netns = os.path.join(REPO, "scripts", "netns-cluster.sh")
    up = subprocess.run(["bash", netns, "up", "4"], capture_output=True, text=True)
    if up.returncode != 0:
        pytest.skip("cannot create network namespaces: " + up.stderr[-300:])
    exact = ["--f32-products", "--wire-dtype", "f32"]  # EP sums as one process's, to ~1e-7
    ucx = ["env", "UCX_TLS=tcp", "UCX_NET_DEVICES=eth0", BINARY, "--threads", "1"]
    procs = []
    try:
        decode = Server(None, command=[
            "bash", netns, "mpirun", "2", *ucx, "serve", "--model", TRAINED, "--host", "10.77.0.1",
            "--port", "0", "--grpc-port", "50051", "--role", "decode", "--served-model-name",
            "sy-test", *exact])
        procs.append(decode)
        log = "".join(decode.log)
        assert "ucx://10.77.0.1:" in log and "ucx://10.77.0.2:" in log, log
        procs.append(Server(None, command=[
            "ip", "netns", "exec", "sy-host2", *ucx, "serve", "--model", TRAINED, "--host",
            "10.77.0.3", "--port", "0", "--grpc-port", "50051", "--role", "prefill",
            "--served-model-name", "sy-test", *exact]))
        split = Server(None, command=[
            "ip", "netns", "exec", "sy-host3", BINARY, "route", "--prefill-engines",
            "10.77.0.3:50051", "--decode-engines", "10.77.0.1:50051,10.77.0.1:50052", "--host",
            "10.77.0.4", "--port", "0", "--served-model-name", "sy-test", "--probe-interval",
            "0.1", "--api-key", "x"])  # the key the clients send; admin off this host needs one
        procs.append(split)
        colocated = start_instance(None, *exact, role="both")
        procs.append(colocated)
        want = greedy_at_once(client_for(colocated))
        got = []
        for _ in range(2):  # at once: the router spreads them over both groups
            got.append(greedy_at_once(client_for(split)))
        assert got == [want, want]
        status, engines, _ = split.request("GET", "/admin/engines",
                                           headers={"Authorization": "Bearer x"})
        assert status == 200, engines
        decoders = {e["engine"]: e for e in engines["engines"] if e["pool"] == "decode"}
        assert decoders["10.77.0.1:50052"]["transfer_address"].startswith("10.77.0.2:"), engines
        assert min(e["routed_total"] for e in decoders.values()) > 0, engines
        assert decode.metric("kv_transfers_total", side="receive") == 2 * len(PROMPTS)
    finally:
        stop_all(procs)
        subprocess.run(["bash", netns, "down", "4"], capture_output=True)
