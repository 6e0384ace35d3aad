"""Returned loop-bound objects: ``returns`` rules (``Owned``) and the check that
catches a loop-bound result no rule covers.

The fakes here have the shapes of the real clients (the recipes' tests run the
real ones): a session whose sync ``get()`` gives an awaitable async context
manager (aiohttp), an async ``fetch()`` that gives a response object, and an async
generator of loop-bound items.  Every owner-side member asserts it runs on the
owner loop.  grpc.aio's stubs are in test_pending.py.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
import uvloop

import loopbridge as lb
from loopbridge import Owned

from .conftest import Service, until_set, within


class Response:
    """Loop-bound: keeps its loop (as aiohttp's ClientResponse does)."""

    def __init__(self, n: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.status = 200 + n
        self.closed = False

    def _here(self) -> None:
        assert asyncio.get_running_loop() is self._loop, "ran off the owner loop"

    async def json(self) -> dict[str, int]:
        self._here()
        await asyncio.sleep(0)
        return {"status": self.status}

    def release(self) -> None:
        self.closed = True


class Request:
    """What ``Session.get()`` gives: awaitable, and an async context manager."""

    def __init__(self, session: Session, n: int) -> None:
        self.session = session
        self.n = n
        self.response: Response | None = None
        session.made.append(threading.get_ident())

    def __await__(self) -> Any:
        return self._send().__await__()

    async def _send(self) -> Response:
        self.session.here()
        return Response(self.n)

    async def __aenter__(self) -> Response:
        self.response = await self._send()
        self.session.open += 1
        return self.response

    async def __aexit__(self, et: Any, exc: Any, tb: Any) -> None:
        self.session.here()
        assert self.response is not None
        self.response.release()
        self.session.open -= 1
        self.session.exits.append(et)


class Session:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.open = 0
        self.made: list[int] = []
        self.exits: list[Any] = []
        self.finished = threading.Event()
        self.started = threading.Event()
        self.log: list[str] = []

    def here(self) -> None:
        assert asyncio.get_running_loop() is self.loop, "ran off the owner loop"

    def get(self, n: int) -> Request:
        return Request(self, n)

    async def fetch(self, n: int) -> Response:
        self.here()
        return Response(n)

    async def fetch_uncovered(self, n: int) -> Response:
        return Response(n)

    async def plain(self) -> Plain:
        return Plain()

    async def responses(self, n: int) -> AsyncIterator[Response]:
        self.started.set()
        try:
            for i in range(n):
                self.here()
                yield Response(i)
                await asyncio.sleep(0)
        finally:
            self.log.append("closed on owner" if asyncio.get_running_loop() is self.loop else "?")
            self.finished.set()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.log.append("exited")

    async def ping(self) -> str:
        self.here()
        return "pong"


class Plain:
    """No loop-bound state: crosses as it is."""

    def __init__(self) -> None:
        self.value = 1


RESPONSE = Owned(stable=("status",), threadsafe=("release",))
REQUEST = Owned(returns={"__aenter__": RESPONSE, "__await__": RESPONSE})
RULES = {"get": REQUEST, "fetch": RESPONSE, "responses": RESPONSE}


async def _session() -> Session:
    return lb.adopt(Session(), returns=RULES)


@pytest.fixture
def session(owner: lb.LoopThread) -> Session:
    return owner.run(_session)


async def _use(p: Session) -> None:
    """Every returned shape, from whatever runs this coroutine."""
    async with p.get(1) as resp:
        assert isinstance(resp, Response) and lb.is_proxy(resp)
        assert resp.status == 201  # declared stable
        assert await resp.json() == {"status": 201}  # runs on the owner
        resp.release()  # declared threadsafe
    resp = await p.get(2)
    assert lb.is_proxy(resp) and await resp.json() == {"status": 202}
    resp = await p.fetch(3)
    assert lb.is_proxy(resp) and await resp.json() == {"status": 203}
    statuses = [await r.json() async for r in p.responses(3)]
    assert statuses == [{"status": 200}, {"status": 201}, {"status": 202}]


def test_owned_results_from_another_asyncio_loop(owner: lb.LoopThread, session: Session) -> None:
    p = lb.proxy(session)
    asyncio.run(_use(p))
    assert session.open == 0 and session.exits == [None]
    # The sync member ran on the owner loop's thread, once per use.
    assert owner.thread is not None
    assert set(session.made) == {owner.thread.ident}


def test_owned_results_from_uvloop_and_trio(owner: lb.LoopThread, session: Session) -> None:
    p = lb.proxy(session)
    uvloop.run(_use(p))
    anyio.run(_use, p, backend="trio")
    assert session.open == 0


def test_owned_results_on_the_owner_loop(owner: lb.LoopThread, session: Session) -> None:
    """On the owner, members run directly; results are still proxies (which may
    then be handed to other threads)."""

    async def main() -> None:
        await _use(lb.proxy(session))

    owner.run(main)
    assert session.open == 0


def test_owned_results_from_a_plain_thread(owner: lb.LoopThread, session: Session) -> None:
    p = lb.proxy(session)
    b = lb.blocking(p)
    with b.get(1) as resp:
        assert isinstance(resp, Response) and resp.status == 201
        assert lb.blocking(resp).json() == {"status": 201}
        assert session.open == 1
    assert session.open == 0
    with lb.blocking(p.get(2)) as resp:  # a pending result made on an async face
        assert resp.status == 202
    assert lb.blocking(p.get(3)).result().status == 203
    assert b.fetch(4).status == 204
    assert [lb.blocking(r).json()["status"] for r in b.responses(2)] == [200, 201]


def test_exit_gets_the_exception_on_the_owner(owner: lb.LoopThread, session: Session) -> None:
    p = lb.proxy(session)

    async def main() -> None:
        with pytest.raises(KeyError):
            async with p.get(1):
                raise KeyError("boom")

    asyncio.run(main())
    assert session.exits == [KeyError] and session.open == 0
    with pytest.raises(KeyError), lb.blocking(p.get(1)):
        raise KeyError("boom")
    assert session.exits == [KeyError, KeyError]


def test_async_with_the_proxy_gives_the_proxy(owner: lb.LoopThread, session: Session) -> None:
    """``__aenter__`` returning self used to hand the caller the bare object."""
    p = lb.proxy(session)

    async def main() -> None:
        async with p as entered:
            assert lb.is_proxy(entered) and lb.unwrap(entered) is session
            assert await entered.ping() == "pong"

    asyncio.run(main())
    with lb.blocking(p) as entered:
        assert lb.is_proxy(entered)
    assert session.log == ["exited", "exited"]


def test_uncovered_loop_bound_result_names_the_member(
    owner: lb.LoopThread, session: Session
) -> None:
    p = lb.proxy(session)

    async def main() -> None:
        resp = await p.fetch_uncovered(1)
        assert isinstance(resp, Response)  # same type, for annotations and isinstance
        for use in (lambda: resp.status, lambda: resp.json(), lambda: resp.release()):
            with pytest.raises(lb.LoopAffinityError) as err:
                use()
            msg = str(err.value)
            assert msg.startswith("Session.fetch_uncovered() gave back a Response object")
            assert "'_loop'" in msg and "returns={'fetch_uncovered':" in msg
        assert "no returns rule covers" in repr(resp)
        raw = lb.unwrap(resp)  # the object itself, for use on its owner loop
        assert type(raw) is Response
        # Results without loop-bound state cross as they are.
        assert type(await p.plain()) is Plain

    asyncio.run(main())
    with pytest.raises(lb.LoopAffinityError, match=r"Session\.fetch_uncovered\(\)"):
        lb.blocking(p).fetch_uncovered(1).status  # noqa: B018


def test_uncovered_result_under_warn_and_off(owner: lb.LoopThread, session: Session) -> None:
    p = lb.proxy(session)
    old = lb.set_affinity_check("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resp = lb.blocking(p).fetch_uncovered(1)
        assert type(resp) is Response
        assert any("fetch_uncovered" in str(w.message) for w in caught)
        lb.set_affinity_check("off")
        assert type(lb.blocking(p).fetch_uncovered(1)) is Response
    finally:
        lb.set_affinity_check(old)


# ------------------------------------------------------------------ cancellation
def test_cancelled_enter_and_stream_are_cancelled_on_the_owner(owner: lb.LoopThread) -> None:
    entered = threading.Event()
    released: list[str] = []

    class Slow:
        async def __aenter__(self) -> Slow:
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                released.append("enter cancelled on owner")
                raise
            return self

        async def __aexit__(self, *exc: Any) -> None:
            pass

    class Client:
        def open(self) -> Slow:
            return Slow()

    async def make() -> tuple[Client, Session]:
        return lb.adopt(Client(), returns={"open": Owned()}), await _session()

    client, session = owner.run(make)
    p, ps = lb.proxy(client), lb.proxy(session)

    async def main() -> None:
        task = asyncio.create_task(p.open().__aenter__())
        await until_set(entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert released == ["enter cancelled on owner"]
        # A stream of owned items closed early closes the generator on the owner.
        async for _ in ps.responses(10**6):
            break
        await within(until_set(session.finished), 30)
        assert session.log == ["closed on owner"]

    asyncio.run(main())


# ------------------------------------------------------------------- bad input
def test_bad_rules_are_refused_with_the_fix(owner: lb.LoopThread) -> None:
    with pytest.raises(TypeError, match=r"Owned\(stable=\.\.\.\) takes a tuple"):
        Owned(stable="status")
    with pytest.raises(TypeError, match=r"adopt\(returns=\.\.\.\)\['get'\] must be"):
        lb.adopt(object(), loop=owner.loop, returns={"get": RESPONSE.stable})  # type: ignore[dict-item]
    with pytest.raises(lb.LoopAffinityError, match="has no member 'gett'"):
        lb.adopt(Session.__new__(Session), loop=owner.loop, returns={"gett": RESPONSE})
    with pytest.raises(AttributeError, match="immutable"):
        RESPONSE.stable = frozenset()  # type: ignore[misc]
    with pytest.raises(TypeError):
        RESPONSE.returns["x"] = RESPONSE  # type: ignore[index]

    class Both:
        def get(self) -> int:
            return 1

        def __aiter__(self) -> Iterator[int]:
            return iter(())

    both = lb.adopt(Both(), loop=owner.loop, threadsafe=("get",), returns={"get": RESPONSE})
    with pytest.raises(lb.LoopAffinityError, match="declared thread-safe and also has a returns"):
        lb.proxy(both)
    items = lb.adopt(Both(), loop=owner.loop, returns={"__aiter__": RESPONSE})
    with pytest.raises(lb.LoopAffinityError, match="returns=\\{'__anext__'"):
        lb.proxy(items)


def test_rules_are_values() -> None:
    a = Owned(stable=("x",), returns={"m": Owned()})
    assert a == Owned(stable=["x"], returns={"m": Owned()})
    assert hash(a) == hash(Owned(stable=("x",), returns={"m": Owned()}))
    assert a != Owned(stable=("x",))
    assert "stable=('x',)" in repr(a)


def test_proxies_with_other_rules_get_their_own_class(owner: lb.LoopThread) -> None:
    async def make(rules: dict[str, Owned]) -> Session:
        return lb.adopt(Session(), returns=rules)

    a = lb.proxy(owner.run(make, {"fetch": RESPONSE}))
    b = lb.proxy(owner.run(make, {}))
    assert type(a) is not type(b)
    assert lb.is_proxy(lb.blocking(a).fetch(1))
    with pytest.raises(lb.LoopAffinityError):
        lb.blocking(b).fetch(1).status  # noqa: B018
    del a, b
    gc.collect()


# Issue 33, point 10: on 3e67832 a fresh ``Queue`` or ``Event`` (``_loop`` still ``None``)
# crossed unchecked and bound to the caller's loop.
def test_a_fresh_queue_or_event_is_caught_before_it_binds_to_the_callers_loop(
    service: Service,
) -> None:
    p = lb.proxy(service)

    async def main() -> None:
        q = await p.fresh_queue()
        with pytest.raises(lb.LoopAffinityError, match=r"fresh_queue.*first loop that uses it"):
            q.put_nowait(1)
        holder = await p.fresh_event_holder()
        with pytest.raises(lb.LoopAffinityError, match=r"attribute 'ready'"):
            holder.ready  # noqa: B018

    asyncio.run(main())
