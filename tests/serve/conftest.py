"""Starts switchyard servers for the client tests: the embedded default model, written fresh by
`switchyard init-model`, served on a free port."""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

BINARY = os.environ.get("SWITCHYARD_BINARY", "build/switchyard")
TMP = os.environ.get("SWITCHYARD_TEST_TMP", "/tmp/switchyard-serve-tests")


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
