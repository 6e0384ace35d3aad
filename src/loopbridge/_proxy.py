"""The awaitable face of a loop-affine object: ``proxy``, and how its results are shaped.

``proxy(obj)`` returns an instance of a generated subclass of ``type(obj)`` whose
every member is replaced by a marshalling or refusing one, so
``isinstance(p, type(obj))`` holds and abstract base classes (vLLM's
``EngineClient``) accept it.  The proxy never runs the base class's ``__init__``
or ``__del__``.  Member kinds come from :func:`~loopbridge._members.classify`,
and what each kind becomes from the member-kind table (:mod:`loopbridge._faces`);
generated classes are cached per (class, declarations).

What a marshalled call gives back is shaped on the owner loop before it crosses:

* :func:`result_by_rule`: a member with a ``returns`` rule gives a proxy of its
  result, owned by the same loop, with the rule's declarations;
* :func:`result_without_rule`: a result no rule covers passes as it is when it is
  plain or a proxy, comes back as a proxy when it is declared loop-affine, and
  otherwise, when it holds loop-bound state, meets the always-on check (an
  uncovered result, :mod:`loopbridge._uncovered`);
* :func:`call_result` (every proxy's ``Options.shape``): the object itself comes
  back as its proxy, anything else as :func:`result_without_rule` says.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable, Hashable
from types import MappingProxyType
from typing import TypeVar, cast

from ._affinity import _Policy
from ._calls import Call
from ._codegen import Maker, make_class
from ._errors import Advice, Fix, LoopAffinityError, refuse
from ._faces import FACES, SEALED, Crossing, Spec, forget, register
from ._members import classify, code_name, is_special, refusal
from ._metrics import Metrics
from ._operation import Options
from ._ownership import Ownership, attach, declarations_key, ownership_of
from ._pending import Pending
from ._returns import INHERITED, PLAIN, Owned, loop_state
from ._streams import BlockingStream, RemoteStream
from ._uncovered import is_uncovered, uncovered, uncovered_advice

__all__ = [
    "proxy",
    "read_ahead",
    "is_proxy",
    "unwrap",
    "metrics_of",
    "result_by_rule",
    "result_without_rule",
    "call_result",
    "BlockingMembers",
    "blocking_members",
    "PendingFactory",
    "refuse_setattr",
    "DEFAULT_WINDOW",
    "DEFAULT_GRACE",
]

T = TypeVar("T")

DEFAULT_WINDOW = 256
DEFAULT_GRACE = 5.0

_MARKER = "__loopbridge_proxy__"

# The owner (for the same-loop test, read on every call), the settings every
# call and stream made through this proxy share, what its owned instance
# attributes last gave (see _OwnedInstanceAttr) and the members its blocking
# faces without a timeout have bound (see blocking_members); None until used.
_SLOTS = ("_lb_target", "_lb_ownership", "_lb_opts", "_lb_attrs", "_lb_blocking")


def is_proxy(obj: object) -> bool:
    """Whether ``obj`` is a loopbridge proxy."""
    return bool(getattr(type(obj), _MARKER, False))


def _passes(value: object) -> bool:
    """A result that crosses as it is: plain data, a proxy, an uncovered result."""
    return type(value) in PLAIN or is_proxy(value) or is_uncovered(value)


# ------------------------------------------------------------ result shaping
#: The rule what an owned object gives back comes under (see _returns).
_COVERED = Owned()


def result_by_rule(value: object, rule: Owned | None, what: str, opts: Options) -> object:
    """What the caller gets for ``value``, which ``what`` gave back on the owner loop.

    With a rule: a proxy of ``value`` owned by the same loop, with the rule's
    declarations.  Without one: :func:`result_without_rule`.
    """
    if rule is None or rule is INHERITED:
        return result_without_rule(value, what, opts, rule is INHERITED)
    if _passes(value):
        return value
    ownership = ownership_of(value)
    if ownership is None:
        ownership = Ownership(
            opts.ownership.owner.loop,
            rule.stable,
            rule.threadsafe,
            f"{type(value).__qualname__} object from {what}",
            rule.returns,
            inherits=True,  # what it gives back is covered too (see _returns)
            key=_key_for(rule),  # one per rule, not one per result (once per request)
        )
        attach(value, ownership)
    return _new_proxy(value, ownership, opts.window, opts.grace, opts.eager)


#: The declarations key of the records made under each rule (see _ownership).
_rule_keys: dict[Owned, Hashable] = {}


def _key_for(rule: Owned) -> Hashable:
    key = _rule_keys.get(rule)
    if key is None:
        key = _rule_keys.setdefault(
            rule,
            declarations_key(
                rule.stable, rule.threadsafe, rule.returns, MappingProxyType({}), True
            ),
        )
    return key


def call_result(call: Call, result: object) -> object:
    """Every proxy's ``Options.shape``: a call's non-plain result, on the owner loop."""
    args = call.args
    if args and result is args[0]:
        # The object itself (``async with p as x`` when __aenter__ returns self,
        # fluent APIs): the caller gets a proxy, never the bare object.
        opts = call.opts
        return _new_proxy(result, opts.ownership, opts.window, opts.grace, opts.eager)
    return result_without_rule(result, call.description, call.opts)


def result_without_rule(value: object, what: str, opts: Options, inherited: bool = False) -> object:
    """A result no rule of its own covers: loop-affine ones come back as proxies;
    what an object handed out under a rule gives (``inherited``, or the proxy's
    ``ownership.inherits``) comes back as a proxy under ``Owned()`` when it holds
    loop-bound state anywhere it reaches; others that hold loop-bound state are
    caught by the always-on check."""
    if _passes(value):
        return value
    ownership = ownership_of(value)
    if ownership is not None:  # declared loop-affine: its own declarations say how
        return _new_proxy(value, ownership, opts.window, opts.grace, opts.eager)
    if inherited or opts.ownership.inherits:
        if loop_state(value, deep=True, strict=True) is None:
            return value  # plain data, all of it looked at
        return result_by_rule(value, _COVERED, what, opts)
    found = loop_state(value)
    if found is None or _Policy.mode == "off":
        return value
    advice = uncovered_advice(what, value, found, opts.ownership)
    if _Policy.mode == "warn":
        warnings.warn(advice.render(), RuntimeWarning, stacklevel=2)
        return value
    return uncovered(value, advice, opts)


# --------------------------------------------------------------- proxy class
_cache: dict[tuple[type, object], tuple[type, Maker]] = {}
_cache_lock = threading.Lock()


def _proxy_class(cls: type, ownership: Ownership) -> tuple[type, Maker]:
    """The proxy class for ``cls`` with these declarations, and how to make its instances."""
    key = (cls, ownership.spec_key())
    made = _cache.get(key)
    if made is not None:
        return made
    ns: dict[str, object] = {"__slots__": _SLOTS, _MARKER: True}
    crossings: dict[str, Crossing] = {}
    members = classify(cls, ownership)
    for name, (kind, raw) in members.items():
        member, crossing = FACES[kind](Spec(cls, name, raw, ownership, result_by_rule))
        if member is not None:  # None: a class-level member, inherited as is
            ns[name] = member
        if crossing is not None:
            crossings[name] = crossing
    for name, rule in ownership.returns.items():
        if name in members or name in ns or is_special(name):
            continue  # a class attribute (its kind says what it becomes), a protocol step
        if name not in ownership.stable and name not in ownership.threadsafe:
            ns[name] = _OwnedInstanceAttr(name, rule, f"{cls.__qualname__}.{name}")
    if hasattr(cls, "_asyncio_future_blocking"):
        # A future's proxy is no future of the caller's loop: asyncio.isfuture()
        # must say so, and ensure_future() then awaits it through __await__.
        ns["_asyncio_future_blocking"] = None
    ns["__getattribute__"] = object.__getattribute__  # members are the class's, above
    ns["__getattr__"] = _instance_attr
    ns["__setattr__"] = refuse_setattr
    ns["__delattr__"] = refuse_setattr
    ns["__repr__"] = _repr
    ns.update(SEALED)
    pcls, maker = make_class(cls, f"{cls.__name__}Proxy", ns)
    pcls.__module__ = cls.__module__
    pcls.__qualname__ = f"{cls.__qualname__}Proxy"
    register(pcls, crossings)  # before any instance exists
    with _cache_lock:
        made = _cache.setdefault(key, (pcls, maker))
    if made[0] is not pcls:
        forget(pcls)  # another thread made it first
    return made


class _OwnedInstanceAttr:
    """An instance attribute with a returns rule (a grpc stub's multicallables,
    set in its ``__init__``), read through the proxy class, not ``__getattr__``.

    Read from the target each time; a value that is a function or a bound
    method gives a :class:`PendingFactory`, any other value what
    :func:`result_by_rule` makes of it.  That result is kept on this proxy
    (``_lb_attrs``) while the attribute holds the same object, so reading it
    again (once per request: ``stub.Say(...)``) costs a lookup, not a new proxy.
    It is the same proxy as a new one would be: a value's ownership record is
    attached to the value once (a transfer of the object moves the object's
    record only, as before), and the settings are this proxy's.  Missing on
    the target: ``__getattr__`` (:func:`_instance_attr`) says why.
    """

    __slots__ = ("name", "rule", "what")

    def __init__(self, name: str, rule: Owned, what: str) -> None:
        self.name = name
        self.rule = rule
        self.what = what

    def __get__(self, obj: object, objtype: type | None = None) -> object:
        if obj is None:
            return self
        get = object.__getattribute__
        name = self.name
        value = getattr(get(obj, "_lb_target"), name)
        kept: dict[str, tuple[object, object]] | None = get(obj, "_lb_attrs")
        if kept is not None:
            hit = kept.get(name)
            if hit is not None and hit[0] is value:
                return hit[1]
        opts: Options = get(obj, "_lb_opts")
        if inspect.ismethod(value) or inspect.isfunction(value):  # a new method each read
            return PendingFactory(value, self.rule, opts, f"{self.what}()")
        made = result_by_rule(value, self.rule, self.what, opts)
        if kept is None:  # two threads may both make one: either dict is right
            kept = {}
            object.__setattr__(obj, "_lb_attrs", kept)
        kept[name] = (value, made)
        return made


def _instance_attr(self: object, name: str) -> object:
    """Instance attributes (set in ``__init__``) that no class member describes."""
    get = object.__getattribute__
    ownership: Ownership = get(self, "_lb_ownership")
    target = get(self, "_lb_target")
    if name in ownership.stable or name in ownership.threadsafe:
        return getattr(target, name)
    rule = ownership.returns.get(name)
    if rule is not None:  # an instance attribute holding an owned object (a grpc stub's)
        opts: Options = get(self, "_lb_opts")
        value = getattr(target, name)
        what = f"{type(target).__qualname__}.{name}"
        if inspect.ismethod(value) or inspect.isfunction(value):
            return PendingFactory(value, rule, opts, f"{what}()")
        return result_by_rule(value, rule, what, opts)
    if is_special(name):
        raise AttributeError(name)
    if not hasattr(target, name):
        raise AttributeError(f"{type(target).__qualname__!r} object has no attribute {name!r}")
    raise _dynamic_refusal(target, name, ownership.name)


class PendingFactory:
    """A method no class attribute describes (an instance's, or one ``__getattr__``
    makes) with a returns rule: like a sync member with one, calling it gives a
    pending result, and the method runs on the owner when that is first used."""

    __slots__ = ("fn", "rule", "opts", "what", "__name__")

    def __init__(self, fn: Callable[..., object], rule: Owned, opts: Options, what: str) -> None:
        self.fn = fn
        self.rule = rule
        self.opts = opts
        self.what = what
        self.__name__ = getattr(fn, "__name__", "call")

    def __call__(self, *args: object, **kwargs: object) -> Pending:
        return Pending(self.fn, args, kwargs, self.rule, self.opts, self.what, result_by_rule)


def _dynamic_refusal(target: object, name: str, owner_name: str) -> LoopAffinityError:
    """The refusal of a member no class attribute describes: an instance attribute, or
    one its class's ``__getattr__`` makes (often an async method: returns= is the fix)."""
    try:
        own = object.__getattribute__(target, "__dict__")
    except AttributeError:
        own = {}
    cls_name = type(target).__qualname__
    cls = type(target)
    if name in own:
        return refusal(cls_name, name, own[name], " (an instance attribute)", cls, owner_name)
    return refusal(cls_name, name, None, f" (made by {cls_name}.__getattr__)", cls, owner_name)


