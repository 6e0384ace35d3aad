"""SGLang's own HTTP server on its own thread, bound to a loop-safe manager.

:func:`start_sglang_server` wraps a ``TokenizerManager`` in
:func:`~loopbridge_sglang.manager.tokenizer_manager_proxy` (unless it already is one),
binds the listening socket in the caller's thread (a busy port fails at once), starts a
thread with a fresh event loop (uvloop when installed), injects the proxy into SGLang's
FastAPI ``app`` through ``http_server.set_global_state`` and serves the app there with
uvicorn (no signal handlers: signals belong to the main thread; TCP_NODELAY on every
connection). It returns once the server accepts connections, with the bound URL.

Ordering guarantees:

* **Start** only after the manager's owner loop answered a round trip (which marks
  the manager up, as SGLang's warm-up does) and ``handle_loop`` runs there.
* **Stop** (:meth:`SGLangServer.stop` / :meth:`SGLangServer.aclose`) stops accepting
  connections, drains for at most ``grace`` seconds (requests still running are
  cancelled, which aborts them in the manager), then joins the thread with a bound.
* ``GET /health`` is answered before SGLang's app sees it, from reads that need no
  owner loop: a busy or blocked owner loop never makes a healthy manager look dead,
  and a dead one is reported without its help.
* A watchdog stops the server when ``handle_loop`` dies (SGLang would have killed
  the process) and when the owner loop stops or closes.
* ``/metrics`` carries loopbridge's series and the owner loop's lag, beside SGLang's
  own when ``--enable-metrics`` serves them (``metrics=False``: SGLang's app answers
  it, as stock); a request body over ``max_body_bytes`` gets a 413 before the app
  reads it (:mod:`loopbridge_adapters.body_limit`; stock has no bound).

SGLang's app is one per process (``set_global_state`` sets a module global), so one
server at a time serves it; a second :meth:`start` while one runs raises
:class:`ServerStartError`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from loopbridge import LoopAffinityError, owner_loop, unwrap
from loopbridge_adapters.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from loopbridge_adapters.exporter import MetricsFirst, export_metrics, metrics_app, monitor_owner
from loopbridge_adapters.http import ExitReason
from loopbridge_adapters.on_loop import arun_on
from loopbridge_adapters.switch_interval import DEFAULT_SWITCH_INTERVAL_S
from loopbridge_adapters.threaded import ServerStartError, ThreadedServer

from .manager import is_tokenizer_manager_proxy, tokenizer_manager_proxy

__all__ = ["ExitReason", "SGLangServer", "ServerStartError", "start_sglang_server"]

_log = logging.getLogger("loopbridge_sglang.server")

_serving_lock = threading.Lock()
_serving: SGLangServer | None = None  # the one server SGLang's module-global app serves

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class _Health:
    """The manager's health, read without its owner loop."""

    def __init__(self, manager: Any, owner: asyncio.AbstractEventLoop) -> None:
        self.manager = manager
        self.owner = owner
        # handle_loop and SGLang's sigterm watchdog, taken on the owner loop at start.
        # Both run for the manager's life: either ending means the manager is gone.
        self.tasks: tuple[asyncio.Task[Any], ...] = ()

    def ended(self) -> ExitReason | None:
        """Why the manager's tasks ended, if they did.

        Only the owner loop's shutdown cancels them; one that raised or returned
        means the manager died (SGLang would now kill the process).
        """
        done = [task for task in self.tasks if task.done()]
        if not done:
            return None
        if all(task.cancelled() for task in done):
            return ExitReason.OWNER_LOOP_STOPPED
        return ExitReason.ENGINE_DIED

    def healthy(self) -> bool:
        return (
            not self.owner.is_closed()
            and self.owner.is_running()
            and self.ended() is None
            and self.manager.is_healthy()
        )


class _HealthFirst:
    """``GET /health`` from :class:`_Health`; everything else to SGLang's app."""

    def __init__(self, app: Any, health: _Health) -> None:
        self.app = app
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            status = 200 if self.health.healthy() else 503
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


async def _mark_up(manager: Any, health: _Health) -> str:
    """On the owner loop: start handle_loop there and mark the manager up; return the
    owner thread's name (it labels the owner loop's lag)."""
    from sglang.srt.managers.tokenizer_manager import ServerStatus

    manager.auto_create_handle_loop()
    health.tasks = tuple(manager.asyncio_tasks)
    if manager.server_status == ServerStatus.Starting:
        manager.server_status = ServerStatus.Up
    return threading.current_thread().name


