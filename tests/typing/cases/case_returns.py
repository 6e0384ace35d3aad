# checkers: mypy mypy-plugin pyright
"""Returned loop-bound objects keep their types through proxy(obj): a rule
(``Owned``) changes what crosses at run time, never the static type."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from typing import Any

from typing_extensions import assert_type

from loopbridge import Blocking, Owned, adopt, blocking, proxy


class Response:
    status: int = 200

    async def json(self) -> dict[str, int]:
        return {}


class Request:
    def __await__(self) -> Generator[Any, None, Response]:
        return Response().json().__await__()  # type: ignore[return-value]

    async def __aenter__(self) -> Response:
        return Response()

    async def __aexit__(self, *exc: object) -> None:
        return None


class Call:
    def __await__(self) -> Generator[Any, None, bytes]:
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[bytes]:
        raise NotImplementedError


class Method:
    def __call__(self, request: bytes, *, timeout: float | None = None) -> Call:
        return Call()


class Session:
    method: Method

    def get(self, url: str) -> Request:
        return Request()

    async def fetch(self, url: str) -> Response:
        return Response()

    async def responses(self, n: int) -> AsyncIterator[Response]:
        yield Response()


RESPONSE = Owned(stable=("status",))
RULES = {
    "get": Owned(returns={"__aenter__": RESPONSE, "__await__": RESPONSE}),
    "fetch": RESPONSE,
    "responses": RESPONSE,
    "method": Owned(returns={"__call__": Owned()}),
}


async def returned_objects() -> None:
    s = adopt(Session(), returns=RULES)
    assert_type(s, Session)
    p = proxy(s)
    assert_type(p.get("/"), Request)
    async with p.get("/") as resp:
        assert_type(resp, Response)
        assert_type(resp.status, int)
        assert_type(await resp.json(), dict[str, int])
    assert_type(await p.get("/"), Response)
    assert_type(await p.fetch("/"), Response)
    async for item in p.responses(2):
        assert_type(item, Response)
    assert_type(await p.method(b"x", timeout=1.0), bytes)
    async for chunk in p.method(b"x"):
        assert_type(chunk, bytes)
    assert_type(blocking(p.get("/")), Blocking[Request])


def rules_are_checked() -> None:
    Owned(stable=1)  # E: [arg-type]
    Owned("status")  # E: [call-arg] Too many positional arguments
    Owned(returns={"get": "status"})  # E: [dict-item]
    adopt(Session(), returns={"get": RESPONSE.stable})  # E: [dict-item]
    adopt(Session(), returns=["get"])  # E: [arg-type]
