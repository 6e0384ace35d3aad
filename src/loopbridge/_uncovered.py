"""Uncovered results: the tripwire a loop-bound result no rule covers comes back as.

A marshalled call that gives back an object holding loop-bound state (a Future,
a connection) with no ``returns`` rule for it would hand the caller something
it cannot use off the owner loop.  With the affinity check in ``raise`` mode
(the default) the caller gets an instance of a generated subclass of the
result's class instead, on which every member raises the check's error, naming
the rule to declare.

Invariants:

* an uncovered result is not a proxy: it carries its own marker
  (``__loopbridge_uncovered__``), so ``is_proxy`` is False for it and
  ``metrics_of`` refuses it with a ``TypeError``;
* awaiting an awaitable one (a Future, a Task, a coroutine) is marshalled to the
  owner loop, as awaiting it there is always right; what it gives is checked in
  turn; every other member, special methods included, raises;
* ``unwrap`` gives the object behind it, for use on its owner loop;
* the error names the member that gave it back and the rule to declare, as
  code (:func:`uncovered_advice`): what that member already declares is kept,
  so the code replaces the user's rule whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from ._codegen import Maker, make_class
from ._errors import Advice, Fix, LoopAffinityError, refuse
from ._faces import SEALED, Crossing, await_member, register
from ._members import MemberKind, classify, declare_site, is_special
from ._operation import Options
from ._ownership import Ownership
from ._returns import Owned

__all__ = ["uncovered", "uncovered_advice", "is_uncovered", "rule_code"]

_MARKER = "__loopbridge_uncovered__"


def is_uncovered(obj: object) -> bool:
    """Whether ``obj`` is the tripwire of an uncovered loop-bound result."""
    return bool(getattr(type(obj), _MARKER, False))


def rule_code(rule: Owned) -> str:
    """``rule`` as the code that makes it (``loopbridge.Owned(stable=('a',))``)."""
    parts = []
    if rule.stable:
        parts.append(f"stable={tuple(sorted(rule.stable))!r}")
    if rule.threadsafe:
        parts.append(f"threadsafe={tuple(sorted(rule.threadsafe))!r}")
    if rule.returns:
        inner = ", ".join(f"{k!r}: {rule_code(v)}" for k, v in rule.returns.items())
        parts.append(f"returns={{{inner}}}")
    return f"loopbridge.Owned({', '.join(parts)})"


#: How the faces name a protocol step of a member's result (``_pending``, ``_faces``).
_STEPS = (("entering ", "__aenter__"), ("awaiting ", "__await__"), ("iterating ", "__anext__"))


def _member_and_step(what: str) -> tuple[str | None, str | None]:
    """``("stream", "__aenter__")`` for ``entering AsyncClient.stream()``; ``(None,
    "__await__")`` for ``awaiting a Foo object``; ``("get", None)`` for ``Foo.get()``."""
    for prefix, step in _STEPS:
        if what.startswith(prefix):
            rest = what[len(prefix) :]
            if rest.startswith("a ") and rest.endswith(" object"):
                return None, step
            return rest.rsplit(".", 1)[-1].removesuffix("()"), step
    return what.rsplit(".", 1)[-1].removesuffix("()"), None


def uncovered_advice(what: str, value: object, found: str, ownership: Ownership) -> Advice:
    """The refusal of ``value``, which ``what`` gave back holding loop-bound state
    (``found``) with no rule for it: the rule to declare, as code."""
    member, step = _member_and_step(what)
    if member is None or step is None:
        key = member if step is None else step
        code = f"returns={{{key!r}: loopbridge.Owned()}}"
    else:
        old = ownership.returns.get(member) or Owned()
        rule = Owned(
            stable=old.stable, threadsafe=old.threadsafe, returns={**old.returns, step: Owned()}
        )
        code = f"returns={{{member!r}: {rule_code(rule)}}}"
    awaitable = hasattr(type(value), "__await__")
    return Advice(
        f"{what} gave back a {type(value).__qualname__} object that holds loop-bound state "
        "no returns rule covers",
        [Fix("declare", code, declare_site(ownership.name))],
        f"It cannot be used off its owner loop ({found}){'; awaiting it can' if awaitable else ''}"
        "; with the rule it comes back as a proxy. On the owner loop, loopbridge.unwrap "
        "gives the object.",
    )


def uncovered(value: object, advice: Advice, opts: Options) -> object:
    """``value`` behind a tripwire whose members raise the refusal ``advice`` renders."""
    cls = type(value)
    made = _classes.get(cls)
    if made is None:
        made = _classes.setdefault(cls, _tripwire_class(cls))
    tcls, maker = made
    t: object = maker(tcls)
    object.__setattr__(t, "_lb_target", value)
    object.__setattr__(t, "_lb_refusal", advice)
    object.__setattr__(t, "_lb_opts", opts)  # awaiting it: on the owner (see _tripwire_class)
    return t


class _Tripped:
    """Every member of an uncovered loop-bound result: using it raises the check's error."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if obj is None:
            return self
        raise _tripped(obj, self.name)

    def __set__(self, obj: object, value: object) -> None:
        raise _tripped(obj, self.name)


