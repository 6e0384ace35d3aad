"""The engine behind ``python -m loopbridge_sglang serve``: launched, then shut down.

:func:`launch` runs on the owner loop's thread, so the ``TokenizerManager`` is built
there and its ``handle_loop`` starts there on the first request. It launches SGLang's
own scheduler and detokenizer processes from the server arguments, as SGLang's
launcher does (``Engine._launch_subprocesses``), or, with ``standin=True``, the CPU
stand-in scheduler of :mod:`loopbridge_sglang.cpu_manager` in their place.

:meth:`Launched.shutdown` undoes it, called from another thread once the HTTP server
has stopped: first, on the owner loop, the manager's own tasks (``handle_loop``) are
cancelled and its sockets closed there (a socket closed under a pending receive on
another thread's loop raises there); then, in SGLang's own order (``Engine.shutdown``),
the subprocess watchdog, the child processes and the manager's other parts. It never
raises, so a command's ``finally`` always reaches the owner loop's stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from loopbridge import LoopThread

__all__ = ["Launched", "launch"]

_log = logging.getLogger("loopbridge_sglang.serve")


@dataclasses.dataclass
class Launched:
    """A running manager, what its app needs, and how to stop what was started."""

    manager: Any
    template_manager: Any
    scheduler_info: dict[str, Any]
    _stops: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def shutdown(self, owner: LoopThread) -> None:
        try:
            owner.run(_quiesce, self.manager)
        except Exception:
            _log.exception("stopping the TokenizerManager on its owner loop failed")
        for stop in self._stops:
            try:
                stop()
            except Exception:  # one failed step must not leave the others undone
                _log.exception("engine shutdown step %s failed", getattr(stop, "__name__", stop))
        self._stops.clear()


async def _quiesce(manager: Any) -> None:
    """On the owner loop: end the manager's tasks, then close its sockets."""
    tasks = [task for task in manager.asyncio_tasks if not task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for sock in (manager.send_to_scheduler, manager.recv_from_detokenizer):
        with contextlib.suppress(Exception):
            sock.close(linger=0)


async def launch(server_args: Any, standin: bool) -> Launched:
    """On the owner loop: start the engine for ``server_args`` (see the module doc)."""
    return _launch_standin(server_args) if standin else _launch_sglang(server_args)


def _launch_sglang(server_args: Any) -> Launched:
    from sglang.srt.entrypoints.engine import Engine, init_tokenizer_manager
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process
    from sglang.srt.managers.scheduler import run_scheduler_process
    from sglang.srt.utils import kill_process_tree

    # What SGLang's launch_server does before serving: the same launcher, the same
    # process functions.
    manager, template_manager, _ports, init_result, watchdog, daemons = Engine._launch_subprocesses(
        server_args=server_args,
        init_tokenizer_manager_func=init_tokenizer_manager,
        run_scheduler_process_func=run_scheduler_process,
        run_detokenizer_process_func=run_detokenizer_process,
    )
    if manager is None:  # a node of rank >= 1 (refused before) or SGLang's Rust server
        raise RuntimeError(
            "SGLang's launcher started no TokenizerManager (SGLANG_RUST_SERVER set?): "
            "nothing to serve; unset it, or use stock `python -m sglang.launch_server`"
        )
    manager._subprocess_watchdog = watchdog  # as launch_server: SGLang's SIGQUIT path reads it
    launched = Launched(manager, template_manager, dict(init_result.scheduler_infos[0]))

    def stop_watchdog() -> None:
        if watchdog is not None:
            watchdog.stop()

    def stop_grpc() -> None:
        init_result.stop_grpc_server()

    def stop_daemons() -> None:
        if daemons:
            Engine._terminate_weight_cache_daemons(daemons)

    def stop_children() -> None:
        kill_process_tree(os.getpid(), include_parent=False, wait_timeout=60)

    def stop_manager_parts() -> None:
        mm_processor = getattr(manager, "mm_processor", None)
        if mm_processor is not None:
            mm_processor.shutdown()
        manager.cuda_vmm_feature_transport.shutdown()

    launched._stops += [stop_watchdog, stop_grpc, stop_daemons, stop_children, stop_manager_parts]
    return launched


def _launch_standin(server_args: Any) -> Launched:
    from sglang.srt.parser.template_manager import TemplateManager

    from .cpu_manager import StandInScheduler, manager_for

    ipc_dir = tempfile.mkdtemp(prefix="lb-sgl-serve-")
    try:
        manager, ports = manager_for(server_args, ipc_dir)
        scheduler = StandInScheduler(ports).start()
    except BaseException:
        shutil.rmtree(ipc_dir, ignore_errors=True)
        raise
    info = {"max_req_input_len": manager.max_req_input_len, "standin_scheduler": True}
    launched = Launched(manager, TemplateManager(), info)

    launched._stops += [scheduler.stop, lambda: shutil.rmtree(ipc_dir, ignore_errors=True)]
    return launched