def refuse_setattr(self: object, name: str, value: object = None) -> None:
    try:
        cls_name = type(object.__getattribute__(self, "_lb_target")).__qualname__
    except AttributeError:
        cls_name = type(self).__qualname__
    target = code_name(cls_name)
    raise refuse(
        Advice(
            f"{cls_name}.{name} cannot be set or deleted through a proxy",
            [
                Fix(
                    "owner",
                    f"setattr(loopbridge.unwrap({target}), {name!r}, value)",
                    "",
                    "",
                    target,
                )
            ],
            "State of a loop-affine object changes only on its owner loop (there, or in an "
            "async method that does it).",
        )
    )


def _repr(self: object) -> str:
    get = object.__getattribute__
    ownership: Ownership = get(self, "_lb_ownership")
    return f"<loopbridge proxy of {get(self, '_lb_target')!r} owned by {ownership.loop!r}>"


# ---------------------------------------------------------------- public API
def proxy(
    obj: T,
    *,
    stream_window: int = DEFAULT_WINDOW,
    cancel_grace: float = DEFAULT_GRACE,
    eager: bool = False,
) -> T:
    """A view of ``obj`` that is safe to use from any thread or event loop.

    * Async methods run on the owner loop; awaiting them from another asyncio loop
      (uvloop included) or from trio (e.g. through anyio) returns their result or
      raises their exception.  On the owner loop itself they are called directly.
    * Async generator methods run on the owner loop; their items stream to the
      consumer with back-pressure (at most ``stream_window`` items ahead).
    * Members declared ``stable`` or ``threadsafe`` are used directly.
    * Any other sync member raises :class:`LoopAffinityError`.

    If the caller is cancelled, the owner-side work is cancelled with the same
    message and the caller waits up to ``cancel_grace`` seconds for its cleanup.

    Owner-side tasks start eagerly on Python 3.12+ (``eager_start``): a call
    that finishes without suspending answers in the same loop iteration.  On
    3.11, ``eager=True`` gets the same effect by running the first step before
    any task exists; ``asyncio.current_task()`` is then ``None`` during that
    step, so only use it for members that need no task before their first
    ``await`` (no ``asyncio.timeout()``, ``TaskGroup`` or anyio scope there).
    """
    if is_proxy(obj) or is_uncovered(obj):
        return obj
    ownership = ownership_of(obj)
    if ownership is None:
        target = code_name(type(obj).__qualname__)
        raise refuse(
            Advice(
                f"loopbridge.proxy() was given a {type(obj).__qualname__} object, which is "
                "not loop-affine",
                [Fix("owner", f"loopbridge.adopt({target})", "", "first", target)],
                "adopt() on the loop that owns it declares the instance; @loop_affine declares "
                "every instance of a class you write.",
            )
        )
    if stream_window < 1:
        raise ValueError(f"stream_window must be at least 1, not {stream_window}")
    if cancel_grace < 0:
        raise ValueError(f"cancel_grace must not be negative, not {cancel_grace}")
    return _new_proxy(obj, ownership, stream_window, cancel_grace, bool(eager))


