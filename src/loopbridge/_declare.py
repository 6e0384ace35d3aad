"""The public ways to declare and move ownership: ``@loop_affine``, ``adopt``,
``owner_loop`` and ``transfer``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar, overload

from ._affinity import guarded, original
from ._compat import get_running_loop
from ._errors import Advice, Fix, LoopAffinityError, code_name, gone, refuse
from ._ownership import _ATTR, Ownership, attach, ownership_of
from ._ports import rearm
from ._returns import Owned, check_rules, names

__all__ = ["loop_affine", "adopt", "owner_loop", "transfer"]

T = TypeVar("T")
C = TypeVar("C", bound=type)


def _current_loop(loop: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop | None:
    return loop if loop is not None else get_running_loop()


def owner_loop(obj: object) -> asyncio.AbstractEventLoop | None:
    """The loop that owns ``obj``, or ``None`` if it has none yet.

    Raises :class:`LoopAffinityError` if ``obj`` is not loop-affine at all.
    """
    ownership = ownership_of(_unproxy(obj))
    if ownership is None:
        raise not_loop_affine(obj, "owner_loop()")
    return ownership.loop


def not_loop_affine(obj: object, used: str) -> LoopAffinityError:
    """The refusal of an object that is not loop-affine, given to ``used``."""
    name = code_name(type(obj).__qualname__)
    return refuse(
        Advice(
            f"{used} was given a {type(obj).__qualname__} object, which is not loop-affine",
            [Fix("owner", f"loopbridge.adopt({name})", "", "first", name)],
            "adopt() on the loop that owns it declares the instance; @loop_affine declares "
            "every instance of a class you write.",
        )
    )


def transfer(obj: object, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Bind ``obj`` to ``loop`` (default: the running loop), or move it there.

    Typical use: a worker created outside any loop records its loop during
    initialisation.  Calls already running on the old owner finish there; calls
    submitted but not yet started are re-routed to the new owner when they reach
    the old one, so a transfer never loses or misroutes a call.
    """
    ownership = ownership_of(_unproxy(obj))
    if ownership is None:
        raise not_loop_affine(obj, "transfer()")
    target = _current_loop(loop)
    if target is None:
        name = code_name(type(_unproxy(obj)).__qualname__)
        raise refuse(
            Advice(
                "transfer() outside a running loop needs the loop to move to",
                [Fix("thread", f"loopbridge.transfer({name}, loop)", "", "", name)],
                "Called on a running loop, it moves the object to that loop.",
            )
        )
    if target.is_closed():
        raise gone(
            Advice(
                f"transfer() was given {target!r}, which is closed",
                [
                    Fix(
                        "run",
                        "loopbridge.transfer(obj, loop)",
                        target="obj",
                        when="with a running loop",
                    )
                ],
            )
        )
    rearm(target)
    ownership.set_loop(target)


def adopt(
    obj: T,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
    returns: Mapping[str, Owned] | None = None,
    read_ahead: Mapping[str, int | None] | None = None,
) -> T:
    """Declare that an existing instance belongs to ``loop`` (default: the running loop).

    This is :func:`loop_affine` for classes you don't own, such as vLLM's
    ``AsyncLLM``.  ``stable`` names data members that any thread may read (set once
    at setup); ``threadsafe`` names sync members that any thread may call;
    ``returns`` gives members whose results belong to the owner loop a rule
    (:class:`Owned`) that brings them back as proxies; ``read_ahead`` how far
    a stream member may read ahead of its consumer (see :func:`read_ahead`).
    Returns ``obj`` itself, unchanged.
    """
    if ownership_of(obj) is not None:
        name = code_name(type(obj).__qualname__)
        raise refuse(
            Advice(
                f"adopt() was given a {type(obj).__qualname__} object that is already loop-affine",
                [Fix("owner", f"loopbridge.transfer({name})", "", "to change its owner", name)],
                "Its declarations are fixed when it becomes loop-affine.",
            )
        )
    base_stable, base_threadsafe, base_returns = _class_spec(type(obj))
    rules = check_rules(returns, "adopt(returns=...)")
    _check_members(obj, rules)
    ahead = check_read_ahead(read_ahead, "adopt(read_ahead=...)")
    ownership = Ownership(
        _current_loop(loop),
        names(stable, "adopt(stable=...)") | base_stable,
        names(threadsafe, "adopt(threadsafe=...)") | base_threadsafe,
        f"{type(obj).__qualname__} object",
        {**base_returns, **rules},
        {**_class_read_ahead(type(obj)), **ahead},
    )
    attach(obj, ownership)
    return obj


