"""vLLM's OpenAI-compatible server on its own thread, bound to a loop-safe client.

:func:`start_openai_server` is the one call: it wraps an ``AsyncLLM`` in
:func:`loopbridge_vllm.engine.engine_client_proxy` (unless it already is such a
proxy), starts a dedicated thread with a fresh event loop, builds vLLM's real
FastAPI app there (``build_app`` + ``init_app_state``), and serves it with a
uvicorn server that installs no signal handlers (signals belong to the main
thread). It returns once the server accepts connections, with the bound URL
(port 0 picks a free port).

Ordering guarantees:

* **Start** only after the engine answered a round trip
  (``get_supported_tasks``) and reports itself healthy.
* **Stop** (:meth:`OpenAIServer.stop` / :meth:`OpenAIServer.aclose`) first
  stops accepting connections and drains the server for at most ``grace``
  seconds (requests still running after that are cancelled, which aborts them
  in the engine), joins the thread with a bound, and only then shuts the engine
  down, if asked to. No request reaches an engine that is already gone.
* A watchdog stops the server when the engine dies (as vLLM's own launcher
  does), unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loopbridge import LoopAffinityError, owner_loop
from loopbridge_vllm._vllm_releases.moved_imports import make_arg_parser, openai_app_builders

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient

__all__ = [
    "OpenAIServer",
    "ServerStartError",
    "astart_openai_server",
    "serve_args",
    "start_openai_server",
]

_log = logging.getLogger("loopbridge_vllm.server")


class ServerStartError(RuntimeError):
    """The server thread failed before it accepted connections."""


class _Shutdownable(Protocol):
    def shutdown(self, timeout: float | None = None) -> None: ...


def _launchers() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``build_app`` and ``init_app_state`` (their homes differ across vLLM releases)."""
    return openai_app_builders()


def _make_parser() -> argparse.ArgumentParser:
    return make_arg_parser()


def serve_args(client: EngineClient, extra: Sequence[str] = ()) -> argparse.Namespace:
    """A complete ``vllm serve`` namespace for ``client``'s model.

    The serving layer reads dozens of these options; the model path and served
    names come from the engine's own config, ``extra`` adds ``vllm serve``
    command-line options (``["--enable-log-requests"]``, ...).
    """
    model_config = client.model_config
    argv = ["--model", str(model_config.model)]
    names = model_config.served_model_name
    if names:
        argv += ["--served-model-name", *([names] if isinstance(names, str) else names)]
    argv.append("--disable-uvicorn-access-log")
    return _make_parser().parse_args([*argv, *extra])


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # Listen at once: clients that connect before uvicorn runs wait in the
        # backlog instead of being refused.
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _server_class() -> type[Any]:
    import uvicorn

    class _ThreadServer(uvicorn.Server):
        # Signal handlers can only be installed on the main thread; whoever
        # owns the process decides what a signal means and calls stop().
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

    return _ThreadServer


