"""What an object handed out under an ``Owned`` rule gives back is covered at
every depth: a proxy when it holds loop-bound state anywhere it reaches, plain
data as it is; and the always-on check looks past the first level too.

Models of a streaming client: ``Client.stream()`` (a sync method) gives a
context manager; entering it gives a ``Response`` whose connection's event sits
four objects down (as httpx's does); ``Response.lines()`` reads it.  Each test
runs the use from another loop or a plain thread and records where the
owner-side code ran.  (A result no rule covers meets the always-on check, which
stays one level deep: see docs/concepts.md.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import _returns
from loopbridge._returns import loop_state

BUDGET: int = getattr(_returns, "BUDGET", 512)


class Socket:
    def __init__(self) -> None:
        self.ready = asyncio.Event()  # binds to the first loop that waits on it


class Connection:
    def __init__(self) -> None:
        self.io = {"socket": Socket()}


class Pool:
    def __init__(self, conn: Connection) -> None:
        self.connections = [conn]


class Body:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool


@dataclasses.dataclass
class Stats:
    n: int
    names: list[str]


class Response:
    def __init__(self, ran: list[int]) -> None:
        self.status_code = 200
        self.body = Body(Pool(Connection()))  # the event is 5 objects down
        self.ran = ran

    async def lines(self) -> AsyncIterator[str]:
        for i in range(3):
            self.ran.append(threading.get_ident())
            yield f"line {i}"

    async def stats(self) -> Stats:
        self.ran.append(threading.get_ident())
        return Stats(3, ["a", "b"])

    async def again(self) -> Response:
        self.ran.append(threading.get_ident())
        return Response(self.ran)

    async def nested(self) -> Body:
        return self.body


class Streamed:
    def __init__(self, ran: list[int]) -> None:
        self.ran = ran

    async def __aenter__(self) -> Response:
        self.ran.append(threading.get_ident())
        return Response(self.ran)

    async def __aexit__(self, *exc: object) -> None:
        self.ran.append(threading.get_ident())

    def __await__(self) -> Any:
        return self.__aenter__().__await__()

    def __aiter__(self) -> AsyncIterator[Response]:
        return self._items()

    async def _items(self) -> AsyncIterator[Response]:
        for _ in range(2):
            yield Response(self.ran)


class Client:
    def __init__(self) -> None:
        self.ran: list[int] = []

    def stream(self) -> Streamed:
        return Streamed(self.ran)

    async def send(self) -> Response:
        self.ran.append(threading.get_ident())
        return Response(self.ran)


@pytest.fixture
def owner() -> Iterator[lb.LoopThread]:
    with lb.LoopThread(name="depth-owner") as t:
        yield t


def _client(owner: lb.LoopThread, **returns: lb.Owned) -> tuple[Client, Any]:
    async def make() -> Client:
        return lb.adopt(Client(), returns=returns)

    client = owner.run(make)
    return client, lb.proxy(client)


def _owner_ident(owner: lb.LoopThread) -> int:
    async def ident() -> int:
        return threading.get_ident()

    return owner.run(ident)


def test_loop_state_looks_at_every_depth() -> None:
    r = Response([])
    assert loop_state(r) is None  # the always-on check stays one level deep
    found = loop_state(r, deep=True)  # type: ignore[call-arg, unused-ignore]
    assert found is not None and "body.pool.connections[0].io['socket'].ready" in found
    assert loop_state(Stats(1, ["x"] * 10), deep=True) is None  # type: ignore[call-arg, unused-ignore]
    many = Stats(1, [str(i) for i in range(BUDGET * 2)])
    assert loop_state(many, deep=True) is None  # type: ignore[call-arg, unused-ignore]
    deep: Any = None
    for _ in range(BUDGET + 1):
        deep = Stats(0, [deep])  # type: ignore[list-item]
    assert loop_state(deep, deep=True) is None  # type: ignore[call-arg, unused-ignore]
    assert loop_state(deep, deep=True, strict=True) == (  # type: ignore[call-arg, unused-ignore]
        f"it reaches more than {BUDGET} objects, too many to look through"
    )


def test_entering_under_a_bare_rule_gives_a_proxy_whose_stream_runs_on_the_owner(
    owner: lb.LoopThread,
) -> None:
    client, p = _client(owner, stream=lb.Owned())

    async def main() -> list[str]:
        async with p.stream() as r:
            assert lb.is_proxy(r), "entering gave a bare Response"
            lines = [line async for line in r.lines()]
            again = await r.again()  # and what the covered response gives, in turn
            assert lb.is_proxy(again)
            assert [line async for line in again.lines()] == lines
            stats = await r.stats()  # plain data: as it is
            assert type(stats) is Stats and stats == Stats(3, ["a", "b"])
            with pytest.raises(lb.LoopAffinityError, match="status_code"):
                r.status_code  # noqa: B018 - not declared: refused, never read across
            return lines

    assert asyncio.run(main()) == ["line 0", "line 1", "line 2"]
    with lb.blocking(p.stream()) as r:
        assert lb.is_proxy(r)
        assert list(lb.blocking(r).lines()) == ["line 0", "line 1", "line 2"]
        assert lb.is_proxy(lb.blocking(r).nested())
    assert set(client.ran) == {_owner_ident(owner)}


def test_awaiting_and_iterating_under_a_bare_rule_are_covered(owner: lb.LoopThread) -> None:
    client, p = _client(owner, stream=lb.Owned())

    async def main() -> None:
        r = await p.stream()  # awaiting it gives a Response too
        assert lb.is_proxy(r)
        assert [line async for line in r.lines()] == ["line 0", "line 1", "line 2"]
        items = [item async for item in p.stream()]
        assert len(items) == 2 and all(lb.is_proxy(i) for i in items)
        assert [line async for line in items[1].lines()] == ["line 0", "line 1", "line 2"]

    asyncio.run(main())
    assert set(client.ran) == {_owner_ident(owner)}


def test_explicit_nested_rules_still_apply(owner: lb.LoopThread) -> None:
    rule = lb.Owned(returns={"__aenter__": lb.Owned(stable=("status_code",))})
    _, p = _client(owner, stream=rule)

    async def main() -> int:
        async with p.stream() as r:
            return int(r.status_code)

    assert asyncio.run(main()) == 200


def test_the_advised_rule_for_an_uncovered_result_covers_it_at_every_depth(
    owner: lb.LoopThread,
) -> None:
    client, p = _client(owner, send=lb.Owned())

    async def main() -> list[str]:
        r = await p.send()
        assert lb.is_proxy(r)
        return [line async for line in r.lines()]

    assert asyncio.run(main()) == ["line 0", "line 1", "line 2"]
    assert set(client.ran) == {_owner_ident(owner)}