def _check_members(obj: object, rules: Mapping[str, Owned]) -> None:
    """A rule for a member the object does not have is a typo: say so now."""
    for name in rules:
        if not hasattr(obj, name):
            raise refuse(
                Advice(
                    f"returns={{{name!r}: ...}} would never apply: {type(obj).__qualname__} "
                    f"object has no member {name!r}",
                    [
                        Fix(
                            "undeclare",
                            f"returns={{{name!r}: ...}}",
                            "adopt(...)",
                            "or correct the name",
                        )
                    ],
                )
            )


_NO_SPEC: tuple[frozenset[str], frozenset[str], Mapping[str, Owned]] = (
    frozenset(),
    frozenset(),
    {},
)


def check_read_ahead(
    read_ahead: Mapping[str, int | None] | None, what: str
) -> dict[str, int | None]:
    """``read_ahead=`` as a plain dict of member name to items (``None``: batched)."""
    out: dict[str, int | None] = {}
    for name, items in (read_ahead or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: member names are strings, not {name!r}")
        if items is not None and (type(items) is not int or items < 0):
            raise ValueError(f"{what}[{name!r}] must be 0 or more items, or None, not {items!r}")
        out[name] = items
    return out


def _class_read_ahead(cls: type) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for klass in reversed(cls.__mro__):
        out.update(klass.__dict__.get("__loopbridge_read_ahead__", {}))
    return out


def _class_spec(cls: type) -> tuple[frozenset[str], frozenset[str], Mapping[str, Owned]]:
    spec = cls.__dict__.get("__loopbridge_spec__")
    if spec is None:
        for base in cls.__mro__[1:]:
            spec = base.__dict__.get("__loopbridge_spec__")
            if spec is not None:
                break
    return spec if spec is not None else _NO_SPEC


@overload
def loop_affine(cls: C, /) -> C: ...


@overload
def loop_affine(
    *,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
    returns: Mapping[str, Owned] | None = None,
    read_ahead: Mapping[str, int | None] | None = None,
) -> Callable[[C], C]: ...


def loop_affine(
    cls: C | None = None,
    /,
    *,
    stable: Iterable[str] = (),
    threadsafe: Iterable[str] = (),
    returns: Mapping[str, Owned] | None = None,
    read_ahead: Mapping[str, int | None] | None = None,
) -> C | Callable[[C], C]:
    """Class decorator: each instance belongs to the loop running at construction.

    An instance created while no loop runs has no owner until
    :func:`transfer` gives it one.  Direct calls of its async members from a loop
    that doesn't own it raise :class:`LoopAffinityError` (see
    :func:`set_affinity_check`); use :func:`proxy` to call it from anywhere.
    ``returns`` declares members whose results belong to the owner loop
    (see :class:`Owned`); ``read_ahead`` how far a stream member may read ahead
    of its consumer (see :func:`read_ahead`).
    """
    stable_set = names(stable, "@loop_affine(stable=...)")
    threadsafe_set = names(threadsafe, "@loop_affine(threadsafe=...)")
    rules = check_rules(returns, "@loop_affine(returns=...)")
    ahead = check_read_ahead(read_ahead, "@loop_affine(read_ahead=...)")

    def decorate(klass: C) -> C:
        base_stable, base_threadsafe, base_returns = _class_spec(klass)
        klass.__loopbridge_spec__ = (  # type: ignore[attr-defined]
            base_stable | stable_set,
            base_threadsafe | threadsafe_set,
            {**base_returns, **rules},
        )
        if ahead:
            klass.__loopbridge_read_ahead__ = ahead  # type: ignore[attr-defined]
        _wrap_init(klass)
        _reduce_without_record(klass)
        slotted = not _has_dict(klass)
        _guard_members(klass, slotted)
        klass = _with_ownership_slot(klass) if slotted else klass
        _guard_subclasses(klass)
        return klass

    if cls is not None:
        return decorate(cls)
    return decorate


def _wrap_init(klass: type) -> None:
    """Instances get their record before the class's own ``__init__`` runs."""
    # mypy flags reading __init__ off a class object; this is the class's own one.
    original_init = klass.__init__  # type: ignore[misc, unused-ignore]
    if getattr(original_init, "__loopbridge_init__", None) is klass:
        return  # wrapped already (a decorated subclass's, by its base's hook)

    @functools.wraps(original_init)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        if ownership_of(self) is None:
            _own_new_instance(self)
        original_init(self, *args, **kwargs)

    __init__.__loopbridge_init__ = klass  # type: ignore[attr-defined]
    klass.__init__ = __init__  # type: ignore[misc]


def _guard_members(klass: type, slotted: bool) -> None:
    """The always-on check on the async members ``klass`` defines itself."""
    for name, value in list(vars(klass).items()):
        if original(value) is not value:
            continue  # guarded already (a decorated subclass's, by its base's hook)
        if inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value):
            setattr(klass, name, guarded(value, slotted))


