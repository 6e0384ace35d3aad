"""An engine's HTTP server on its own thread: the lifecycle, whichever engine.

:class:`ThreadedServer` serves an ASGI app with uvicorn on a dedicated thread with a
fresh event loop (:class:`loopbridge.LoopThread`), on a socket bound before that
thread starts; or, with ``on_owner_loop``, on the engine's owner loop itself (the
stock servers' topology: no request crosses a thread; for an engine that has a loop
of its own, :class:`loopbridge_adapters.engine_loop.EngineLoop`). Each adapter's
server subclasses it and adds only what is its engine's: building the app and its
uvicorn config (:meth:`ThreadedServer._build`), the engine's health
(:meth:`ThreadedServer._engine_exit`), what to do when the owner loop dies
(:meth:`ThreadedServer._owner_stopped`) and anything that lives as long as the
serving does (:meth:`ThreadedServer._serving`).

Invariants:

* **Ordered start.** :meth:`~ThreadedServer.start` returns only once uvicorn accepts
  connections, and ``_build`` serves nothing before the engine's owner loop answered
  a round trip. A start that fails or times out stops the thread (bounded) and
  raises :class:`ServerStartError`; :meth:`~ThreadedServer.start` on the owner loop
  is refused (:class:`~loopbridge.LoopAffinityError` pointing to ``astart()``): it
  would wait for the loop it blocks.
* **Bounded, ordered stop.** :meth:`~ThreadedServer.stop` stops accepting, lets
  requests drain for at most ``grace`` seconds (uvicorn then cancels them, and serving
  ends only once each cancelled handler has ended: its engine request aborted), joins
  the thread within ``timeout`` (default ``grace + 5``), force-exits uvicorn if it is
  still running, joins once more, and raises :class:`TimeoutError` if the thread
  survives even that. A stop before start only closes the socket. Stopping on the
  owner loop while the thread runs is refused (``LoopAffinityError`` pointing to
  ``aclose()``): requests in flight need that loop to finish.
* **Watchdog.** While serving, a task on the server's loop stops the server by
  itself, setting :attr:`~ThreadedServer.exit_reason`, when the owner loop closes or
  is seen stopped on :data:`OWNER_STOPPED_TICKS` checks in a row, or when the
  engine's health hook reports it dead. It reads only what needs no owner loop: a
  blocked owner must not hide a dead engine, and a dead owner must be seen without
  its help. The owner is checked first: its death also ends the engine's tasks, and
  the cause, not the symptom, is the exit reason.
* **One address.** The server listens on the socket it is given (adopted: made
  non-blocking, TCP_NODELAY) or binds ``host:port`` itself (:meth:`_listen`; port 0:
  a free one; an address it cannot bind, a busy port say, raises the start error
  naming the address and the fix); :attr:`host`, :attr:`port` and :attr:`url` are the
  bound address (``unix:PATH`` with port 0 for a Unix socket, as vLLM's launcher
  announces it; the scheme is :meth:`_scheme`'s).
* **Cut requests are one line each.** A request still running when the grace runs
  out is cancelled; uvicorn would log each as ``Exception in ASGI application`` with
  a traceback at ERROR. While a server serves, those records (a cancellation, and
  nothing else) become one WARNING line each naming the stop, and uvicorn's count
  of them a WARNING.
* **The switch interval** (``switch_interval``, default 1 ms; None: the
  interpreter's, untouched) holds while the server serves, and comes back when it
  stops: :mod:`loopbridge_adapters.switch_interval`.
* **The socket is closed on every path** that ends the server: a stop (before start
  too), a failed or timed-out start, a start the adapter refuses (:meth:`_claim`). A
  start refused on the owner loop keeps it: ``astart()`` may follow.
* **On the owner loop** (``on_owner_loop=True``) the lifecycle is the same, with the
  owner's loop and thread for the server's: :attr:`~ThreadedServer.thread` is the
  owner's thread once serving, a stop waits for serving to end (not for a thread)
  and leaves the owner loop running, and the watchdog checks only the engine (it
  runs on the owner loop, so it cannot see that loop stop). A start needs that loop
  running (:class:`ServerStartError` otherwise); a stop after it closed only closes
  the socket.

Built on the core's public API only; imports no engine and no adapter.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import errno
import logging
import socket
import threading
from typing import Any, ClassVar, TypeVar

from loopbridge import LoopAffinityError, LoopThread

from .http import ExitReason, adopt_listener, bind, loop_factory, thread_server_class
from .switch_interval import (
    DEFAULT_SWITCH_INTERVAL_S,
    check_switch_interval,
    serving_switch_interval,
)

__all__ = ["OWNER_STOPPED_TICKS", "ServerStartError", "ThreadedServer", "listen_failure"]

# The owner loop must be seen stopped on this many watchdog checks in a row: a loop
# driven by repeated run_until_complete() calls is briefly not running.
OWNER_STOPPED_TICKS = 2

_S = TypeVar("_S", bound="ThreadedServer")


class ServerStartError(RuntimeError):
    """The server failed before it accepted connections (each adapter exports it)."""


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """What a server started by a library call says when ``host:port`` cannot be bound."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: port {port} is already in use; stop the process "
            "that listens on it, or pass another port= (port=0 picks a free one)"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}; check host= and port="


