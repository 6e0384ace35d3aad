"""A cap on request body size, answered with 413 before the app reads the body.

The server thread shares its process with the engine's front-end (and, in RL
set-ups, a trainer): one oversized body is held in memory whole while vLLM
parses it, so its size should have a bound. Stock ``vllm serve`` has none.

* A declared ``Content-Length`` over the cap is refused without keeping any of
  the body: it is read and dropped first, so that the client, still sending,
  sees the 413 instead of a connection reset.
* A body without one (chunked) is kept up to the cap, then dropped the same
  way and refused; a body within the cap is replayed to the app unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["BodyLimit", "DEFAULT_MAX_BODY_BYTES"]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: Default cap: far above any text request (a 128k-token prompt is about
#: 1 MB of JSON) and room for several base64 images, far below what would
#: strain the process.
DEFAULT_MAX_BODY_BYTES = 32 * 2**20


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get a 413 in OpenAI's error format."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes!r}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:
                await _drop_rest(receive)
                await self._refuse(send)
            else:
                await self.app(scope, receive, send)
            return
        # No length declared: read the body (bounded) before the app sees it.
        chunks: list[Message] = []
        size = 0
        while True:
            message = await receive()
            chunks.append(message)
            if message["type"] != "http.request":
                break  # the client left: let the app see it
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                chunks.clear()
                if message.get("more_body", False):
                    await _drop_rest(receive)
                await self._refuse(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return chunks.pop(0) if chunks else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": (
                        f"request body is larger than this server's limit of {self.max_bytes} bytes"
                    ),
                    "type": "RequestEntityTooLarge",
                    "param": None,
                    "code": 413,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _drop_rest(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _content_length(scope: MutableMapping[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # malformed: the HTTP layer rejects it
    return None
