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
  does), unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` is set, and when the
  engine's owner loop stops or closes (then it also aborts every request still
  in the engine, on that loop, if it ever runs again). It reads only state that
  needs no owner loop, as ``/health`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loopbridge import LoopAffinityError, owner_loop, unwrap
from loopbridge_adapters.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from loopbridge_adapters.exporter import export_metrics
from loopbridge_adapters.http import ExitReason, bind_unix
from loopbridge_adapters.on_loop import arun_on
from loopbridge_adapters.switch_interval import DEFAULT_SWITCH_INTERVAL_S
from loopbridge_adapters.threaded import ServerStartError, ThreadedServer
from loopbridge_vllm._vllm_releases.moved_imports import make_arg_parser, openai_app_builders

from ._library_options import (
    Listen,
    ServeArgsMismatch,
    ServeOptionError,
    engine_contradictions,
    library_refusals,
    quiet,
    quiet_parse,
)
from ._paused_admission import PausePolicy, PauseWatch, gate_paused, pause_policy
from ._weight_version import WeightVersionTags

if TYPE_CHECKING:
    from fastapi import APIRouter
    from starlette.middleware import Middleware
    from vllm.engine.protocol import EngineClient

__all__ = [
    "ExitReason",
    "OpenAIServer",
    "ServeArgsMismatch",
    "ServeOptionError",
    "ServerStartError",
    "astart_openai_server",
    "check_serve_args",
    "serve_args",
    "start_openai_server",
]

_log = logging.getLogger("loopbridge_vllm.server")


class _Shutdownable(Protocol):
    def shutdown(self, timeout: float | None = None) -> None: ...


def _launchers() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``build_app`` and ``init_app_state`` (their homes differ across vLLM releases)."""
    return openai_app_builders()


def _make_parser() -> argparse.ArgumentParser:
    return make_arg_parser()


def _engine_settings(client: EngineClient) -> dict[str, Any]:
    """What ``init_app_state``/``build_app`` read from the namespace that the engine fixed.

    ``dest`` -> the engine's value, in the namespace's form.
    """
    config = client.vllm_config
    names = config.model_config.served_model_name
    structured = config.structured_outputs_config
    return {
        "model": str(config.model_config.model),
        "served_model_name": [names] if isinstance(names, str) else list(names or []),
        # AsyncLLM's own switches (not part of the EngineClient protocol).
        "enable_log_requests": bool(getattr(client, "log_requests", False)),
        "disable_log_stats": not getattr(client, "log_stats", True),
        "reasoning_parser": structured.reasoning_parser or "",
        # 0.24's parallel config has no fault tolerance: off.
        "enable_fault_tolerance": bool(
            getattr(config.parallel_config, "enable_fault_tolerance", False)
        ),
    }


def _namespace_settings(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`_engine_settings`'s fields as ``args`` gives them."""
    names = args.served_model_name
    return {
        "model": str(args.model),
        "served_model_name": list(names) if names else [str(args.model)],
        "enable_log_requests": bool(args.enable_log_requests),
        "disable_log_stats": bool(args.disable_log_stats),
        # The app reads the structured-outputs config; --reasoning-parser lands
        # there only when an engine is built from this namespace.
        "reasoning_parser": args.structured_outputs_config.reasoning_parser
        or getattr(args, "reasoning_parser", "")
        or "",
        "enable_fault_tolerance": bool(getattr(args, "enable_fault_tolerance", False)),
    }


def serve_args(client: EngineClient, extra: Sequence[str] = ()) -> argparse.Namespace:
    """A complete ``vllm serve`` namespace for ``client``'s engine.

    Every field the serving layer reads that the engine already fixed comes
    from the engine's own config: the model and served names, request and
    stats logging, the reasoning parser, fault tolerance. ``extra`` adds
    ``vllm serve`` command-line options (``["--enable-auto-tool-choice", ...]``);
    one that contradicts the engine makes :func:`start_openai_server` raise
    :class:`ServeArgsMismatch`. An option vLLM's parser rejects raises
    :class:`ServeOptionError` (never ``SystemExit``). The access log is off unless ``extra`` turns it
    on (``--enable-uvicorn-access-log`` on vLLM 0.33, ``--no-disable-uvicorn-access-log``
    on 0.32).
    """
    engine = _engine_settings(client)
    argv = ["--model", engine["model"], "--served-model-name", *engine["served_model_name"]]
    if engine["enable_log_requests"]:
        argv.append("--enable-log-requests")
    if engine["disable_log_stats"]:
        argv.append("--disable-log-stats")
    if engine["enable_fault_tolerance"]:
        argv.append("--enable-fault-tolerance")
    if engine["reasoning_parser"]:
        argv += ["--reasoning-parser", engine["reasoning_parser"]]
    argv.append("--disable-uvicorn-access-log")
    args = quiet_parse(_make_parser(), [*argv, *extra])
    if not any(a in ("--reasoning-parser", "--structured-outputs-config") for a in extra):
        # The engine's own structured-outputs config, reasoning parser included.
        args.structured_outputs_config = client.vllm_config.structured_outputs_config
    return args