def _new_proxy(obj: T, ownership: Ownership, window: int, grace: float, eager: bool) -> T:
    pcls, maker = _proxy_class(type(obj), ownership)
    p = cast(T, maker(pcls))  # an empty instance of a subclass of type(obj)
    setattr_ = object.__setattr__
    setattr_(p, "_lb_target", obj)
    setattr_(p, "_lb_ownership", ownership)
    setattr_(p, "_lb_opts", Options(ownership, window, grace, eager, call_result))
    setattr_(p, "_lb_attrs", None)
    setattr_(p, "_lb_blocking", None)
    return p


#: What a blocking face keeps: its bound members by name, and the faces of owned
#: data members under ``(name,)`` (see ``_blocking._face_of_value``).
BlockingMembers = dict["str | tuple[str]", object]


def blocking_members(p: object) -> BlockingMembers:
    """Where the blocking faces of proxy ``p`` that have no timeout keep the members
    they bind: one dict for all of them, so ``blocking(p).m(...)`` binds ``m`` once
    per proxy, not once per face.  A bound member holds the target and the
    proxy's settings, never the proxy or a face.  Anything else: a new dict."""
    if not is_proxy(p):
        return {}
    members: BlockingMembers | None = object.__getattribute__(p, "_lb_blocking")
    if members is None:  # two threads may both make one: either dict is right
        members = {}
        object.__setattr__(p, "_lb_blocking", members)
    return members


