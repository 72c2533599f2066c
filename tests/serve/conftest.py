"""Starts switchyard servers for the client tests: the embedded default model, written fresh by
`switchyard init-model`, served on a free port; instances behind a router (the trained default
model, gRPC on free ports, one process or an mpirun job) and the router itself."""

import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

BINARY = os.environ.get("SWITCHYARD_BINARY", "build/switchyard")
TMP = os.environ.get("SWITCHYARD_TEST_TMP", "/tmp/switchyard-serve-tests")
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRAINED = os.path.join(REPO, "models", "default")


MPIRUN = ["mpirun", "--oversubscribe"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


# Every process a test started, so a failing test shows what each of them printed.
STARTED = []


class Server:
    """A switchyard process serving HTTP: `serve` on model_dir, or any `command` (the router)
    that prints the same 'serving … on http://H:P (pid N; …)' line."""

    def __init__(self, model_dir, *extra, ranks=1, threads=2, command=None):
        STARTED.append(self)
        self.stopped = False
        self.model_dir = model_dir
        launcher = MPIRUN + ["-np", str(ranks)] if ranks > 1 else []
        if command is None:
            command = [BINARY, "--threads", str(threads), "serve", "--model", model_dir,
                       "--port", "0", "--served-model-name", "sy-test", *extra]
        self.process = subprocess.Popen(
            launcher + command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **MPI_ENV})
        deadline = time.time() + 120
        self.port = None
        self.log = []
        while time.time() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.log.append(line)
            if "serving" in line and ("http://" in line or "https://" in line):
                self.scheme = "https" if " on https://" in line else "http"
                self.host, port = line.split(f"{self.scheme}://")[1].split(" ")[0].rsplit(":", 1)
                self.port = int(port)
                self.pid = int(line.split("(pid ")[1].split(";")[0])
                break
        assert self.port, "server did not start:\n" + "".join(self.log)
        self.url = f"{self.scheme}://{self.host}:{self.port}"
        # Keep reading what it prints: the pipe never fills, and the log stays whole.
        self.reader = threading.Thread(target=lambda: self.log.extend(self.process.stdout),
                                       daemon=True)
        self.reader.start()

    def request(self, method, path, body=None, headers=None, raw=None):
        """(status, parsed JSON or text, headers) of one plain HTTP request."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as response:
                status, text, hdrs = response.status, response.read().decode(), response.headers
        except urllib.error.HTTPError as e:
            status, text, hdrs = e.code, e.read().decode(), e.headers
        try:
            return status, json.loads(text), hdrs
        except json.JSONDecodeError:
            return status, text, hdrs

    def metrics(self):
        status, text, _ = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
        return values

    def metric(self, name, **labels):
        label_text = ",".join(['model_name="sy-test"'] + [f'{k}="{v}"' for k, v in labels.items()])
        return self.metrics()[f"switchyard:{name}{{{label_text}}}"]

    def rss_bytes(self):
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def terminate(self):
        """SIGTERM to the serving process (rank 0 under mpirun: it stops every rank; mpirun
        itself, when signalled, reports exit code 1 however cleanly its ranks ended)."""
        os.kill(self.pid, signal.SIGTERM)

    def stop(self):
        self.stopped = True
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # What it printed last (its "stopped" line) is in the log once its output has ended.
        self.reader.join(timeout=30)
        return self.process.returncode


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failure, the end of every started process's output, and whether it is still
    running: a server that died or stalled says why in its own log, not in the test's."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for server in STARTED:
        code = server.process.poll()
        if code is not None and server.stopped:
            continue  # ended by its test, as meant
        state = "running" if code is None else f"exited {code} unasked"
        where = getattr(server, "url", "(not started)")
        report.sections.append((f"{where} {' '.join(server.process.args[3:5])} ({state})",
                                "".join(server.log[-30:])))


@pytest.fixture(scope="session")
def model_dir():
    path = os.path.join(TMP, "model")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        subprocess.run([BINARY, "init-model", "--out", path], check=True, capture_output=True)
    return path


@pytest.fixture(scope="session")
def tool_server(model_dir):
    """The default model with tool_choice "auto" allowed and DeepSeek-V3's call format: the tool
    calling, Responses, Agents SDK and LangChain tests share it."""
    s = Server(model_dir, "--kv-cache-tokens", "16384", "--enable-auto-tool-choice",
               "--tool-call-parser", "deepseek_v3")
    yield s
    assert s.stop() == 0, "".join(s.log)


def calls_begin(server):
    """The id of the token that opens DeepSeek-V3's tool calls, "<｜tool▁calls▁begin｜>": a logit
    bias on it decides between calling and answering where the grammar allows both."""
    status, out, _ = server.request("POST", "/tokenize", {
        "prompt": "<｜tool▁calls▁begin｜>", "add_special_tokens": False})
    assert status == 200 and len(out["tokens"]) == 1, out
    return out["tokens"][0]


@pytest.fixture(scope="session")
def server(model_dir):
    s = Server(model_dir, "--kv-cache-tokens", "32768", "--max-waiting", "4096")
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def assert_sigterm_drains(server, max_tokens):
    """Sends SIGTERM while a request runs: the request must finish and the server exit 0."""
    import threading
    from openai import OpenAI
    client = OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    result = {}

    def run():
        result["out"] = client.completions.create(
            model="sy-test", prompt="Long tale", max_tokens=max_tokens, temperature=0,
            extra_body={"ignore_eos": True})
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    server.terminate()
    thread.join(timeout=120)
    assert server.process.wait(timeout=60) == 0
    assert result["out"].usage.completion_tokens == max_tokens


# Instances behind a router, and the router (test_route.py, test_disagg.py and the tests that
# import these from test_route).

def free_port(count=1):
    """A free port P with P + 1 … P + count - 1 free too (an mpirun job serves DP group g's gRPC
    on P + g). Chosen below the kernel's ephemeral range: a port the kernel handed out and this
    function closed again could be taken by any client's outgoing connection before the server
    binds it (CI once lost a start that way), one below the range only by another bind."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low = 10000 if ephemeral_low > 12000 else 1024
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(low, max(low + 1, ephemeral_low - count))
        try:
            for port in range(base, base + count):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


