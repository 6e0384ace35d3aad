"""An engine's member table, engine aside (loopbridge_adapters.surface).

Small classes stand in for an engine; each adapter's table is checked against the
installed engine in tests/vllm (test_engine_surface.py) and tests/sglang
(test_manager_surface.py).
"""

from __future__ import annotations

import functools
import pickle
from typing import Any, ClassVar, Protocol

import pytest

from loopbridge_adapters.surface import (
    Member,
    MemberTable,
    Policy,
    Rule,
    UnclassifiedMemberError,
    collect,
    member_kind,
)


class _Client(Protocol):
    config: Any

    async def generate(self) -> Any: ...


class _Base:
    def shutdown(self) -> None: ...

    async def abort(self) -> None: ...


class _Engine(_Base):
    version: ClassVar[str] = "1"

    def __init__(self) -> None:
        self.queue: list[Any] = []
        self._socket = None

    async def generate(self) -> Any:
        yield None

    def abort(self) -> None:  # type: ignore[override]  # the subclass decides the kind
        ...

    @property
    def healthy(self) -> bool:
        return True

    @functools.cached_property
    def tokenizer(self) -> Any:
        return None

    @classmethod
    def build(cls) -> _Engine:
        return cls()

    def _internal(self) -> None: ...

    def __repr__(self) -> str:
        return "engine"


def test_member_kinds_as_found_in_a_class_dict() -> None:
    kinds = {name: member_kind(raw) for name, raw in vars(_Engine).items()}
    assert kinds["generate"] == "asyncgen"
    assert kinds["abort"] == "sync"
    assert kinds["healthy"] == "property"
    assert kinds["tokenizer"] == "property"  # another descriptor
    assert kinds["build"] == "class-level"
    assert kinds["version"] == "class-level"  # class data
    assert member_kind(vars(_Base)["abort"]) == "async"
    assert member_kind(staticmethod(len)) == "class-level"


def test_collect_finds_every_member_once_and_no_dunders() -> None:
    members = collect((_Engine, _Client), annotated=(_Client,), instance=_Engine())
    assert members["abort"] == Member("abort", "sync", "_Engine")  # the first class decides
    assert members["shutdown"] == Member("shutdown", "sync", "_Engine")  # from a base
    assert members["config"] == Member("config", "data", "_Client")  # a protocol's data
    assert members["queue"] == Member("queue", "data", "instance")
    assert members["_socket"] == Member("_socket", "data", "instance")
    assert not [name for name in members if name.startswith("__")]


_RULES = {
    "abort": Rule(Policy.MARSHAL, "sends on the socket"),
    "shutdown": Rule(Policy.THREADSAFE, "thread-safe teardown"),
    "healthy": Rule(Policy.HEALTH, "a plain read"),
    "tokenizer": Rule(Policy.STABLE, "set once"),
    "version": Rule(Policy.STABLE, "class data, named anyway"),
}
_KIND_RULES = {
    "async": Rule(Policy.MARSHAL, "coroutines run on the owner loop"),
    "asyncgen": Rule(Policy.STREAM, "streams"),
    "class-level": Rule(Policy.CLASS_LEVEL, "no instance state"),
    "private": Rule(Policy.REFUSE, "internals"),
}
_TABLE = MemberTable(_RULES, _KIND_RULES, "the test's RULES")


def test_a_member_rule_comes_first_then_its_kind() -> None:
    table = _TABLE.classify(collect((_Engine,), instance=_Engine()))
    rules = {name: rule.policy if rule else None for name, (_, rule) in table.items()}
    assert rules == {
        "abort": Policy.MARSHAL,  # a sync member: its own rule
        "shutdown": Policy.THREADSAFE,
        "healthy": Policy.HEALTH,
        "tokenizer": Policy.STABLE,
        "version": Policy.STABLE,  # its own rule before its kind's
        "generate": Policy.STREAM,
        "build": Policy.CLASS_LEVEL,
        "_internal": Policy.REFUSE,
        "_socket": Policy.REFUSE,
        "queue": None,  # public data: only a rule of its own may classify it
    }


def test_declarations_fail_closed_naming_each_unclassified_member() -> None:
    with pytest.raises(UnclassifiedMemberError, match="the test's RULES") as info:
        _TABLE.declarations(collect((_Engine,), instance=_Engine()))
    assert info.value.members == (Member("queue", "data", "instance"),)
    assert "queue (data, from instance)" in str(info.value)


def test_the_unclassified_member_error_survives_pickling() -> None:
    with pytest.raises(UnclassifiedMemberError) as info:
        _TABLE.declarations(collect((_Engine,), instance=_Engine()))
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is UnclassifiedMemberError
    assert back.args == info.value.args and str(back) == str(info.value)
    assert back.members == (Member("queue", "data", "instance"),)
    assert back.table == "the test's RULES"


def test_declarations_split_stable_data_from_members_any_thread_may_call() -> None:
    stable, threadsafe = _TABLE.declarations(collect((_Engine,)))
    assert stable == {"tokenizer", "version"}
    assert threadsafe == {"healthy", "shutdown"}  # health reads are thread-safe too