def check_serve_args(client: EngineClient, args: argparse.Namespace) -> None:
    """Raise :class:`ServeArgsMismatch` if ``args`` contradicts ``client``'s engine."""
    engine, ours = _engine_settings(client), _namespace_settings(args)
    wrong = [
        f"{dest} (namespace: {ours[dest]!r}, engine: {engine[dest]!r})"
        for dest in engine
        if ours[dest] != engine[dest]
    ]
    if wrong:
        raise ServeArgsMismatch(
            "the vllm serve namespace disagrees with the engine it serves: "
            + "; ".join(wrong)
            + ". Build it with serve_args(engine), or build the engine from it"
        )


def _uses_tls(args: argparse.Namespace) -> bool:
    # vLLM's launcher announces https exactly when both files are given.
    return bool(getattr(args, "ssl_keyfile", None) and getattr(args, "ssl_certfile", None))


def import_parser_plugins(args: argparse.Namespace) -> None:
    """Import ``--tool-parser-plugin`` and ``--reasoning-parser-plugin``, as vLLM's launcher does.

    Both register parsers by name, so they must run before the names are
    checked and before the app is built. Importing twice is harmless (vLLM's
    own launcher does).
    """
    # vLLM's own test: anything shorter than "a.py" is no plugin.
    if len(getattr(args, "tool_parser_plugin", "") or "") > 3:
        from vllm.tool_parsers import ToolParserManager

        ToolParserManager.import_tool_parser(args.tool_parser_plugin)
    if len(getattr(args, "reasoning_parser_plugin", "") or "") > 3:
        from vllm.reasoning import ReasoningParserManager

        ReasoningParserManager.import_reasoning_parser(args.reasoning_parser_plugin)


def _uvicorn_config(app: Any, args: argparse.Namespace, log_level: str, grace: float) -> Any:
    """uvicorn's config for ``args``, as vLLM's ``build_and_serve``/``serve_http`` make it.

    TLS, access log, log config, keep-alive timeout and h11 limits all come
    from the ``vllm serve`` namespace; only the log level and the drain are
    the caller's (``log_level``, ``grace``).
    """
    import uvicorn
    from vllm import envs

    from loopbridge_vllm._vllm_releases.moved_imports import uvicorn_log_config

    options: dict[str, Any] = {}
    log_config = uvicorn_log_config()(args)
    if log_config is not None:
        options["log_config"] = log_config
    config: Any = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        timeout_graceful_shutdown=max(1, round(grace)),
        lifespan="on",
        ssl_keyfile=args.ssl_keyfile,
        ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs,
        ssl_cert_reqs=args.ssl_cert_reqs,
        ssl_ciphers=args.ssl_ciphers,
        h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        **options,
    )
    # vLLM sets this too; the uvicorn releases it supports do not read it yet.
    config.h11_max_header_count = args.h11_max_header_count
    config.load()  # builds the SSL context the certificate refresher reloads
    return config


