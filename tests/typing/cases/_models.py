"""Classes the typing cases use: one of each member shape the proxy marshals."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Generic, TypeVar, overload

from loopbridge import loop_affine

T = TypeVar("T")
K = TypeVar("K")


class Token:
    text: str = ""


@loop_affine
class Engine:
    def __init__(self) -> None:
        self.count = 0

    async def generate(self, prompt: str, *, max_tokens: int = 16) -> str:
        return prompt[:max_tokens]

    async def stream(self, prompt: str) -> AsyncIterator[Token]:
        yield Token()

    async def numbers(self, n: int, step: int = 1) -> AsyncGenerator[int, None]:
        for i in range(0, n, step):
            yield i

    async def kinds(
        self,
        a: int,
        /,
        b: str,
        c: float = 1.0,
        *args: bytes,
        d: bool,
        e: int | None = None,
        **kw: object,
    ) -> tuple[int, str]:
        return a, b

    async def first(self, items: list[T]) -> T:
        return items[0]

    @overload
    async def get(self, key: int) -> int: ...
    @overload
    async def get(self, key: str) -> str: ...
    async def get(self, key: int | str) -> int | str:
        return key

    async def nothing(self) -> None:
        return None

    def sync_member(self) -> int:
        return self.count


@loop_affine(stable=("name", "config"))
class Store(Generic[K]):
    config: dict[str, int] = {}

    def __init__(self, name: str) -> None:
        self.name = name
        self.items: dict[str, K] = {}

    async def load(self, key: str) -> K:
        return self.items[key]

    async def save(self, key: str, value: K) -> None:
        self.items[key] = value

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        for k in self.items:
            if k.startswith(prefix):
                yield k


class Foreign:
    """A class from a library we don't own: never decorated, adopted per instance."""

    limit: int = 3

    async def fetch(self, url: str, /, *, timeout: float | None = None) -> bytes:
        return url.encode()

    async def generate(self, prompt: str) -> bytes:
        return prompt.encode()

    async def lines(self, *paths: str) -> AsyncGenerator[str, None]:
        for p in paths:
            yield p
