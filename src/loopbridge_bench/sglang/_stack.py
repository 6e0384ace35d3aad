"""The two servers the benchmark compares, over one real ``TokenizerManager``.

One manager (SGLang's real class, config-only tiny model, ``skip_tokenizer_init``)
talks to one :class:`~loopbridge_sglang.cpu_manager.StandInScheduler` and is owned by
one loop: a thread of its own running uvloop, as ``launch_server`` runs its loop.
:meth:`Stack.serving` serves SGLang's own FastAPI ``app`` for it in one of two ways:

* ``stock`` - uvicorn on the owner loop itself, the raw manager in
  ``set_global_state``: ``launch_server``'s topology (one loop for the app and the
  manager) with its uvicorn settings (uvloop, ``SGLANG_TIMEOUT_KEEP_ALIVE``);
* ``loopbridge`` - :func:`~loopbridge_sglang.server.start_sglang_server`: the app on a
  thread of its own, the manager reached through its proxy.

Both modes serve the same manager, stand-in and app, so they cannot differ in model or
engine settings; :meth:`Stack.check_same` still compares what each server reports
(``/model_info``, ``/server_info``'s arguments) and fails loudly on any difference.
The GC is frozen after set-up, as ``launch_server`` does after its warm-up. Both
servers get the same socket (:func:`loopbridge_adapters.http.bind`: TCP_NODELAY),
no access log and the same log level: logging is not what is measured.

SGLang's app is one per process (``set_global_state`` sets a module global), so one
mode serves at a time; the rounds start and stop a server per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loopbridge import LoopThread, unwrap
from loopbridge_adapters.http import bind, thread_server_class
from loopbridge_sglang.cpu_manager import StandInScheduler, build_tiny_model, make_tokenizer_manager
from loopbridge_sglang.manager import tokenizer_manager_proxy
from loopbridge_sglang.server import _skip_warmup, start_sglang_server

__all__ = ["MODES", "ConfigMismatchError", "Stack"]

#: The reference row first.
MODES = ("stock", "loopbridge")

_LOG_LEVEL = "warning"


class ConfigMismatchError(RuntimeError):
    """The two servers report different configurations: their figures do not compare."""


class Stack:
    """The manager, its stand-in scheduler and its owner loop; see the module docstring."""

    def __init__(self, step_s: float, grace: float = 5.0, freeze_gc: bool = True) -> None:
        self.step_s = step_s
        self.freeze_gc = freeze_gc
        self.grace = grace
        self._tmp = tempfile.TemporaryDirectory(prefix="loopbridge-sglang-bench-")
        self.model = build_tiny_model(Path(self._tmp.name) / "model")
        self.manager: Any = None
        self.server_args: Any = None
        self.scheduler: StandInScheduler | None = None
        self.owner: LoopThread | None = None
        self.proxy: Any = None

    def start(self) -> Stack:
        manager, server_args, port_args = make_tokenizer_manager(
            self.model, Path(self._tmp.name) / "ipc"
        )
        self.manager, self.server_args = manager, server_args
        # The stand-in forks: before any thread of ours exists.
        self.scheduler = StandInScheduler(port_args, step_s=self.step_s).start()
        self.owner = LoopThread("sglang-owner", use_uvloop=None).start()
        self.proxy = tokenizer_manager_proxy(manager, loop=self.owner.loop)
        self.owner.run(self._mark_up)
        return self

    async def _mark_up(self) -> None:
        """On the owner loop: ``handle_loop`` starts there, the manager is up, the GC is
        frozen: what ``launch_server``'s warm-up leaves behind, for both modes alike."""
        from sglang.srt.managers.tokenizer_manager import ServerStatus

        self.manager.auto_create_handle_loop()
        self.manager.server_status = ServerStatus.Up
        # launch_server freezes the GC after its warm-up: without it a full collection
        # walks SGLang's and torch's import-time objects, about 0.4 s on 2 busy cores,
        # landing on whichever mode happens to run then.
        if self.freeze_gc:
            await self.manager.freeze_gc()

    @property
    def healthy(self) -> bool:
        return (
            self.scheduler is not None
            and self.scheduler.alive
            and self.owner is not None
            and self.owner.loop.is_running()
            and all(not t.done() for t in self.manager.asyncio_tasks)
        )

    @contextlib.contextmanager
    def serving(self, mode: str) -> Iterator[str]:
        """Serve SGLang's app in ``mode`` (a :data:`MODES` name) for the block; its URL."""
        if mode == "stock":
            with self._stock() as url:
                yield url
        elif mode == "loopbridge":
            server = start_sglang_server(self.proxy, log_level=_LOG_LEVEL, grace=self.grace)
            try:
                if unwrap(server.manager) is not self.manager:
                    raise ConfigMismatchError("the loopbridge server serves another manager")
                yield server.url
            finally:
                server.stop()
        else:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")

    @contextlib.contextmanager
    def _stock(self) -> Iterator[str]:
        """``launch_server``'s ``_setup_and_run_http_server``, on the owner loop."""
        import uvicorn
        from sglang.srt.entrypoints import http_server
        from sglang.srt.environ import envs
        from sglang.srt.parser.template_manager import TemplateManager

        assert self.owner is not None
        http_server.set_global_state(
            http_server._GlobalState(
                tokenizer_manager=self.manager,
                template_manager=TemplateManager(),
                scheduler_info={},
            )
        )
        app = http_server.app
        app.is_single_tokenizer_mode = True
        app.server_args = self.server_args
        app.warmup_thread_kwargs = dict(
            server_args=self.server_args, execute_warmup_func=_skip_warmup
        )
        sock = bind("127.0.0.1", 0)
        config = uvicorn.Config(
            app,
            log_level=_LOG_LEVEL,
            access_log=False,
            timeout_keep_alive=envs.SGLANG_TIMEOUT_KEEP_ALIVE.get(),
            timeout_graceful_shutdown=max(1, round(self.grace)),
        )
        # Not the main thread: uvicorn's own Server would install signal handlers.
        server = thread_server_class()(config)
        started = threading.Event()
        server.on_started = started.set
        serving = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), self.owner.loop)
        try:
            while not started.wait(0.05):
                if serving.done():
                    serving.result()  # its error
                    raise RuntimeError("the stock server stopped before it started")
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            try:
                serving.result(self.grace + 10.0)
            finally:
                sock.close()

    def check_same(self, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The configuration every mode reported (``{mode: {path: json}}``), or
        :class:`ConfigMismatchError` naming what differs."""
        modes = list(reports)
        first = reports[modes[0]]
        for mode in modes[1:]:
            other = reports[mode]
            for path in sorted(set(first) | set(other)):
                a, b = first.get(path), other.get(path)
                if a == b:
                    continue
                keys = (
                    sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                    if isinstance(a, dict) and isinstance(b, dict)
                    else ["(the whole answer)"]
                )
                raise ConfigMismatchError(
                    f"{modes[0]} and {mode} report different {path}: {', '.join(keys)} "
                    "differ; their latencies would not compare"
                )
        return first

    def stop(self) -> None:
        if self.owner is not None:
            with contextlib.suppress(Exception):
                self.owner.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.manager is not None:
            for sock in (self.manager.send_to_scheduler, self.manager.recv_from_detokenizer):
                sock.close(linger=0)
        self._tmp.cleanup()