class OpenAIServer(ThreadedServer):
    """A running server thread; see :func:`start_openai_server`."""

    _logger = _log
    _kind = "OpenAI server"
    _start_on_owner = (
        "start() on the engine's owner loop would wait for that same loop: "
        "use `await server.astart()` (or astart_openai_server) there"
    )

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
        use_uvloop: bool | None = None,
        metrics: bool = True,
        max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
        sock: socket.socket | None = None,
        routers: Sequence[APIRouter] = (),
        middleware: Sequence[Middleware] = (),
        weight_version_tags: bool = False,
        paused_admission: str | PausePolicy = PausePolicy.ENGINE,
        paused_hold_s: float = 60.0,
        switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
        on_engine_loop: bool = False,
    ) -> None:
        self.client = client
        self._paused_admission = pause_policy(paused_admission)
        if paused_hold_s <= 0:
            raise ValueError(f"paused_hold_s must be positive, not {paused_hold_s!r}")
        self._paused_hold_s = paused_hold_s
        #: Whether the engine is paused, for ``paused_admission`` other than
        #: "engine" (None then): read by the gate, closed when serving ends.
        self.pause_watch: PauseWatch | None = None
        if weight_version_tags and not hasattr(type(client), "get_weight_version"):
            # vLLM 0.24 has no weight versions: tags would fail on every request.
            raise ServerStartError(
                "weight_version_tags=True needs the engine's get_weight_version(), which "
                f"{type(client).__name__} of this vLLM release does not have (vLLM 0.29 and "
                "later have it); start the server without weight_version_tags"
            )
        self._weight_version_tags = weight_version_tags
        self._routers = tuple(routers)
        self._middleware = tuple(middleware)
        self.args = args if args is not None else serve_args(client)
        self._engine = engine
        self._log_level = log_level
        self._metrics = metrics
        if max_body_bytes is not None and max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive or None, not {max_body_bytes!r}")
        self._max_body_bytes = max_body_bytes
        super().__init__(
            sock,
            host=host,
            port=port,
            grace=grace,
            watchdog_interval=watchdog_interval,
            name=name,
            use_uvloop=use_uvloop,
            switch_interval=switch_interval,
            on_engine_loop=on_engine_loop,
        )

    def _release(self) -> None:
        if self.pause_watch is not None:
            self.pause_watch.close()  # the engine's pause members as they were

    def _scheme(self) -> str:
        return "https" if _uses_tls(self.args) else "http"

    # -- lifecycle (the shared one, with vLLM's defaults and engine shutdown) ---------
    def start(self, timeout: float = 120.0) -> OpenAIServer:
        """Start the thread; return once connections are served.

        Start-up needs the engine's owner loop (it asks the engine for its
        tasks), so on the owner loop's own thread use ``await astart()``.
        """
        return super().start(timeout)

    async def astart(self, timeout: float = 120.0) -> OpenAIServer:
        """:meth:`start` for async callers; the calling loop keeps running meanwhile."""
        return await super().astart(timeout)

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
        if not self._stop_thread(timeout):
            return
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

    # -- the engine's part of the server thread ---------------------------------------
    def _owner(self) -> asyncio.AbstractEventLoop | None:
        return _owner_of(self.client)

    async def _build(self) -> Any:
        client = self.client
        # The engine must answer before anything is served.
        supported = tuple(await client.get_supported_tasks())
        if client.errored:
            raise ServerStartError("engine is not healthy") from client.dead_error
        build_app, init_app_state = _launchers()
        app = build_app(self.args, supported, client.model_config)
        # The caller's routes, on the same app: vLLM's come first (a path both
        # define is vLLM's).
        for router in self._routers:
            app.include_router(router)
        await init_app_state(client, app.state, self.args, supported)
        if self._metrics:
            await self._export_metrics()
        served: Any = app
        if self._weight_version_tags:
            served = WeightVersionTags(served, client)
        paths = [getattr(route, "path", "") for route in app.routes]
        served, self.pause_watch = gate_paused(
            served, unwrap(client), self._paused_admission, self._paused_hold_s, paths
        )
        # The caller's middleware wraps the whole app (vLLM's app has built its
        # middleware stack already), the first one outermost.
        for layer in reversed(self._middleware):
            served = layer.cls(served, *layer.args, **layer.kwargs)
        if self._max_body_bytes is not None:
            served = BodyLimit(served, self._max_body_bytes)
        server = self._new_server(_uvicorn_config(served, self.args, self._log_level, self.grace))
        app.state.server = server
        return server

    @contextlib.contextmanager
    def _serving(self, server: Any) -> Iterator[None]:
        config = server.config
        if not (self.args.enable_ssl_refresh and config.ssl is not None):
            yield
            return
        from loopbridge_vllm._vllm_releases.moved_imports import ssl_cert_refresher

        refresher = ssl_cert_refresher()(
            ssl_context=config.ssl,
            key_path=config.ssl_keyfile,
            cert_path=config.ssl_certfile,
            ca_path=config.ssl_ca_certs,
        )
        try:
            yield
        finally:
            refresher.stop()

    async def _export_metrics(self) -> None:
        owner = _owner_of(self.client)
        if owner is None:
            return
        # The label names the engine: its model and the thread that owns it.
        thread = await arun_on(owner, _current_thread_name)
        names = self.client.model_config.served_model_name
        model = names if isinstance(names, str) else (names or [self.client.model_config.model])[0]
        export_metrics(owner, f"{model} on {thread}")

    def _engine_exit(self) -> ExitReason | None:
        from loopbridge_vllm.engine import engine_shut_down

        if engine_shut_down(self.client):
            return ExitReason.ENGINE_SHUT_DOWN  # its streams ended with an error event
        if self.client.errored and not _keep_alive_on_engine_death():
            return ExitReason.ENGINE_DIED
        return None

    def _owner_stopped(self, owner: asyncio.AbstractEventLoop | None) -> None:
        # The server was told to exit, which refuses new requests and ends those in
        # flight: a stopped loop is not dead to the core (it may run again), so they
        # wait on it until uvicorn's drain (``grace``) cancels them, and each cancel
        # returns within the proxy's cancel_grace. Their generators are suspended
        # on the owner loop, so the EngineCore would run them to the end: queue an
        # abort of everything in flight, which runs if that loop runs again (a
        # restart, or the clean-up sweep of LoopThread.stop / asyncio.run). A
        # closed loop already cancelled its generators, which aborts them.
        if owner is None or owner.is_closed():
            return
        engine = unwrap(self.client)
        # Queued on the loop, not a call through loopbridge's crossing: nobody waits for
        # it (this server's loop ends now), and a crossing whose caller has gone is
        # taken back before it starts; the abort must run whenever that loop runs again.
        with contextlib.suppress(RuntimeError):  # closed meanwhile: see above
            owner.call_soon_threadsafe(_start_abort_all, engine)