async def _handlers_ended(server: Any) -> None:
    """Wait for the request handlers that uvicorn cancelled when the grace ran out.

    uvicorn cancels them and returns without waiting; their cancellation aborts their
    engine requests. On its own thread the loop's clean-up sweep would wait for them;
    on the owner loop nothing would, and a stop must not return before every request
    it cut short has been aborted.
    """
    pending = [task for task in server.server_state.tasks if not task.done()]
    if pending:
        await asyncio.wait(pending)


class _CutRequests(logging.Filter):
    """uvicorn's report of a request its stop cancelled, as one WARNING line.

    uvicorn logs every request handler that ends with an exception as ``Exception
    in ASGI application`` with the traceback, at ERROR, and the count of those it
    cancels at ERROR too; a cancellation there is the stop's own doing (the grace
    ran out), not a failure of the app.
    """

    def __init__(self) -> None:
        super().__init__()
        self.users = 0  # servers serving; guarded by _cut_lock

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if str(record.msg).startswith("Cancel %s running task(s), timeout graceful"):
            # uvicorn's count of what the grace cut: the stop's doing, not a failure.
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        elif isinstance(exc, asyncio.CancelledError) and str(record.msg).startswith(
            "Exception in ASGI application"
        ):
            record.msg = (
                "a request still running when the server stopped was cut short (the "
                "grace ran out); its client got no final response"
            )
            record.args = ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_cut = _CutRequests()
_cut_lock = threading.Lock()
_UVICORN_LOGGER = "uvicorn.error"


@contextlib.contextmanager
def _cut_requests_in_one_line() -> Any:
    with _cut_lock:
        if _cut.users == 0:
            logging.getLogger(_UVICORN_LOGGER).addFilter(_cut)
        _cut.users += 1
    try:
        yield
    finally:
        with _cut_lock:
            _cut.users -= 1
            if _cut.users == 0:
                logging.getLogger(_UVICORN_LOGGER).removeFilter(_cut)


