"""An engine's member table: every member of the installed engine, each with a rule.

An adapter hands a proxy to serving code that runs on another thread. Which of the
engine's members that code may touch directly, and which must run on the owner loop,
is a decision per member; an engine release that adds a member must not slip through
with a guess. So the member list is never written by hand: :func:`collect` derives it
from the installed engine's classes (and, given one, an instance's attributes), and a
:class:`MemberTable` classifies each member by its per-member rule, else by its kind.

Invariants:

* every member of the surface gets exactly one rule, or the table refuses the whole
  surface with :class:`UnclassifiedMemberError` (fail closed: at start-up, never a
  failed request later);
* a kind rule covers only members whose nature decides their policy (coroutines run on
  the owner loop, async generators stream from it, class-level members carry no
  per-instance state, private sync members are refused); a public sync member or data
  attribute always needs a per-member rule that says why.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loopbridge import LoopAffinityError

__all__ = [
    "Member",
    "MemberTable",
    "Policy",
    "Rule",
    "UnclassifiedMemberError",
    "collect",
    "member_kind",
]


class Policy(str, enum.Enum):
    """What the proxy does with a member."""

    STABLE = "stable"  # data set once at construction: read directly
    HEALTH = "health"  # status read directly; never blocks the caller's loop
    THREADSAFE = "threadsafe"  # sync member that is safe to call from any thread
    MARSHAL = "marshal"  # coroutine: runs on the owner loop
    STREAM = "stream"  # async generator: runs on the owner loop, streamed back
    REFUSE = "refuse"  # owner-loop state: LoopAffinityError when touched
    CLASS_LEVEL = "class-level"  # classmethod/staticmethod/class data: untouched


@dataclass(frozen=True)
class Rule:
    policy: Policy
    reason: str


@dataclass(frozen=True)
class Member:
    """One member of the installed engine surface."""

    name: str
    kind: str  # "async", "asyncgen", "sync", "property", "class-level", "data"
    origin: str  # where it was found: a class name, or "instance"


class UnclassifiedMemberError(LoopAffinityError):
    """The installed engine has members that no rule classifies."""

    def __init__(self, members: Iterable[Member], table: str = "the adapter's RULES") -> None:
        self.members = tuple(members)
        self.table = table
        listed = ", ".join(f"{m.name} ({m.kind}, from {m.origin})" for m in self.members)
        super().__init__(
            f"these engine members are not classified for cross-thread use: {listed}. "
            f"Add a rule to {table} saying whether each is stable data, a health read, "
            "thread-safe, or owner-loop state."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's would call the class with the message, not the members.
        return type(self), (self.members, self.table), self.__dict__


def member_kind(raw: Any) -> str:
    """The kind of a class attribute as found in a class ``__dict__``."""
    if isinstance(raw, (staticmethod, classmethod)):
        return "class-level"
    if inspect.isasyncgenfunction(raw):
        return "asyncgen"
    if inspect.iscoroutinefunction(raw):
        return "async"
    if isinstance(raw, property):
        return "property"
    if inspect.isfunction(raw):
        return "sync"
    if hasattr(raw, "__get__") and not inspect.isclass(raw):
        return "property"  # other descriptors (cached_property, slots, ...)
    return "class-level"


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def collect(
    classes: Sequence[type],
    *,
    annotated: Sequence[type] = (),
    instance: object | None = None,
) -> dict[str, Member]:
    """Every member of ``classes`` (all bases), with its kind and where it was found.

    The first class that defines a name decides its kind. ``annotated`` adds the
    annotated attributes of those classes (a protocol's declared data) as ``data``;
    ``instance`` adds its own attributes, also as ``data``. Dunder members are left
    out: a proxy never forwards them.
    """
    found: dict[str, Member] = {}
    for cls in classes:
        for klass in cls.__mro__:
            if klass is object:
                continue
            for name, raw in vars(klass).items():
                if not _is_dunder(name) and name not in found:
                    found[name] = Member(name, member_kind(raw), cls.__name__)
    for cls in annotated:
        for klass in cls.__mro__:
            for name in getattr(klass, "__annotations__", {}):
                if not _is_dunder(name) and name not in found:
                    found[name] = Member(name, "data", cls.__name__)
    if instance is not None:
        for name in vars(instance):
            if not _is_dunder(name) and name not in found:
                found[name] = Member(name, "data", "instance")
    return found


class MemberTable:
    """Per-member rules, then rules by kind; see the module docstring.

    ``kind_rules`` may hold a rule for ``"async"``, ``"asyncgen"``, ``"class-level"``
    and ``"private"`` (private sync members and attributes); ``name`` is where the
    rules live, for the error message.
    """

    def __init__(self, rules: Mapping[str, Rule], kind_rules: Mapping[str, Rule], name: str):
        self.rules = rules
        self.kind_rules = kind_rules
        self.name = name

    def rule_for(self, member: Member) -> Rule | None:
        rule = self.rules.get(member.name)
        if rule is not None:
            return rule
        if member.kind in ("async", "asyncgen", "class-level"):
            return self.kind_rules.get(member.kind)
        if member.name.startswith("_"):
            return self.kind_rules.get("private")
        return None

    def classify(self, members: Mapping[str, Member]) -> dict[str, tuple[Member, Rule | None]]:
        """Each member with its rule (``None``: unclassified)."""
        return {name: (m, self.rule_for(m)) for name, m in members.items()}

    def declarations(self, members: Mapping[str, Member]) -> tuple[frozenset[str], frozenset[str]]:
        """``(stable, threadsafe)`` names for ``loopbridge.adopt``; fails closed.

        Health reads and thread-safe members are both declared thread-safe: the proxy
        forwards them without touching the owner loop.
        """
        table = self.classify(members)
        missing = [m for m, rule in table.values() if rule is None]
        if missing:
            raise UnclassifiedMemberError(missing, self.name)
        policies = {name: rule.policy for name, (_, rule) in table.items() if rule is not None}
        stable = frozenset(n for n, p in policies.items() if p is Policy.STABLE)
        threadsafe = frozenset(
            n for n, p in policies.items() if p in (Policy.HEALTH, Policy.THREADSAFE)
        )
        return stable, threadsafe