def _owner_of(client: Any) -> asyncio.AbstractEventLoop | None:
    """The client's owner loop; ``None`` for a client that is not loop-affine."""
    try:
        return owner_loop(client)
    except LoopAffinityError:
        return None


def _current_thread_name() -> str:
    return threading.current_thread().name


def _start_abort_all(engine: Any) -> None:
    # Runs on the owner loop: the output processor is its state.
    ids = list(engine.output_processor.request_states)
    if ids:
        task = asyncio.get_running_loop().create_task(engine.abort(ids, internal=True))
        _background.add(task)
        task.add_done_callback(_background.discard)


# Strong references to fire-and-forget tasks (the loop keeps only weak ones).
_background: set[asyncio.Task[None]] = set()


def _keep_alive_on_engine_death() -> bool:
    # vLLM's own switch, read on every check as vLLM does.
    return os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class _StartOptions:
    """The keyword parameters of :func:`start_openai_server` and
    :func:`astart_openai_server`, defined once.

    Both entry points spell them out, so that users and type checkers see each one;
    tests/vllm/test_server_options.py checks that both take exactly these fields, in
    this order, with these defaults and annotations, and that :class:`OpenAIServer`
    gives the ones it shares the same defaults. Each entry point hands them over as one
    object (:meth:`of`).
    """

    host: str | None = None
    port: int | None = None
    serve_argv: Sequence[str] = ()
    args: argparse.Namespace | None = None
    grace: float = 5.0
    shutdown_engine: bool = False
    log_level: str = "warning"
    start_timeout: float = 120.0
    use_uvloop: bool | None = None
    metrics: bool = True
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES
    sock: socket.socket | None = None
    routers: Sequence[APIRouter] = ()
    middleware: Sequence[Middleware] = ()
    weight_version_tags: bool = False
    paused_admission: str | PausePolicy = PausePolicy.ENGINE
    paused_hold_s: float = 60.0
    switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S
    on_engine_loop: bool = False

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> _StartOptions:
        """The options from an entry point's parameters (its ``locals()``, by name)."""
        return cls(**{field.name: given[field.name] for field in dataclasses.fields(cls)})

    def for_server(self) -> dict[str, Any]:
        """The options :class:`OpenAIServer` takes as they are (the address, the
        namespace and the engine to shut down are :func:`_prepare`'s to settle)."""
        return {name: getattr(self, name) for name in _SERVER_AS_GIVEN}


