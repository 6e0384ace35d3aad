"""Wrappers with a method's exact signature.

Forwarding through ``(self, *args, **kwargs)`` costs more than the work the
wrappers do (the affinity check, the same-loop test of a proxy member): CPython
must pack and unpack both containers.  So the wrappers are generated with the
wrapped method's own parameter list and forward each argument by name.

Each wrapper has one template.  A signature that can't be mirrored (a
decorator's ``(*args, **kwargs)``, a builtin) renders the same template with
plain forwarding (:data:`GENERIC`), so there is never a hand-written second copy
of a wrapper to keep in step.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Forwarding",
    "forwarding",
    "GENERIC",
    "build",
    "compile_function",
    "make_class",
    "Maker",
]


@dataclass(frozen=True)
class Forwarding:
    """Source fragments for a wrapper of one method."""

    params: str  # the full parameter list, defaults bound to __lb_d<i> names
    self_name: str
    args: str  # everything after self, as call arguments: "a, b, *rest, c=c, **kw"
    positional: str  # positional arguments after self, for a tuple: "a, b, *rest, "
    keywords: str  # keyword arguments as a dict display: "{'c': c, **kw}"
    defaults: dict[str, Any]


def forwarding(fn: Callable[..., Any]) -> Forwarding:
    """Describe ``fn``'s signature; raises ``ValueError`` when it can't be mirrored."""
    P = inspect.Parameter
    # The callable's own parameters, not those of a function it wraps: a
    # decorator's wrapper may accept more (or other) arguments than its target.
    params = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    if not params or params[0].kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        raise ValueError("not a method")
    out: list[str] = []
    positional: list[str] = []
    keywords: list[str] = []  # dict display items
    by_name: list[str] = []  # the same, as call arguments
    defaults: dict[str, Any] = {}
    kwonly_started = posonly_open = False
    for i, p in enumerate(params):
        if p.name.startswith("__lb_"):
            raise ValueError(p.name)
        text = p.name
        if p.default is not P.empty:
            defaults[f"__lb_d{i}"] = p.default
            text = f"{p.name}=__lb_d{i}"
        if p.kind is P.POSITIONAL_ONLY:
            posonly_open = True
        elif posonly_open:
            out.append("/")
            posonly_open = False
        if p.kind is P.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            positional.append(f"*{p.name}")
            kwonly_started = True
        elif p.kind is P.VAR_KEYWORD:
            out.append(f"**{p.name}")
            keywords.append(f"**{p.name}")
            by_name.append(f"**{p.name}")
        elif p.kind is P.KEYWORD_ONLY:
            if not kwonly_started:
                out.append("*")
                kwonly_started = True
            out.append(text)
            keywords.append(f"{p.name!r}: {p.name}")
            by_name.append(f"{p.name}={p.name}")
        else:
            out.append(text)
            if i:
                positional.append(p.name)
    if posonly_open:
        out.append("/")
    return Forwarding(
        params=", ".join(out),
        self_name=params[0].name,
        args=", ".join(positional + by_name),
        positional="".join(f"{a}, " for a in positional),
        keywords="{" + ", ".join(keywords) + "}",
        defaults=defaults,
    )


#: The rendering for callables whose signature can't be mirrored (a decorator's
#: ``(*args, **kwargs)``, a builtin): plain forwarding, same template.
GENERIC = Forwarding(
    params="__lb_self, /, *__lb_args, **__lb_kwargs",
    self_name="__lb_self",
    args="*__lb_args, **__lb_kwargs",
    positional="*__lb_args, ",
    keywords="__lb_kwargs",
    defaults={},
)


def build(
    template: str, fn: Callable[..., Any], label: str, *, generic: bool = False, **env: Any
) -> Callable[..., Any]:
    """Compile ``template`` for ``fn`` and return the wrapper ``make(**env)`` returns.

    The template defines ``make(<env names>, <default names>)`` and may use the
    fields of :class:`Forwarding` as ``{params}``, ``{self}``, ``{args}``,
    ``{positional}`` and ``{keywords}``.  It is rendered with ``fn``'s own
    signature, or with :data:`GENERIC` when that can't be mirrored (or when
    ``generic`` asks for it): one template, so both wrappers run the same code.
    """
    fw = GENERIC
    if not generic:
        try:
            fw = forwarding(fn)
            return _render(template, fn, label, fw, env)
        except (TypeError, ValueError, SyntaxError):  # e.g. a decorator's (*args, **kwargs)
            fw = GENERIC
    return _render(template, fn, label, fw, env)


def _render(
    template: str, fn: Callable[..., Any], label: str, fw: Forwarding, env: dict[str, Any]
) -> Callable[..., Any]:
    names = [*env, *fw.defaults]
    src = template.format(
        make_params=", ".join(names),
        params=fw.params,
        self=fw.self_name,
        args=fw.args,
        positional=fw.positional,
        keywords=fw.keywords,
    )
    made: Callable[..., Any] = compile_function(src, f"{label} of {fn.__qualname__}", "make")(
        **env, **fw.defaults
    )
    return made


def compile_function(src: str, label: str, name: str) -> Callable[..., Any]:
    """Compile ``src`` and return the function it defines as ``name``."""
    ns: dict[str, Any] = {}
    exec(compile(src, f"<loopbridge {label}>", "exec"), ns)
    fn: Callable[..., Any] = ns[name]
    return fn


# ------------------------------------------------------------ generated classes
# Generated subclasses of any class, and instances of them made without the
# class's constructor.
#
# A proxy (and the tripwire of an uncovered result) is an instance of a class
# generated as a subclass of the object's own class, so ``isinstance`` holds.  The
# proxy must never run that class's ``__new__`` or ``__init__`` (user code, made
# for real instances).  For a class whose instances are laid out by Python,
# ``object.__new__`` makes an empty instance.  For one with a C layout (a Future,
# a Task, a deque, a ``str`` subclass) ``object.__new__`` refuses ("not safe"), and
# the empty instance must come from the ``__new__`` of the C type that fixes the
# layout, called with no arguments: it allocates and sets no state.
#
# Invariants:
#
# * :func:`make_class` returns a class and the function that makes its
#   instances, found once, by making one: it never fails later, per instance;
# * a class that cannot be subclassed (final, a C type that refuses) or whose
#   empty instance cannot be made gets a plain class with the same members
#   instead (``isinstance`` with the original class then fails: there is no other
#   way);
# * only C ``__new__`` functions are called, never one written in Python.

#: Makes an empty instance of the given class.
Maker = Callable[[type], Any]


def _c_makers(cls: type) -> list[Maker]:
    """``object.__new__``, then the C ``__new__`` of each C type in ``cls``'s MRO."""
    out: list[Maker] = [object.__new__]
    for klass in cls.__mro__:
        new = klass.__dict__.get("__new__")
        if isinstance(new, types.BuiltinFunctionType) and new is not object.__new__:
            out.append(new)
    return out


def _maker_for(pcls: type) -> Maker | None:
    """How to make an empty instance of ``pcls``: tried once, here."""
    for new in _c_makers(pcls):
        try:
            new(pcls)
        except Exception:  # a C __new__ that needs arguments, or refuses this layout
            continue
        return new
    return None


def make_class(cls: type, name: str, ns: dict[str, Any]) -> tuple[type, Maker]:
    """A subclass of ``cls`` named ``name`` with members ``ns`` (which has ``__slots__``),
    and the function that makes its empty instances.

    Tried in order: a slotted subclass; one without ``__slots__`` (variable-size
    C types such as ``int`` and ``tuple`` take no slots, so instances keep their
    own attributes in a ``__dict__``); a plain class with the same members.
    """
    unslotted = {k: v for k, v in ns.items() if k != "__slots__"}
    for body in (ns, unslotted):
        try:
            pcls = type(cls)(name, (cls,), dict(body))
        except TypeError:  # final, a C type that refuses, a slot layout conflict
            continue
        maker = _maker_for(pcls)
        if maker is not None:
            return pcls, maker
    pcls = type(name, (), dict(ns))
    return pcls, object.__new__
