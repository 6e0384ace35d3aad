"""An engine's HTTP server on its own thread: the lifecycle, whichever engine.

:class:`ThreadedServer` serves an ASGI app with uvicorn on a dedicated thread with a
fresh event loop (:class:`loopbridge.LoopThread`), on a socket bound before that
thread starts; or, with ``on_engine_loop``, on the engine's owner loop itself (the
stock servers' topology: no request crosses a thread; for an engine that has a loop
of its own, a :class:`loopbridge.LoopThread`). What differs between the two is its
:class:`~loopbridge_adapters.topology.Topology`'s, picked once when the server is
made. Each adapter's server subclasses it and adds only what is its engine's:
building the app and its uvicorn config (:meth:`ThreadedServer._build`), the engine's
health (:meth:`ThreadedServer._engine_exit`), what to do when the owner loop dies
(:meth:`ThreadedServer._owner_stopped`) and anything that lives as long as the
serving does (:meth:`ThreadedServer._serving`).

A server's life is one :class:`ServerState` (``NEW``, ``STARTING``, ``SERVING``,
``STOPPING``, ``STOPPED``), changed only by :meth:`ThreadedServer._advance`, which
takes one event (launch, built, started, exit, ended) and makes its change under the
server's lock; a start is refused by the state it finds (:data:`START_REFUSED`), and
:attr:`~ThreadedServer.running` is ``SERVING`` while uvicorn has not been told to exit.

Invariants:

* **Ordered start.** :meth:`~ThreadedServer.start` returns only once uvicorn accepts
  connections, and ``_build`` serves nothing before the engine's owner loop answered
  a round trip. A start that fails or times out stops the thread (bounded) and
  raises :class:`ServerStartError`; :meth:`~ThreadedServer.start` on the owner loop
  is refused (:class:`~loopbridge.LoopAffinityError` pointing to ``astart()``): it
  would wait for the loop it blocks. A server serves once: a second start, or one
  after a stop, is refused naming its state.
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
  start refused on the owner loop keeps it: ``astart()`` may follow; so does a start
  refused because the server already started.
* **On the owner loop** (``on_engine_loop=True``) the lifecycle is the same, with the
  owner's loop and thread for the server's: :attr:`~ThreadedServer.thread` is the
  owner's thread once serving, a stop waits for serving to end (not for a thread)
  and leaves the owner loop running, and the watchdog checks only the engine (it
  runs on the owner loop, so it cannot see that loop stop). A start needs that loop
  running (:class:`ServerStartError` otherwise; one it does not answer within the
  start timeout is a start that timed out); a stop after it closed only closes the
  socket.

Built on the core's public API only; imports no engine and no adapter; reaches the
owner loop through loopbridge's crossing (:mod:`loopbridge_adapters.on_loop`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import errno
import logging
import socket
import threading
from typing import Any, ClassVar, TypeVar

from loopbridge import LoopAffinityError

from .http import ExitReason, adopt_listener, bind, thread_server_class
from .switch_interval import (
    DEFAULT_SWITCH_INTERVAL_S,
    check_switch_interval,
    serving_switch_interval,
)
from .topology import OnEngineLoop, OwnThread, Topology

__all__ = [
    "OWNER_STOPPED_TICKS",
    "START_REFUSED",
    "ServerStartError",
    "ServerState",
    "ThreadedServer",
    "listen_failure",
]

# The owner loop must be seen stopped on this many watchdog checks in a row: a loop
# driven by repeated run_until_complete() calls is briefly not running.
OWNER_STOPPED_TICKS = 2

_S = TypeVar("_S", bound="ThreadedServer")


class ServerStartError(RuntimeError):
    """The server failed before it accepted connections (each adapter exports it)."""


class ServerState(enum.Enum):
    """Where a server is in its life (:meth:`ThreadedServer._advance` moves it)."""

    #: Made: the socket is bound (or adopted); nothing runs yet.
    NEW = "new"
    #: Launched: the app is being built (after the owner loop's answer) and uvicorn
    #: started; :meth:`ThreadedServer.start` waits.
    STARTING = "starting"
    #: uvicorn accepts connections.
    SERVING = "serving"
    #: Told to exit (a stop, the watchdog, a start that failed or timed out): uvicorn
    #: drains, or the build finishes and serves nothing.
    STOPPING = "stopping"
    #: Serving has ended, or never began (a stop before start); the server is done.
    STOPPED = "stopped"


class _Event(enum.Enum):
    """What happens to a server: the input of :meth:`ThreadedServer._advance`."""

    LAUNCH = "launch"  # start() or astart() begins
    BUILT = "built"  # the app and its uvicorn server are made, on the serving loop
    STARTED = "started"  # uvicorn accepts connections
    EXIT = "exit"  # a stop, the watchdog or a failed start tells the server to exit
    ENDED = "ended"  # serving has ended, whichever way (or a launch failed)


#: (event, the state it finds) -> the state it leaves; a pair not here changes nothing.
_NEXT: dict[tuple[_Event, ServerState], ServerState] = {
    (_Event.LAUNCH, ServerState.NEW): ServerState.STARTING,
    (_Event.STARTED, ServerState.STARTING): ServerState.SERVING,
    (_Event.EXIT, ServerState.NEW): ServerState.STOPPED,
    (_Event.EXIT, ServerState.STARTING): ServerState.STOPPING,
    (_Event.EXIT, ServerState.SERVING): ServerState.STOPPING,
    (_Event.ENDED, ServerState.STARTING): ServerState.STOPPED,
    (_Event.ENDED, ServerState.SERVING): ServerState.STOPPED,
    (_Event.ENDED, ServerState.STOPPING): ServerState.STOPPED,
}

#: Why a start is refused, by the state it finds (a NEW server starts).
START_REFUSED: dict[ServerState, str] = {
    ServerState.STARTING: "the server at {url} is already starting: wait for that start",
    ServerState.SERVING: "the server at {url} already serves: a server starts once",
    ServerState.STOPPING: "the server at {url} is stopping: a server starts once; make a new one",
    ServerState.STOPPED: "the server at {url} has stopped: a server starts once; make a new one",
}

#: The topology that each ``on_engine_loop`` picks.
_TOPOLOGY: dict[bool, type[OwnThread | OnEngineLoop]] = {False: OwnThread, True: OnEngineLoop}


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
        on_engine_loop: bool = False,
    ) -> None:
        self._switch_interval = check_switch_interval(switch_interval)
        # Where it serves; refuses what that place cannot honour before a socket exists.
        self._topology: Topology = _TOPOLOGY[on_engine_loop](name, use_uvloop)
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
        #: The loop it serves on, once launched: its own thread's, or the owner's.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_reason: ExitReason | None = None
        self._state = ServerState.NEW  # guarded by _lock; changed by _advance only
        self._lock = threading.Lock()
        self._server: Any = None  # uvicorn's, once built while STARTING
        self._serving_task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        # What waits can block on; _advance sets them as the state moves. Ready: start()
        # may return (SERVING, or STOPPED). Ended: STOPPED.
        self._ready = threading.Event()
        self._ended = threading.Event()

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
        server.on_started = self._on_started
        return server

    # -- the state --------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        """Where the server is in its life."""
        return self._state

    @property
    def on_engine_loop(self) -> bool:
        """Whether it serves on the engine's owner loop (else on a thread of its own)."""
        return self._topology.on_engine_loop

    def _advance(self, event: _Event, server: Any = None) -> ServerState:
        """Make ``event``'s change (every change of state is made here); return the
        state it found, from which the caller does the work the change implies."""
        with self._lock:
            found = self._state
            self._state = state = _NEXT.get((event, found), found)
            if event is _Event.BUILT and found is ServerState.STARTING:
                self._server = server  # it serves: an exit from now on tells uvicorn
            if event is _Event.EXIT and self._server is not None:
                self._server.should_exit = True
            if state is ServerState.SERVING or state is ServerState.STOPPED:
                self._ready.set()
            if state is ServerState.STOPPED:
                self._ended.set()
            return found

    def _on_started(self) -> None:
        self._advance(_Event.STARTED)

    def _signal_exit(self) -> None:
        self._advance(_Event.EXIT)

    # -- lifecycle --------------------------------------------------------------------
    def start(self: _S, timeout: float = 60.0) -> _S:
        """Start the thread; return once connections are served.

        Start-up needs the engine's owner loop, so on that loop use ``await astart()``.
        """
        if self._called_on_owner_loop():
            raise LoopAffinityError(self._start_on_owner)
        return self._started(self._launch(timeout), timeout)

    async def astart(self: _S, timeout: float = 60.0) -> _S:
        """:meth:`start` for async callers; the calling loop keeps running meanwhile."""
        return self._started(await asyncio.to_thread(self._launch, timeout), timeout)

    def _launch(self, timeout: float) -> bool:
        """Launch serving; whether it started within ``timeout``."""
        found = self._advance(_Event.LAUNCH)
        if found is not ServerState.NEW:
            raise self._start_error(START_REFUSED[found].format(url=self.url))
        try:
            self._claim()
            self.loop = self._topology.launch(self._running_owner, self._begin, timeout)
        except TimeoutError:  # the owner loop did not run the launch: nothing began
            self._never_served()
            raise self._start_error(f"server did not start within {timeout} s") from None
        except BaseException:
            self._never_served()
            raise
        return self._ready.wait(timeout)

    def _never_served(self) -> None:
        self._advance(_Event.ENDED)
        self._sock.close()

    def _begin(self) -> None:
        """On the serving loop: serving starts there, as a task of that loop."""
        self._serving_task = asyncio.get_running_loop().create_task(self._serve_until_exit())

    def _running_owner(self) -> asyncio.AbstractEventLoop:
        """The owner loop to serve on, or the start error naming why there is none."""
        owner = self._owner()
        if owner is None:
            why = "the engine's owner loop is not known (the engine is not loop-affine)"
        elif owner.is_closed():
            why = "the engine's owner loop is closed"
        elif not owner.is_running():
            why = "the engine's owner loop is not running"
        else:
            return owner
        raise self._start_error(
            f"cannot serve on the engine's owner loop: {why}; start the engine on a "
            "running loop of its own (loopbridge.LoopThread), or serve from a thread of "
            "its own (the default)"
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
        loop = self.loop
        if loop is None:  # never launched
            return True
        return self._topology.wait_ended(self._ended, loop, timeout)

    def _called_on_owner_loop(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        return running is self._owner()

    @property
    def running(self) -> bool:
        """True while the server serves requests."""
        server = self._server
        return (
            self._state is ServerState.SERVING
            and server is not None
            and not server.should_exit  # the app's own handlers may tell it to exit
            and self.thread.is_alive()
        )

    @property
    def thread(self) -> threading.Thread:
        """The server's thread (a thread that never runs, before :meth:`start`); on the
        owner loop, the owner's thread once serving has begun."""
        return self._topology.thread

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
        if self._state is not ServerState.STOPPED:  # once ended, any thread may stop
            if self._called_on_owner_loop():
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
            raise TimeoutError(f"server {self._topology.where} {self.thread.name} did not stop")
        return True

    def _wake_loop(self) -> None:
        loop = self.loop
        if loop is not None:
            # A wake-up of the loop this server runs on, not a call onto it: nothing
            # crosses, and a loop that closed meanwhile needs none.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_nothing)

    async def aclose(self, timeout: float | None = None) -> None:
        """:meth:`stop` for async callers (the owner loop stays free meanwhile)."""
        await asyncio.to_thread(self.stop, timeout)

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the serving loop -------------------------------------------------------------
    async def _serve_until_exit(self) -> None:
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
            self._advance(_Event.ENDED)
            self._topology.after_serving(asyncio.get_running_loop())

    async def _main(self) -> None:
        server = await self._build()
        if self._advance(_Event.BUILT, server) is not ServerState.STARTING:
            return  # told to exit while it was built: serve nothing
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
        owner = self._topology.watched(self._owner())
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
                self._exit_by_itself(ExitReason.OWNER_LOOP_STOPPED)
                self._owner_stopped(owner)
                return
            reason = self._engine_exit()
            if reason is not None:
                self._exit_by_itself(reason)
                return

    def _exit_by_itself(self, reason: ExitReason) -> None:
        self.exit_reason = reason
        # A shutdown that was asked for is no failure.
        level = logging.WARNING if reason is ExitReason.ENGINE_SHUT_DOWN else logging.ERROR
        self._logger.log(level, "%s; stopping the %s at %s", reason.value, self._kind, self.url)
        self._signal_exit()


def _nothing() -> None:
    return None
