# checkers: mypy mypy-plugin pyright
"""Through proxy(obj) the checker sees the real signatures of async members."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from typing_extensions import assert_type

from loopbridge import adopt, proxy

from _models import Engine, Foreign, Store, Token


async def engine_members(loop: asyncio.AbstractEventLoop) -> None:
    p = proxy(Engine())
    assert_type(p, Engine)

    reveal_type(p.generate)  # R: def (prompt: builtins.str, *, max_tokens: builtins.int =) -> typing.Coroutine[Any, Any, builtins.str]  # P: (prompt: str, *, max_tokens: int = 16) -> CoroutineType[Any, Any, str]
    assert_type(await p.generate("hi"), str)
    assert_type(await p.generate("hi", max_tokens=3), str)
    assert_type(await p.generate(prompt="hi"), str)

    reveal_type(p.stream)  # R: def (prompt: builtins.str) -> typing.AsyncIterator[_models.Token]  # P: (prompt: str) -> AsyncIterator[Token]
    assert_type(p.stream("hi"), AsyncIterator[Token])
    async for tok in p.stream("hi"):
        assert_type(tok, Token)

    reveal_type(p.numbers)  # R: def (n: builtins.int, step: builtins.int =) -> typing.AsyncGenerator[builtins.int, None]  # P: (n: int, step: int = 1) -> AsyncGenerator[int, None]
    gen = p.numbers(10, step=2)
    assert_type(gen, AsyncGenerator[int, None])
    async for i in gen:
        assert_type(i, int)
    await gen.aclose()

    reveal_type(p.kinds)  # R: def (builtins.int, b: builtins.str, c: builtins.float =, *args: builtins.bytes, d: builtins.bool, e: builtins.int | None =, **kw: builtins.object) -> typing.Coroutine[Any, Any, tuple[builtins.int, builtins.str]]  # P: (a: int, /, b: str, c: float = 1, *args: bytes, d: bool, e: int | None = None, **kw: object) -> CoroutineType[Any, Any, tuple[int, str]]
    assert_type(await p.kinds(1, "b", d=True), tuple[int, str])
    assert_type(await p.kinds(1, "b", 2.0, b"x", b"y", d=False, e=None, extra=[1]), tuple[int, str])

    reveal_type(p.first)  # R: def [T] (items: list[T]) -> typing.Coroutine[Any, Any, T]  # P: (items: list[T@first]) -> CoroutineType[Any, Any, T@first]
    assert_type(await p.first([1, 2]), int)
    assert_type(await p.first(["a"]), str)

    reveal_type(p.get)  # R: Overload(def (key: builtins.int) -> typing.Coroutine[Any, Any, builtins.int], def (key: builtins.str) -> typing.Coroutine[Any, Any, builtins.str])  # P: Overload[(key: int) -> CoroutineType[Any, Any, int], (key: str) -> CoroutineType[Any, Any, str]]
    assert_type(await p.get(1), int)
    assert_type(await p.get("k"), str)

    assert_type(await p.nothing(), None)

    # A sync member keeps its type although the proxy refuses it at run time.
    reveal_type(p.sync_member)  # R: def () -> builtins.int  # P: () -> int


async def decorated_with_declarations() -> None:
    p = proxy(Store[bytes]("s"))
    assert_type(p, Store[bytes])
    assert_type(p.name, str)  # declared stable
    assert_type(p.config, dict[str, int])  # declared stable
    reveal_type(p.save)  # R: def (key: builtins.str, value: builtins.bytes) -> typing.Coroutine[Any, Any, None]  # P: (key: str, value: bytes) -> CoroutineType[Any, Any, None]
    assert_type(await p.load("k"), bytes)
    reveal_type(p.keys)  # R: def (prefix: builtins.str =) -> typing.AsyncIterator[builtins.str]  # P: (prefix: str = "") -> AsyncIterator[str]
    async for k in p.keys():
        assert_type(k, str)


async def adopted_foreign(loop: asyncio.AbstractEventLoop) -> None:
    f = adopt(Foreign(), loop=loop, stable=("limit",))
    assert_type(f, Foreign)
    p = proxy(f, stream_window=8, cancel_grace=1.0)
    assert_type(p, Foreign)
    assert_type(p.limit, int)
    reveal_type(p.fetch)  # R: def (builtins.str, *, timeout: builtins.float | None =) -> typing.Coroutine[Any, Any, builtins.bytes]  # P: (url: str, /, *, timeout: float | None = None) -> CoroutineType[Any, Any, bytes]
    assert_type(await p.fetch("u", timeout=2.0), bytes)
    reveal_type(p.lines)  # R: def (*paths: builtins.str) -> typing.AsyncGenerator[builtins.str, None]  # P: (*paths: str) -> AsyncGenerator[str, None]
    async for line in p.lines("a", "b"):
        assert_type(line, str)

    # A foreign generic class from the standard library.
    q = proxy(adopt(asyncio.Queue[int](), loop=loop))
    assert_type(q, asyncio.Queue[int])
    reveal_type(q.put)  # R: def (item: builtins.int) -> typing.Coroutine[Any, Any, None]  # P: (item: int) -> CoroutineType[Any, Any, None]
    assert_type(await q.get(), int)
