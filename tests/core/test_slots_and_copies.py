"""Instances without a ``__dict__`` (``__slots__``), copies and pickles.

On 3e67832: any direct call of an async method of a slotted ``@loop_affine``
class raised ``AttributeError: ... no attribute '__dict__'`` (the always-on
check read ``self.__dict__``), even on its owner; without ``__weakref__`` every
instance was kept alive for ever by the ownership table.  ``copy.copy(obj)``
shared the original's ownership record, so ``transfer(copy, B)`` moved the
original too; ``pickle.dumps`` and ``copy.deepcopy`` failed with ``cannot pickle
'mappingproxy' object``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import gc
import pickle
from typing import Any

import pytest

import loopbridge as lb

freed = 0


@lb.loop_affine
class Slotted:
    __slots__ = ("x",)

    def __init__(self, x: int) -> None:
        self.x = x

    async def get(self) -> int:
        return self.x

    def __del__(self) -> None:
        global freed
        freed += 1


@lb.loop_affine
class WeakSlotted:
    __slots__ = ("x", "__weakref__")

    def __init__(self, x: int) -> None:
        self.x = x

    async def get(self) -> int:
        return self.x


@lb.loop_affine
@dataclasses.dataclass(slots=True)
class Row:
    id: int

    async def get(self) -> int:
        return self.id


@lb.loop_affine
class Plain:
    def __init__(self) -> None:
        self.x = 1
        self.items = [1, 2]

    async def get(self) -> int:
        return self.x


def _on(owner: lb.LoopThread, factory: Any, *args: Any) -> Any:
    async def make() -> Any:
        return factory(*args)

    return owner.run(make)


@pytest.mark.parametrize("cls", [Slotted, WeakSlotted, Row])
def test_slotted_classes_work_on_their_owner_and_are_guarded_off_it(
    owner: lb.LoopThread, cls: Any
) -> None:
    async def on_owner() -> tuple[int, bool]:
        obj = cls(7)
        return await obj.get(), lb.owner_loop(obj) is asyncio.get_running_loop()

    assert owner.run(on_owner) == (7, True)
    obj = _on(owner, cls, 8)

    async def elsewhere() -> int:
        with pytest.raises(lb.LoopAffinityError, match=r"get\(\) called from"):
            await obj.get()
        return await lb.proxy(obj).get()  # type: ignore[no-any-return]

    assert asyncio.run(elsewhere()) == 8
    assert type(obj).__name__ == cls.__name__  # the class keeps its name


def test_dropped_slotted_instances_are_freed() -> None:
    """1,000 of 1,000 dropped instances stayed alive on 3e67832."""

    async def churn() -> None:
        for i in range(1000):
            Slotted(i)

    before = freed
    asyncio.run(churn())
    gc.collect()
    assert freed - before == 1000


def test_adopted_objects_are_told_apart_by_identity_not_equality(owner: lb.LoopThread) -> None:
    """The table of adopted objects without a __dict__ used the object's own hash and
    equality: two equal slotted rows shared one record."""

    class Key:
        __slots__ = ("k", "__weakref__")

        def __init__(self, k: int) -> None:
            self.k = k

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Key) and other.k == self.k

        def __hash__(self) -> int:
            return hash(self.k)

    a, b = Key(1), Key(1)
    lb.adopt(a, loop=owner.loop)
    assert lb.owner_loop(a) is owner.loop
    with pytest.raises(lb.LoopAffinityError, match="not loop-affine"):
        lb.owner_loop(b)  # equal, but not adopted


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
@pytest.mark.parametrize("cls", [Plain, Slotted])
def test_a_copy_owns_itself(owner: lb.LoopThread, how: str, cls: Any) -> None:
    dup = {"copy": copy.copy, "deepcopy": copy.deepcopy}.get(
        how, lambda o: pickle.loads(pickle.dumps(o))
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        obj = cls(3) if cls is Slotted else cls()
        c = dup(obj)
        assert c.x == obj.x and type(c) is type(obj)
        assert lb.owner_loop(c) is loop  # made here, as if constructed here
        assert await c.get() == obj.x
        lb.transfer(c, owner.loop)
        assert lb.owner_loop(c) is owner.loop
        assert lb.owner_loop(obj) is loop  # the original stays where it was
        assert await obj.get() == obj.x

    asyncio.run(main())


def test_a_copy_made_where_no_loop_runs_has_no_owner_yet(owner: lb.LoopThread) -> None:
    obj = _on(owner, Plain)
    c = copy.copy(obj)
    assert lb.owner_loop(c) is None and lb.owner_loop(obj) is owner.loop


def test_a_copy_of_an_adopted_object_is_not_loop_affine(owner: lb.LoopThread) -> None:
    """Its class was not decorated, so nothing gives a copy a record; the shared one
    is the original's, and it is ignored: adopt the copy to declare it."""
    obj = lb.adopt(dataclasses.make_dataclass("Conn", ["x"])(1), loop=owner.loop)
    c = copy.copy(obj)
    with pytest.raises(lb.LoopAffinityError, match="not loop-affine"):
        lb.owner_loop(c)
    lb.adopt(c, loop=owner.loop)
    assert lb.owner_loop(c) is owner.loop


def test_a_class_that_defines_its_own_reduce_keeps_it(owner: lb.LoopThread) -> None:
    obj = _on(owner, Rebuilt, 5)
    before = Rebuilt.rebuilt
    c = pickle.loads(pickle.dumps(obj))
    assert c.n == 5 and Rebuilt.rebuilt == before + 1  # its own __reduce__ ran
    assert lb.owner_loop(c) is None  # made by __init__ where no loop runs


@lb.loop_affine
class Rebuilt:
    rebuilt = 0

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self) -> Any:
        type(self).rebuilt += 1
        return (Rebuilt, (self.n,))
