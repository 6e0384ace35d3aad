"""The threaded server's lifecycle, engine aside (loopbridge_adapters.threaded).

A tiny ASGI app and an owner loop on a LoopThread stand in for an engine; both real
servers (vLLM's and SGLang's) run the same lifecycle in their own suites. It needs
uvicorn, which the recipes group installs in every core lane. The lifecycle tests
run twice: on a thread of the server's own, and on the owner loop (``on_engine_loop``).

Every wait is on an event the code under test sets, except the start timeout, which
is the thing under test.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from loopbridge import LoopAffinityError, LoopThread
from loopbridge_adapters.http import ExitReason, bind
from loopbridge_adapters.switch_interval import DEFAULT_SWITCH_INTERVAL_S
from loopbridge_adapters.threaded import ServerStartError, ServerState, ThreadedServer

pytest.importorskip("uvicorn", reason="the recipes group is not installed")
httpx = pytest.importorskip("httpx", reason="the test group is not installed")

BOUND_S = 30.0  # an upper bound only: every wait ends on an event well before it


class _StartError(RuntimeError):
    pass


class _App:
    """``/slow`` waits for ``release``; ``/forever`` never answers; the rest say ok."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.cancelled = threading.Event()
        self.abort_gate = threading.Event()
        self.abort_gate.set()
        self.order: list[str] = []
        self.threads: set[threading.Thread] = set()  # where requests ran

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.threads.add(threading.current_thread())
        if scope["path"] == "/forever":
            self.entered.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                # Cut short, a handler aborts its engine request: a round trip that
                # ends once ``abort_gate`` opens (always open unless a test shuts it).
                await asyncio.to_thread(self.abort_gate.wait, BOUND_S)
                self.order.append("aborted")
                raise
        if scope["path"] == "/slow":
            self.entered.set()
            await asyncio.to_thread(self.release.wait, BOUND_S)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        self.order.append("response sent")


class _Server(ThreadedServer):
    _start_error = _StartError
    _kind = "test server"

    def __init__(
        self,
        owner: LoopThread,
        app: _App,
        *,
        grace: float = BOUND_S,
        switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
        on_engine_loop: bool = False,
    ) -> None:
        self.owner_loop: asyncio.AbstractEventLoop | None = owner.loop
        self.app = app
        self.engine_dead: ExitReason | None = None
        self.owner_gate = threading.Event()
        self.owner_gate.set()
        self.exit_signalled = threading.Event()
        self.owner_stopped_seen: list[asyncio.AbstractEventLoop | None] = []
        super().__init__(
            bind("127.0.0.1", 0),
            grace=grace,
            watchdog_interval=0.01,
            name="test-threaded-server",
            use_uvloop=None if on_engine_loop else False,
            switch_interval=switch_interval,
            on_engine_loop=on_engine_loop,
        )
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _owner(self) -> asyncio.AbstractEventLoop | None:
        return self.owner_loop

    async def _build(self) -> Any:
        import uvicorn

        gate = self.owner_gate
        assert self.owner_loop is not None
        # The owner's round trip; the owner blocks in it until the gate opens.
        await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(_blocking_wait(gate), self.owner_loop)
        )
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=max(1, round(self.grace)),
        )
        return self._new_server(config)

    def _engine_exit(self) -> ExitReason | None:
        return self.engine_dead

    def _owner_stopped(self, owner: asyncio.AbstractEventLoop | None) -> None:
        self.owner_stopped_seen.append(owner)

    def _signal_exit(self) -> None:
        super()._signal_exit()
        self.exit_signalled.set()


async def _blocking_wait(gate: threading.Event) -> None:
    gate.wait(BOUND_S)  # blocks the owner loop, as a busy engine would


@pytest.fixture
def owner() -> Iterator[LoopThread]:
    thread = LoopThread(name="test-owner").start()
    yield thread
    thread.stop()


