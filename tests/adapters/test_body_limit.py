"""The request body cap (loopbridge_adapters.body_limit), as ASGI messages, engine aside.

Each adapter's server runs it against its real app: tests/vllm/test_server_body_limit.py
and tests/sglang/test_server_body_limit.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from loopbridge_adapters.body_limit import BodyLimit

Message = MutableMapping[str, Any]
LIMIT = 10


class Client:
    """The messages a client sends (``receive``), and what the server sent back."""

    def __init__(self, *bodies: bytes, disconnect: bool = False) -> None:
        self.incoming: list[Message] = [
            {"type": "http.request", "body": b, "more_body": i < len(bodies) - 1}
            for i, b in enumerate(bodies)
        ]
        if disconnect:
            self.incoming[-1]["more_body"] = True
            self.incoming.append({"type": "http.disconnect"})
        self.read = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        self.read += 1
        return self.incoming[self.read - 1]

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])


class App:
    """An app that reads the whole body and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.messages: list[Message] = []

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            self.messages.append(message)
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(length: int | None = None) -> Message:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return {"type": "http", "path": "/v1/completions", "headers": headers}


def _serve(client: Client, scope: Message) -> App:
    app = App()
    asyncio.run(BodyLimit(app, LIMIT)(scope, client.receive, client.send))
    return app


def test_a_declared_length_over_the_limit_is_413_after_the_body_is_dropped() -> None:
    client = Client(b"x" * 8, b"x" * 8)
    app = _serve(client, _scope(16))
    assert app.messages == []  # the app never sees the request
    assert client.read == 2  # read to its end, so the client sees the answer
    assert client.status == 413
    error = json.loads(client.sent[1]["body"])["error"]
    assert error["code"] == 413 and str(LIMIT) in error["message"]
    assert (b"connection", b"close") in client.sent[0]["headers"]


def test_a_declared_length_within_the_limit_reaches_the_app_untouched() -> None:
    client = Client(b"x" * 4, b"y" * 6)
    app = _serve(client, _scope(10))
    assert app.bodies == [b"x" * 4 + b"y" * 6] and client.status == 200


def test_a_chunked_body_over_the_limit_is_413_and_the_rest_dropped() -> None:
    client = Client(b"x" * 6, b"x" * 6, b"x" * 6)
    app = _serve(client, _scope())
    assert app.messages == [] and client.read == 3 and client.status == 413


def test_a_chunked_body_within_the_limit_is_replayed_to_the_app() -> None:
    client = Client(b"ab", b"cd", b"")
    app = _serve(client, _scope())
    assert app.bodies == [b"abcd"] and client.status == 200
    assert [m["more_body"] for m in app.messages] == [True, True, False]


def test_a_client_that_leaves_mid_body_is_the_apps_to_see() -> None:
    client = Client(b"ab", disconnect=True)
    app = _serve(client, _scope())
    assert [m["type"] for m in app.messages] == ["http.request", "http.disconnect"]
    assert client.sent == []


def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Message, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        raise AssertionError("not read")

    async def unsent(message: Message) -> None:
        raise AssertionError("not sent")

    asyncio.run(BodyLimit(app, LIMIT)({"type": "lifespan"}, nothing, unsent))
    assert seen == ["lifespan"]


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_byte_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match=f"max_bytes must be positive, not {limit}"):
        BodyLimit(App(), limit)