def _tripped(obj: object, name: str) -> LoopAffinityError:
    said: Advice = object.__getattribute__(obj, "_lb_refusal")
    return refuse(Advice(f"{said.problem} (used: .{name})", said.fixes, said.why))


def _tripped_special(name: str) -> Callable[..., object]:
    """A special method of an uncovered result: Python calls it for an operator (``await``,
    ``==``, ``len``), so it must be a method that raises, not an attribute: the
    operator slots swallow an error raised while the method is looked up."""

    def tripped(self: object, *args: object, **kwargs: object) -> object:
        raise _tripped(self, name)

    tripped.__name__ = name
    return tripped


def _tripped_getattr(self: object, name: str) -> object:
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise _tripped(self, name)


def _tripped_setattr(self: object, name: str, value: object = None) -> None:
    raise _tripped(self, name)


def _tripped_repr(self: object) -> str:
    value = object.__getattribute__(self, "_lb_target")
    return f"<loopbridge: {type(value).__qualname__} object no returns rule covers>"


_classes: dict[type, tuple[type, Maker]] = {}
_SLOTS = ("_lb_target", "_lb_refusal", "_lb_opts")


def _tripwire_class(cls: type) -> tuple[type, Maker]:
    """Every member refuses, except awaiting an awaitable (a Future, a Task, a
    coroutine): that is marshalled, as awaiting it on its owner is always right,
    and what it gives is checked in turn."""
    empty = Ownership(None, frozenset(), frozenset(), cls.__qualname__)
    ns: dict[str, object] = {"__slots__": _SLOTS, _MARKER: True}
    crossings: dict[str, Crossing] = {}
    for name, (kind, raw) in classify(cls, empty).items():
        if kind is MemberKind.AWAIT:
            ns[name], crossing = await_member(
                cls, cast("Callable[[object], object]", raw), None, None
            )
            assert crossing is not None
            crossings[name] = crossing
        else:
            ns[name] = _tripped_special(name) if is_special(name) else _Tripped(name)
    if hasattr(cls, "_asyncio_future_blocking"):
        ns["_asyncio_future_blocking"] = None  # no future of the caller's loop (see _proxy)
    ns["__getattribute__"] = object.__getattribute__
    ns["__getattr__"] = _tripped_getattr
    ns["__setattr__"] = ns["__delattr__"] = _tripped_setattr
    ns["__repr__"] = _tripped_repr
    ns.update(SEALED)
    tcls, maker = make_class(cls, f"{cls.__name__}Uncovered", ns)
    tcls.__module__ = cls.__module__
    tcls.__qualname__ = f"{cls.__qualname__}Uncovered"
    register(tcls, crossings)
    return tcls, maker