@pytest.fixture(params=[False, True], ids=["own-thread", "on-engine-loop"])
def on_engine_loop(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def _closed(sock: Any) -> bool:
    return bool(sock.fileno() == -1)


def test_stop_drains_a_request_in_flight_then_closes(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    app = _App()
    server = _Server(owner, app, on_engine_loop=on_engine_loop).start()
    assert server.running
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        reply = pool.submit(httpx.get, f"{server.url}/slow", timeout=BOUND_S)
        assert app.entered.wait(BOUND_S)

        def stop() -> None:
            server.stop()
            app.order.append("stopped")

        stopping = pool.submit(stop)
        assert server.exit_signalled.wait(BOUND_S)
        # Told to exit, the server refuses new connections but still drains.
        assert not stopping.done()
        app.release.set()
        assert reply.result(BOUND_S).text == "ok"
        stopping.result(BOUND_S)
    assert app.order == ["response sent", "stopped"]
    assert server.wait_stopped(0) and not server.running
    assert _closed(server._sock)
    assert server.exit_reason is None
    # Where it served: the owner's thread, whose loop goes on; or a thread of its own.
    assert (app.threads == {owner.thread}) is on_engine_loop
    assert owner.running and owner.loop.is_running()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/", timeout=BOUND_S)


def test_stop_cancels_what_outlives_the_grace(owner: LoopThread, on_engine_loop: bool) -> None:
    app = _App()
    server = _Server(owner, app, grace=0.1, on_engine_loop=on_engine_loop).start()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reply = pool.submit(httpx.get, f"{server.url}/forever", timeout=BOUND_S)
        assert app.entered.wait(BOUND_S)
        server.stop()
        assert app.cancelled.is_set()
        # Cancelled before it answered: uvicorn says 500 and closes.
        assert reply.result(BOUND_S).status_code == 500
    assert server.wait_stopped(0) and _closed(server._sock)


class _Marking(_Server):
    """Marks when uvicorn's serve() returns, and records ``released`` in the app's
    order where serving ends (``_release``, on the server's loop)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.serve_returned = threading.Event()

    def _new_server(self, config: Any) -> Any:
        server = super()._new_server(config)
        serve = server.serve

        async def serve_then_mark(*args: Any, **kwargs: Any) -> None:
            try:
                await serve(*args, **kwargs)
            finally:
                self.serve_returned.set()

        server.serve = serve_then_mark
        return server

    def _release(self) -> None:
        self.app.order.append("released")
        super()._release()


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_serving_ends_only_once_each_cancelled_handler_has_ended(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    """uvicorn cancels what outlives the grace and returns without waiting for it; the
    cancelled handler's abort must end before serving does (on the owner loop nothing
    else would wait for it), and so before a stop returns.

    The abort is held until serve() has returned and the server's loop has turned 20
    times: what serving does after serve() needs no I/O, so without the wait it would
    have ended by then, and ``released`` would come first."""
    app = _App()
    app.abort_gate.clear()
    server = _Marking(owner, app, grace=0.1, on_engine_loop=on_engine_loop).start()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        reply = pool.submit(httpx.get, f"{server.url}/forever", timeout=BOUND_S)
        assert app.entered.wait(BOUND_S)
        stopping = pool.submit(server.stop)
        assert app.cancelled.wait(BOUND_S) and server.serve_returned.wait(BOUND_S)
        assert server.loop is not None
        turns = asyncio.run_coroutine_threadsafe(_turns(20), server.loop)
        concurrent.futures.wait([turns], BOUND_S)  # or swept, with the loop it ran on
        app.abort_gate.set()
        stopping.result(BOUND_S)
        assert reply.result(BOUND_S).status_code == 500
    assert app.order == ["aborted", "released"]
    assert server.wait_stopped(0) and owner.loop.is_running()


def test_the_state_names_each_step_and_a_server_starts_once(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    """NEW, SERVING, STOPPED; a second start is refused by the state it finds, naming
    it, and leaves the serving server (and its socket) alone."""
    server = _Server(owner, _App(), on_engine_loop=on_engine_loop)
    assert server.state is ServerState.NEW and server.on_engine_loop is on_engine_loop
    server.start()
    assert server.state is ServerState.SERVING and server.running
    with pytest.raises(_StartError, match=r"already serves: a server starts once"):
        server.start()
    assert server.running and not _closed(server._sock)
    server.stop()
    assert server.state is ServerState.STOPPED and not server.running
    with pytest.raises(_StartError, match=r"has stopped: a server starts once; make a new one"):
        server.start()


def test_a_stop_before_start_leaves_a_server_that_cannot_start(owner: LoopThread) -> None:
    server = _Server(owner, _App())
    server.stop()
    assert server.state is ServerState.STOPPED and _closed(server._sock)
    with pytest.raises(_StartError, match="has stopped"):
        server.start()
    assert not server.thread.is_alive()


def test_stop_before_start_closes_the_socket(owner: LoopThread) -> None:
    server = _Server(owner, _App())
    assert not server.thread.is_alive() and not server.running
    assert server.thread.name == "test-threaded-server (not started)"
    server.stop()
    assert _closed(server._sock)
    server.stop()  # again: nothing left to do
    with _Server(owner, _App()) as unused:
        pass
    assert _closed(unused._sock)


def test_start_timeout_stops_the_thread_and_closes_the_socket(owner: LoopThread) -> None:
    server = _Server(owner, _App())
    server.owner_gate.clear()  # the owner does not answer (on the owner loop: is blocked)

    def answer_once_refused() -> None:
        # The owner answers only after the start gave up: nothing must be served.
        if server.exit_signalled.wait(BOUND_S):
            server.owner_gate.set()

    helper = threading.Thread(target=answer_once_refused)
    helper.start()
    with pytest.raises(_StartError, match=r"did not start within 0\.2 s"):
        server.start(timeout=0.2)
    helper.join(BOUND_S)
    assert not server.thread.is_alive()
    assert _closed(server._sock)
    assert server._server is None  # never served


def test_failed_start_reports_the_error_and_closes_the_socket(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    class Broken(_Server):
        async def _build(self) -> Any:
            raise ValueError("no app today")

    server = Broken(owner, _App(), on_engine_loop=on_engine_loop)
    with pytest.raises(_StartError, match="failed to start: no app today") as info:
        server.start()
    assert isinstance(info.value.__cause__, ValueError)
    assert server.wait_stopped(0) and _closed(server._sock)
    assert owner.loop.is_running()


def test_watchdog_stops_the_server_when_the_owner_loop_closes(owner: LoopThread) -> None:
    server = _Server(owner, _App()).start()
    closed_loop = owner.loop
    owner.stop()
    server.thread.join(BOUND_S)
    assert not server.thread.is_alive()
    assert server.exit_reason is ExitReason.OWNER_LOOP_STOPPED
    assert server.owner_stopped_seen == [closed_loop]
    server.stop()
    assert _closed(server._sock)


def test_watchdog_stops_the_server_when_the_engine_dies(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    server = _Server(owner, _App(), on_engine_loop=on_engine_loop).start()
    server.engine_dead = ExitReason.ENGINE_DIED
    assert server.wait_stopped(BOUND_S) and not server.running
    assert server.exit_reason is ExitReason.ENGINE_DIED
    assert server.owner_stopped_seen == []  # the owner is fine

    async def stop_on_owner() -> None:
        server.stop()  # serving has ended: nothing to wait for, even on this loop

    asyncio.run_coroutine_threadsafe(stop_on_owner(), owner.loop).result(BOUND_S)
    assert _closed(server._sock)


def test_start_and_stop_on_the_owner_loop_point_to_the_async_forms(
    owner: LoopThread, on_engine_loop: bool
) -> None:
    server = _Server(owner, _App(), on_engine_loop=on_engine_loop)

    async def on_owner() -> list[str]:
        seen = []
        with pytest.raises(LoopAffinityError, match=r"await server\.astart\(\)") as info:
            server.start()
        seen.append(str(info.value))
        # The refused start left the socket to the async one.
        await server.astart()
        assert server.running
        with pytest.raises(LoopAffinityError, match=r"await server\.aclose\(\)") as info:
            server.stop()
        seen.append(str(info.value))
        await server.aclose()
        return seen

    seen = asyncio.run_coroutine_threadsafe(on_owner(), owner.loop).result(BOUND_S)
    assert len(seen) == 2
    assert server.wait_stopped(0) and _closed(server._sock)


def test_stop_from_the_server_thread_is_refused(owner: LoopThread) -> None:
    """(On the owner loop, that thread's stop is the owner loop's: refused above.)"""
    server = _Server(owner, _App()).start()
    assert server.loop is not None

    async def stop_here() -> None:
        server.stop()

    with pytest.raises(RuntimeError, match="from the server's own thread"):
        asyncio.run_coroutine_threadsafe(stop_here(), server.loop).result(BOUND_S)
    server.stop()
    assert not server.thread.is_alive()


def test_start_failures_raise_the_shared_start_error_by_default(owner: LoopThread) -> None:
    class Plain(_Server):
        _start_error = ServerStartError  # what every adapter's server leaves in place

        async def _build(self) -> Any:
            raise ValueError("no app today")

    with pytest.raises(ServerStartError, match="failed to start: no app today"):
        Plain(owner, _App()).start()
    assert ThreadedServer._start_error is ServerStartError


def test_the_switch_interval_holds_while_serving_and_comes_back(owner: LoopThread) -> None:
    """1 ms while the server serves (the default), the interpreter's after a stop, also
    after the watchdog ended the serving; ``None`` leaves it alone throughout."""
    before = sys.getswitchinterval()
    assert before != DEFAULT_SWITCH_INTERVAL_S
    server = _Server(owner, _App()).start()
    assert sys.getswitchinterval() == DEFAULT_SWITCH_INTERVAL_S
    server.stop()
    assert sys.getswitchinterval() == before
    with _Server(owner, _App(), switch_interval=None):
        assert sys.getswitchinterval() == before
    dying = _Server(owner, _App()).start()
    assert sys.getswitchinterval() == DEFAULT_SWITCH_INTERVAL_S
    dying.engine_dead = ExitReason.ENGINE_DIED  # the watchdog ends the serving by itself
    dying.thread.join(BOUND_S)
    assert not dying.thread.is_alive() and sys.getswitchinterval() == before
    dying.stop()


def test_a_bad_switch_interval_is_refused_before_anything_starts(owner: LoopThread) -> None:
    with pytest.raises(ValueError, match="switch_interval must be a positive number"):
        _Server(owner, _App(), switch_interval=0.0)


# -- on the owner loop ----------------------------------------------------------------
def test_on_the_owner_loop_a_start_needs_that_loop_running(owner: LoopThread) -> None:
    """No owner loop, a stopped one, a closed one: refused before serving, naming the
    fix, with the socket closed."""
    unknown = _Server(owner, _App(), on_engine_loop=True)
    unknown.owner_loop = None
    with pytest.raises(
        _StartError, match=r"owner loop is not known.*loopbridge\.LoopThread"
    ) as info:
        unknown.start()
    assert "from a thread of its own (the default)" in str(info.value)
    assert _closed(unknown._sock) and not unknown.running
    stopped = _Server(owner, _App(), on_engine_loop=True)
    stopped.owner_loop = asyncio.new_event_loop()  # never run
    try:
        with pytest.raises(_StartError, match="owner loop is not running"):
            stopped.start()
        stopped.owner_loop.close()
        closed = _Server(owner, _App(), on_engine_loop=True)
        closed.owner_loop = stopped.owner_loop
        with pytest.raises(_StartError, match="owner loop is closed"):
            closed.start()
    finally:
        stopped.owner_loop.close()
    assert _closed(stopped._sock) and _closed(closed._sock)
    stopped.stop()  # nothing was served: only the (closed) socket


def test_on_the_owner_loop_a_blocked_owner_is_a_start_that_timed_out(owner: LoopThread) -> None:
    """The owner loop never runs the launch: the start error says so, the socket is
    closed, and nothing serves once the owner runs again."""
    hold, held = threading.Event(), threading.Event()

    def block() -> None:
        held.set()
        hold.wait(BOUND_S)

    owner.loop.call_soon_threadsafe(block)
    assert held.wait(BOUND_S)
    server = _Server(owner, _App(), on_engine_loop=True)
    try:
        with pytest.raises(_StartError, match=r"did not start within 0\.2 s"):
            server.start(timeout=0.2)
    finally:
        hold.set()
    assert _closed(server._sock) and server.state is ServerState.STOPPED
    assert owner.run(asyncio.sleep, 0) is None  # the owner runs again ...
    assert server._serving_task is None and server.wait_stopped(0)  # ... and serves nothing


def test_on_the_owner_loop_serving_ends_with_that_loop(owner: LoopThread) -> None:
    """The owner loop stops and closes while serving (its clean-up sweep cancels the
    server): serving has ended, and a stop afterwards only closes the socket."""
    app = _App()
    server = _Server(owner, app, on_engine_loop=True).start()
    assert httpx.get(f"{server.url}/", timeout=BOUND_S).text == "ok"
    assert server.thread is owner.thread and app.threads == {owner.thread}
    owner.stop()
    assert server.wait_stopped(BOUND_S) and not server.running
    assert server.owner_stopped_seen == []  # the watchdog ran there: it could not see it
    server.stop()
    assert _closed(server._sock)


def test_on_the_owner_loop_a_choice_of_loop_is_refused(owner: LoopThread) -> None:
    """``use_uvloop`` picks the server thread's loop: with none, it cannot be honoured."""
    for choice in (True, False):
        with pytest.raises(ValueError, match="leave use_uvloop out"):
            ThreadedServer.__init__(
                object.__new__(_Server),
                host="127.0.0.1",
                grace=1.0,
                watchdog_interval=1.0,
                name="refused",
                use_uvloop=choice,
                on_engine_loop=True,
            )