S = TypeVar("S")


def read_ahead(stream: S, items: int | None) -> S:
    """Set how far ``stream`` may read ahead of its consumer; returns ``stream``.

    ``stream``: what an async generator member, an async-iterable object or a
    pending result gives through a proxy (or its blocking face), before its
    first item is asked for.  ``items=0``: the owner asks the source for an item
    only once the consumer has asked for it, so leaving early leaves the rest
    in the source; ``n``: up to ``n`` more; ``None``: batched, up to the proxy's
    ``stream_window`` (the default for a generator member, whose generator is
    the stream's own).  Items read ahead that the consumer never takes are
    lost to the source and counted (``stream_items_unread``).  On the owner
    loop a member gives the generator itself, which reads nothing ahead: it
    is returned unchanged.
    """
    if items is not None and (type(items) is not int or items < 0):
        raise ValueError(f"read_ahead takes 0 or more items, or None, not {items!r}")
    if type(stream) is Pending:
        cast(Pending, stream).ahead = items
        return stream
    if isinstance(stream, (RemoteStream, BlockingStream)):
        if object.__getattribute__(stream, "_waker") is not None:
            raise ValueError("read_ahead() applies before the stream's first item is asked for")
        object.__getattribute__(stream, "_ch").set_ahead(items)
        return stream
    if inspect.isasyncgen(stream) or hasattr(type(stream), "__anext__"):
        return stream  # the generator itself, on its owner loop: no pump, nothing ahead
    raise TypeError(
        "read_ahead() takes what an async generator member, an async-iterable object or a "
        f"pending result gave through a proxy, not a {type(stream).__qualname__} object"
    )


def unwrap(obj: T) -> T:
    """The object behind a proxy or an uncovered result (``obj`` itself if it is neither).

    The result is only safe to use on its owner loop.
    """
    if is_proxy(obj) or is_uncovered(obj):
        target: T = object.__getattribute__(obj, "_lb_target")
        return target
    return obj


def metrics_of(p: object) -> Metrics:
    """The metrics of the object behind a proxy (shared by all its proxies)."""
    if not is_proxy(p):
        raise TypeError(f"expected a loopbridge proxy, got {type(p).__qualname__}")
    opts: Options = object.__getattribute__(p, "_lb_opts")
    return opts.metrics