def Process(*args):
    """A switchyard command serving HTTP (an instance or the router)."""
    return Server(None, command=[BINARY, *args])


def start_instance(grpc_port=None, *extra, role=None, ranks=1, tp=1, env=None):
    """`serve` of the trained default model for a router: one thread per process, gRPC on
    grpc_port (a free one by default), `ranks` > 1 an mpirun job (expert parallelism, a DP group
    per `tp` ranks, group g's gRPC on grpc_port + g). The Server's `grpc` lists the groups'
    addresses.
    The serving default (no --batch-invariant): a failover's recomputation gives the text the
    stream had (one answer per request)."""
    groups = ranks // tp
    for attempt in range(3):
        port = grpc_port or free_port(groups)
        command = [BINARY, "--threads", "1", "serve", "--model", TRAINED, "--port", "0",
                   "--grpc-port", str(port), "--kv-cache-tokens", "16384",
                   "--served-model-name", "sy-test", *(["--role", role] if role else []),
                   *(["--tp", str(tp)] if tp > 1 else []), *extra]
        if env:
            command = ["env", *[f"{k}={v}" for k, v in env.items()], *command]
        try:
            server = Server(None, command=command, ranks=ranks)
        except AssertionError as e:
            # A port of our choosing taken between the choice and the bind: choose again.
            if grpc_port or attempt == 2 or "cannot serve gRPC" not in str(e):
                raise
            continue
        server.grpc = [f"127.0.0.1:{port + g}" for g in range(groups)]
        return server


def start_router(engines=(), policy=None, *extra, prefill=(), decode=(), probe_interval=0.1):
    """`route` over colocated `engines` (gRPC ports or host:port addresses), or over a prefill and
    a decode pool; probes every `probe_interval` seconds."""
    def addresses(items):
        return ",".join(e if isinstance(e, str) else f"127.0.0.1:{e}" for e in items)
    args = ["route", "--port", "0", "--served-model-name", "sy-test",
            "--probe-interval", str(probe_interval), *(["--policy", policy] if policy else []),
            *extra]
    if engines:
        args += ["--engines", addresses(engines)]
    else:
        args += ["--prefill-engines", addresses(prefill), "--decode-engines", addresses(decode)]
    return Process(*args)


def client_for(process):
    from openai import OpenAI
    return OpenAI(base_url=process.url + "/v1", api_key="x", max_retries=0, timeout=300)


def streamed_calls(client, args):
    """A streamed chat completion's tool calls as a client assembles them from the deltas, and
    its finish reason: [{"id", "name", "arguments"}] in index order."""
    calls, finish = {}, None
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                entry["id"] = d.id
            if d.function and d.function.name:
                entry["name"] = d.function.name
            if d.function and d.function.arguments:
                entry["arguments"] += d.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


def stop_all(procs):
    for p in procs:
        if p.process.poll() is None:
            p.stop()


def streams_interrupted(client, prompts, args, interrupt, after_chunks=5):
    """Streams every prompt at once; once each has sent `after_chunks` chunks, calls interrupt();
    returns each stream's (text, finish reason)."""
    chunks = [0] * len(prompts)

    def stream(i):
        text, finish = "", None
        for c in client.completions.create(prompt=prompts[i], stream=True, **args):
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
            chunks[i] += 1
        return text, finish

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(stream, i) for i in range(len(prompts))]
        deadline = time.time() + 120
        while min(chunks) < after_chunks and time.time() < deadline:
            time.sleep(0.005)
        interrupt()
        return [f.result(timeout=300) for f in futures]
