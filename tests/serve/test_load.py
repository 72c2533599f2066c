"""The server under load and abuse: 512 concurrent streams, clients that hang up, a soak of
2,000 requests with random parameters, SIGTERM while serving, and real Prometheus scraping."""

import concurrent.futures
import http.client
import json
import os
import random
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

from openai import OpenAI

from conftest import TMP, Server, assert_sigterm_drains


def wait_idle(server, timeout=60):
    """Waits for no running or waiting request and no held cache page."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (server.metric("num_requests_running") == 0 and
                server.metric("num_requests_waiting") == 0 and
                server.metric("kv_cache_usage_perc") == 0):
            return True
        time.sleep(0.05)
    return False


def thread_count(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def test_512_concurrent_streams_with_a_fixed_set_of_threads(server):
    """512 streams open at once: 256 long ones running (the server's --max-num-seqs), then 256
    short ones waiting with their connections held. The short ones complete once the long ones
    hang up (their requests aborted); the server keeps the threads it had when idle (no thread
    per connection) and every page comes back."""
    half = 256
    # Threads started on first use (the kernel pool's) are there after one request.
    server.request("POST", "/v1/completions", {"model": "sy-test", "prompt": "x", "max_tokens": 1})
    idle_threads = thread_count(server.pid)
    aborted_before = server.metric("request_success_total", finished_reason="abort")
    clients = [OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
               for _ in range(2 * half)]
    hang_up = threading.Event()

    def long_one(i):
        # Far longer than the test: it ends only when this client hangs up.
        stream = clients[i].completions.create(
            model="sy-test", prompt=f"Long {i}: ", max_tokens=1500, stream=True, seed=i,
            extra_body={"ignore_eos": True})
        for _ in stream:
            if hang_up.is_set():
                break
        stream.close()

    def short_one(i):
        chunks = list(clients[i].completions.create(
            model="sy-test", prompt=f"Short {i}: ", max_tokens=8, stream=True, seed=i,
            extra_body={"ignore_eos": True}))
        return chunks[-1].choices[0].finish_reason

    def wait_for(condition, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline and not condition():
            time.sleep(0.02)
        return condition()

    with concurrent.futures.ThreadPoolExecutor(max_workers=2 * half) as pool:
        longs = [pool.submit(long_one, i) for i in range(half)]
        assert wait_for(lambda: server.metric("num_requests_running") == half)
        shorts = [pool.submit(short_one, half + i) for i in range(half)]
        # Nothing can finish while the long ones run: all 512 are in flight together.
        assert wait_for(lambda: server.metric("num_requests_running") +
                        server.metric("num_requests_waiting") == 2 * half)
        assert thread_count(server.pid) == idle_threads
        hang_up.set()
        for f in longs:
            f.result()
        assert [f.result() for f in shorts] == ["length"] * half
    assert thread_count(server.pid) == idle_threads
    assert wait_for(lambda: server.metric("request_success_total", finished_reason="abort") ==
                    aborted_before + half)
    assert wait_idle(server)


def test_a_client_that_hangs_up_has_its_request_aborted(server):
    before = server.metric("request_success_total", finished_reason="abort")
    for stream in (True, False):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        body = json.dumps({"model": "sy-test", "prompt": "Go on and on", "max_tokens": 20000,
                           "stream": stream, "extra_body": {}, "ignore_eos": True})
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        if stream:
            response = connection.getresponse()
            response.fp.readline()  # the first event arrives, then the client goes
        else:
            time.sleep(0.3)
        connection.sock.close()
        connection.close()
    deadline = time.time() + 30
    while time.time() < deadline and \
            server.metric("request_success_total", finished_reason="abort") < before + 2:
        time.sleep(0.05)
    assert server.metric("request_success_total", finished_reason="abort") == before + 2
    assert wait_idle(server)


def test_soak_of_2000_random_requests_holds_memory_flat(server):
    rng = random.Random(2026)
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)

    def one(seed):
        r = random.Random(seed)
        common = dict(model="sy-test", max_tokens=r.randint(0, 8), temperature=r.choice([0, 0.5, 1.0]),
                      top_p=r.choice([1.0, 0.9, 0.5]), seed=r.randint(0, 1 << 30),
                      n=r.choice([1, 1, 2]), stop=r.choice([None, ["e"], ["the", "\n"]]),
                      extra_body={"top_k": r.choice([-1, 5, 50]), "min_p": r.choice([0, 0.1]),
                                  "repetition_penalty": r.choice([1.0, 1.2])})
        prompt = "".join(r.choice("abcdefg hijk ,.") for _ in range(r.randint(1, 300)))
        if r.random() < 0.5:
            stream = r.random() < 0.5
            out = client.completions.create(prompt=prompt, stream=stream,
                                            logprobs=r.choice([None, 1]), **common)
            if stream:
                list(out)
        else:
            stream = r.random() < 0.5
            out = client.chat.completions.create(
                messages=[{"role": "user", "content": prompt}], stream=stream, **common)
            if stream:
                list(out)
        return True

    def batch(seeds):
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            assert all(pool.map(one, seeds))

    batch([rng.randint(0, 1 << 30) for _ in range(300)])  # warm-up: caches and pools fill
    assert wait_idle(server)
    rss_before = server.rss_bytes()
    batch([rng.randint(0, 1 << 30) for _ in range(1700)])
    assert wait_idle(server)
    growth = server.rss_bytes() - rss_before
    assert growth < 64 << 20, f"resident memory grew {growth / 2**20:.1f} MiB over 1,700 requests"


def test_sigterm_finishes_running_requests_and_exits_zero(model_dir):
    assert_sigterm_drains(Server(model_dir, "--kv-cache-tokens", "4096"), 200)


def test_prometheus_scrapes_metrics(server):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed (scripts/setup.sh installs it)"
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    client.completions.create(model="sy-test", prompt="Counted", max_tokens=2)
    workdir = os.path.join(TMP, "prometheus")
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n"
                "  - job_name: switchyard\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{server.port}']\n")
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        web_port = sock.getsockname()[1]
    process = subprocess.Popen(
        [prometheus, f"--config.file={workdir}/prometheus.yml", f"--storage.tsdb.path={workdir}/data",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        query = urllib.parse.quote('sum(switchyard:request_success_total{job="switchyard"})')
        value = None
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{web_port}/api/v1/query?query={query}", timeout=5) as r:
                    data = json.loads(r.read())
                if data["data"]["result"]:
                    value = float(data["data"]["result"][0]["value"][1])
                    if value > 0:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        assert value and value > 0, "Prometheus never saw a finished request"
        # A labelled counter of the HTTP front, as a dashboard would query it.
        query = urllib.parse.quote(
            'switchyard:http_requests_total{job="switchyard",handler="/v1/completions",'
            'method="POST",status="2xx"}')
        with urllib.request.urlopen(
                f"http://127.0.0.1:{web_port}/api/v1/query?query={query}", timeout=5) as r:
            data = json.loads(r.read())
        assert float(data["data"]["result"][0]["value"][1]) >= 1, data
    finally:
        process.terminate()
        process.wait(timeout=30)