class ThreadedServer(abc.ABC):
    """The thread, loop, uvicorn server and watchdog of one engine server.

    Subclasses set the class attributes (their logger, start error and the
    messages that name their engine) and implement :meth:`_owner`, :meth:`_build`
    and :meth:`_engine_exit`.
    """

    #: What start-up failures raise.
    _start_error: ClassVar[type[Exception]] = ServerStartError
    #: The adapter's logger and what its log lines call the server.
    _logger: ClassVar[logging.Logger] = logging.getLogger(__name__)
    _kind: ClassVar[str] = "server"
    #: The refusals on the owner loop, naming the engine and the async variant.
    _start_on_owner: ClassVar[str] = (
        "start() on the engine's owner loop would wait for that same loop: "
        "use `await server.astart()` there"
    )
    _stop_on_owner: ClassVar[str] = (
        "stop() on the engine's owner loop would block the loop that running "
        "requests need to finish: use `await server.aclose()` there"
    )

    #: The bound address: ``host`` as given (the socket's own when adopted), the actual
    #: port, and the URL clients use.
    host: str
    port: int
    url: str

    def __init__(
        self,
        sock: socket.socket | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        grace: float,
        watchdog_interval: float,
        name: str,
        use_uvloop: bool | None = None,
        switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
        on_owner_loop: bool = False,
    ) -> None:
        if on_owner_loop and use_uvloop is not None:
            raise ValueError(
                f"use_uvloop={use_uvloop!r} picks the loop of the server's own thread; a "
                "server on the engine's loop runs on that loop, whichever kind it is: leave "
                "use_uvloop out"
            )
        self._switch_interval = check_switch_interval(switch_interval)
        #: Serve on the engine's owner loop instead of a thread of its own.
        self.on_owner_loop = on_owner_loop
        self._sock = self._bound(host, port) if sock is None else adopt_listener(sock)
        bound = self._sock.getsockname()
        if self._sock.family == socket.AF_UNIX:
            self.host, self.port, self.url = str(bound), 0, f"unix:{bound}"
        else:
            self.host = host if sock is None else str(bound[0])
            self.port = int(bound[1])
            shown = f"[{self.host}]" if ":" in self.host else self.host
            self.url = f"{self._scheme()}://{shown}:{self.port}"
        self.grace = grace
        self._watchdog_interval = watchdog_interval
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_reason: ExitReason | None = None
        self._server: Any = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        # Serving has ended (set on the serving loop, whichever it is).
        self._finished = threading.Event()
        self._serving_thread: threading.Thread | None = None  # on the owner loop
        self._stopped = False
        self._lock = threading.Lock()
        # The same loop thread as an owner loop's: start, clean-up sweep, close.
        self._loop_thread = LoopThread(name, loop_factory=loop_factory(use_uvloop is not False))
        # What `thread` is before start(): a thread that never runs.
        self._not_started = threading.Thread(name=f"{name} (not started)")

    def _bound(self, host: str, port: int) -> socket.socket:
        """:meth:`_listen`, its failure a :class:`ServerStartError` naming the address."""
        try:
            return self._listen(host, port)
        except OSError as exc:
            raise self._start_error(listen_failure(host, port, exc)) from exc

    # -- the engine's part ----------------------------------------------------------
    def _listen(self, host: str, port: int) -> socket.socket:
        """The listening socket on ``host:port`` when none is given."""
        return bind(host, port)

    def _scheme(self) -> str:
        """The URL scheme of a TCP listener (``https`` when the app serves TLS)."""
        return "http"

    @abc.abstractmethod
    def _owner(self) -> asyncio.AbstractEventLoop | None:
        """The engine's owner loop (``None``: not loop-affine, nothing to watch)."""

    @abc.abstractmethod
    async def _build(self) -> Any:
        """On the server's loop: wait for the owner loop's answer, then return the
        uvicorn server (made with :meth:`_new_server`) that serves the engine's app."""

    @abc.abstractmethod
    def _engine_exit(self) -> ExitReason | None:
        """Why the server must stop because of its engine, if it must; read without
        the owner loop."""

    def _owner_stopped(self, owner: asyncio.AbstractEventLoop | None) -> None:
        """After the watchdog saw the owner loop stop or close (server already told
        to exit); runs on the server's loop."""
        return None  # default: nothing

    def _serving(self, server: Any) -> contextlib.AbstractContextManager[None]:
        """What lives exactly as long as ``server`` serves (entered on its loop)."""
        return contextlib.nullcontext()

    def _claim(self) -> None:
        """Before the thread starts (may raise; the socket is closed then)."""
        return None  # default: nothing

    def _release(self) -> None:
        """On the server's loop, once serving has ended, whichever way."""
        return None  # default: nothing

    def _new_server(self, config: Any) -> Any:
        """uvicorn's server for ``config``, reporting readiness to :meth:`start`."""
        server = thread_server_class()(config)
        server.on_started = self._ready.set
        return server

    # -- lifecycle --------------------------------------------------------------------
    def start(self: _S, timeout: float = 60.0) -> _S:
        """Start the thread; return once connections are served.

        Start-up needs the engine's owner loop, so on that loop use ``await astart()``.
        """
        if self._on_owner_loop():
            raise LoopAffinityError(self._start_on_owner)
        return self._started(self._launch(timeout), timeout)

    async def astart(self: _S, timeout: float = 60.0) -> _S:
        """:meth:`start` for async callers; the calling loop keeps running meanwhile."""
        return self._started(await asyncio.to_thread(self._launch, timeout), timeout)

    def _launch(self, timeout: float) -> bool:
        try:
            self._claim()
        except BaseException:
            self._sock.close()
            raise
        if self.on_owner_loop:
            self.loop = self._running_owner()
        else:
            self._loop_thread.start()
            self.loop = self._loop_thread.loop
        asyncio.run_coroutine_threadsafe(self._serve_until_exit(), self.loop)
        return self._ready.wait(timeout)

    def _running_owner(self) -> asyncio.AbstractEventLoop:
        """The owner loop to serve on; the socket is closed if there is none."""
        owner = self._owner()
        if owner is None:
            why = "the engine's owner loop is not known (the engine is not loop-affine)"
        elif owner.is_closed():
            why = "the engine's owner loop is closed"
        elif not owner.is_running():
            why = "the engine's owner loop is not running"
        else:
            return owner
        self._sock.close()
        raise self._start_error(
            f"cannot serve on the engine's owner loop: {why}; start the engine on a "
            "running loop of its own (EngineLoop), or serve from a thread of its own "
            "(the default)"
        )

    def _started(self: _S, ready: bool, timeout: float) -> _S:
        if not ready:
            self._abort_start()
            raise self._start_error(f"server did not start within {timeout} s")
        if self._error is not None or not self.running:
            self.wait_stopped(self.grace + 5.0)
            self._sock.close()
            raise self._start_error(
                f"server thread failed to start: {self._error}"
            ) from self._error
        return self

    def _abort_start(self) -> None:
        self._signal_exit()
        if self.thread.is_alive():
            # Wake the loop: a start-up still waiting for the owner sees the flag
            # when it resumes, not only when that wait ends.
            self._wake_loop()
        self.wait_stopped(self.grace + 5.0)
        self._sock.close()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Wait until serving has ended, by a stop or by itself (the watchdog), and on a
        thread of its own until that thread has ended too; True if it has (also before
        a start)."""
        owner = self.loop
        if owner is None:  # never launched
            return True
        if self.on_owner_loop:
            # A closed owner loop dropped (or cancelled) the serving task: nothing to wait for.
            return self._finished.wait(timeout) or owner.is_closed()
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _on_owner_loop(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is self._owner()

    @property
    def running(self) -> bool:
        """True while the server thread serves requests."""
        return (
            not self._finished.is_set()
            and self.thread.is_alive()
            and self._server is not None
            and bool(self._server.started)
            and not self._server.should_exit
        )

    @property
    def thread(self) -> threading.Thread:
        """The server's thread (a thread that never runs, before :meth:`start`); on the
        owner loop, the owner's thread once serving has begun."""
        if self.on_owner_loop:
            return self._serving_thread or self._not_started
        return self._loop_thread.thread or self._not_started

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server: drain for ``grace`` s, then join the thread (bounded).

        ``timeout`` bounds the join (default ``grace + 5`` s); a server still running
        after it is force-closed, and :class:`TimeoutError` is raised if even that
        does not end the thread. On the engine's owner loop, use ``await aclose()``:
        draining requests need that loop.
        """
        self._stop_thread(timeout)

    def _stop_thread(self, timeout: float | None) -> bool:
        """:meth:`stop`'s work; False if the server never started."""
        if self.loop is None:  # never launched
            self._signal_exit()
            self._sock.close()
            return False
        if not self._finished.is_set():  # once serving has ended, any thread may stop
            if self._on_owner_loop():
                raise LoopAffinityError(self._stop_on_owner)
            if threading.current_thread() is self.thread:
                raise RuntimeError("stop() called from the server's own thread")
        self._signal_exit()
        finished = self.wait_stopped(self.grace + 5.0 if timeout is None else timeout)
        if not finished:
            if self._server is not None:
                self._server.force_exit = True
            self._wake_loop()
            finished = self.wait_stopped(5.0)
        self._sock.close()
        if not finished:
            where = "on the engine's owner loop" if self.on_owner_loop else "thread"
            raise TimeoutError(f"server {where} {self.thread.name} did not stop")
        return True

    def _wake_loop(self) -> None:
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(lambda: None)

    async def aclose(self, timeout: float | None = None) -> None:
        """:meth:`stop` for async callers (the owner loop stays free meanwhile)."""
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server thread ------------------------------------------------------------
    def _signal_exit(self) -> None:
        with self._lock:
            self._stopped = True
            if self._server is not None:
                self._server.should_exit = True

    async def _serve_until_exit(self) -> None:
        # Serving ends the loop thread: the loop stops, and LoopThread sweeps the
        # remaining tasks and closes it. The owner loop keeps running.
        self._serving_thread = threading.current_thread()
        try:
            await self._main()
        except asyncio.CancelledError as exc:  # the owner loop's clean-up sweep
            self._error = exc
            self._logger.warning("%s at %s cancelled with its loop", self._kind, self.url)
        except BaseException as exc:  # reported through start() or the log
            self._error = exc
            if self._ready.is_set():
                self._logger.exception("%s thread failed", self._kind)
        finally:
            self._release()
            self._finished.set()
            self._ready.set()
            if not self.on_owner_loop:
                asyncio.get_running_loop().stop()

    async def _main(self) -> None:
        server = await self._build()
        with self._lock:
            if self._stopped:
                return
            self._server = server
        interval = serving_switch_interval(self._switch_interval, self._logger, self._kind)
        with self._serving(server), interval, _cut_requests_in_one_line():
            serving = asyncio.create_task(server.serve(sockets=[self._sock]))
            watchdog = asyncio.create_task(self._watchdog(server))
            try:
                await serving
            finally:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
                await _handlers_ended(server)

    async def _watchdog(self, server: Any) -> None:
        # On the owner loop the watchdog cannot see that loop stop: it runs there.
        owner = None if self.on_owner_loop else self._owner()
        stopped_ticks = 0
        while True:
            await asyncio.sleep(self._watchdog_interval)
            # Owner first: see the module docstring.
            if owner is not None and owner.is_closed():
                stopped_ticks = OWNER_STOPPED_TICKS
            elif owner is not None and not owner.is_running():
                stopped_ticks += 1
            else:
                stopped_ticks = 0
            if stopped_ticks >= OWNER_STOPPED_TICKS:
                self._exit_by_itself(server, ExitReason.OWNER_LOOP_STOPPED)
                self._owner_stopped(owner)
                return
            reason = self._engine_exit()
            if reason is not None:
                self._exit_by_itself(server, reason)
                return

    def _exit_by_itself(self, server: Any, reason: ExitReason) -> None:
        self.exit_reason = reason
        # A shutdown that was asked for is no failure.
        level = logging.WARNING if reason is ExitReason.ENGINE_SHUT_DOWN else logging.ERROR
        self._logger.log(level, "%s; stopping the %s at %s", reason.value, self._kind, self.url)
        server.should_exit = True
