# checkers: mypy-plugin
"""With loopbridge.mypy_plugin, blocking(p).member has the real signature, without await."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from typing_extensions import assert_type

from loopbridge import Blocking, adopt, blocking, proxy
from loopbridge._streams import BlockingStream

from _models import Engine, Foreign, Store, Token

X = TypeVar("X")
E = TypeVar("E", bound=Engine)


def engine_members() -> None:
    b = blocking(proxy(Engine()))
    assert_type(b, Blocking[Engine])

    reveal_type(b.generate)  # R: def (prompt: str, *, max_tokens: int =) -> str
    assert_type(b.generate("hi"), str)
    assert_type(b.generate("hi", max_tokens=3), str)
    assert_type(b.generate(prompt="hi"), str)

    reveal_type(b.stream)  # R: def (prompt: str) -> loopbridge._streams.BlockingStream[_models.Token]
    stream = b.stream("hi")
    assert_type(stream, BlockingStream[Token])
    for tok in stream:
        assert_type(tok, Token)
    with b.stream("hi") as s:
        assert_type(s, BlockingStream[Token])
        assert_type(next(s), Token)
    b.stream("hi").close()

    reveal_type(b.numbers)  # R: def (n: int, step: int =) -> loopbridge._streams.BlockingStream[int]
    assert_type(b.numbers(3, step=1), BlockingStream[int])

    reveal_type(b.kinds)  # R: def (int, b: str, c: float =, *args: bytes, d: bool, e: int | None =, **kw: object) -> tuple[int, str]
    assert_type(b.kinds(1, "b", 2.0, b"x", d=True, extra=1), tuple[int, str])

    reveal_type(b.first)  # R: def [T] (items: list[T]) -> T
    assert_type(b.first([1]), int)
    assert_type(b.first(["a"]), str)

    reveal_type(b.get)  # R: Overload(def (key: int) -> int, def (key: str) -> str)
    assert_type(b.get(1), int)
    assert_type(b.get("k"), str)

    assert_type(b.nothing(), None)
    # Sync members keep their type (the run time refuses undeclared ones).
    reveal_type(b.sync_member)  # R: def () -> int


def on_a_plain_object_too() -> None:
    # blocking() also accepts the loop-affine object itself.
    b = blocking(Engine())
    assert_type(b.generate("x"), str)


def declared_generic_and_foreign(loop: asyncio.AbstractEventLoop) -> None:
    s = blocking(proxy(Store[bytes]("s")))
    assert_type(s.name, str)
    assert_type(s.config, dict[str, int])
    assert_type(s.load("k"), bytes)
    reveal_type(s.save)  # R: def (key: str, value: bytes)
    assert_type(s.save("k", b"v"), None)
    reveal_type(s.keys)  # R: def (prefix: str =) -> loopbridge._streams.BlockingStream[str]

    f = blocking(proxy(adopt(Foreign(), loop=loop, stable=("limit",))))
    assert_type(f.limit, int)
    reveal_type(f.fetch)  # R: def (str, *, timeout: float | None =) -> bytes
    reveal_type(f.lines)  # R: def (*paths: str) -> loopbridge._streams.BlockingStream[str]

    q = blocking(adopt(asyncio.Queue[int](), loop=loop))
    assert_type(q.get(), int)
    reveal_type(q.put)  # R: def (item: int)
    assert_type(q.qsize(), int)


def through_a_union(b: Blocking[Engine] | Blocking[Foreign], c: Blocking[Engine | Foreign]) -> None:
    reveal_type(b.generate)  # R: (def (prompt: str, *, max_tokens: int =) -> str) | (def (prompt: str) -> bytes)
    assert_type(c.generate("x"), str | bytes)


def through_type_variables(bounded: Blocking[E], free: Blocking[X], a: Blocking[Any]) -> None:
    assert_type(bounded.generate("x"), str)
    free.generate  # E: [attr-defined] has no attribute "generate"
    assert_type(a.anything, Any)


def rejected(loop: asyncio.AbstractEventLoop) -> None:
    b = blocking(proxy(Engine()))
    b.generate(1)  # E: [arg-type]
    b.generate()  # E: [call-arg]
    b.generate("x", max_tokns=1)  # E: [call-arg] Unexpected keyword argument "max_tokns"
    b.kinds(a=1, b="b", d=True)  # E: [call-arg]
    b.get(1.5)  # E: [call-overload]
    b.missing  # E: [attr-defined] "Engine" has no attribute "missing"
    n: int = b.generate("x")  # E: [assignment]
    for tok in b.nothing():  # E: [attr-defined] "None" has no attribute "__iter__"
        pass
    q = blocking(adopt(asyncio.Queue[int](), loop=loop))
    q.put("s")  # E: [arg-type]


async def not_awaitable() -> None:
    b = blocking(proxy(Engine()))
    await b.generate("x")  # E: [misc] Incompatible types in "await"
    async for tok in b.stream("x"):  # E: [attr-defined] not async iterable
        pass
