"""What one request through a recipe builds, and what it no longer builds.

A recipe's request goes through the same few objects every time: a grpc stub's
method (an instance attribute with a returns rule), a blocking face's member,
and, for clients whose results belong to the owner loop, one object handed out
under a rule per request (a response, an RPC's call).  These tests pin that the
objects that stay the same are made once, not once per request:

* an owned instance attribute gives the same proxy while it holds the same
  object, and a new one once it holds another (``_proxy._OwnedInstanceAttr``);
* the blocking faces of a proxy without a timeout bind each member once, and
  the binding holds neither the proxy nor a face (no cycle keeps them);
* objects handed out under a rule (one per request) get their records made
  with the declarations their rule fixes once, and keep metrics of their own.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import Owned
from loopbridge._ownership import ownership_of
from loopbridge.metrics import metrics_of, snapshot


class Reply:
    """Awaitable, made on the loop it belongs to (a grpc.aio call's shape)."""

    def __init__(self, n: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.n = n

    def __await__(self) -> Any:
        return self._value().__await__()

    async def _value(self) -> int:
        assert asyncio.get_running_loop() is self._loop
        return self.n * 10


class Method:
    def __call__(self, n: int) -> Reply:
        return Reply(n)


class Stub:
    def __init__(self) -> None:
        self.Say = Method()  # an instance attribute, as a generated stub's


METHOD = Owned(returns={"__call__": Owned()})


async def _make_stub() -> Stub:
    return lb.adopt(Stub(), returns={"Say": METHOD})


def test_an_owned_instance_attribute_gives_one_proxy_while_it_holds_one_object(
    owner: lb.LoopThread,
) -> None:
    stub = owner.run(_make_stub)
    p = lb.proxy(stub)
    first = p.Say
    assert lb.is_proxy(first) and lb.unwrap(first) is stub.Say
    assert p.Say is first  # read again: the same proxy, not a new one per request

    async def main() -> list[int]:
        return [await p.Say(n) for n in range(3)]

    assert asyncio.run(main()) == [0, 10, 20]
    assert lb.blocking(p).Say(4).result() == 40

    async def replace() -> None:
        stub.Say = Method()

    owner.run(replace)
    second = p.Say  # the attribute holds another object now: its own proxy
    assert second is not first and lb.unwrap(second) is stub.Say
    assert asyncio.run(main()) == [0, 10, 20]
    # Another proxy of the same object keeps its own (its settings may differ).
    assert lb.proxy(stub, cancel_grace=1.0).Say is not second


def test_an_owned_instance_attribute_missing_on_the_object_is_an_attribute_error(
    owner: lb.LoopThread,
) -> None:
    stub = owner.run(_make_stub)
    p = lb.proxy(stub)

    async def drop() -> None:
        del stub.Say

    owner.run(drop)
    with pytest.raises(AttributeError, match="Say"):
        p.Say  # noqa: B018
    assert not hasattr(p, "Say")


@lb.loop_affine
class Counter:
    def __init__(self) -> None:
        self.n = 0

    async def bump(self) -> int:
        self.n += 1
        return self.n


async def _make_counter() -> Counter:
    return Counter()


def test_blocking_faces_of_a_proxy_bind_each_member_once(owner: lb.LoopThread) -> None:
    p = lb.proxy(owner.run(_make_counter))
    member = lb.blocking(p).bump
    assert lb.blocking(p).bump is member  # a new face per request binds nothing anew
    assert [lb.blocking(p).bump() for _ in range(3)] == [1, 2, 3]
    # A face with a timeout binds its own: its calls carry that timeout.
    timed = lb.blocking(p, timeout=5).bump
    assert timed is not member and timed() == 4
    # Another proxy of the same object has its own members (its own settings).
    assert lb.blocking(lb.proxy(lb.unwrap(p))).bump is not member


def test_a_bound_blocking_member_refers_to_no_proxy_or_face(owner: lb.LoopThread) -> None:
    """What the shared members hold is the object and the proxy's settings, never
    the proxy or a face: the proxy, kept by its faces' members, would otherwise
    be in a cycle, and a result's proxy (a response) would wait for the
    collector to be freed."""
    p = lb.proxy(owner.run(_make_counter))
    face = lb.blocking(p)
    member = face.bump
    assert member() == 1
    held = gc.get_referents(member.__self__)
    assert lb.unwrap(p) in held
    assert not any(x is p or x is face or isinstance(x, lb.Blocking) for x in held)
    assert not any(x is p or isinstance(x, lb.Blocking) for x in gc.get_referents(member))


class Response:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def body(self) -> bytes:
        assert asyncio.get_running_loop() is self._loop
        return b"body"


@lb.loop_affine(returns={"get": Owned()})
class Session:
    async def get(self) -> Response:
        return Response()


async def _make_session() -> Session:
    return Session()


def test_results_under_one_rule_share_its_declarations_and_keep_their_own_metrics(
    asyncio_owner: lb.LoopThread,
) -> None:
    """One response per request: each comes back as its own proxy with a record
    of its own, whose declarations (what its proxy class is cached by) are made
    once per rule, not once per result; its metrics are its own, and the totals
    of its name count every call, also once the responses are gone."""
    session = lb.proxy(asyncio_owner.run(_make_session))
    name = "Response object from Session.get()"
    gc.collect()
    before = snapshot()["objects"].get(name, {}).get("calls", 0)

    async def requests(n: int) -> list[Any]:
        responses = [await session.get() for _ in range(n)]
        assert [await r.body() for r in responses] == [b"body"] * n
        return responses

    responses = asyncio.run(requests(50))
    records = [ownership_of(lb.unwrap(r)) for r in responses]
    assert len({id(r) for r in records}) == 50  # each its own record
    key = records[0].spec_key()  # type: ignore[union-attr]
    assert all(r.spec_key() is key for r in records)  # type: ignore[union-attr]
    assert len({id(metrics_of(r)) for r in responses}) == 50
    assert all(metrics_of(r).snapshot()["calls"] == 1 for r in responses)
    assert snapshot()["objects"][name]["calls"] - before == 50
    del responses, records
    gc.collect()
    assert snapshot()["objects"][name]["calls"] - before == 50  # never drops


def test_the_blocking_face_of_an_owned_attribute_is_made_once_while_it_holds_one_object(
    owner: lb.LoopThread,
) -> None:
    """``blocking(stub).Say(...)`` per request: the face of ``Say`` is kept beside
    the bound members while the attribute holds the same object, and made anew
    once it holds another; the face of the stub itself is a new, cheap one."""
    stub = owner.run(_make_stub)
    p = lb.proxy(stub)
    face = lb.blocking(p).Say
    assert isinstance(face, lb.Blocking) and lb.unwrap(p.Say) is stub.Say
    assert lb.blocking(p).Say is face  # another request: the same face
    assert [lb.blocking(p).Say(n).result() for n in range(3)] == [0, 10, 20]

    async def replace() -> None:
        stub.Say = Method()

    owner.run(replace)
    second = lb.blocking(p).Say  # the attribute holds another object: its own face
    assert second is not face and second(5).result() == 50
    assert lb.blocking(p).Say is second
    # A face with a timeout keeps its own (its waits carry that timeout).
    assert lb.blocking(p, timeout=5).Say is not second


def test_a_kept_attribute_face_keeps_no_cycle_through_the_proxy(owner: lb.LoopThread) -> None:
    """The kept face holds the attribute's proxy, never the stub's: with the
    collector off, dropping the stub's proxy frees it (and what it kept) at once."""
    stub = owner.run(_make_stub)
    p = lb.proxy(stub)
    assert lb.blocking(p).Say(1).result() == 10
    gone = weakref.ref(p)
    say = weakref.ref(p.Say)
    gc.disable()
    try:
        del p
        assert gone() is None and say() is None
    finally:
        gc.enable()
