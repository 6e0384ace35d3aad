"""Forked workers (gunicorn ``--preload``, Celery prefork, uWSGI, multiprocessing's
fork): a ``LoopThread`` and proxies made before ``os.fork()`` belong to the parent.

In the child the loop's thread does not exist, yet the copied loop still says it
is running.  Every call, await and stream towards such a loop must fail at once
with ``OwnerLoopClosed`` naming fork and the fix, nothing inherited may keep
waiting, and a ``LoopThread`` made in the child works.

The child reports through a pipe and leaves with ``os._exit``; the parent waits
on the pipe with a deadline and kills a child that hangs, so a regression fails
the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import loopbridge as lb
from loopbridge._ports import PORT_ATTR, port_for_loop

from .conftest import Engine, make_engine

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

#: How long the child may take for everything it checks (each check is instant).
CHILD_DEADLINE_S = 10.0
#: How long one check in the child may take to fail (it must fail at once).
AT_ONCE_S = 1.0


def _timed(check: Callable[[], Any]) -> dict[str, Any]:
    """Run ``check``; what it raised (type, message) and how long it took."""
    t0 = time.perf_counter()
    try:
        value = check()
    except BaseException as exc:  # reported to the parent, which asserts
        return {"raised": type(exc).__name__, "message": str(exc), "s": time.perf_counter() - t0}
    return {"raised": None, "value": repr(value), "s": time.perf_counter() - t0}


def _in_child(owner: lb.LoopThread, p: Any) -> dict[str, Any]:
    """Everything the child checks, each reported rather than asserted here."""
    port = getattr(owner.loop, PORT_ATTR)
    out = {
        "inflight_left": len(port.inflight),
        "port_dead": type(port.dead).__name__,
        "blocking_call": _timed(lambda: lb.blocking(p).echo(1)),  # no timeout
        "await_from_new_loop": _timed(lambda: asyncio.run(p.echo(2))),
        "blocking_stream": _timed(lambda: list(lb.blocking(p).count(3))),
        "async_stream": _timed(lambda: asyncio.run(_consume(p.count(3)))),
        "owner_run": _timed(lambda: owner.run(make_engine)),
    }
    with lb.LoopThread(name="child-owner") as fresh:
        engine = fresh.run(make_engine)
        q = lb.proxy(engine)
        out["new_loop_thread"] = _timed(
            lambda: (lb.blocking(q).echo(5), list(lb.blocking(q).count(3)), asyncio.run(q.echo(6)))
        )
    return out


async def _consume(stream: Any) -> list[Any]:
    return [item async for item in stream]


def _fork_and_report(child: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Fork; the child runs ``child`` and writes its JSON report to a pipe.

    The parent reads it within ``CHILD_DEADLINE_S`` or kills the child.
    """
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # 3.12+: "This process is multi-threaded, use of fork() may lead to
        # deadlocks in the child": the very situation under test.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: never returns into pytest
        code = 0
        try:
            os.close(read_fd)
            report = json.dumps(child()).encode()
        except BaseException:
            report = json.dumps({"child_error": traceback.format_exc()}).encode()
            code = 1
        try:
            os.write(write_fd, report)
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data = b""
        deadline = time.monotonic() + CHILD_DEADLINE_S
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the forked child hung: no report within {CHILD_DEADLINE_S} s")
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(data)
    assert "child_error" not in report, report.get("child_error")
    return report


def _assert_fails_at_once_naming_fork(result: dict[str, Any], what: str) -> None:
    assert result["raised"] == "OwnerLoopClosed", (what, result)
    assert result["s"] < AT_ONCE_S, (what, result)
    message = result["message"]
    assert "did not survive fork()" in message, (what, message)
    for fix in ("post_fork", "worker_process_init", "@postfork"):
        assert fix in message, (what, fix, message)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_forked_child_fails_at_once_with_calls_and_streams_in_flight(kind: str) -> None:
    owner = lb.LoopThread(name="engine-owner", use_uvloop=kind == "uvloop").start()
    other = lb.LoopThread(name="caller-loop").start()
    engine: Engine = owner.run(make_engine)
    p = lb.proxy(engine)
    outcomes: dict[str, BaseException | None] = {}

    def blocking_call() -> None:
        try:
            lb.blocking(p).sleep(60)
        except BaseException as exc:
            outcomes["call"] = exc

    def blocking_stream() -> None:
        try:
            for _ in lb.blocking(p).count(10**9, delay=60):
                pass
        except BaseException as exc:
            outcomes["stream"] = exc

    async def awaited() -> None:
        await p.sleep(60)

    threads = [threading.Thread(target=blocking_call), threading.Thread(target=blocking_stream)]
    for t in threads:
        t.start()
    assert engine.started["sleep"].wait(30) and engine.started["count"].wait(30)
    from_loop = asyncio.run_coroutine_threadsafe(awaited(), other.loop)
    try:
        report = _fork_and_report(lambda: _in_child(owner, p))
    finally:
        owner.stop()
        other.stop()
        for t in threads:
            t.join(30)
    # The parent is untouched by the child's hook: its calls ended with its owner.
    assert isinstance(outcomes["call"], lb.OwnerLoopClosed)
    assert isinstance(outcomes["stream"], lb.OwnerLoopClosed)
    assert "fork" not in str(outcomes["call"])
    assert from_loop.done()

    assert report["port_dead"] == "OwnerLoopClosed"
    assert report["inflight_left"] == 0  # nothing inherited is left waiting
    for what in ("blocking_call", "await_from_new_loop", "blocking_stream", "async_stream"):
        _assert_fails_at_once_naming_fork(report[what], what)
    _assert_fails_at_once_naming_fork(report["owner_run"], "owner_run")
    assert "'engine-owner'" in report["blocking_call"]["message"]  # the LoopThread's name
    assert report["new_loop_thread"]["raised"] is None, report["new_loop_thread"]
    assert report["new_loop_thread"]["value"] == repr((5, [0, 1, 2], 6))


@pytest.mark.timeout(60)
def test_fork_from_a_loop_keeps_that_loop() -> None:
    """A child forked from inside a running loop keeps that loop (its thread is the
    one that survives): calls from the child to an object it owns still work."""

    async def main() -> dict[str, Any]:
        engine = Engine("here")
        p = lb.proxy(engine)

        port = port_for_loop(asyncio.get_running_loop())

        def child() -> dict[str, Any]:
            # Still inside the forking coroutine, on the surviving thread: the
            # port of its loop must not have been failed.
            return {"dead": port.dead is not None}

        assert await p.echo(1) == 1
        return _fork_and_report(child)

    assert asyncio.run(main()) == {"dead": False}


def test_fork_message_names_the_fix() -> None:
    """The message's first sentence names the loop, fork and each server's hook."""
    from loopbridge._ports import fork_message

    message = fork_message("asyncio loop 0x1", "engine-owner")
    first = message.split(". ")[0]
    assert first.startswith("asyncio loop 0x1 (thread 'engine-owner') did not survive fork()")
    for fix in ("LoopThread", "post_fork", "worker_process_init", "@postfork", "multiprocessing"):
        assert fix in first


if sys.platform == "win32":  # pragma: no cover
    pytest.skip("fork is POSIX only", allow_module_level=True)
