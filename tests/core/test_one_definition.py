"""Code the hot path repeats to save a Python frame is the same code as its original.

Three bodies are repeated where they run, once per call or per stream item: the
common case of ``loop_waker`` at the top of ``route_call``, ``Channel.take`` in
``RemoteStream.__anext__``'s fast path, and the settle latch (``Port.leave``) in
``Operation.settle``.  Each test compares
the syntax trees of the original and of its repetition (comments and layout
aside), so a change to one that forgets the other fails here.  Each test also
shows that its comparison tells a changed body apart.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from loopbridge import _calls, _operation, _ports, _streams, _wakers


def _function(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return node


def _code(stmts: list[ast.stmt]) -> list[str]:
    """Statements without their docstring, as comparable text (no line numbers)."""
    if stmts and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
        stmts = stmts[1:]
    return [ast.dump(s) for s in stmts]


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = self.new
        return node


def _renamed(stmts: list[ast.stmt], old: str, new: str) -> list[ast.stmt]:
    return [_Rename(old, new).visit(copy.deepcopy(s)) for s in stmts]


def _contains(body: list[str], part: list[str]) -> bool:
    n = len(part)
    return n > 0 and any(body[i : i + n] == part for i in range(len(body) - n + 1))


def _changed(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """The same statements with one constant or name altered: what a forgotten edit looks like."""
    changed = copy.deepcopy(stmts)
    for node in ast.walk(changed[-1]):
        if isinstance(node, ast.Constant) and not isinstance(node.value, str):
            node.value = 2 if node.value != 2 else 3
            return changed
        if isinstance(node, ast.Attribute):
            node.attr += "_changed"
            return changed
    raise AssertionError("nothing to change")


def _lookup_of_loop_waker() -> list[ast.stmt]:
    """``loop_waker``'s common case: its first two statements (the port, then its
    waker or, past the common case, ``new_loop_waker``)."""
    stmts = _function(_wakers.loop_waker).body[1:3]  # after the docstring
    assert isinstance(stmts[1], ast.If) and "new_loop_waker" in ast.dump(stmts[1])
    return stmts


def test_route_call_finds_the_waker_with_loop_wakers_own_statements() -> None:
    lookup = _lookup_of_loop_waker()
    route = _code(_function(_calls.route_call).body)
    assert _contains(route, _code(lookup)), (
        "route_call's waker lookup differs from loop_waker's: change both (or neither)"
    )
    assert not _contains(route, _code(_changed(lookup)))


def _fast_path_of_anext() -> list[ast.stmt]:
    """The body of ``if buf:`` at the top of ``RemoteStream.__anext__``."""
    for node in _function(_streams.RemoteStream.__anext__).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "buf":
            return node.body
    raise AssertionError("RemoteStream.__anext__ has no `if buf:` fast path")


def test_a_streams_fast_path_takes_an_item_with_channel_takes_own_statements() -> None:
    take = _renamed(_function(_streams.Channel.take).body, "self", "ch")
    fast = _code(_fast_path_of_anext())
    assert fast == _code(take), (
        "RemoteStream.__anext__'s fast path differs from Channel.take: change both (or neither)"
    )
    assert fast != _code(_changed(take[1:]))


class _ReturnNothing(ast.NodeTransformer):
    """``return False`` (a method's "not latched") as ``return`` (settle's)."""

    def visit_Return(self, node: ast.Return) -> ast.Return:
        if isinstance(node.value, ast.Constant) and node.value.value is False:
            node.value = None
        return node


def _latch_of_leave() -> list[ast.stmt]:
    """``Port.leave``'s latch, as ``Operation.settle`` would write it: the port is
    ``owner``, the operation ``self``; "not latched" returns nothing; the final
    ``return True`` (latched: go on) is settle's falling through."""
    stmts = _function(_ports.Port.leave).body[1:]  # after the docstring
    assert ast.dump(stmts[-1]) == ast.dump(ast.parse("return True").body[0])
    renamed = _renamed(_renamed(stmts[:-1], "self", "owner"), "op", "self")
    return [_ReturnNothing().visit(s) for s in renamed]


def test_settle_takes_the_latch_with_port_leaves_own_statements() -> None:
    latch = _latch_of_leave()
    body = _code(_if_not_latched())
    assert _contains(body, _code(latch)), (
        "Operation.settle's latch differs from Port.leave: change both (or neither)"
    )
    assert not _contains(body, _code(_changed(latch)))


def _if_not_latched() -> list[ast.stmt]:
    """The body of ``if not latched:`` in ``Operation.settle``."""
    for node in _function(_operation.Operation.settle).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp):
            return node.body
    raise AssertionError("Operation.settle has no `if not latched:` block")