class OpenAIServer:
    """A running server thread; see :func:`start_openai_server`."""

    def __init__(
        self,
        client: EngineClient,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        args: argparse.Namespace | None = None,
        grace: float = 5.0,
        log_level: str = "warning",
        engine: _Shutdownable | None = None,
        watchdog_interval: float = 1.0,
        name: str = "loopbridge-openai-server",
    ) -> None:
        self.client = client
        self.args = args if args is not None else serve_args(client)
        self.grace = grace
        self._engine = engine
        self._log_level = log_level
        self._watchdog_interval = watchdog_interval
        self._sock = _bind(host, port)
        bound = self._sock.getsockname()
        self.host: str = host
        self.port: int = int(bound[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_reason: str | None = None
        self._server: Any = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> OpenAIServer:
        """Start the thread; return once connections are served.

        Start-up needs the engine's owner loop (it asks the engine for its
        tasks), so on the owner loop's own thread use ``await astart()``.
        """
        if self._on_owner_thread():
            raise LoopAffinityError(
                "start() on the engine's owner loop would wait for that same loop: "
                "use `await server.astart()` (or astart_openai_server) there"
            )
        self._thread.start()
        ready = self._ready.wait(timeout)
        return self._started(ready, timeout)

    async def astart(self, timeout: float = 120.0) -> OpenAIServer:
        """:meth:`start` for async callers; the calling loop keeps running meanwhile."""
        self._thread.start()
        ready = await asyncio.to_thread(self._ready.wait, timeout)
        return self._started(ready, timeout)

    def _started(self, ready: bool, timeout: float) -> OpenAIServer:
        if not ready:
            self._abort_start()
            raise ServerStartError(f"server did not start within {timeout} s")
        if self._error is not None or not self.running:
            self._thread.join(self.grace + 5.0)
            self._sock.close()
            raise ServerStartError(f"server thread failed to start: {self._error}") from self._error
        return self

    def _on_owner_thread(self) -> bool:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return False
        try:
            owner = owner_loop(self.client)
        except LoopAffinityError:
            return False
        return running is owner

    @property
    def running(self) -> bool:
        """True while the server thread serves requests."""
        return (
            self._thread.is_alive()
            and self._server is not None
            and bool(self._server.started)
            and not self._server.should_exit
        )

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def stop(self, timeout: float | None = None, *, shutdown_engine: bool | None = None) -> None:
        """Stop the server (bounded), then the engine if this server owns it.

        ``timeout`` bounds the join (default ``grace + 5`` s); a server still
        running after it is force-closed, and :class:`TimeoutError` is raised
        if even that does not end the thread. Must not be called on the
        engine's owner loop thread when requests may be in flight (their
        completion needs that loop): use ``await aclose()`` there.
        ``shutdown_engine`` defaults to whether an engine was handed to
        :func:`start_openai_server` with ``shutdown_engine=True``.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("stop() called from the server's own thread")
        if self._thread.ident is None:  # never started
            self._signal_exit()
            self._sock.close()
            return
        if self._on_owner_thread() and self._thread.is_alive():
            raise LoopAffinityError(
                "stop() on the engine's owner loop would block the loop that running "
                "requests need to finish: use `await server.aclose()` there"
            )
        self._signal_exit()
        limit = self.grace + 5.0 if timeout is None else timeout
        self._thread.join(limit)
        if self._thread.is_alive():
            if self._server is not None:
                self._server.force_exit = True
            self._thread.join(5.0)
        self._sock.close()
        if self._thread.is_alive():
            raise TimeoutError(f"server thread {self._thread.name} did not stop")
        engine = self._engine if shutdown_engine is None or shutdown_engine else None
        if shutdown_engine and engine is None:
            raise ValueError("no engine to shut down was given to this server")
        self._engine = None
        if engine is not None:
            from loopbridge_vllm.engine import shutdown_engine as _shutdown

            _shutdown(engine)

    async def aclose(
        self, timeout: float | None = None, *, shutdown_engine: bool | None = None
    ) -> None:
        """:meth:`stop` for async callers (the owner loop stays free meanwhile)."""
        await asyncio.to_thread(self.stop, timeout, shutdown_engine=shutdown_engine)

    def __enter__(self) -> OpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server thread -------------------------------------------------------
    def _signal_exit(self) -> None:
        with self._lock:
            self._stopped = True
            if self._server is not None:
                self._server.should_exit = True

    def _abort_start(self) -> None:
        self._signal_exit()
        loop = self.loop
        if loop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: None)
        self._thread.join(self.grace + 5.0)
        self._sock.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported through start()/logs
            self._error = exc
            if self._ready.is_set():
                _log.exception("OpenAI server thread failed")
        finally:
            self._ready.set()
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def _main(self) -> None:
        import uvicorn

        client = self.client
        # The engine must answer before anything is served.
        supported = tuple(await client.get_supported_tasks())
        if client.errored:
            raise ServerStartError("engine is not healthy") from client.dead_error
        build_app, init_app_state = _launchers()
        app = build_app(self.args, supported, client.model_config)
        await init_app_state(client, app.state, self.args, supported)
        config = uvicorn.Config(
            app,
            log_level=self._log_level,
            access_log=False,
            timeout_graceful_shutdown=max(1, round(self.grace)),
            lifespan="on",
        )
        server = _server_class()(config)
        app.state.server = server
        with self._lock:
            if self._stopped:
                return
            self._server = server
        serving = asyncio.create_task(server.serve(sockets=[self._sock]))
        watchdog = asyncio.create_task(self._watchdog(server))
        try:
            while not server.started and not serving.done():
                await asyncio.sleep(0.005)
            self._ready.set()
            await serving
        finally:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

    async def _watchdog(self, server: Any) -> None:
        keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") not in ("", "0")
        while True:
            await asyncio.sleep(self._watchdog_interval)
            # Health members are answered without blocking this loop.
            if self.client.errored and not self.client.is_running and not keep_alive:
                self.exit_reason = "engine died"
                _log.error("engine died; stopping the OpenAI server at %s", self.url)
                server.should_exit = True
                return


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def start_openai_server(
    engine: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    serve_argv: Sequence[str] = (),
    args: argparse.Namespace | None = None,
    grace: float = 5.0,
    shutdown_engine: bool = False,
    log_level: str = "warning",
    start_timeout: float = 120.0,
    **proxy_options: Any,
) -> OpenAIServer:
    """Serve vLLM's OpenAI app for ``engine`` from a new thread; return when ready.

    ``engine`` is an ``AsyncLLM`` whose owner loop is known (it was created on
    a running loop, or declared with ``loopbridge.adopt``), or a client made by
    :func:`~loopbridge_vllm.engine.engine_client_proxy`. A raw ``AsyncLLM`` is
    wrapped (``proxy_options`` go to ``engine_client_proxy``); the server never
    touches the engine's asyncio state directly.

    ``serve_argv`` adds ``vllm serve`` options; ``args`` replaces the whole
    namespace. With ``shutdown_engine=True``, :meth:`OpenAIServer.stop` shuts
    the engine down after the server has stopped.
    """
    server = _prepare(
        engine, host, port, serve_argv, args, grace, shutdown_engine, log_level, proxy_options
    )
    return server.start(start_timeout)


async def astart_openai_server(
    engine: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    serve_argv: Sequence[str] = (),
    args: argparse.Namespace | None = None,
    grace: float = 5.0,
    shutdown_engine: bool = False,
    log_level: str = "warning",
    start_timeout: float = 120.0,
    **proxy_options: Any,
) -> OpenAIServer:
    """:func:`start_openai_server` for async code, including the engine's owner loop.

    A Ray async actor that owns the engine calls this from one of its async
    methods: the actor's loop keeps serving the engine while the server starts.
    """
    server = _prepare(
        engine, host, port, serve_argv, args, grace, shutdown_engine, log_level, proxy_options
    )
    return await server.astart(start_timeout)


def _prepare(
    engine: Any,
    host: str,
    port: int,
    serve_argv: Sequence[str],
    args: argparse.Namespace | None,
    grace: float,
    shutdown_engine: bool,
    log_level: str,
    proxy_options: dict[str, Any],
) -> OpenAIServer:
    from loopbridge_vllm.engine import engine_client_proxy, is_engine_client_proxy

    client = (
        engine if is_engine_client_proxy(engine) else engine_client_proxy(engine, **proxy_options)
    )
    owner = owner_loop(client)
    if owner is None:
        raise LoopAffinityError(
            "the engine has no owner loop yet: build it on a running loop, or record "
            "the loop with loopbridge_vllm.bind_owner_loop() before serving it"
        )
    if client.errored:
        raise ServerStartError("the engine is not healthy") from client.dead_error
    if owner.is_closed():
        raise ServerStartError("the engine's owner loop is closed")
    if args is None:
        args = serve_args(client, serve_argv)
    return OpenAIServer(
        client,
        host=host,
        port=port,
        args=args,
        grace=grace,
        log_level=log_level,
        engine=client if shutdown_engine else None,
    )
