# checkers: mypy mypy-plugin pyright
"""Calls through proxy(obj) that the checker must reject, as it would on the object."""

from __future__ import annotations

import asyncio

from loopbridge import adopt, proxy

from _models import Engine, Foreign, Store


async def wrong_calls(loop: asyncio.AbstractEventLoop) -> None:
    p = proxy(Engine())
    await p.generate(1)  # E: [arg-type]
    await p.generate()  # E: [call-arg]
    await p.generate("x", max_tokns=3)  # E: [call-arg] Unexpected keyword argument "max_tokns"
    await p.generate("x", 3)  # E: [call-arg] Too many positional arguments
    await p.generate("x", max_tokens="3")  # E: [arg-type]
    n: int = await p.generate("x")  # E: [assignment]
    await p.kinds(a=1, b="b", d=True)  # E: [call-arg]
    await p.kinds(1, "b")  # E: [call-arg] Missing named argument "d"
    await p.kinds(1, "b", 1.0, "not bytes", d=True)  # E: [arg-type]
    await p.first(1)  # E: [arg-type]
    await p.get(1.5)  # E: [call-overload]
    await p.missing()  # E: [attr-defined]
    p.generate("never awaited")  # E: [unused-coroutine]


async def streams_are_not_coroutines() -> None:
    p = proxy(Engine())
    await p.stream("x")  # E: [misc] Incompatible types in "await"
    await p.numbers(3)  # E: [misc] Incompatible types in "await"
    for tok in p.stream("x"):  # E: [attr-defined] not iterable
        pass


async def coroutines_are_not_streams() -> None:
    p = proxy(Engine())
    async for ch in p.generate("x"):  # E: [attr-defined] not async iterable
        pass
    for ch2 in p.generate("x"):  # E: [attr-defined] not iterable
        pass


async def declared_and_foreign(loop: asyncio.AbstractEventLoop) -> None:
    s = proxy(Store[bytes]("s"))
    await s.save("k", "not bytes")  # E: [arg-type]
    f = proxy(adopt(Foreign(), loop=loop))
    await f.fetch(url="u")  # E: [call-arg]
    await f.fetch("u", 2.0)  # E: [call-arg] Too many positional arguments
    q = proxy(adopt(asyncio.Queue[int](), loop=loop))
    await q.put("s")  # E: [arg-type]
