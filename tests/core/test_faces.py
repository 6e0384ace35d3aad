"""The member-kind table (:mod:`loopbridge._faces`): one row per member kind, and
the crossing each marshalled member records, from which the blocking face builds
its own members; on the owner loop a proxy member calls straight through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import loopbridge as lb
from loopbridge._faces import FACES, Wait, crossings_of
from loopbridge._members import MemberKind

from .conftest import Engine, Service


class Conn:
    def __init__(self) -> None:
        self.name = "c"

    async def query(self, q: str) -> str:
        return q

    async def rows(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i

    async def child(self) -> Conn:
        return Conn()

    def cursor(self) -> Conn:
        return Conn()

    def close(self) -> None:
        pass

    def label(self) -> str:
        return self.name


def test_every_member_kind_has_a_row() -> None:
    assert set(FACES) == set(MemberKind)


def test_marshalled_members_and_only_they_record_a_crossing(owner: lb.LoopThread) -> None:
    conn = Conn()
    rules = {"child": lb.Owned(), "cursor": lb.Owned()}
    lb.adopt(conn, loop=owner.loop, threadsafe=("label",), returns=rules)
    crossings = crossings_of(type(lb.proxy(conn)))
    waits = {name: (c.wait, c.with_opts) for name, c in crossings.items()}
    assert waits == {
        "query": (Wait.CALL, False),  # rendered with its own signature
        "rows": (Wait.STREAM, False),
        "child": (Wait.CALL, True),  # its result is shaped by its rule on the owner
        "cursor": (Wait.PENDING, False),
    }  # close (refused) and label (thread-safe) cross as they are
    assert crossings["query"].source is Conn.query


def test_the_blocking_face_runs_what_the_crossings_record(owner: lb.LoopThread) -> None:
    conn = Conn()
    lb.adopt(conn, loop=owner.loop, threadsafe=("label",), returns={"child": lb.Owned()})
    b = lb.blocking(lb.proxy(conn))
    assert b.query("x") == "x"
    with b.rows(3) as rows:
        assert list(rows) == [0, 1, 2]
    child = b.child()
    assert lb.is_proxy(child)  # an owned result comes back as a proxy
    assert lb.blocking(child).query("y") == "y"
    assert b.label() == "c"


def test_same_loop_calls_go_straight_through(owner: lb.LoopThread, engine: Engine) -> None:
    p = lb.proxy(engine)

    async def on_owner() -> bool:
        coro = p.echo(1)
        # Straight through: the real coroutine, no bridging wrapper.
        direct = getattr(coro, "cr_code", None) is Engine.echo.__wrapped__.__code__  # type: ignore[attr-defined]
        assert await coro == 1
        return direct

    assert owner.run(on_owner)


# Issue 33, point 10: on 3e67832 they ran on the caller's loop, the proxy class as ``cls``.
def test_async_classmethods_and_staticmethods_run_on_the_owner(
    owner: lb.LoopThread, service: Service
) -> None:
    p = lb.proxy(service)

    async def main() -> None:
        cls, ran_on = await p.register("a")
        assert cls is Service and ran_on is owner.loop  # never the proxy class
        assert await p.version() is owner.loop
        assert [x async for x in p.names()] == [(Service, owner.loop)]

    asyncio.run(main())
    assert lb.blocking(p).register("b") == (Service, owner.loop)
    assert Service.registry[-2:] == [("a", owner.loop), ("b", owner.loop)]