def _generated(cls: type) -> bool:
    """A class loopbridge generated (a proxy's, an uncovered result's): the markers
    are set by ``_proxy`` and ``_uncovered``, which sit above this module."""
    own = cls.__dict__
    return bool(own.get("__loopbridge_proxy__") or own.get("__loopbridge_uncovered__"))


def _guard_subclasses(klass: type) -> None:
    """Declarations are inherited, and so is the check: an undecorated subclass's own
    async members are guarded, and its own ``__init__`` gives instances a record,
    when the subclass is made (``__init_subclass__``)."""
    own = klass.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, /, **kwargs: object) -> None:
        if own is not None:
            own.__func__(cls, **kwargs)
        else:
            super(klass, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]
        if _generated(cls) or not issubclass(cls, klass):
            return  # a proxy or uncovered-result class: its members are its own
        if "__init__" in cls.__dict__:
            _wrap_init(cls)
        slot = getattr(cls, _ATTR, None)
        _guard_members(cls, isinstance(slot, types.MemberDescriptorType))

    klass.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]


def _own_new_instance(obj: object) -> None:
    """Attach a new instance's own record: owned by the running loop, if any."""
    cls = type(obj)
    s, t, r = _class_spec(cls)
    name = f"{cls.__qualname__} object"
    attach(obj, Ownership(get_running_loop(), s, t, name, r, _class_read_ahead(cls)))


# ------------------------------------------------------------- copy and pickle
# A copy (copy.copy, copy.deepcopy) or an unpickled instance of a @loop_affine
# class is a new object: like one constructed, it gets its own record, owned by
# the loop running where it is made, so transfer() of a copy never moves the
# original.  Everything else pickles and copies as the undecorated class does:
# its own __reduce__/__getstate__/__setstate__ run, minus loopbridge's record.


def _reduce_without_record(klass: type) -> None:
    base: Callable[[object, int], object] = klass.__reduce_ex__  # type: ignore[assignment]
    if getattr(base, "__loopbridge_reduce__", False):
        return  # a decorated base's already does it

    def __reduce_ex__(self: object, protocol: int) -> object:
        rv = base(self, protocol)
        if isinstance(rv, str) or not isinstance(rv, tuple) or len(rv) < 2:
            return rv  # a global's name, or what the class's own reduce made of it
        fn, args, *rest = rv
        if rest:
            rest[0] = _state_without_record(rest[0])
        return (_remade, (fn, args), *rest)

    __reduce_ex__.__loopbridge_reduce__ = True  # type: ignore[attr-defined]
    __reduce_ex__.__qualname__ = f"{klass.__qualname__}.__reduce_ex__"
    klass.__reduce_ex__ = __reduce_ex__  # type: ignore[method-assign, assignment]


def _state_without_record(state: object) -> object:
    if type(state) is dict and _ATTR in state:
        return {k: v for k, v in state.items() if k != _ATTR}
    if type(state) is tuple and len(state) == 2:  # (__dict__, slots)
        return tuple(_state_without_record(part) for part in state)
    return state


def _remade(fn: Callable[..., object], args: tuple[object, ...]) -> object:
    """Make the copy (or unpickled object) as the class's reduce says; give it its record."""
    obj = fn(*args)
    if ownership_of(obj) is None:  # not made by __init__ (copyreg.__newobj__)
        _own_new_instance(obj)
    return obj


def _has_dict(cls: type) -> bool:
    """Whether instances of ``cls`` have a ``__dict__`` (no ``__slots__`` somewhere)."""
    return bool(getattr(cls, "__dictoffset__", 0))


def _with_ownership_slot(klass: C) -> C:
    """A class whose instances have no ``__dict__`` gets a slot for their record.

    Without one the record would have to live in a table keyed by the
    instance, which keeps every instance of a class without ``__weakref__``
    alive for ever.  The decorator returns this subclass, with the class's own
    name; it adds nothing but the slot.
    """
    if isinstance(getattr(klass, _ATTR, None), types.MemberDescriptorType):
        return klass  # a base already has the slot
    ns = {
        "__slots__": (_ATTR,),
        "__module__": klass.__module__,
        "__qualname__": klass.__qualname__,
        "__doc__": klass.__doc__,
    }
    return type(klass)(klass.__name__, (klass,), ns)


def _unproxy(obj: object) -> object:
    target = getattr(type(obj), "__loopbridge_proxy__", False)
    if target:
        return object.__getattribute__(obj, "_lb_target")
    return obj
