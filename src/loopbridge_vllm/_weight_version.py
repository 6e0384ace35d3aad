"""Tag each completion with the weight versions it was served under (opt-in).

:class:`WeightVersionTags` is ASGI middleware for the threaded OpenAI server
(``start_openai_server(..., weight_version_tags=True)``). For every
``POST .../v1/completions`` and ``.../v1/chat/completions`` it reads the
engine's ``get_weight_version()`` twice, through the loop-safe client:

* at admission, before vLLM sees the request: header
  ``x-weight-version-admitted``;
* at finish, once the engine has produced the last token: for a JSON reply,
  headers ``x-weight-version-finished`` and ``x-weight-version-mixed``; for a
  stream, one more chunk just before ``data: [DONE]`` with no choices and a
  ``weight_version`` field ``{"admitted", "finished", "mixed"}`` (the shape of
  the usage chunk, so clients that read ``choices`` see an empty list).

Invariant: ``mixed`` is never false for a request whose tokens came from two
versions. Versions only change at ``finish_weight_update``; the admission
read happens before the first token and the finish read after the last, so a
change between them shows. The converse does not hold: a version committed
between the admission read and the first token (or the last token and the
finish read) also marks the request mixed. vLLM 0.33's own
``return_weight_versions`` request field gives exact per-token spans.

Each tagged request costs two utility round trips to the EngineCore.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

__all__ = ["WeightVersionTags"]

_log = logging.getLogger("loopbridge_vllm.server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_PATHS = ("/v1/completions", "/v1/chat/completions")
_DONE = b"data: [DONE]"
ADMITTED = b"x-weight-version-admitted"
FINISHED = b"x-weight-version-finished"
MIXED = b"x-weight-version-mixed"


def _header(version: str) -> bytes:
    # A version is any string the trainer chose; a header value must be
    # printable ASCII without line breaks.
    return quote(version, safe=" !#$&'()*+,-./:;<=>?@[]^_`{|}~").encode("ascii")


class WeightVersionTags:
    """ASGI middleware: see the module docstring. ``client`` is the engine
    client the app serves (its ``get_weight_version`` runs on the owner loop)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], client: Any):
        self.app = app
        self.client = client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not str(scope.get("path", "")).endswith(_PATHS)
        ):
            await self.app(scope, receive, send)
            return
        admitted = await self._version()
        if admitted is None:
            await self.app(scope, receive, send)
            return
        stream = False
        first: dict[str, Any] | None = None

        async def tagged(message: Message) -> None:
            nonlocal stream, first
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                kind = dict(headers).get(b"content-type", b"")
                stream = kind.startswith(b"text/event-stream")
                headers.append((ADMITTED, _header(admitted)))
                if not stream:  # a JSON reply starts once the engine is done with it
                    finished = await self._version()
                    if finished is not None:
                        mixed = b"true" if finished != admitted else b"false"
                        headers += [(FINISHED, _header(finished)), (MIXED, mixed)]
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and stream:
                body = bytes(message.get("body", b""))
                if first is None:
                    first = _first_chunk(body)
                at = body.find(_DONE)
                if at >= 0:
                    finished = await self._version()
                    if finished is not None:
                        event = _tag_chunk(first, admitted, finished)
                        body = body[:at] + b"data: " + event + b"\n\n" + body[at:]
                        message = {**message, "body": body}
            await send(message)

        await self.app(scope, receive, tagged)

    async def _version(self) -> str | None:
        try:
            return str(await self.client.get_weight_version())
        except Exception:  # an engine that cannot answer: serve untagged
            _log.warning("weight version unavailable; response not tagged", exc_info=True)
            return None


def _first_chunk(body: bytes) -> dict[str, Any] | None:
    """The first JSON event of a stream (its id, object, created, model)."""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                chunk = json.loads(line[len(b"data: ") :])
            except ValueError:
                return None
            return chunk if isinstance(chunk, dict) else None
    return None


def _tag_chunk(first: dict[str, Any] | None, admitted: str, finished: str) -> bytes:
    base = first or {}
    chunk = {
        "id": base.get("id", ""),
        "object": base.get("object", "text_completion"),
        "created": base.get("created", 0),
        "model": base.get("model", ""),
        "choices": [],
        "weight_version": {
            "admitted": admitted,
            "finished": finished,
            "mixed": admitted != finished,
        },
    }
    return json.dumps(chunk, separators=(",", ":")).encode()