def _skip_warmup(*args: Any, **kwargs: Any) -> bool:
    # The server marked the manager up itself (a round trip on its owner loop);
    # SGLang's warm-up would POST a request to its own URL and freeze the GC.
    return False


class SGLangServer(ThreadedServer):
    """A running server thread; see :func:`start_sglang_server`."""

    _logger = _log
    _kind = "SGLang server"
    _start_on_owner = (
        "start() on the manager's owner loop would wait for that same loop: "
        "use `await server.astart()` there"
    )
    _stop_on_owner = (
        "stop() on the manager's owner loop would block the loop that running "
        "requests need to finish: use `await server.aclose()` there"
    )

    def __init__(
        self,
        manager: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        grace: float = 5.0,
        log_level: str = "warning",
        watchdog_interval: float = 1.0,
        name: str = "loopbridge-sglang-server",
        use_uvloop: bool | None = None,
        sock: socket.socket | None = None,
        template_manager: Any = None,
        scheduler_info: dict[str, Any] | None = None,
        root_path: str = "",
        access_log: bool = False,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
        on_engine_loop: bool = False,
        metrics: bool = True,
        max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes is not None and max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive or None, not {max_body_bytes!r}")
        if not is_tokenizer_manager_proxy(manager):
            manager = tokenizer_manager_proxy(manager)
        owner = owner_loop(manager)
        if owner is None:
            raise LoopAffinityError(
                "the manager has no owner loop yet: pass loop= to tokenizer_manager_proxy, "
                "or record it with loopbridge_sglang.bind_owner_loop() before serving"
            )
        if owner.is_closed():
            raise ServerStartError("the manager's owner loop is closed")
        self.manager = manager
        self._log_level = log_level
        self._template_manager = template_manager
        self._scheduler_info = scheduler_info
        self._root_path = root_path
        self._access_log = access_log
        self._api_key = api_key
        self._admin_api_key = admin_api_key
        self._metrics = metrics
        self._max_body_bytes = max_body_bytes
        self._health = _Health(manager, owner)
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

    # -- the engine's part of the server thread -----------------------------------------
    def _owner(self) -> asyncio.AbstractEventLoop:
        return self._health.owner

    def _claim(self) -> None:
        # SGLang's app is one per process: one server at a time serves it.
        global _serving
        with _serving_lock:
            if _serving is not None and _serving.running:
                raise ServerStartError(
                    f"SGLang's app is already served by {_serving.url}: it is one per process "
                    "(http_server.set_global_state); stop that server first"
                )
            _serving = self

    def _release(self) -> None:
        global _serving
        with _serving_lock:
            if _serving is self:
                _serving = None

    async def _build(self) -> Any:
        manager = self.manager
        owner = self._health.owner
        # The owner loop must answer before anything is served.
        owner_thread = await arun_on(owner, _mark_up, unwrap(manager), self._health)
        if not self._health.healthy():
            raise ServerStartError("the manager is not healthy")
        from sglang.srt.entrypoints import http_server
        from sglang.srt.parser.template_manager import TemplateManager

        http_server.set_global_state(
            http_server._GlobalState(
                tokenizer_manager=manager,
                template_manager=self._template_manager or TemplateManager(),
                scheduler_info=self._scheduler_info or {},
            )
        )
        app = http_server.app
        # What SGLang's launcher sets before serving a single-tokenizer app.
        app.is_single_tokenizer_mode = True
        app.server_args = manager.server_args
        app.warmup_thread_kwargs = dict(
            server_args=manager.server_args, execute_warmup_func=_skip_warmup
        )
        import uvicorn

        served: Any = _HealthFirst(self._with_auth(app), self._health)
        if self._metrics:
            served = self._with_metrics(served, owner_thread)
        if self._max_body_bytes is not None:
            served = BodyLimit(served, self._max_body_bytes)
        config = uvicorn.Config(
            served,
            log_level=self._log_level,
            access_log=self._access_log,
            root_path=self._root_path,
            lifespan="on",
            timeout_graceful_shutdown=max(1, round(self.grace)),
        )
        return self._new_server(config)

    def _engine_exit(self) -> ExitReason | None:
        return self._health.ended()

    def _with_metrics(self, app: Any, owner_thread: str) -> Any:
        """``/metrics`` with loopbridge's series, and the owner loop's lag monitored.

        With ``--enable-metrics`` SGLang's app would serve the multiprocess files'
        registry at ``/metrics``: served here, with loopbridge's collector beside it.
        """
        manager = self.manager
        multiprocess = bool(manager.enable_metrics)
        metrics = metrics_app(multiprocess=multiprocess)
        if metrics is None:
            return app  # no prometheus_client: SGLang's app answers, as stock
        label = f"{manager.served_model_name or manager.model_path} on {owner_thread}"
        if multiprocess:
            monitor_owner(self._health.owner, label)
        else:
            export_metrics(self._health.owner, label)
        return MetricsFirst(app, metrics)

    def _with_auth(self, app: Any) -> Any:
        """SGLang's API-key middleware around ``app``, when SGLang's launcher adds it.

        The launcher calls ``add_api_key_middleware(app, ...)``, which adds it to the
        module-global app; that app may already have served (an earlier server in this
        process), after which Starlette takes no middleware. So SGLang's own middleware
        class is taken from that call and wraps the app here instead.
        """
        from sglang.srt.utils.auth import add_api_key_middleware, app_has_admin_force_endpoints

        if not (self._api_key or self._admin_api_key or app_has_admin_force_endpoints(app)):
            return app
        layers: list[tuple[Any, dict[str, Any]]] = []

        class _Collect:
            def add_middleware(self, cls: Any, **options: Any) -> None:
                layers.append((cls, options))

        add_api_key_middleware(_Collect(), api_key=self._api_key, admin_api_key=self._admin_api_key)
        [(middleware, options)] = layers
        return middleware(app, **{**options, "fastapi_app": app})


def start_sglang_server(
    manager: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    grace: float = 5.0,
    log_level: str = "warning",
    start_timeout: float = 60.0,
    use_uvloop: bool | None = None,
    sock: socket.socket | None = None,
    template_manager: Any = None,
    scheduler_info: dict[str, Any] | None = None,
    root_path: str = "",
    access_log: bool = False,
    api_key: str | None = None,
    admin_api_key: str | None = None,
    switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
    on_engine_loop: bool = False,
    metrics: bool = True,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
) -> SGLangServer:
    """Serve SGLang's HTTP app for ``manager`` from a new thread; return when ready.

    ``manager`` is a ``TokenizerManager`` proxy (:func:`tokenizer_manager_proxy`), or a
    manager already declared with its owner loop. ``port=0`` picks a free port;
    ``sock`` serves an already bound, listening socket instead. ``template_manager``
    and ``scheduler_info`` are SGLang's (its chat templates, ``/server_info``).
    ``root_path`` and ``access_log`` are uvicorn's (SGLang's ``--fastapi-root-path``;
    stock logs every request at info level, this server by default does not).
    ``api_key`` and ``admin_api_key`` are SGLang's (``--api-key``, ``--admin-api-key``):
    SGLang's own API-key middleware checks them, as its launcher installs it.
    ``switch_interval``: the interpreter's switch interval while serving (default
    1 ms; None leaves it alone), as :mod:`loopbridge_adapters.switch_interval` says.
    ``on_engine_loop=True`` serves on the manager's owner loop instead of a thread of
    its own (SGLang's own topology), for a manager on a loop that runs nothing else;
    ``use_uvloop`` (default: uvloop when installed) is refused with it.
    ``metrics``: loopbridge's series and the owner loop's lag on ``/metrics`` (beside
    SGLang's own with ``--enable-metrics``). ``max_body_bytes``: larger request bodies
    get a 413 (default 32 MiB; None: no limit, as stock SGLang).
    """
    return SGLangServer(
        manager,
        host=host,
        port=port,
        grace=grace,
        log_level=log_level,
        use_uvloop=use_uvloop,
        sock=sock,
        template_manager=template_manager,
        scheduler_info=scheduler_info,
        root_path=root_path,
        access_log=access_log,
        api_key=api_key,
        admin_api_key=admin_api_key,
        switch_interval=switch_interval,
        on_engine_loop=on_engine_loop,
        metrics=metrics,
        max_body_bytes=max_body_bytes,
    ).start(start_timeout)
