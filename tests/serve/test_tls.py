"""HTTPS on serve and route, and mutual TLS between the router and its instances, with
certificates made here by the openssl command: the official openai client over HTTPS verifying
the CA streams and completes; plaintext to the HTTPS port, a client trusting another CA, an
expired server certificate, a missing client certificate and one from another CA are each
refused, logged once, and the server keeps serving; SIGHUP switches to a new certificate while a
stream is in flight; clients hanging up over TLS have their requests aborted; the 413 and the
SIGTERM drain work over TLS; a router reaches instances that require its client certificate, and
one without it (or trusting another CA) cannot use them; open ports are warned about."""

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from conftest import BINARY, TMP, Server

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRAINED = os.path.join(REPO, "models", "default")

CA_CONFIG = """[ca]
default_ca = test_ca
[test_ca]
database = {dir}/index.txt
new_certs_dir = {dir}
certificate = {dir}/ca.pem
private_key = {dir}/ca.key
serial = {dir}/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
"""


class Pki:
    """Two CAs (ca, other_ca) and certificates they sign, as NAME.pem + NAME.key in `dir`."""

    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.serial = 1
        for ca in ("ca", "other_ca"):
            self.run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                     "-nodes", "-days", "30", "-subj", f"/CN={ca}", "-keyout", self.path(ca, "key"),
                     "-out", self.path(ca, "pem"))
        with open(self.path("ca", "cnf"), "w") as f:
            f.write(CA_CONFIG.format(dir=directory))
        open(os.path.join(directory, "index.txt"), "w").close()
        with open(os.path.join(directory, "serial"), "w") as f:
            f.write("1000\n")

    def path(self, name, ext):
        return os.path.join(self.dir, f"{name}.{ext}")

    def run(self, *args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def leaf(self, name, ca="ca", expired=False):
        """A certificate for 127.0.0.1 and localhost (server and client use). Expired: valid for
        one day in 2020, made with `openssl ca -startdate/-enddate` (OpenSSL 3.0's x509 command
        cannot date a certificate in the past)."""
        with open(self.path(name, "ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                    "extendedKeyUsage=serverAuth,clientAuth\n")
        self.run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-subj", f"/CN={name}", "-keyout", self.path(name, "key"), "-out",
                 self.path(name, "csr"))
        if expired:
            self.run("ca", "-batch", "-notext", "-config", self.path(ca, "cnf"), "-startdate",
                     "20200101000000Z", "-enddate", "20200102000000Z", "-extfile",
                     self.path(name, "ext"), "-in", self.path(name, "csr"), "-out",
                     self.path(name, "pem"))
        else:
            self.serial += 1
            self.run("x509", "-req", "-in", self.path(name, "csr"), "-CA", self.path(ca, "pem"),
                     "-CAkey", self.path(ca, "key"), "-set_serial", str(self.serial), "-days", "30",
                     "-extfile", self.path(name, "ext"), "-out", self.path(name, "pem"))
        return self.path(name, "pem"), self.path(name, "key")


@pytest.fixture(scope="module")
def pki():
    p = Pki(os.path.join(TMP, "pki"))
    for name in ("server", "renewed", "client", "router"):
        p.leaf(name)
    p.leaf("expired", expired=True)
    p.leaf("intruder", ca="other_ca")
    return p


def tls_client(url, ca, cert=None, api_key="x"):
    """The openai client over HTTPS, trusting `ca`, presenting `cert` (pem, key) if given."""
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(*cert)
    return OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=60,
                  http_client=httpx.Client(verify=context, timeout=60))


def complete(client, max_tokens=4):
    out = client.completions.create(model="sy-test", prompt="ROMEO:", max_tokens=max_tokens,
                                    temperature=0, extra_body={"ignore_eos": True})
    return out.usage.completion_tokens


def refused_lines(server):
    return [line for line in list(server.log) if "TLS connection from" in line and "refused" in line]


def wait_for(predicate, timeout=10):
    deadline = time.time() + timeout
    while not predicate() and time.time() < deadline:
        time.sleep(0.05)
    return predicate()


def serve_https(pki, *extra):
    """`serve` on the trained default model, HTTPS with the files copied under live/ (so that
    a test can replace them and send SIGHUP)."""
    live = os.path.join(pki.dir, "live")
    os.makedirs(live, exist_ok=True)
    for src, dst in ((pki.path("server", "pem"), "cert.pem"), (pki.path("server", "key"), "key.pem")):
        with open(src, "rb") as f, open(os.path.join(live, dst), "wb") as g:
            g.write(f.read())
    return Server(None, command=[
        BINARY, "--threads", "1", "serve", "--model", TRAINED, "--port", "0", "--served-model-name",
        "sy-test", "--kv-cache-tokens", "4096", "--ssl-certfile", os.path.join(live, "cert.pem"),
        "--ssl-keyfile", os.path.join(live, "key.pem"), *extra])


@pytest.fixture(scope="module")
def https_server(pki):
    s = serve_https(pki)
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_https_streams_and_completes(https_server, pki):
    assert https_server.url.startswith("https://")
    client = tls_client(https_server.url, pki.path("ca", "pem"))
    assert complete(client, 8) == 8
    text, finish, chunks = "", None, 0
    for chunk in client.chat.completions.create(
            model="sy-test", messages=[{"role": "user", "content": "Speak, friend."}],
            max_tokens=24, temperature=0, stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
            chunks += 1
    assert finish == "length" and chunks >= 24 and text
    # The same client again: its keep-alive connection serves another request.
    assert complete(client) == 4


def test_refused_connections_are_logged_once_and_the_server_keeps_serving(https_server, pki):
    good = tls_client(https_server.url, pki.path("ca", "pem"))
    before = len(refused_lines(https_server))

    plaintext = OpenAI(base_url=https_server.url.replace("https://", "http://") + "/v1",
                       api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.APIConnectionError):
        complete(plaintext)
    assert wait_for(lambda: len(refused_lines(https_server)) == before + 1)
    assert "plaintext HTTP request" in refused_lines(https_server)[-1]
    assert complete(good) == 4

    with pytest.raises(openai.APIConnectionError) as refused:
        complete(tls_client(https_server.url, pki.path("other_ca", "pem")))
    assert "CERTIFICATE_VERIFY_FAILED" in repr(refused.value.__cause__)
    assert wait_for(lambda: len(refused_lines(https_server)) == before + 2)
    assert complete(good) == 4
    time.sleep(0.3)
    assert len(refused_lines(https_server)) == before + 2, "".join(https_server.log)


def aborted_requests(server, ca):
    text = httpx.get(server.url + "/metrics", verify=ssl.create_default_context(cafile=ca)).text
    line = next(l for l in text.splitlines()
                if l.startswith("switchyard:request_success_total") and '"abort"' in l)
    return float(line.rsplit(" ", 1)[1])


def test_a_client_that_hangs_up_over_tls_has_its_request_aborted(https_server, pki):
    """Hang-up detection through TLS: a client that says goodbye (close_notify, then FIN) and one
    that just closes, streaming and not, each have their request aborted."""
    ca = pki.path("ca", "pem")
    before = aborted_requests(https_server, ca)
    cases = ((True, True), (True, False), (False, True))
    for stream, goodbye in cases:
        connection = http.client.HTTPSConnection(
            https_server.host, https_server.port, timeout=10,
            context=ssl.create_default_context(cafile=ca))
        body = json.dumps({"model": "sy-test", "prompt": "Go on and on", "max_tokens": 2000,
                           "stream": stream, "ignore_eos": True})
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        if stream:
            connection.getresponse().fp.readline()  # the first event arrives, then the client goes
        else:
            time.sleep(0.2)
        if goodbye:
            try:
                connection.sock = connection.sock.unwrap()  # sends close_notify before the FIN
            except (OSError, ValueError):
                pass
        connection.sock.close()
        connection.close()
    assert wait_for(lambda: aborted_requests(https_server, ca) == before + len(cases), timeout=30)


def test_oversized_body_over_tls_gets_413(https_server, pki):
    """The refusal of a body over the limit (32 MiB) still reaches the client, which is still
    sending: the server drains through TLS before closing."""
    response = httpx.post(https_server.url + "/v1/completions", content=b"x" * (40 << 20),
                          headers={"Content-Type": "application/json"}, timeout=60,
                          verify=ssl.create_default_context(cafile=pki.path("ca", "pem")))
    assert response.status_code == 413
    assert complete(tls_client(https_server.url, pki.path("ca", "pem"))) == 4


def test_sigterm_drains_over_tls(pki):
    server = serve_https(pki)
    client = tls_client(server.url, pki.path("ca", "pem"))
    result = {}
    thread = threading.Thread(target=lambda: result.update(tokens=complete(client, 1500)))
    thread.start()
    time.sleep(0.3)
    server.terminate()
    thread.join(timeout=120)
    assert server.process.wait(timeout=60) == 0, "".join(server.log)
    assert result["tokens"] == 1500


def peer_serial(server, ca):
    """The serial number of the certificate a new connection gets."""
    context = ssl.create_default_context(cafile=ca)
    with socket.create_connection((server.host, server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=server.host) as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


def install(pki, name):
    """Replaces the served certificate and key with NAME's, each file atomically."""
    live = os.path.join(pki.dir, "live")
    for ext, dst in (("key", "key.pem"), ("pem", "cert.pem")):
        with open(pki.path(name, ext), "rb") as f:
            data = f.read()
        with open(os.path.join(live, dst + ".new"), "wb") as g:
            g.write(data)
        os.replace(os.path.join(live, dst + ".new"), os.path.join(live, dst))


def reload(server, pki, name):
    count = "".join(server.log).count("TLS certificate reloaded")
    install(pki, name)
    os.kill(server.pid, signal.SIGHUP)
    assert wait_for(lambda: "".join(server.log).count("TLS certificate reloaded") == count + 1), \
        "".join(server.log)


def test_sighup_switches_certificate_without_dropping_a_stream(https_server, pki):
    ca = pki.path("ca", "pem")
    first = peer_serial(https_server, ca)
    # A stream that is still being generated and written when the certificate changes: two
    # choices of 1,000 tokens (about 500 KB of events) to a client whose receive buffer is 16 KiB,
    # which reads three chunks, has the server reload, checks that a new connection gets the new
    # certificate, and only then reads the rest.
    context = ssl.create_default_context(cafile=ca)
    transport = httpx.HTTPTransport(
        verify=context, socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)])
    client = OpenAI(base_url=https_server.url + "/v1", api_key="x", max_retries=0, timeout=60,
                    http_client=httpx.Client(transport=transport, timeout=60))
    stream = client.completions.create(model="sy-test", prompt="KING HENRY:", max_tokens=1000, n=2,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = iter(stream)
    received = [next(chunks) for _ in range(3)]
    try:
        reload(https_server, pki, "renewed")
        assert peer_serial(https_server, ca) != first
        received += list(chunks)
        tokens, finish = [0] * 2, [None] * 2
        for chunk in received:
            for choice in chunk.choices:
                tokens[choice.index] += 1
                finish[choice.index] = choice.finish_reason or finish[choice.index]
        assert tokens == [1000] * 2 and finish == ["length"] * 2
        assert complete(tls_client(https_server.url, ca)) == 4

        # An expired certificate (reloaded like any other): clients refuse it, the server goes on.
        reload(https_server, pki, "expired")
        with pytest.raises(openai.APIConnectionError) as refused:
            complete(tls_client(https_server.url, ca))
        assert "certificate has expired" in repr(refused.value.__cause__)
    finally:
        reload(https_server, pki, "server")
    assert peer_serial(https_server, ca) == first
    assert complete(tls_client(https_server.url, ca)) == 4


@pytest.mark.parametrize("cert_reqs", ["1", "2"])
def test_client_certificates(pki, cert_reqs):
    """--ssl-cert-reqs 2: a certificate from --ssl-ca-certs is required; 1: verified when given."""
    ca = pki.path("ca", "pem")
    server = serve_https(pki, "--ssl-ca-certs", ca, "--ssl-cert-reqs", cert_reqs)
    try:
        good = tls_client(server.url, ca, (pki.path("client", "pem"), pki.path("client", "key")))
        assert complete(good) == 4
        intruder = (pki.path("intruder", "pem"), pki.path("intruder", "key"))
        if cert_reqs == "1":
            assert complete(tls_client(server.url, ca)) == 4
        for cert in ([None] if cert_reqs == "2" else []) + [intruder]:
            before = len(refused_lines(server))
            with pytest.raises(openai.APIConnectionError):
                complete(tls_client(server.url, ca, cert))
            assert wait_for(lambda: len(refused_lines(server)) == before + 1), "".join(server.log)
            assert complete(good) == 4
    finally:
        assert server.stop() == 0, "".join(server.log)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_router_and_instances_under_mutual_tls(pki):
    ca = pki.path("ca", "pem")
    ports = [free_port(), free_port()]
    instances = [Server(None, command=[
        BINARY, "--threads", "1", "serve", "--model", TRAINED, "--port", "0", "--grpc-port",
        str(p), "--kv-cache-tokens", "4096", "--served-model-name", "sy-test",
        "--grpc-tls-cert", pki.path("server", "pem"), "--grpc-tls-key", pki.path("server", "key"),
        "--grpc-tls-client-ca", ca]) for p in ports]
    engines = ",".join(f"127.0.0.1:{p}" for p in ports)
    key = "sy-test-key-7f3a9c"
    try:
        assert all("(mutual TLS)" in "".join(i.log) for i in instances)
        os.environ["SWITCHYARD_API_KEY"] = key  # the key from the environment, not the command line
        try:
            router = Server(None, command=[
            BINARY, "route", "--engines", engines, "--port", "0", "--policy", "round_robin",
            "--served-model-name", "sy-test", "--probe-interval", "0.1",
            "--engine-tls-ca", ca, "--engine-tls-cert", pki.path("router", "pem"),
            "--engine-tls-key", pki.path("router", "key"),
            "--ssl-certfile", pki.path("server", "pem"), "--ssl-keyfile", pki.path("server", "key")])
        finally:
            del os.environ["SWITCHYARD_API_KEY"]
        try:
            # Both instances admitted, then requests through both (round robin).
            assert wait_for(lambda: "".join(router.log).count(" serving\n") >= 2), "".join(router.log)
            with pytest.raises(openai.AuthenticationError):
                complete(tls_client(router.url, ca))
            client = tls_client(router.url, ca, api_key=key)
            for _ in range(2):
                assert complete(client) == 4
            text = "".join(c.choices[0].text for c in client.completions.create(
                model="sy-test", prompt="To be", max_tokens=12, temperature=0, stream=True,
                extra_body={"ignore_eos": True}) if c.choices)
            assert text
            assert all(i.metric("generation_tokens_total") > 0 for i in instances)
            # The admin endpoints need the key too.
            admin = httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=30)
            assert admin.get(router.url + "/admin/engines").status_code == 401
            engines_state = admin.get(router.url + "/admin/engines",
                                      headers={"Authorization": f"Bearer {key}"}).json()
            assert [e["healthy"] for e in engines_state["engines"]] == [True, True]
        finally:
            assert router.stop() == 0, "".join(router.log)
        assert key not in "".join(router.log)

        # Without a client certificate, or trusting another CA, a router cannot use them: it
        # gives up after --wait naming each instance's reason.
        for flags, reason in ((["--engine-tls-ca", ca], "instance refused"),
                              (["--engine-tls-ca", pki.path("other_ca", "pem"), "--engine-tls-cert",
                                pki.path("router", "pem"), "--engine-tls-key",
                                pki.path("router", "key")], "certificate does not verify")):
            out = subprocess.run(
                [BINARY, "route", "--engines", engines, "--port", "0", "--wait", "2",
                 "--probe-interval", "0.1", *flags], capture_output=True, text=True, timeout=60)
            assert out.returncode != 0, (reason, out.stdout, out.stderr)
            assert "none of the 2 instances answered" in out.stderr, (reason, out.stderr)
            assert "not usable" in out.stderr, (reason, out.stderr)
    finally:
        for i in instances:
            assert i.stop() == 0, "".join(i.log)


def test_open_ports_are_warned_about(model_dir):
    """Bound to every interface with neither TLS nor a key: both ports say what is at risk."""
    server = Server(model_dir, "--host", "0.0.0.0", "--grpc-port", "0")
    try:
        log = "".join(server.log)
        assert "warning: 0.0.0.0:" in log and "neither TLS" in log, log
        assert "warning: the gRPC instance API on 0.0.0.0:" in log, log
    finally:
        assert server.stop() == 0, "".join(server.log)
