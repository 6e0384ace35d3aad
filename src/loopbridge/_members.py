"""Member kinds: every member of a loop-affine class, special methods included, is
classified from the class itself (never from a hand-written list), so a member
added in a later version of the class is covered automatically.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing

from ._affinity import original
from ._errors import Advice, Fix, LoopAffinityError, code_name, refuse
from ._ownership import Ownership
from ._returns import loop_state

__all__ = [
    "MemberKind",
    "classify",
    "PROXY_OWNED_DUNDERS",
    "Refused",
    "refused_member",
    "refusal",
    "ClassData",
    "class_data",
    "sync_advice",
    "declare_site",
    "code_name",
    "DECLARE_SITE",
    "INSTANCE_ATTRIBUTE",
    "is_special",
    "loop_bound_result",
]


class MemberKind(enum.Enum):
    ASYNC = "async method"  # marshalled call
    STREAM = "async generator"  # marshalled stream
    ITERATION = "async iteration"  # its __aiter__: the object's iteration, streamed on demand
    STABLE = "stable"  # read directly from any thread (declared)
    THREADSAFE = "thread-safe"  # called directly from any thread (declared)
    CLASS_LEVEL = "class-level"  # staticmethod, classmethod, class constant
    SYNC = "sync"  # refused through a proxy
    AWAIT = "awaitable"  # a sync __await__: awaiting the object, marshalled
    # A member with a returns rule (see _returns): its result comes back as a proxy.
    OWNED_CALL = "async method returning an owned object"
    OWNED_STREAM = "async generator yielding owned objects"
    PENDING = "sync method returning an owned object"  # the call runs on the owner
    OWNED_ATTR = "data member holding an owned object"  # read directly, value proxied


#: Special methods the proxy class defines itself (how a proxy is built, shown,
#: pickled and how its attributes are looked up), whatever the class defines.
PROXY_OWNED_DUNDERS = frozenset(
    {
        "__init__",
        "__new__",
        "__del__",
        "__repr__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__reduce__",
        "__reduce_ex__",
        "__init_subclass__",
        "__class_getitem__",
        "__subclasshook__",
    }
)


def classify(cls: type, ownership: Ownership) -> dict[str, tuple[MemberKind, object]]:
    """Every member of ``cls`` (MRO order, first definition wins) with its kind.

    Returns ``{name: (kind, raw)}`` where ``raw`` is the unwrapped function for
    async members and the class attribute otherwise.  Special methods are
    members too: an ``async def __x__`` is marshalled like any async method, an
    ``__aiter__`` (sync, or an async generator function) makes the object's own
    async iteration a stream that reads nothing ahead, a sync
    ``__await__`` makes awaiting the object a call, a member with a ``returns``
    rule gives back a proxy (see :mod:`loopbridge._returns`), and any other
    special *method* is refused unless declared (Python calls it on the
    caller's thread: ``len(p)``, ``p == q``, ``with p``).  Special attributes
    that are not methods (``__module__``, ``__slots__``, ``__hash__ = None``) and
    those the proxy defines itself (:data:`PROXY_OWNED_DUNDERS`) are left out.
    """
    out: dict[str, tuple[MemberKind, object]] = {}
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name in out:
                continue
            if name.startswith("__") and name.endswith("__"):
                kind = _dunder_kind(name, raw, ownership)
                if kind is not None:
                    out[name] = (kind, raw)
                continue
            out[name] = (_kind(name, raw, ownership), raw)
    return out


#: Special methods of C types (``deque.__len__``, ``Future.__await__``): methods
#: too, so they are marshalled or refused like functions, never inherited.
_C_METHODS = (types.WrapperDescriptorType, types.MethodDescriptorType)


def _dunder_kind(name: str, raw: object, ownership: Ownership) -> MemberKind | None:
    if name in PROXY_OWNED_DUNDERS or isinstance(raw, (staticmethod, classmethod)):
        return None
    fn = original(raw)
    if not (inspect.isfunction(fn) or isinstance(fn, _C_METHODS)):
        return None  # data, a slot or dict descriptor, __hash__ = None
    if name == "__aiter__" and name in ownership.returns:
        raise refuse(
            Advice(
                f"returns={{'__aiter__': ...}} for the {ownership.name} never applies",
                [
                    Fix(
                        "declare",
                        "returns={'__anext__': loopbridge.Owned()}",
                        say="declare the rule for what async iteration yields as",
                        when=f"in {declare_site(ownership.name)}, in its place",
                    )
                ],
                "The proxy streams the object's own iteration; each item comes from __anext__.",
            )
        )
    if name == "__aiter__" and not inspect.iscoroutinefunction(fn):
        # The object's own iteration, however __aiter__ is written (returning
        # self with an __anext__, or an async generator function as websockets'
        # connections): the object stays usable after a `break`, so it is
        # streamed one item per request, never read ahead (see _faces._iteration).
        return _declared(name, ownership) or MemberKind.ITERATION
    if name == "__await__" and not _is_async(fn):
        return _declared(name, ownership) or MemberKind.AWAIT
    return _kind(name, raw, ownership)


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _declared(name: str, ownership: Ownership) -> MemberKind | None:
    if name in ownership.stable:
        return MemberKind.STABLE
    if name in ownership.threadsafe:
        return MemberKind.THREADSAFE
    return None


def _kind(name: str, raw: object, ownership: Ownership) -> MemberKind:
    fn = original(raw)
    declared = _declared(name, ownership)
    if name in ownership.returns:
        return _owned_kind(name, raw, fn, declared, declare_site(ownership.name))
    if declared is not None:
        return declared
    if isinstance(raw, (staticmethod, classmethod)):
        return MemberKind.CLASS_LEVEL
    if inspect.isasyncgenfunction(fn):
        return MemberKind.STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.ASYNC
    if inspect.isfunction(fn) or hasattr(raw, "__get__"):
        return MemberKind.SYNC
    return MemberKind.CLASS_LEVEL


def _owned_kind(
    name: str, raw: object, fn: object, declared: MemberKind | None, where: str
) -> MemberKind:
    """The kind of a member that has a ``returns`` rule; a rule that can't apply is an error."""
    if declared is not None:
        word = "stable" if declared is MemberKind.STABLE else "threadsafe"
        raise refuse(
            Advice(
                f"{name!r} is declared {declared.value} and also has a returns rule",
                [Fix("undeclare", f"{word}=({name!r},)", where)],
                "A member is one or the other: a returns rule already says how it crosses threads.",
            )
        )
    if isinstance(raw, (staticmethod, classmethod)):
        raise refuse(
            Advice(
                f"returns={{{name!r}: ...}} cannot apply: {name} is a {type(raw).__name__}, "
                "which does not act on the object",
                [Fix("undeclare", f"returns={{{name!r}: ...}}", where)],
                "Give the rule to the members of the object it returns.",
            )
        )
    if inspect.isasyncgenfunction(fn):
        return MemberKind.OWNED_STREAM
    if inspect.iscoroutinefunction(fn):
        return MemberKind.OWNED_CALL
    if inspect.isfunction(fn):
        return MemberKind.PENDING
    return MemberKind.OWNED_ATTR


# ------------------------------------------------------------------ refusals
# What a proxy refuses, and the advice its error gives.
#
# A sync member nobody declared is refused through a proxy.  The error says what
# to declare, and the advice must not cause the bug it guards against: for a
# member whose result is bound to the owner loop (it wraps an async function, as
# ``@asynccontextmanager`` and aiosqlite's ``execute`` do, or is annotated to
# return an awaitable or an async context manager), ``stable`` or ``threadsafe``
# would run it on the calling thread and its result on the calling loop, so the
# advice there is ``returns=`` only.  The advice fits the member: a sync method
# with an async twin (``iter_lines`` / ``aiter_lines``, ``close`` / ``aclose``)
# is told to use the twin, on a loop or through ``loopbridge.blocking``; data (a
# property, a slot, an instance's value) ``stable=``; a method annotated to give
# plain data ``threadsafe=``; a method nothing is known of ``returns=`` (the safe
# one) then ``threadsafe=``.  Each error carries its advice as data
# (``exc.advice``, see ``_errors.Advice``) and its message is rendered from it.
#
# Special methods are refused by a *method* that raises when called, not by an
# attribute that raises when looked up: CPython's operator slots (``==``, ``<``,
# ``hash()``, ``iter()``) swallow an error raised by the lookup and fall back to
# their default (``False``, "unhashable", "not iterable"), so only a method makes
# the operator itself raise.

#: What a refusal says of a member that is the instance's own value (``raw`` is that
#: value, ``None`` included); a ``raw`` of ``None`` otherwise means nothing is known.
INSTANCE_ATTRIBUTE = " (an instance attribute)"
#: Where a root object's declarations go; a result's go in the rule that gives it.
DECLARE_SITE = "@loop_affine(...) or adopt(...)"

#: Words in a return annotation that say the result belongs to a loop.
_ASYNC_WORDS = (
    "Awaitable",
    "Coroutine",
    "AsyncIterator",
    "AsyncIterable",
    "AsyncGenerator",
    "AsyncContextManager",
    "Future",
    "Task",
)
#: What an object has when it is awaited, entered or iterated on a loop.
_ASYNC_PROTOCOL = ("__await__", "__aenter__", "__aiter__", "__anext__")
#: Return annotations of plain data: such a method can be declared threadsafe.
_PLAIN_RESULTS = frozenset({"int", "float", "bool", "str", "bytes", "None", "dict", "list"})


def is_special(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def declare_site(owner_name: str | None) -> str:
    """Where the declarations of the object ``owner_name`` names go."""
    if owner_name is not None and " object from " in owner_name:
        return f"the Owned(...) rule that gives the {owner_name}"
    return DECLARE_SITE


def _return_annotation(fn: object) -> object:
    try:
        return inspect.get_annotations(fn).get("return") if callable(fn) else None
    except Exception:  # not a function with annotations
        return None


def loop_bound_result(raw: object) -> str | None:
    """Why the sync member ``raw`` seems to give back an object bound to the owner loop."""
    fn = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
    seen = 0
    f = fn
    while f is not None and seen < 8:  # a decorator's wrapper around an async function
        if inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f):
            return f"it wraps the async function {getattr(f, '__qualname__', f)!s}"
        f = getattr(f, "__wrapped__", None)
        seen += 1
    ann = _return_annotation(fn)
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", None) or repr(ann)
    if ann is not None and any(w in text for w in _ASYNC_WORDS):
        return f"it is annotated to return {text}"
    resolved = _resolve(fn, ann)
    resolved = typing.get_origin(resolved) or resolved  # UnaryStreamCall[Req, Resp]
    if isinstance(resolved, type) and any(hasattr(resolved, m) for m in _ASYNC_PROTOCOL):
        return f"it returns a {resolved.__qualname__}, which is awaited or entered on a loop"
    return None


def _resolve(fn: object, ann: object) -> object:
    """A string annotation (``"_base_call.UnaryStreamCall[...]"``) as the object it
    names in ``fn``'s module, or ``None``; only names are looked up, nothing runs."""
    if not isinstance(ann, str):
        return ann
    first, *rest = ann.split("[", 1)[0].strip().split(".")
    found = getattr(fn, "__globals__", {}).get(first)
    for part in rest:
        found = getattr(found, part, None)
    return found


def _plain_result(raw: object) -> bool:
    ann = _return_annotation(getattr(raw, "__func__", raw))
    text = ann if isinstance(ann, str) else getattr(ann, "__name__", None)
    return text in _PLAIN_RESULTS or ann is type(None)


def _is_data(raw: object, how: str) -> bool:
    """A member read as a value (a property, a slot, an instance's data), not called."""
    if isinstance(raw, (property, types.MemberDescriptorType, types.GetSetDescriptorType)):
        return True
    if how == INSTANCE_ATTRIBUTE:
        return not callable(raw)
    return not callable(raw) and not inspect.isfunction(original(raw))


def _async_twin(cls: type | None, name: str) -> str | None:
    """``aiter_lines`` for ``iter_lines``, ``aclose`` for ``close``: the async member
    that does the same work on the owner, when the class has one."""
    if cls is None or is_special(name):
        return None
    twin = getattr(cls, f"a{name}", None)
    fn = original(twin)
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return f"a{name}"
    return None


def sync_advice(
    cls_name: str,
    name: str,
    raw: object = None,
    how: str = "",
    cls: type | None = None,
    owner_name: str | None = None,
) -> Advice:
    """The advice for touching the undeclared sync member ``name`` through a proxy:
    one that fits the member (see the comment above)."""
    where = declare_site(owner_name)
    known = raw is not None or how == INSTANCE_ATTRIBUTE  # an instance's value may be None
    called = known and not _is_data(raw, how) and not is_special(name)
    problem = f"{cls_name}.{name}{'()' if called else ''}{how} is refused through a proxy"
    returns = Fix("declare", f"returns={{{name!r}: loopbridge.Owned()}}", where)
    why = loop_bound_result(raw) if raw is not None else None
    if why is not None:
        return Advice(
            problem,
            [returns],
            f"Its result belongs to the owner loop ({why}); with the rule the call runs on "
            "the owner when its result is first awaited, entered or iterated.",
        )
    twin = _async_twin(cls, name)
    if twin is not None:
        target = code_name(cls_name)
        return Advice(
            f"{cls_name}.{name}() is refused through a proxy",
            [
                Fix("loop", f"{target}.{twin}()", target=target),
                Fix("thread", f"loopbridge.blocking({target}).{twin}()", target=target),
            ],
            f"It is sync and would run on the calling thread; {twin}() does the same work "
            "on the owner loop.",
        )
    if is_special(name) and name != "__call__":  # calling it is a method call
        return Advice(
            problem,
            [Fix("declare", f"threadsafe=({name!r},)", where, "if it touches no loop-bound state")],
            f"Python runs {name} on the calling thread, off the owner loop; otherwise call "
            "an async method that does the same work.",
        )
    return _data_or_method_advice(problem, name, raw, how, where, returns, known)


def _data_or_method_advice(
    problem: str, name: str, raw: object, how: str, where: str, returns: Fix, known: bool
) -> Advice:
    if known and _is_data(raw, how):
        if how and loop_state(raw) is not None:  # an instance's value we can see
            return Advice(problem, [returns], "Its value holds loop-bound state.")
        return Advice(
            problem,
            [Fix("declare", f"stable=({name!r},)", where, "if it is set once at setup")],
            "Other threads may read only data declared stable; if it changes later, "
            "read it in an async method on the owner.",
        )
    threadsafe = Fix("declare", f"threadsafe=({name!r},)", where, "if any thread may call it")
    if raw is not None and _plain_result(raw):
        return Advice(problem, [threadsafe], "It would run on the calling thread.")
    returns.when = "if what it gives back belongs to the owner loop"
    return Advice(
        problem,
        [returns, threadsafe],
        "A sync member runs on the calling thread; never declare a loop-bound one threadsafe.",
    )


def refusal(
    cls_name: str,
    name: str,
    raw: object = None,
    how: str = "",
    cls: type | None = None,
    owner_name: str | None = None,
) -> LoopAffinityError:
    """The error for touching the undeclared sync member ``name`` through a proxy.

    ``raw``: the class attribute, to tell a member whose result is loop-bound;
    ``how``: what else is known (a member made by ``__getattr__``); ``cls`` the
    object's class (for an async twin); ``owner_name`` the object's ownership
    name (a result of a rule takes its declarations in that rule).
    """
    return refuse(sync_advice(cls_name, name, raw, how, cls, owner_name))


def _context(obj: object) -> tuple[type | None, str | None]:
    """The class behind a proxy (or its blocking face) and its ownership's name."""
    get = object.__getattribute__
    try:
        cls: type | None = type(get(obj, "_lb_target"))
    except AttributeError:
        cls = None
    try:
        name: str | None = get(obj, "_lb_ownership").name
    except AttributeError:
        name = None
    return cls, name


class Refused:
    """A sync member nobody declared safe: touching it through a proxy is an error."""

    __slots__ = ("name", "owner_name", "raw")

    def __init__(self, name: str, owner_name: str, raw: object) -> None:
        self.name = name
        self.owner_name = owner_name
        self.raw = raw

    def __get__(self, obj: object, objtype: object = None) -> object:
        if obj is None:
            return self
        raise refusal(self.owner_name, self.name, self.raw, "", *_context(obj))

    def __set__(self, obj: object, value: object) -> None:
        raise refusal(self.owner_name, self.name, self.raw, "", *_context(obj))


# A class attribute that is data (``status: int = None``, ``limit = 3``) is the
# class's value only until an instance sets its own: aiohttp's ClientResponse
# declares ``content: StreamReader = None`` and ``status: int = None`` and sets
# both on the instance when the response starts.  Inherited as is, the proxy
# would give the class's ``None`` for ever.  So on a class whose instances have a
# ``__dict__``, such a name is looked up on the object when it is read: a value
# of the instance's own, or a name the class annotates as per-instance (PEP 526,
# not ``ClassVar``), is instance data, refused like any instance attribute (with
# the same advice, from the instance's value); anything else is the class's
# constant, read as is.


class ClassData:
    """A class-level data attribute that instances may shadow (see above)."""

    __slots__ = ("name", "raw", "per_instance")

    def __init__(self, name: str, raw: object, per_instance: bool) -> None:
        self.name = name
        self.raw = raw
        self.per_instance = per_instance

    def __get__(self, obj: object, objtype: object = None) -> object:
        if obj is None:
            return self.raw
        get = object.__getattribute__
        target = get(obj, "_lb_target")
        try:
            own = get(target, "__dict__")
        except AttributeError:
            own = {}
        if self.name in own:
            value = own[self.name]  # the instance's own: the advice is from it
        elif self.per_instance:
            value = self.raw
        else:
            return self.raw  # the class's constant
        cls = type(target)
        how = INSTANCE_ATTRIBUTE
        raise refusal(cls.__qualname__, self.name, value, how, cls, get(obj, "_lb_ownership").name)


def _per_instance(cls: type, name: str) -> bool:
    """Whether the class that defines ``name`` annotates it as an instance variable."""
    for klass in cls.__mro__:
        if name in vars(klass):
            try:
                ann = inspect.get_annotations(klass).get(name)
            except Exception:  # annotations that cannot be read
                return False
            text = ann if isinstance(ann, str) else repr(ann)
            return ann is not None and "ClassVar" not in text
    return False


def class_data(cls: type, name: str, raw: object) -> ClassData | None:
    """How a proxy of ``cls`` gives the class-level data ``raw``: a :class:`ClassData`
    when instances may hold their own value, ``None`` (inherited as is) when they
    cannot (no instance ``__dict__``)."""
    if not getattr(cls, "__dictoffset__", 0):
        return None
    return ClassData(name, raw, _per_instance(cls, name))


def refused_member(cls_name: str, name: str, raw: object) -> object:
    """A refused member: a raising method for a special method, else a :class:`Refused`."""
    if not is_special(name):
        return Refused(name, cls_name, raw)

    def refused(self: object, *args: object, **kwargs: object) -> object:
        raise refusal(cls_name, name, raw, "", *_context(self))

    refused.__name__ = name
    refused.__qualname__ = f"{cls_name}.{name}"
    refused.__loopbridge_refused__ = True  # type: ignore[attr-defined]
    return refused