#: The fields of _StartOptions that OpenAIServer takes unchanged.
_SERVER_AS_GIVEN = tuple(
    field.name
    for field in dataclasses.fields(_StartOptions)
    if field.name in inspect.signature(OpenAIServer).parameters
    and field.name not in ("host", "port", "sock", "args")
)


def start_openai_server(
    engine: Any,
    *,
    host: str | None = None,
    port: int | None = None,
    serve_argv: Sequence[str] = (),
    args: argparse.Namespace | None = None,
    grace: float = 5.0,
    shutdown_engine: bool = False,
    log_level: str = "warning",
    start_timeout: float = 120.0,
    use_uvloop: bool | None = None,
    metrics: bool = True,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    sock: socket.socket | None = None,
    routers: Sequence[APIRouter] = (),
    middleware: Sequence[Middleware] = (),
    weight_version_tags: bool = False,
    paused_admission: str | PausePolicy = PausePolicy.ENGINE,
    paused_hold_s: float = 60.0,
    switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
    on_engine_loop: bool = False,
    **proxy_options: Any,
) -> OpenAIServer:
    """Serve vLLM's OpenAI app for ``engine`` from a new thread; return when ready.

    The server never touches the engine's asyncio state directly: a raw ``AsyncLLM``
    is wrapped in :func:`~loopbridge_vllm.engine_client_proxy`. Returns once the
    server accepts connections; :attr:`OpenAIServer.url` is the bound address.

    :param engine: an ``AsyncLLM`` whose owner loop is known (it was created on a
        running loop, or recorded with :func:`~loopbridge_vllm.bind_owner_loop`), or a
        client made by :func:`~loopbridge_vllm.engine_client_proxy`.
    :param host: the address to bind (default ``127.0.0.1``).
    :param port: the port to bind (default ``0``: a free port, read back from ``url``).
    :param serve_argv: more ``vllm serve`` options, as on its command line; one that
        a library call refuses, or that vLLM's parser rejects, raises
        :class:`ServeOptionError`.
    :param args: a whole ``vllm serve`` namespace, instead of ``serve_argv`` (not both).
        One that contradicts the engine's own config raises :class:`ServeArgsMismatch`.
    :param grace: seconds a stop drains running requests before cancelling them (which
        aborts them in the engine).
    :param shutdown_engine: with ``True``, :meth:`OpenAIServer.stop` shuts the engine
        down after the server has stopped.
    :param log_level: uvicorn's log level (default ``"warning"``).
    :param start_timeout: seconds to wait for the server to accept connections (the
        engine's round trip on its owner loop included) before raising
        :class:`ServerStartError`.
    :param use_uvloop: the server loop: ``None`` (default) uvloop when it is installed,
        as ``vllm serve`` does; ``False`` asyncio's own loop; ``True`` insists on uvloop
        (as :class:`loopbridge.LoopThread` takes it). Refused with ``on_engine_loop``.
    :param metrics: with ``True`` (and ``prometheus_client`` installed, as it is with
        vLLM), loopbridge's series are exported on the app's ``/metrics`` next to
        vLLM's, and the engine's owner loop gets a lag monitor; both are set up once
        per process and per owner loop however many servers start.
    :param max_body_bytes: request bodies over this size (default 32 MiB) are answered
        413 without being kept; ``None`` accepts any size, as stock ``vllm serve`` does.
    :param sock: an already bound, listening TCP socket to serve instead of binding
        ``host:port``.
    :param routers: FastAPI ``APIRouter`` objects added to vLLM's app, served on the
        same thread: a route reaches the engine as ``request.app.state.engine_client``,
        the loop-safe proxy.
    :param middleware: Starlette ``Middleware`` wrapping the app (the first outermost).
    :param weight_version_tags: with ``True`` every completion and chat completion says
        which weight versions served it (read from ``get_weight_version()`` at admission
        and at finish): headers ``x-weight-version-admitted``, ``-finished`` and
        ``-mixed`` on a JSON reply; the admission header and a last chunk with a
        ``weight_version`` field on a stream.
    :param paused_admission: what happens to a generation request that arrives while
        the engine is paused: ``"engine"`` (default) leaves it to the vLLM release
        (from 0.33: refused in "abort" and "wait" mode, queued in the engine in
        "keep"; before: queued in every mode), ``"refuse"`` answers 503 with
        ``Retry-After`` before it reaches the engine, ``"hold"`` keeps it in the server
        until the resume.
    :param paused_hold_s: with ``paused_admission="hold"``, the most seconds a request
        is held (then 503).
    :param switch_interval: the interpreter's switch interval while the server serves
        (default 1 ms, logged at info level; restored when the last server stops): the
        HTTP and owner threads then wait at most about that long for a GIL that the
        process's other Python work holds. ``None`` leaves it alone.
    :param on_engine_loop: with ``True``, serve on the engine's owner loop instead of a
        thread of its own (``vllm serve``'s topology), for an engine on a loop that
        runs nothing else, such as a :class:`loopbridge.LoopThread`'s.
    :param proxy_options: passed to :func:`~loopbridge_vllm.engine_client_proxy` when
        ``engine`` is a raw ``AsyncLLM`` (``stream_window``, ``cancel_grace``).
    :raises ServerStartError: the server failed before it accepted connections.
    :raises ServeOptionError: an option of ``serve_argv`` is refused.
    :raises ServeArgsMismatch: the namespace contradicts the engine.
    """
    options = _StartOptions.of(locals())
    return _prepare(engine, options, proxy_options).start(options.start_timeout)


