"""``python -m loopbridge_vllm serve`` next to stock ``vllm serve``, in the same run.

Both serve the tiny model on the CPU stand-in with the same ``vllm serve``
options (ours gets them after ``--``): TLS with a real certificate from a
throw-away CA, a port chosen here, the access log left at its default. Each
check asks both servers the same thing and expects the same answer.
"""

from __future__ import annotations

import socket
import ssl
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trustme
from vllm_engines import ServeProcess, free_port

from loopbridge_vllm.cpu_engine import STANDIN_BACKEND

START_TIMEOUT = 300

# The same vLLM options for both; each server gets its own port.
KEY = "lb-test-key"
ENGINE = ["--served-model-name", "tiny", "--max-model-len", "200", "--max-num-seqs", "4"]
FRONTEND = ["--api-key", KEY, "--root-path", "/behind-proxy"]
AUTH = {"Authorization": f"Bearer {KEY}"}
STANDIN = ["--distributed-executor-backend", STANDIN_BACKEND, "--dtype", "float32"]


class Server:
    def __init__(self, name: str, process: ServeProcess, url: str) -> None:
        self.name, self.process, self.url = name, process, url


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, list[str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    where = tmp_path_factory.mktemp("tls")
    key, chain = where / "key.pem", where / "cert.pem"
    cert.private_key_pem.write_to_path(str(key))
    cert.cert_chain_pems[0].write_to_path(str(chain))
    options = ["--ssl-keyfile", str(key), "--ssl-certfile", str(chain), "--enable-ssl-refresh"]
    return ca, options


@pytest.fixture(scope="module")
def servers(
    tiny_model: Path, tls: tuple[trustme.CA, list[str]]
) -> Iterator[tuple[Server, Server, int]]:
    """(ours, stock, the port ours was asked for after ``--``)."""
    _, tls_options = tls
    port = free_port()
    ours = ServeProcess(
        [
            sys.executable,
            "-m",
            "loopbridge_vllm",
            "serve",
            str(tiny_model),
            "--cpu-standin",
            "--grace",
            "1",
            "--",
            "--port",
            str(port),
            *ENGINE,
            *FRONTEND,
            *tls_options,
        ]
    )
    stock_port = free_port()
    stock = ServeProcess(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(tiny_model),
            "--host",
            "127.0.0.1",
            "--port",
            str(stock_port),
            *ENGINE,
            *FRONTEND,
            *STANDIN,
            "--enforce-eager",
            *tls_options,
        ]
    )
    try:
        url = ours.wait_for(r"serving on (\S+)", START_TIMEOUT).group(1)
        # Stock serves a socket it bound itself, and logs no address for it.
        stock.wait_for(r"Application startup complete", START_TIMEOUT)
        _until_listening(stock_port)
        yield (
            Server("ours", ours, url),
            Server("stock", stock, f"https://127.0.0.1:{stock_port}"),
            port,
        )
    finally:
        ours.stop()
        stock.stop()


def _until_listening(port: int) -> None:
    """Return once ``port`` accepts: uvicorn listens right after it logs start-up
    complete, in the same step of its start-up task; a refusal before then is
    retried at once, never slept on."""
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise


def _trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def test_port_after_dashes_is_the_port_served(servers: tuple[Server, Server, int]) -> None:
    ours, _, port = servers
    assert ours.url == f"https://127.0.0.1:{port}"


def test_tls_with_the_openai_client_on_both(
    servers: tuple[Server, Server, int], tls: tuple[trustme.CA, list[str]]
) -> None:
    ca, _ = tls
    for server in servers[:2]:
        with httpx.Client(verify=_trusting(ca), timeout=60) as http:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, http_client=http)
            assert [m.id for m in client.models.list()] == ["tiny"], server.name
            done = client.completions.create(
                model="tiny", prompt="Hello", max_tokens=3, extra_body={"ignore_eos": True}
            )
            assert done.usage is not None and done.usage.completion_tokens == 3, server.name
            # The engine got the engine-only options: the context length is ours.
            listed = http.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]
            assert listed["max_model_len"] == 200, server.name


def test_plain_http_is_not_served_on_the_tls_port(servers: tuple[Server, Server, int]) -> None:
    for server in servers[:2]:
        plain = server.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(plain + "/health", timeout=30)


def test_untrusted_certificate_is_refused_by_the_client(
    servers: tuple[Server, Server, int],
) -> None:
    for server in servers[:2]:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(server.url + "/health", timeout=30)


def test_access_log_is_on_by_default(
    servers: tuple[Server, Server, int], tls: tuple[trustme.CA, list[str]]
) -> None:
    ca, _ = tls
    for server in servers[:2]:
        start = len(server.process.lines)
        path = f"/v1/models?lb-probe={server.name}"
        reply = httpx.get(server.url + path, headers=AUTH, verify=_trusting(ca), timeout=30)
        assert reply.status_code == 200
        # uvicorn writes the line before the response goes out.
        line = server.process.wait_for(r'"GET /v1/models\?lb-probe=\w+ HTTP/1.1" 200', 30, start)
        assert server.name in line.group(0)


def test_api_key_and_root_path_apply_on_both(
    servers: tuple[Server, Server, int], tls: tuple[trustme.CA, list[str]]
) -> None:
    ca, _ = tls
    for server in servers[:2]:
        with httpx.Client(base_url=server.url, verify=_trusting(ca), timeout=30) as http:
            assert http.get("/v1/models").status_code == 401, server.name
            assert http.get("/v1/models", headers=AUTH).status_code == 200, server.name
            # FastAPI serves its schema under the root path it was given.
            docs = http.get("/docs").text
            assert "/behind-proxy/openapi.json" in docs, server.name


def _outcome(url: str, headers: dict[str, str], context: ssl.SSLContext) -> str:
    try:
        return str(
            httpx.get(url + "/health", headers=headers, verify=context, timeout=60).status_code
        )
    except httpx.HTTPError:
        return "connection closed"


def test_a_header_flood_is_answered_as_stock_answers_it(
    servers: tuple[Server, Server, int], tls: tuple[trustme.CA, list[str]]
) -> None:
    ca, _ = tls
    floods = {
        "300 headers": {f"x-flood-{i}": "v" for i in range(300)},
        "one 100 kB header": {"x-flood": "v" * 100_000},  # over h11's own 16 kB default
        "5 MB of headers": {f"x-flood-{i}": "v" * 100_000 for i in range(50)},
    }
    answers = {
        server.name: {kind: _outcome(server.url, h, _trusting(ca)) for kind, h in floods.items()}
        for server in servers[:2]
    }
    assert answers["ours"] == answers["stock"]
    # Stock's 4 MB limit on an incomplete event, not h11's 16 kB default.
    assert answers["ours"]["one 100 kB header"] == "200"
    assert answers["ours"]["5 MB of headers"] != "200"
