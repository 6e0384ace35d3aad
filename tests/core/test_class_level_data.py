"""Class-level data that an instance shadows is the instance's data.

On 45500bb a class attribute that is data (not a method or descriptor) was
classified as class-level and inherited by the proxy class as is, so a proxy
read the class's value for ever: aiohttp's ``ClientResponse`` declares
``content: StreamReader = None`` and ``status: int = None`` and sets both on the
instance when the response starts, and ``response.content`` through a proxy was
``None``.  Now a name the instance holds a value of its own for, or one the
class annotates as per-instance (PEP 526, not ``ClassVar``), is instance data:
refused with the advice for the instance's value, and following that advice
reads the instance's value.  A class constant nobody shadows is still read as
is, and so is anything on a class whose instances have no ``__dict__``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest

import loopbridge as lb
from loopbridge import LoopAffinityError, Owned


class Reader:
    """A loop-bound stream, as aiohttp's ``StreamReader``."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()

    async def read(self) -> bytes:
        return b"body"


class Response:
    """aiohttp's shape: per-instance data declared with a class-level default."""

    status: int = None  # type: ignore[assignment]
    content: Reader = None  # type: ignore[assignment]
    reason = None  # unannotated default, set when the response starts
    kind: ClassVar[str] = "http"  # a class constant, annotated as one
    VERSION = (1, 1)  # a class constant

    async def start(self) -> None:
        self.status = 200
        self.content = Reader()
        self.reason = "OK"


class Slotted:
    __slots__ = ("value",)
    LIMIT = 3

    def __init__(self) -> None:
        self.value = 1


def made(owner: lb.LoopThread, started: bool = True, **declared: Any) -> Any:
    async def build() -> Response:
        r = Response()
        if started:
            await r.start()
        return lb.adopt(r, **declared)

    return lb.proxy(owner.run(build))


def advice_of(exc: LoopAffinityError) -> str:
    assert exc.advice is not None
    assert str(exc) == exc.advice.render()
    return exc.advice.fixes[0].code


def test_shadowed_data_is_refused_with_stable_advice_that_reads_the_instance(
    owner: lb.LoopThread,
) -> None:
    p = made(owner)
    with pytest.raises(LoopAffinityError) as info:
        _ = p.status
    assert str(info.value).startswith(
        "Response.status (an instance attribute) is refused through a proxy: "
        "declare `stable=('status',)`"
    )
    assert advice_of(info.value) == "stable=('status',)"
    assert made(owner, stable=("status",)).status == 200
    assert lb.blocking(made(owner, stable=("status",))).status == 200


def test_shadowed_loop_bound_data_is_advised_returns_and_comes_back_owned(
    owner: lb.LoopThread,
) -> None:
    p = made(owner)
    with pytest.raises(LoopAffinityError) as info:
        _ = p.content
    code = advice_of(info.value)
    assert code == "returns={'content': loopbridge.Owned()}"
    fixed = made(owner, returns={"content": Owned()})
    content = fixed.content
    assert lb.is_proxy(content)
    assert asyncio.run(content.read()) == b"body"
    assert lb.blocking(fixed).content.read() == b"body"


def test_unannotated_default_shadowed_by_the_instance_is_refused(owner: lb.LoopThread) -> None:
    with pytest.raises(LoopAffinityError, match=r"^Response\.reason \(an instance attribute\)"):
        _ = made(owner).reason
    assert made(owner, stable=("reason",)).reason == "OK"


def test_annotated_per_instance_data_is_refused_before_it_is_set(owner: lb.LoopThread) -> None:
    """The class says ``status`` is per-instance: refused even while the instance
    still shows the class's default, since the owner sets it later."""
    with pytest.raises(LoopAffinityError, match=r"stable=\('status',\)"):
        _ = made(owner, started=False).status


def test_class_constants_nobody_shadows_are_read_as_is(owner: lb.LoopThread) -> None:
    p = made(owner, started=False)
    assert p.VERSION == (1, 1)
    assert p.kind == "http"
    assert p.reason is None  # unannotated and not (yet) set: the class's value
    assert lb.blocking(p).VERSION == (1, 1)
    assert type(p).VERSION == (1, 1)


def test_a_class_without_instance_dict_keeps_its_constants(owner: lb.LoopThread) -> None:
    async def build() -> Slotted:
        return lb.adopt(Slotted())

    p = lb.proxy(owner.run(build))
    assert p.LIMIT == 3
    with pytest.raises(LoopAffinityError, match=r"stable=\('value',\)"):
        _ = p.value


def test_an_instance_value_of_none_is_data(owner: lb.LoopThread) -> None:
    """``None`` is a value an instance holds: advised ``stable=``, not as a method."""

    class Holder:
        def __init__(self) -> None:
            self.token = None

    async def build() -> Holder:
        return lb.adopt(Holder())

    with pytest.raises(LoopAffinityError) as info:
        _ = lb.proxy(owner.run(build)).token
    assert advice_of(info.value) == "stable=('token',)"
