# checkers: mypy mypy-plugin pyright
"""Special methods keep their exact types through proxy(obj): calls, iteration, context."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

from typing_extensions import assert_type

from loopbridge import loop_affine, proxy


@loop_affine
class Scorer:
    async def __call__(self, prompt: str, *, scale: float = 1.0) -> float:
        return len(prompt) * scale


@loop_affine
class Countdown:
    def __init__(self, n: int) -> None:
        self.n = n

    def __aiter__(self) -> Countdown:
        return self

    async def __anext__(self) -> int:
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return self.n


@loop_affine
class Words:
    async def __aiter__(self) -> AsyncIterator[str]:
        yield "a"


@loop_affine
class Session:
    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return False

    async def fetch(self, url: str) -> bytes:
        return url.encode()


async def special_members() -> None:
    scorer = proxy(Scorer())
    assert_type(scorer, Scorer)
    reveal_type(scorer.__call__)  # R: def (prompt: builtins.str, *, scale: builtins.float =) -> typing.Coroutine[Any, Any, builtins.float]  # P: (prompt: str, *, scale: float = 1) -> CoroutineType[Any, Any, float]
    assert_type(await scorer("hi"), float)
    assert_type(await scorer("hi", scale=2.0), float)
    await scorer(1)  # E: [arg-type]
    await scorer("hi", 2.0)  # E: [call-arg]

    countdown = proxy(Countdown(3))
    async for n in countdown:
        assert_type(n, int)
    assert_type(await countdown.__anext__(), int)

    async for word in proxy(Words()):
        assert_type(word, str)

    async with proxy(Session()) as session:
        assert_type(session, Session)
        assert_type(await session.fetch("u"), bytes)
