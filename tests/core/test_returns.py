"""Returned loop-bound objects: ``returns`` rules (``Owned``) and the check that
catches a loop-bound result no rule covers.

The fakes here have the shapes of the real clients (the recipes' tests run the
real ones): a session whose sync ``get()`` gives an awaitable async context
manager (aiohttp), an async ``fetch()`` that gives a response object, a stub
whose attributes are callables that give awaitable and async-iterable calls
(grpc.aio), and an async generator of loop-bound items.  Every owner-side
member asserts it runs on the owner loop.
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
            assert "Session.fetch_uncovered() returned a Response object" in msg
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


@lb.loop_affine(stable=("name",))
class Child:
    def __init__(self, name: str) -> None:
        self.name = name

    async def where(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()


@lb.loop_affine
class Parent:
    async def child(self) -> Child:
        return Child("c")


def test_loop_affine_result_comes_back_as_a_proxy(owner: lb.LoopThread) -> None:
    async def make() -> Parent:
        return Parent()

    p = lb.proxy(owner.run(make))
    child = lb.blocking(p).child()
    assert lb.is_proxy(child) and child.name == "c"
    assert lb.blocking(child).where() is owner.loop


# ------------------------------------------------------------ grpc-shaped stubs
class Call:
    """Awaitable and async-iterable, started on the loop it is made on (grpc.aio)."""

    def __init__(self, n: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.n = n
        self.was_cancelled = False

    def __await__(self) -> Any:
        return self._result().__await__()

    async def _result(self) -> int:
        assert asyncio.get_running_loop() is self._loop
        return self.n * 10

    def __aiter__(self) -> AsyncIterator[int]:
        return self._items()

    async def _items(self) -> AsyncIterator[int]:
        assert asyncio.get_running_loop() is self._loop
        for i in range(self.n):
            yield i

    # The future protocol, as grpc.aio's calls have it: an operation in flight.
    def cancel(self) -> bool:
        assert asyncio.get_running_loop() is self._loop
        self.was_cancelled = True
        return True

    def cancelled(self) -> bool:
        return self.was_cancelled

    def done(self) -> bool:
        return self.was_cancelled

    def add_done_callback(self, fn: Any) -> None:
        raise NotImplementedError


class MultiCallable:
    def __init__(self) -> None:
        self.calls = 0
        self.made: list[Call] = []

    def __call__(self, n: int) -> Call:
        self.calls += 1
        self.made.append(Call(n))
        return self.made[-1]


class Stub:
    def __init__(self) -> None:
        self.method = MultiCallable()  # an instance attribute, like a generated stub's


CALLABLE = Owned(returns={"__call__": Owned()})


def test_stub_attributes_callables_and_calls(owner: lb.LoopThread) -> None:
    async def make() -> Stub:
        return lb.adopt(Stub(), returns={"method": CALLABLE})

    stub = owner.run(make)
    p = lb.proxy(stub)

    async def main() -> None:
        assert isinstance(p.method, MultiCallable) and lb.is_proxy(p.method)
        assert await p.method(4) == 40
        assert [i async for i in p.method(3)] == [0, 1, 2]

    asyncio.run(main())
    anyio.run(main, backend="trio")
    b = lb.blocking(p)
    assert b.method(5).result() == 50
    assert list(b.method(2)) == [0, 1]
    assert stub.method.calls == 6  # each call made once, on the owner
    assert not any(call.was_cancelled for call in stub.method.made)  # all ran to the end


def test_a_call_iterated_and_left_early_is_cancelled_on_the_owner(owner: lb.LoopThread) -> None:
    async def make() -> Stub:
        return lb.adopt(Stub(), returns={"method": CALLABLE})

    stub = owner.run(make)
    p = lb.proxy(stub)

    async def main() -> None:
        it = p.method(10**6).__aiter__()
        assert await it.__anext__() == 0
        await it.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    with iter(lb.blocking(p).method(10**6)) as items:  # type: ignore[attr-defined]
        assert next(items) == 0
    with (
        pytest.raises(TypeError, match="gave a Call object, which is not an async context"),
        lb.blocking(p).method(1),
    ):
        pass
    assert [call.was_cancelled for call in stub.method.made] == [True, True, False]


class Order:
    """A business object with a ``cancel()`` of its own, iterable for its lines."""

    def __init__(self) -> None:
        self.cancelled_by: list[str] = []

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:  # longer than any read-ahead: the consumer leaves early
            yield "tea"

    def cancel(self) -> None:
        self.cancelled_by.append("loopbridge")


class Shop:
    def __init__(self) -> None:
        self.orders: list[Order] = []

    def order(self) -> Order:
        self.orders.append(Order())
        return self.orders[-1]


def test_leaving_early_never_calls_a_business_objects_cancel(owner: lb.LoopThread) -> None:
    """On 3e67832 a break out of `async for` over a pending result called the
    object's cancel() whatever it was: an order was cancelled."""

    async def make() -> Shop:
        return lb.adopt(Shop(), returns={"order": Owned()})

    shop = owner.run(make)
    p = lb.proxy(shop)

    async def main() -> None:
        lines = p.order().__aiter__()
        assert await lines.__anext__() == "tea"
        await lines.aclose()  # type: ignore[attr-defined]  # waits for the owner's cleanup

    asyncio.run(main())
    with iter(lb.blocking(p).order()) as lines:  # type: ignore[attr-defined]
        assert next(lines) == "tea"  # leaving the block waits for the owner's cleanup

    async def cancelled() -> list[list[str]]:
        return [o.cancelled_by for o in shop.orders]

    assert owner.run(cancelled) == [[], []]


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