async def astart_openai_server(
    engine: Any,
    *,
    host: str | None = None,
    port: int | None = None,
    serve_argv: Sequence[str] = (),
    args: argparse.Namespace | None = None,
    grace: float = 5.0,
    shutdown_engine: bool = False,
    log_level: str = "warning",
    start_timeout: float = 120.0,
    use_uvloop: bool | None = None,
    metrics: bool = True,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    sock: socket.socket | None = None,
    routers: Sequence[APIRouter] = (),
    middleware: Sequence[Middleware] = (),
    weight_version_tags: bool = False,
    paused_admission: str | PausePolicy = PausePolicy.ENGINE,
    paused_hold_s: float = 60.0,
    switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
    on_engine_loop: bool = False,
    **proxy_options: Any,
) -> OpenAIServer:
    """:func:`start_openai_server` for async code, including the engine's owner loop.

    A Ray async actor that owns the engine calls this from one of its async
    methods: the actor's loop keeps serving the engine while the server starts.
    Every parameter is :func:`start_openai_server`'s, with the same meaning.
    """
    options = _StartOptions.of(locals())
    return await _prepare(engine, options, proxy_options).astart(options.start_timeout)


def _prepare(engine: Any, options: _StartOptions, proxy_options: dict[str, Any]) -> OpenAIServer:
    """The server an entry point starts: the client, the namespace checked against the
    engine, the address."""
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
    host, port, sock, args = options.host, options.port, options.sock, options.args
    listen = Listen(host, port, sock is not None)
    if args is None:
        args = serve_args(client, options.serve_argv)
        given = _given(options.serve_argv)
    elif options.serve_argv:
        raise ServeOptionError(
            "serve_argv and args= both give the vllm serve options; give one (args= "
            "replaces the whole namespace)"
        )
    else:
        given = set()
    refused = library_refusals(_make_parser(), args, given, listen)
    if refused:
        raise ServeOptionError("serve_argv: " + "; ".join(refused))
    check_serve_args(client, args)
    wrong = engine_contradictions(_make_parser(), args, given, client.vllm_config)
    if wrong:
        raise ServeArgsMismatch("serve_argv contradicts the engine it serves: " + "; ".join(wrong))
    import_parser_plugins(args)
    if "uds" in given:
        sock = bind_unix(args.uds)
    else:
        host = args.host if "host" in given else host
        port = args.port if "port" in given else port
    return OpenAIServer(
        client,
        args=args,
        engine=client if options.shutdown_engine else None,
        host="127.0.0.1" if host is None else host,
        port=0 if port is None else port,
        sock=sock,
        **options.for_server(),
    )


def _given(serve_argv: Sequence[str]) -> set[str]:
    """``dest`` of every option ``serve_argv`` sets (parsed quietly)."""
    from loopbridge_vllm._serve_options import given_options

    if any(a in ("-h", "--help") for a in serve_argv):
        quiet_parse(_make_parser(), serve_argv)  # refused, with its reason
    return given_options(quiet(_make_parser()), list(serve_argv))
