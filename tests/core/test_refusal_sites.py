"""Every refusal the core can raise is triggered by a test, carries its advice as
code, and (where the advice is code) following it works.

The sites are found in the source, not listed by hand: an AST walk over
``src/loopbridge`` finds every ``raise`` of a :class:`~loopbridge.LoopAffinityError`
(or an :class:`~loopbridge.OwnerLoopClosed` built from advice) and of every
helper that builds one (a function that returns a call to one, found to a fixed
point).  :data:`TRIGGERS` maps each site to the test code that makes it raise; a
new site without an entry fails :func:`test_every_refusal_site_has_a_trigger`,
and each trigger must raise *at its site* (its traceback passes through the
``raise``), with a message rendered from ``exc.advice`` whose first sentence
shows each fix's code between backquotes.  Each trigger then does what that code
says, literally (``(...)`` is the refused call's own arguments), and checks the
refused use now works.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import LoopAffinityError, Owned, OwnerLoopClosed

from .conftest import until_set

SRC = Path(lb.__file__).parent
ROOTS = {"LoopAffinityError", "refuse", "gone"}
CODE = re.compile(r"`([^`]+)`")


# ------------------------------------------------------------------ the sites
@dataclass(frozen=True)
class Site:
    module: str  # "_calls.py"
    scope: str  # "call_from_thread", "LoopThread.run"
    builder: str  # "refuse", "_cycle"
    first: int  # the raise statement's lines
    last: int

    @property
    def key(self) -> str:
        return f"{self.module}:{self.scope}:{self.builder}"


def _callee(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _builders(trees: dict[str, ast.Module]) -> set[str]:
    """The roots and every function that returns a call to one, to a fixed point."""
    found = set(ROOTS)
    while True:
        more = {
            fn.name
            for tree in trees.values()
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for r in ast.walk(fn)
            if isinstance(r, ast.Return)
            and isinstance(r.value, ast.Call)
            and _callee(r.value) in found
        }
        if more <= found:
            return found
        found |= more


def refusal_sites() -> dict[str, Site]:
    """Every refusal site, keyed ``module:scope:builder`` (``#n`` from the second on)."""
    trees = {
        p.relative_to(SRC).as_posix(): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted(SRC.rglob("*.py"))
    }
    builders = _builders(trees)
    sites: dict[str, Site] = {}

    def visit(module: str, node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(module, child, [*scope, child.name])
                continue
            if (
                isinstance(child, ast.Raise)
                and isinstance(child.exc, ast.Call)
                and _callee(child.exc) in builders
            ):
                site = Site(
                    module,
                    ".".join(scope),
                    str(_callee(child.exc)),
                    child.lineno,
                    child.end_lineno or child.lineno,
                )
                key, n = site.key, 1
                while key in sites:
                    key, n = f"{site.key}#{n}", n + 1
                sites[key] = site
            visit(module, child, scope)

    for module, tree in trees.items():
        visit(module, tree, [])
    return sites


# ------------------------------------------------------------------ helpers
@dataclass
class Env:
    owner: lb.LoopThread


def caught(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except (LoopAffinityError, OwnerLoopClosed) as exc:
        return exc
    raise AssertionError("no refusal")


def on_owner(owner: lb.LoopThread, fn: Callable[[], object]) -> BaseException:
    """``fn`` run on the owner loop's thread, its refusal brought back."""

    async def main() -> BaseException:
        return caught(fn)

    return owner.run(main)


def code(exc: BaseException, kind: str) -> str:
    advice = exc.advice  # type: ignore[attr-defined]
    codes = [f.code for f in advice.fixes if f.kind == kind]
    assert codes, f"no {kind!r} fix in: {exc}"
    return codes[0]


def run(code_: str, call_args: str = "", /, **names: object) -> Any:
    """The advice's code, as written (``(...)`` is the refused call's arguments)."""
    return eval(code_.replace("(...)", f"({call_args})"), {"loopbridge": lb, **names})


def declared(code_: str) -> dict[str, Any]:
    value: dict[str, Any] = eval(f"dict({code_})", {"loopbridge": lb})
    return value


def without(kwargs: dict[str, Any], code_: str) -> dict[str, Any]:
    """``kwargs`` less what an ``undeclare`` fix names."""
    out = dict(kwargs)
    for key, value in declared(code_).items():
        kept = out[key]
        if isinstance(kept, dict):
            out[key] = {k: v for k, v in kept.items() if k not in value}
        else:
            out[key] = tuple(n for n in kept if n not in value)
    return out


def built(owner: lb.LoopThread, make: Callable[[], Any]) -> Any:
    async def main() -> Any:
        return make()

    return owner.run(main)


# ------------------------------------------------------------ objects to refuse
@lb.loop_affine
class Engine:
    def __init__(self) -> None:
        self.log: list[str] = []

    async def echo(self, value: Any) -> Any:
        return value

    async def count(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            yield i


class Plain:
    async def echo(self, value: Any) -> Any:
        return value

    @classmethod
    def make(cls) -> Plain:
        return cls()


class Counter:
    def __init__(self) -> None:
        self.log: list[str] = []

    def bump(self) -> int:
        return 1


class Iterable:
    def __aiter__(self) -> Iterable:
        self.n = 0
        return self

    async def __anext__(self) -> int:
        self.n += 1
        if self.n > 2:
            raise StopAsyncIteration
        return self.n


class Response:
    status: int = None  # type: ignore[assignment]

    def __init__(self) -> None:
        self.status = 200


class Futures:
    async def bare_future(self) -> asyncio.Future[int]:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(1)
        return fut


# ---------------------------------------------------------------- triggers
def t_affinity(env: Env) -> BaseException:
    engine = built(env.owner, Engine)
    exc = caught(lambda: asyncio.run(engine.echo(1)))

    async def advised() -> Any:
        return await run(code(exc, "loop"), "1", engine=engine)

    assert asyncio.run(advised()) == 1
    assert run(code(exc, "thread"), "1", engine=engine) == 1
    return exc


def t_no_loop(env: Env) -> BaseException:
    p = lb.proxy(built(env.owner, Engine))
    coro: Any = p.echo(1)
    exc = caught(lambda: coro.send(None))
    coro.close()
    assert run(code(exc, "thread"), "1", p=p) == 1
    return exc


def t_blocking_on_owner(env: Env) -> BaseException:
    p = lb.proxy(built(env.owner, Engine))
    exc = on_owner(env.owner, lambda: lb.blocking(p).echo(1))

    async def advised() -> Any:
        return await run(code(exc, "owner"), "1", p=p)

    assert env.owner.run(advised) == 1
    return exc


def _adopt_first(env: Env, use: Callable[[Any], object]) -> BaseException:
    obj = Plain()
    exc = caught(lambda: use(obj))

    async def advised() -> None:
        run(code(exc, "owner"), plain=obj)

    env.owner.run(advised)
    use(obj)
    return exc


def t_owner_loop_not_affine(env: Env) -> BaseException:
    exc = _adopt_first(env, lb.owner_loop)
    return exc


def t_transfer_not_affine(env: Env) -> BaseException:
    return _adopt_first(env, lambda obj: lb.transfer(obj, env.owner.loop))


def t_transfer_no_loop(env: Env) -> BaseException:
    obj = built(env.owner, Engine)
    exc = caught(lambda: lb.transfer(obj))
    run(code(exc, "thread"), engine=obj, loop=env.owner.loop)
    assert lb.owner_loop(obj) is env.owner.loop
    return exc


def t_transfer_closed(env: Env) -> BaseException:
    obj = built(env.owner, Engine)
    closed = asyncio.new_event_loop()
    closed.close()
    exc = caught(lambda: lb.transfer(obj, closed))
    run(code(exc, "run"), obj=obj, loop=env.owner.loop)
    return exc


def t_adopt_twice(env: Env) -> BaseException:
    obj = built(env.owner, Engine)
    exc = caught(lambda: lb.adopt(obj))

    async def advised() -> None:
        run(code(exc, "owner"), engine=obj)

    env.owner.run(advised)
    return exc


def t_no_such_member(env: Env) -> BaseException:
    kwargs: dict[str, Any] = {"returns": {"ecoh": Owned()}}
    exc = on_owner(env.owner, lambda: lb.adopt(Plain(), **kwargs))
    fixed = without(kwargs, code(exc, "undeclare"))
    assert lb.proxy(built(env.owner, lambda: lb.adopt(Plain(), **fixed)))
    return exc


def t_not_started(env: Env) -> BaseException:
    t = lb.LoopThread(name="not-yet")
    exc = caught(lambda: t.loop)
    try:
        exec(code(exc, "run"), {"loop_thread": t})
        assert t.loop.is_running()
    finally:
        t.stop()
    return exc


def _runs(t: lb.LoopThread) -> None:
    async def one() -> int:
        return 1

    assert t.run(one) == 1


def t_forked(env: Env) -> BaseException:
    """What the fork hook leaves in a child: a LoopThread marked as the parent's."""
    t = lb.LoopThread(name="parent-only").start()
    t._forked = True
    exc = caught(lambda: _runs(t))
    t._forked = False
    t.stop()
    fresh = run(code(exc, "child"))
    try:
        _runs(fresh)
    finally:
        fresh.stop()
    return exc


def t_stopped(env: Env) -> BaseException:
    t = lb.LoopThread(name="stopped").start()
    t.stop()
    exc = caught(lambda: _runs(t))
    fresh = run(code(exc, "run"))
    try:
        _runs(fresh)
    finally:
        fresh.stop()
    return exc


def t_run_on_own_thread(env: Env) -> BaseException:
    async def fn(value: int) -> int:
        return value

    exc = on_owner(env.owner, lambda: env.owner.run(fn, 1))

    async def advised() -> Any:
        return await run(code(exc, "owner"), fn=fn, args=(1,))

    assert env.owner.run(advised) == 1
    return exc


def t_stop_on_own_thread(env: Env) -> BaseException:
    t = lb.LoopThread(name="stops").start()
    exc = on_owner(t, t.stop)
    run(code(exc, "thread"), loop_thread=t)
    assert not t.running
    return exc


def _proxy_with(env: Env, make: Callable[[], Any], **kwargs: Any) -> Any:
    return lb.proxy(built(env.owner, lambda: lb.adopt(make(), **kwargs)))


def t_aiter_rule(env: Env) -> BaseException:
    exc = caught(lambda: _proxy_with(env, Iterable, returns={"__aiter__": Owned()}))
    p = _proxy_with(env, Iterable, **declared(code(exc, "declare")))
    assert list(lb.blocking(p)) == [1, 2]
    return exc


def t_declared_and_returns(env: Env) -> BaseException:
    kwargs: dict[str, Any] = {"stable": ("echo",), "returns": {"echo": Owned()}}
    exc = caught(lambda: _proxy_with(env, Plain, **kwargs))
    p = _proxy_with(env, Plain, **without(kwargs, code(exc, "undeclare")))
    assert lb.blocking(p).echo(3) == 3
    return exc


def t_classmethod_rule(env: Env) -> BaseException:
    kwargs: dict[str, Any] = {"returns": {"make": Owned()}}
    exc = caught(lambda: _proxy_with(env, Plain, **kwargs))
    p = _proxy_with(env, Plain, **without(kwargs, code(exc, "undeclare")))
    assert isinstance(p.make(), Plain)
    return exc


def t_sync_member(env: Env) -> BaseException:
    exc = caught(lambda: _proxy_with(env, Counter).bump())
    assert _proxy_with(env, Counter, **declared(code(exc, "declare"))).bump() == 1
    return exc


def t_sync_member_set(env: Env) -> BaseException:
    """A subclass of a proxy class that sets attributes the way objects do (an
    adapter's layer) reaches the refused member's ``__set__``."""
    p = _proxy_with(env, Counter)
    return caught(lambda: object.__setattr__(p, "bump", None))


def t_class_data(env: Env) -> BaseException:
    exc = caught(lambda: _proxy_with(env, Response).status)
    assert _proxy_with(env, Response, **declared(code(exc, "declare"))).status == 200
    return exc


def t_special_method(env: Env) -> BaseException:
    class Sized(Plain):
        def __len__(self) -> int:
            return 2

    exc = caught(lambda: len(_proxy_with(env, Sized)))
    assert len(_proxy_with(env, Sized, **declared(code(exc, "declare")))) == 2
    return exc


@lb.loop_affine
class Node:
    """One of two, on loops A and B, calling each other."""

    def __init__(self) -> None:
        self.peer: Any = None
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.submitted = threading.Event()

    async def ask_peer(self) -> str:
        return await self.peer.answer()  # type: ignore[no-any-return]

    async def answer(self) -> str:
        return "answer"

    async def wait_at_gate(self) -> str:
        self.entered.set()
        await asyncio.to_thread(self.gate.wait, 30)
        return "through"

    async def ask_while_streaming(self) -> AsyncIterator[str]:
        yield "first"
        await asyncio.to_thread(self.gate.wait, 30)  # its consumer is between waits
        asked = asyncio.ensure_future(self.peer.answer())
        await asyncio.sleep(0)  # the task runs its first step: the call is submitted
        self.submitted.set()
        yield await asked


@contextlib.contextmanager
def _pair() -> Iterator[tuple[lb.LoopThread, lb.LoopThread, Node, Node]]:
    a, b = lb.LoopThread(name="loop-A").start(), lb.LoopThread(name="loop-B").start()
    try:
        na, nb = a.run(_make_node), b.run(_make_node)
        na.peer, nb.peer = lb.proxy(nb), lb.proxy(na)
        yield a, b, na, nb
    finally:
        a.stop()
        b.stop()


async def _make_node() -> Node:
    return Node()


def _awaited_on(t: lb.LoopThread, code_: str, p: Any) -> Any:
    async def advised() -> Any:
        return await run(code_, p=p)

    return t.run(advised)


def t_cycle_block(env: Env) -> BaseException:
    with _pair() as (a, b, na, nb):
        held = asyncio.run_coroutine_threadsafe(_blocks_on(nb), a.loop)

        async def b_blocks_on_a() -> BaseException:
            await until_set(nb.entered)  # A's thread is blocked now
            return caught(lambda: lb.blocking(lb.proxy(na)).answer())

        exc = b.run(b_blocks_on_a)
        loop_code = code(exc, "loop")
        nb.gate.set()
        assert held.result(30) == "through"
        assert _awaited_on(b, loop_code, lb.proxy(na)) == "answer"
        assert run(code(exc, "thread"), p=lb.proxy(na)) == "answer"
    return exc


async def _blocks_on(nb: Node) -> Any:
    return lb.blocking(lb.proxy(nb)).wait_at_gate()


def t_cycle_submission(env: Env) -> BaseException:
    with _pair() as (_, b, na, _):
        exc = on_owner(b, lambda: lb.blocking(lb.proxy(na)).ask_peer())
        assert _awaited_on(b, code(exc, "loop"), lb.proxy(na)) == "answer"
        assert run(code(exc, "thread"), p=lb.proxy(na)) == "answer"
    return exc


def t_cycle_queued(env: Env) -> BaseException:
    with _pair() as (_, b, na, _):

        def iterate() -> None:
            items = iter(lb.blocking(lb.proxy(na)).ask_while_streaming())
            assert next(items) == "first"
            na.gate.set()
            assert na.submitted.wait(30)
            next(items)

        exc = on_owner(b, iterate)
        assert "ask_while_streaming" in str(exc)
        na.submitted.clear()
        assert list(run(code(exc, "thread"), p=lb.proxy(na))) == ["first", "answer"]
    return exc


def t_no_owner(env: Env) -> BaseException:
    engine = Engine()  # no loop runs here
    exc = caught(lambda: lb.blocking(lb.proxy(engine)).echo(1))
    run(code(exc, "run"), obj=engine, loop=env.owner.loop)
    assert lb.blocking(lb.proxy(engine)).echo(1) == 1
    return exc


def t_instance_attribute(env: Env) -> BaseException:
    exc = caught(lambda: _proxy_with(env, Counter).log)
    assert _proxy_with(env, Counter, **declared(code(exc, "declare"))).log == []
    return exc


def t_setattr(env: Env) -> BaseException:
    engine = built(env.owner, Engine)
    p = lb.proxy(engine)
    exc = caught(lambda: setattr(p, "log", ["x"]))

    async def advised() -> None:
        run(code(exc, "owner"), engine=p, value=["x"])

    env.owner.run(advised)
    assert engine.log == ["x"]
    return exc


def t_proxy_not_affine(env: Env) -> BaseException:
    return _adopt_first(env, lb.proxy)


def t_stream_no_loop(env: Env) -> BaseException:
    p = lb.proxy(built(env.owner, Engine))
    stream: Any = p.count(2)
    exc = caught(lambda: stream.__anext__().send(None))
    assert list(run(code(exc, "thread"), "2", p=p)) == [0, 1]
    return exc


def t_blocking_stream_on_owner(env: Env) -> BaseException:
    p = lb.proxy(built(env.owner, Engine))
    exc = on_owner(env.owner, lambda: list(lb.blocking(p).count(2)))

    async def advised() -> list[int]:
        return [i async for i in run(code(exc, "owner"), "2", p=p)]

    assert env.owner.run(advised) == [0, 1]
    return exc


def _uncovered(env: Env, use: Callable[[Any], object]) -> BaseException:
    p = _proxy_with(env, Futures)
    fut = lb.blocking(p).bare_future()
    exc = caught(lambda: use(fut))
    fixed = _proxy_with(env, Futures, **declared(code(exc, "declare")))
    assert lb.is_proxy(lb.blocking(fixed).bare_future())
    return exc


def t_uncovered_get(env: Env) -> BaseException:
    return _uncovered(env, lambda fut: fut.done)


def t_uncovered_set(env: Env) -> BaseException:
    """As ``t_sync_member_set``: a layer setting attributes the way objects do."""
    return _uncovered(env, lambda fut: object.__setattr__(fut, "done", None))


def t_uncovered_special(env: Env) -> BaseException:
    return _uncovered(env, iter)


def t_uncovered_getattr(env: Env) -> BaseException:
    return _uncovered(env, lambda fut: fut.no_such_member)


def t_uncovered_setattr(env: Env) -> BaseException:
    return _uncovered(env, lambda fut: setattr(fut, "x", 1))


TRIGGERS: dict[str, Callable[[Env], BaseException]] = {
    "_affinity.py:_affinity_violation:refuse": t_affinity,
    "_calls.py:_route_on_await:_no_loop": t_no_loop,
    "_calls.py:call_from_thread:refuse": t_blocking_on_owner,
    "_declare.py:owner_loop:not_loop_affine": t_owner_loop_not_affine,
    "_declare.py:transfer:not_loop_affine": t_transfer_not_affine,
    "_declare.py:transfer:refuse": t_transfer_no_loop,
    "_declare.py:transfer:gone": t_transfer_closed,
    "_declare.py:adopt:refuse": t_adopt_twice,
    "_declare.py:_check_members:refuse": t_no_such_member,
    "_loop_thread.py:LoopThread.loop:refuse": t_not_started,
    "_loop_thread.py:LoopThread._reachable:gone": t_forked,
    "_loop_thread.py:LoopThread._reachable:gone#1": t_stopped,
    "_loop_thread.py:LoopThread._reachable:refuse": t_run_on_own_thread,
    "_loop_thread.py:LoopThread.stop:refuse": t_stop_on_own_thread,
    "_members.py:_dunder_kind:refuse": t_aiter_rule,
    "_members.py:_owned_kind:refuse": t_declared_and_returns,
    "_members.py:_owned_kind:refuse#1": t_classmethod_rule,
    "_members.py:Refused.__get__:refusal": t_sync_member,
    "_members.py:Refused.__set__:refusal": t_sync_member_set,
    "_members.py:ClassData.__get__:refusal": t_class_data,
    "_members.py:refused_member.refused:refusal": t_special_method,
    "_operation.py:check_block:_cycle": t_cycle_block,
    "_operation.py:check_queued:_cycle": t_cycle_queued,
    "_operation.py:check_submission:_cycle": t_cycle_submission,
    "_ownership.py:Ownership.port:refuse": t_no_owner,
    "_proxy.py:_instance_attr:_dynamic_refusal": t_instance_attribute,
    "_proxy.py:refuse_setattr:refuse": t_setattr,
    "_proxy.py:proxy:refuse": t_proxy_not_affine,
    "_streams.py:RemoteStream._begin:refuse": t_stream_no_loop,
    "_streams.py:BlockingStream._begin:refuse": t_blocking_stream_on_owner,
    "_uncovered.py:_Tripped.__get__:_tripped": t_uncovered_get,
    "_uncovered.py:_Tripped.__set__:_tripped": t_uncovered_set,
    "_uncovered.py:_tripped_special.tripped:_tripped": t_uncovered_special,
    "_uncovered.py:_tripped_getattr:_tripped": t_uncovered_getattr,
    "_uncovered.py:_tripped_setattr:_tripped": t_uncovered_setattr,
}
SITES = refusal_sites()


def test_every_refusal_site_has_a_trigger() -> None:
    assert len(SITES) > 20  # the walk found them
    missing = sorted(set(SITES) - set(TRIGGERS))
    stale = sorted(set(TRIGGERS) - set(SITES))
    assert not missing, f"refusal sites no test triggers (add them to TRIGGERS): {missing}"
    assert not stale, f"TRIGGERS rows for sites that are gone: {stale}"


def _raised_at(exc: BaseException, site: Site) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        where = tb.tb_frame.f_code.co_filename
        if where.endswith(f"loopbridge/{site.module}") and site.first <= tb.tb_lineno <= site.last:
            return True
        tb = tb.tb_next
    return False


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with lb.LoopThread(name="sites-owner") as t:
        yield Env(t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", sorted(TRIGGERS))
def test_each_refusal_is_raised_with_executable_advice(env: Env, key: str) -> None:
    site = SITES.get(key)
    if site is None:
        pytest.skip(f"{key} is no longer a site")
    exc = TRIGGERS[key](env)
    assert _raised_at(exc, site), f"{key}: raised elsewhere: {exc!r}"
    advice = getattr(exc, "advice", None)
    assert advice is not None, f"{key}: no advice: {exc}"
    assert str(exc) == advice.render()
    first = str(exc).split(". ", 1)[0]
    assert CODE.findall(first) == [f.code for f in advice.fixes], str(exc)
