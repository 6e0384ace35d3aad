"""A mypy plugin that types the blocking face precisely.

``Blocking[T]`` resolves its members at run time through ``__getattr__``, so
without help a type checker sees ``Any`` for every ``blocking(p).member``.  Enable
this plugin to get the real signatures instead::

    [mypy]
    plugins = loopbridge.mypy_plugin

For ``b = blocking(p)`` where ``p`` is (a proxy of) a ``T``:

* an async method ``async def m(self, x: int) -> R`` of ``T`` is typed
  ``def (x: int) -> R``: the same parameters, called without ``await``;
* an async generator method returning ``AsyncIterator[Y]`` (or
  ``AsyncGenerator[Y, S]``, ``AsyncIterable[Y]``) is typed as a callable with the
  same parameters returning :class:`loopbridge.BlockingStream` ``[Y]``;
* every other member keeps the type it has on ``T``; a name ``T`` lacks is an
  ``attr-defined`` error, as it is on ``T`` itself.

The member is looked up with mypy's own attribute access, so inheritance,
generic classes, overloads, properties and unions behave as they do on ``T``.
What the plugin cannot see: the ``stable=`` / ``threadsafe=`` declarations (an
async method declared stable is passed through unchanged at run time), and sync
members that the proxy refuses at run time keep their type here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from mypy.checker import TypeChecker
from mypy.checkmember import analyze_member_access
from mypy.maptype import map_instance_to_supertype
from mypy.nodes import FuncDef, TypeInfo
from mypy.plugin import AttributeContext, Plugin
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    Overloaded,
    ProperType,
    Type,
    TypeOfAny,
    UnionType,
    get_proper_type,
)
from mypy.version import __version__ as mypy_version

__all__ = ["plugin"]

# Keyed on the public names: where loopbridge defines them is its own business.
_BLOCKING = "loopbridge.Blocking"
_STREAM = "loopbridge.BlockingStream"
_ASYNC_ITERABLE = "typing.AsyncIterable"
_COROUTINE = "typing.Coroutine"
_ASYNC_GENERATOR = "typing.AsyncGenerator"

# ``msg`` was a required argument of analyze_member_access before mypy 1.16
# (python/mypy#18818); compiled builds may not expose a signature to inspect.
_NEEDS_MSG = tuple(int(n) for n in re.findall(r"\d+", mypy_version)[:2]) < (1, 16)


class LoopbridgePlugin(Plugin):
    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        # Called for names that Blocking resolves through __getattr__.
        blocking = self._defined_as(_BLOCKING)
        prefix = blocking + "."
        if blocking and fullname.startswith(prefix):
            return functools.partial(_blocking_member, blocking, fullname[len(prefix) :])
        return None

    def _defined_as(self, public: str) -> str:
        """The full name mypy records for the public name ``public`` ("" before
        loopbridge is loaded: then nothing can be a Blocking yet)."""
        sym = self.lookup_fully_qualified(public)
        return sym.node.fullname if sym is not None and isinstance(sym.node, TypeInfo) else ""


def plugin(version: str) -> type[Plugin]:
    """Entry point named by ``plugins = loopbridge.mypy_plugin``."""
    return LoopbridgePlugin


def _blocking_member(blocking: str, name: str, ctx: AttributeContext) -> Type:
    if getattr(ctx, "is_lvalue", False):  # (no is_lvalue before mypy 1.11)
        return ctx.default_attr_type
    # For a union of faces the hook runs once per item but only sees the whole
    # union, so every run answers for all Blocking items (mypy merges the results).
    face = get_proper_type(ctx.type)
    items = face.relevant_items() if isinstance(face, UnionType) else [face]
    targets = [t for t in (_target_of(blocking, item) for item in items) if t is not None]
    if not targets:
        return ctx.default_attr_type
    target = make_simplified_union(targets)
    if isinstance(get_proper_type(target), AnyType):
        return ctx.default_attr_type
    api = ctx.api
    if not isinstance(api, TypeChecker):
        return ctx.default_attr_type
    kwargs: dict[str, Any] = {}
    if _NEEDS_MSG:
        kwargs["msg"] = api.msg
    member = analyze_member_access(
        name,
        target,
        ctx.context,
        is_lvalue=False,
        is_super=False,
        is_operator=False,
        original_type=target,
        chk=api,
        **kwargs,
    )
    return _to_blocking(member, api)


def _target_of(blocking: str, face: Type) -> Type | None:
    """``T`` of a ``Blocking[T]`` (or of a subclass of it), else None."""
    face = get_proper_type(face)
    if not isinstance(face, Instance):
        return None
    info = face.type.get_containing_type_info("__getattr__")
    if info is None or info.fullname != blocking:
        return None
    face = map_instance_to_supertype(face, info)
    return face.args[0] if face.args else None


def _to_blocking(typ: Type, api: TypeChecker) -> Type:
    proper = get_proper_type(typ)
    if isinstance(proper, CallableType):
        return _callable_to_blocking(proper, api)
    if isinstance(proper, Overloaded):
        items = [_callable_to_blocking(item, api) for item in proper.items]
        return Overloaded(items)
    if isinstance(proper, UnionType):
        return make_simplified_union([_to_blocking(item, api) for item in proper.items])
    return typ


def _callable_to_blocking(fn: CallableType, api: TypeChecker) -> CallableType:
    ret = get_proper_type(fn.ret_type)
    definition = fn.definition
    if isinstance(definition, FuncDef):
        # The definition says what the run time will do (inspect.iscoroutinefunction /
        # isasyncgenfunction); a sync def that returns an awaitable is refused there.
        # (an async generator is flagged is_coroutine as well: test it first)
        if definition.is_async_generator:
            return fn.copy_modified(ret_type=_stream_of(ret, api))
        if definition.is_coroutine:
            return fn.copy_modified(ret_type=_awaited(ret, fn.ret_type))
        return fn
    # Decorated members lose their definition: judge by the declared result.
    if isinstance(ret, Instance) and ret.type.fullname == _COROUTINE:
        return fn.copy_modified(ret_type=_awaited(ret, fn.ret_type))
    if isinstance(ret, Instance) and ret.type.fullname == _ASYNC_GENERATOR:
        return fn.copy_modified(ret_type=_stream_of(ret, api))
    return fn


def _awaited(ret: ProperType, default: Type) -> Type:
    if isinstance(ret, Instance) and ret.type.fullname == _COROUTINE and len(ret.args) == 3:
        return ret.args[2]
    if isinstance(ret, AnyType):
        return ret
    return default


def _stream_of(ret: ProperType, api: TypeChecker) -> Type:
    item: Type = AnyType(TypeOfAny.from_omitted_generics)
    if isinstance(ret, Instance):
        for base in ret.type.mro:
            if base.fullname == _ASYNC_ITERABLE:
                mapped = map_instance_to_supertype(ret, base)
                if mapped.args:
                    item = mapped.args[0]
                break
    # Looked up by its public name (the name resolves to the defining module's
    # class); found whenever the checked code imports loopbridge, as it must to
    # call blocking().
    module_name, _, class_name = _STREAM.rpartition(".")
    module = api.modules.get(module_name)
    sym = module.names.get(class_name) if module is not None else None
    if sym is None or not isinstance(sym.node, TypeInfo):
        return AnyType(TypeOfAny.special_form)
    return Instance(sym.node, [item])
