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

import ast
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

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
    defaults: dict[str, object]


def forwarding(fn: Callable[..., object]) -> Forwarding:
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
    defaults: dict[str, object] = {}
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
    template: str, fn: Callable[..., object], label: str, *, generic: bool = False, **env: object
) -> Callable[..., object]:
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
    template: str, fn: Callable[..., object], label: str, fw: Forwarding, env: dict[str, object]
) -> Callable[..., object]:
    names = [*env, *fw.defaults]
    src = template.format(
        make_params=", ".join(names),
        params=fw.params,
        self=fw.self_name,
        args=fw.args,
        positional=fw.positional,
        keywords=fw.keywords,
    )
    make = compile_function(src, f"{label} of {fn.__qualname__}", "make")
    return cast("Callable[..., object]", make(**env, **fw.defaults))


def compile_function(src: str, label: str, name: str) -> Callable[..., Any]:
    """Compile ``src`` and return the function it defines as ``name`` (its type is
    what ``src`` says, which the caller knows and the checker cannot)."""
    ns: dict[str, object] = {}
    exec(compile(src, f"<loopbridge {label}>", "exec"), ns)
    return cast("Callable[..., Any]", ns[name])


# ------------------------------------------------------------ inlined prologues
# A wrapper costs a frame per call, and a coroutine wrapper a second coroutine
# object and frame too: more than a check it would add.  So a check that must
# run at a coroutine's first step is compiled *into* the coroutine function
# itself, from the function's own source: the same body, with one statement in
# front, in a function object with the same globals, defaults and closure.
#
# It is only done when it provably gives the same function: the source is
# found, and the unmodified source, compiled the same way, gives exactly the
# function's own bytecode, names and variables (so a file edited since import,
# a decorator's wrapper, or anything else unusual falls back to a wrapper).
_FUTURE_FLAGS = 0
for _feature in __import__("__future__").all_feature_names:
    _FUTURE_FLAGS |= getattr(__import__("__future__"), _feature).compiler_flag


def inline_prologue(
    fn: Callable[..., object], prologue: str, env: dict[str, object]
) -> Callable[..., object] | None:
    """``fn`` (an ``async def``: a coroutine or async generator function) with
    ``prologue`` (statements, using the names in ``env``) run at the start of its
    body, at the first step; ``None`` where that can't be done exactly."""
    code = getattr(fn, "__code__", None)
    if type(fn) is not types.FunctionType or code is None or hasattr(fn, "__wrapped__"):
        return None
    if set(env) & (set(code.co_varnames) | set(code.co_names) | set(code.co_freevars)):
        return None
    try:
        node, klass = _function_node(fn)
        same = _compiled(fn, node, klass, env)
        if same is None or not _same_code(same, code):
            return None  # the source is not what was compiled (edited, generated...)
        node.body[_body_start(node) : _body_start(node)] = _statements(prologue, node)
        made = _compiled(fn, node, klass, env)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    return None if made is None else _function(fn, made, env)


def _function_node(fn: types.FunctionType) -> tuple[ast.AsyncFunctionDef, str | None]:
    lines, start = inspect.getsourcelines(fn)
    src = "".join(lines)
    indented = src[:1].isspace()
    tree = ast.parse("if 1:\n" + src if indented else src)
    stmt = tree.body[0].body[0] if indented else tree.body[0]  # type: ignore[attr-defined]
    if not isinstance(stmt, ast.AsyncFunctionDef) or stmt.name != fn.__name__:
        raise ValueError("not the function's own definition")
    ast.increment_lineno(stmt, start - (2 if indented else 1))
    stmt.decorator_list = []
    parts = fn.__qualname__.split(".")
    klass = parts[-2] if len(parts) > 1 and parts[-2] != "<locals>" else None
    return stmt, klass


def _body_start(node: ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return 1 if is_doc and isinstance(first.value.value, str) else 0  # type: ignore[attr-defined]


def _statements(src: str, at: ast.AST) -> list[ast.stmt]:
    body = ast.parse(src).body
    for stmt in body:
        for sub in ast.walk(stmt):
            ast.copy_location(sub, at)
            if hasattr(sub, "end_lineno"):
                sub.end_lineno = at.lineno  # type: ignore[attr-defined]
    return body


def _compiled(
    fn: types.FunctionType, node: ast.AsyncFunctionDef, klass: str | None, env: dict[str, object]
) -> types.CodeType | None:
    """Compile ``node`` where ``fn`` was: inside its class (for name mangling and
    ``__class__``), inside a function whose parameters are its free variables."""
    code: types.CodeType = fn.__code__
    params = [*env, *(v for v in code.co_freevars if v != "__class__")]
    inner: ast.stmt = node
    if klass is not None:
        inner = ast.ClassDef(name=klass, bases=[], keywords=[], body=[node], decorator_list=[])
        inner.type_params = []  # type: ignore[attr-defined]
    outer = ast.parse(f"def _loopbridge_outer({', '.join(params)}):\n    pass").body[0]
    outer.body = [inner]  # type: ignore[attr-defined]
    # Since 3.12 the compiler calls ``name.attr()`` differently when ``name`` is
    # bound by an import in the module: bind the likely ones the same way (never
    # run; only compiled), and let the comparison judge.
    imports: list[ast.stmt] = [
        ast.Import(names=[ast.alias(name="sys", asname=name)]) for name in _imported_names(fn)
    ]
    module = ast.fix_missing_locations(ast.Module(body=[*imports, outer], type_ignores=[]))
    flags = code.co_flags & _FUTURE_FLAGS
    top = compile(module, code.co_filename, "exec", flags=flags, dont_inherit=True)
    return _find_code(top, fn.__name__)


def _imported_names(fn: types.FunctionType) -> list[str]:
    """Globals ``fn`` uses that its module most likely bound by an import."""
    out: list[str] = []
    stack = [fn.__code__]
    names: set[str] = set()
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    for name in sorted(names):
        value = fn.__globals__.get(name)
        if isinstance(value, types.ModuleType) or (
            isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType))
            and getattr(value, "__module__", fn.__module__) != fn.__module__
        ):
            out.append(name)
    return out


_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def _find_code(code: types.CodeType, name: str) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_flags & _ASYNC_FLAGS:
                return const
            found = _find_code(const, name)
            if found is not None:
                return found
    return None


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """The same bytecode, names and variables, nested functions' included (positions,
    which dedenting or a moved line change, are not compared)."""
    return (
        a.co_code == b.co_code
        and a.co_names == b.co_names
        and a.co_varnames == b.co_varnames
        and a.co_freevars == b.co_freevars
        and a.co_cellvars == b.co_cellvars
        and a.co_argcount == b.co_argcount
        and a.co_kwonlyargcount == b.co_kwonlyargcount
        and len(a.co_consts) == len(b.co_consts)
        and all(_same_const(x, y) for x, y in zip(a.co_consts, b.co_consts))
    )


def _same_const(x: object, y: object) -> bool:
    if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
        return _same_code(x, y)
    return type(x) is type(y) and (x is y or x == y)


def _function(
    fn: types.FunctionType, code: types.CodeType, env: dict[str, object]
) -> Callable[..., object] | None:
    own = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells = []
    for name in code.co_freevars:
        if name in env:
            cells.append(types.CellType(env[name]))
        elif name in own:
            cells.append(own[name])
        else:
            return None
    made = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    made.__kwdefaults__ = fn.__kwdefaults__
    return made


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
Maker = Callable[[type], object]


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


def make_class(cls: type, name: str, ns: dict[str, object]) -> tuple[type, Maker]:
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
