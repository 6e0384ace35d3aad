"""The serving process under test: one engine owner loop, one HTTP server per mode.

The engine (a real ``AsyncLLM``) is created on a dedicated owner loop thread,
the way a Ray actor's loop owns it; that loop, and the busy actor's own, is uvloop
when installed, as Ray makes an async actor's loop (``use_uvloop``).  Each mode
gets its own vLLM OpenAI server, on its own thread but for ``on-engine-loop``, all
over the *same* engine, so that the modes differ only in how the HTTP server
reaches the engine:

* ``unsafe``: the raw ``AsyncLLM`` (no race hook installed), with the one
  guard the downstream deployment had before its fix: a lock around the engine
  input socket's ``send_multipart``.  Without it, the HTTP thread's
  ``add_request`` and the owner loop's utility calls (the refit cycle)
  interleave frames on one ZMQ socket, and libzmq aborts the whole process
  (``Assertion failed: !_current_out``);
* ``per-hop``: :class:`~loopbridge_bench.vllm._perhop.PerHopClient`;
* ``loopbridge``: :func:`loopbridge_vllm.engine_client_proxy`;
* ``on-engine-loop``: the same proxy with the server on the engine's owner loop
  (``on_engine_loop=True``): no thread of its own, ``vllm serve``'s topology in
  this process, for an engine on a loop of its own.

The optional *busy actor* load: work in slices that block the actor's loop (what an
output backlog, a training step or unrelated actor methods look like to the loop;
:data:`BUSY_WORK` says what a slice runs: pure Python, which holds the GIL, or
code that releases it, as torch's kernels and a wait on a device do) and a refit-like
``pause_generation(mode="keep")`` / ``resume_generation()`` cycle.  It runs on
the engine's owner loop (the engine built on the busy actor's loop), or on an
actor loop of its own while the engine keeps its loop
(a :class:`loopbridge.LoopThread`): the ``-own-loop``
scenarios.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopbridge import LoopThread
from loopbridge_adapters.http import loop_kind
from loopbridge_adapters.switch_interval import DEFAULT_SWITCH_INTERVAL_S

from ._stages import StageProbe, TimedClient

__all__ = [
    "BUSY_WORK",
    "BusyWork",
    "OURS",
    "THREADED_MODES",
    "BusyLoad",
    "EngineSpec",
    "Stack",
    "engine_args",
    "engine_overrides",
    "kv_cache_info",
    "prepare_model",
]

#: The modes served by a thread of this process (``stock`` is a process of its own).
THREADED_MODES = ("unsafe", "per-hop", "loopbridge", "on-engine-loop")
#: The modes that are loopbridge's own (what the report compares with the baselines).
OURS = ("loopbridge", "on-engine-loop")
SERVED_NAME = "bench"


def _spin(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


#: 64 KiB: CPython's hashlib hashes anything over 2 KiB with the GIL released.
_HASHED = bytes(1 << 16)


def _hash(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        hashlib.sha256(_HASHED).digest()
        n += 1
    return n


def _wait(seconds: float) -> int:
    time.sleep(seconds)
    return 1


@dataclass(frozen=True)
class BusyWork:
    """One kind of ``--busy-work``: what a slice runs while it blocks the actor's loop."""

    describes: str  # for the option's help and the report's first paragraph
    run: Callable[[float], int]  # blocks the calling thread for that many seconds


#: ``--busy-work``, by name: the one table the option, the load and the report read.
BUSY_WORK = {
    "python": BusyWork(
        "pure Python, which holds the GIL, so every other thread waits: the worst case", _spin
    ),
    "native": BusyWork(
        "hashing in C with the GIL released, a core busy, as torch's CPU kernels", _hash
    ),
    "wait": BusyWork(
        "a blocking wait with the GIL released, as a training step waiting on its device", _wait
    ),
}


@dataclass(frozen=True)
class EngineSpec:
    """Which engine to build."""

    model: Path | None  # a local HF model directory (GPU), or None: the CPU stand-in
    cache_dir: Path
    step_s: float  # stand-in step time
    max_num_seqs: int
    max_model_len: int  # 0: the model's own
    engine_args: tuple[tuple[str, Any], ...] = ()
    prefix_caching: bool = False  # off: no request is cheaper for another's prompt
    # vLLM's stats (its default), off unless the stage probe needs the EngineCore's
    # QUEUED / SCHEDULED events; stock's ``vllm serve`` follows the same setting.
    log_stats: bool = False
    env: tuple[tuple[str, str], ...] = ()  # set before the engine starts (its devices)


@dataclass(frozen=True)
class BusyLoad:
    """Extra work on the owner loop (all zero: none)."""

    slice_s: float = 0.0  # work per slice, blocking the loop
    period_s: float = 0.0  # one slice per period
    work: str = "python"  # what a slice runs (a key of BUSY_WORK)
    refit_every_s: float = 0.0  # a pause/resume cycle this often
    refit_pause_s: float = 0.0  # how long generation stays paused
    # When the first refit comes, from the load's start (None: after refit_every_s). A
    # job's closed-loop waves admit their requests together, so whether a pause meets
    # an admission depends on its phase against the waves: the benchmark draws the
    # offset per round and scenario, the same for every mode (see _run).
    first_refit_s: float | None = None

    def __post_init__(self) -> None:
        if self.work not in BUSY_WORK:
            raise ValueError(f"BusyLoad(work={self.work!r}): use one of {', '.join(BUSY_WORK)}")

    @property
    def active(self) -> bool:
        return (self.slice_s > 0 and self.period_s > 0) or (self.refit_every_s > 0)


async def _busy(engine: Any, load: BusyLoad, counters: dict[str, int]) -> None:
    run_slice = BUSY_WORK[load.work].run

    async def cpu() -> None:
        while True:
            run_slice(load.slice_s)
            counters["slices"] += 1
            await asyncio.sleep(max(0.0, load.period_s - load.slice_s))

    async def refit() -> None:
        first = load.first_refit_s
        while True:
            await asyncio.sleep(load.refit_every_s if first is None else first)
            first = None
            try:
                try:
                    await engine.pause_generation(mode="keep", clear_cache=False)
                except Exception:
                    # The engine sets the paused state before it waits for the
                    # device; an executor without that wait fails here, but
                    # generation is paused all the same.
                    counters["refit_pause_errors"] += 1
                await asyncio.sleep(load.refit_pause_s)
            finally:
                # Also when the load stops (a cancel) during the pause call or the
                # resume: the next job must not find the engine paused.
                await _resume(engine)
            counters["refits"] += 1

    loop = asyncio.get_running_loop()
    tasks = []
    if load.slice_s > 0 and load.period_s > 0:
        tasks.append(loop.create_task(cpu()))
    if load.refit_every_s > 0:
        tasks.append(loop.create_task(refit()))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Stack:
    """Engine on its own loop (a :class:`LoopThread`) plus one OpenAI server per mode."""

    def __init__(
        self,
        spec: EngineSpec,
        modes: tuple[str, ...] = THREADED_MODES,
        probe: StageProbe | None = None,
        switch_interval: float | None = DEFAULT_SWITCH_INTERVAL_S,
        use_uvloop: bool | None = None,
    ) -> None:
        self.spec = spec
        # The owner's and the busy actor's loops (LoopThread's choice: None is uvloop when
        # installed, as Ray makes an async actor's loop and vllm serve its engine's).
        self.use_uvloop = use_uvloop
        self.switch_interval = switch_interval  # every server's (see OpenAIServer)
        self.modes = modes
        self.probe = probe  # marks every request's stages (see _stages); None: no cost
        self.owner: LoopThread | None = None
        self.owner_kind: str | None = None  # "uvloop" or "asyncio", once started
        self.actor: LoopThread | None = None  # the busy actor's own loop (own-loop scenarios)
        self.engine: Any = None
        self.servers: dict[str, Any] = {}
        self.restarts = 0
        self._busy: tuple[LoopThread, asyncio.Task[None]] | None = None  # (its loop, task)
        self.busy_counters = {"slices": 0, "refits": 0, "refit_pause_errors": 0}

    @property
    def served_name(self) -> str:
        return SERVED_NAME

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> Stack:
        spec = self.spec
        model_dir = prepare_model(spec)
        # Inherited by the EngineCore the engine spawns (CUDA_VISIBLE_DEVICES):
        # this process itself never initializes CUDA.
        os.environ.update(dict(spec.env))
        self.owner = LoopThread("bench-engine-owner", use_uvloop=self.use_uvloop).start()
        self.owner_kind = loop_kind(self.owner.loop)
        self.engine = self.owner.run(_make_engine, engine_args(spec, model_dir))
        # vLLM's own server caches this at start-up; doing it on the owner loop
        # means the unsafe server needs no utility call from its thread.
        self.owner.run(self.engine.get_supported_tasks)
        if "unsafe" in self.modes:
            _lock_input_socket(self.engine)
        try:
            for mode in self.modes:
                self.servers[mode] = self._start_server(mode)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_server(self, mode: str) -> Any:
        from loopbridge import adopt
        from loopbridge_vllm.engine import engine_client_proxy
        from loopbridge_vllm.server import OpenAIServer, start_openai_server

        from ._perhop import PerHopClient

        assert self.owner is not None
        if mode not in THREADED_MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {THREADED_MODES}")
        on_engine_loop = mode == "on-engine-loop"
        if mode in OURS and self.probe is None:
            return start_openai_server(
                self.engine,
                start_timeout=120,
                switch_interval=self.switch_interval,
                on_engine_loop=on_engine_loop,
            )
        client: Any = self.engine  # unsafe: the raw engine
        if mode == "per-hop":
            client = PerHopClient(self.engine, self.owner.loop)
        elif mode in OURS:
            client = engine_client_proxy(self.engine)
        middleware = []
        if self.probe is not None:
            # Every threaded mode wrapped alike: the same marks, the same cost.
            client = TimedClient(client, self.probe)
            middleware.append(self.probe.middleware())
            if on_engine_loop:  # the wrapper lives on the engine's loop with its server
                adopt(client, loop=self.owner.loop)
        server = OpenAIServer(
            client,
            name=f"bench-http-{mode}",
            middleware=middleware,
            switch_interval=self.switch_interval,
            on_engine_loop=on_engine_loop,
        )
        return server.start(120)

    def kv_cache(self) -> dict[str, Any]:
        """The engine's KV cache as its EngineCore reported it at start-up."""
        return kv_cache_info(self.engine)

    def url(self, mode: str) -> str:
        return str(self.servers[mode].url)

    @property
    def healthy(self) -> bool:
        return self.engine is not None and not self.engine.errored

    def restart(self) -> None:
        """Rebuild everything (after the unsafe mode killed the engine)."""
        self.stop()
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        self.set_busy(None)
        for server in self.servers.values():
            try:
                server.stop(timeout=15)
            except Exception:
                pass
        self.servers = {}
        if self.engine is not None:
            # On the owner loop: the output handler is cancelled there before
            # it can report the EngineCore's exit as an engine failure.
            try:
                if self.owner is not None and self.owner.running:
                    self.owner.run(_shutdown_engine, self.engine)
                else:
                    self.engine.shutdown()
            except Exception:
                pass
            self.engine = None
        if self.owner is not None:
            self.owner.stop()
            self.owner = None
        if self.actor is not None:
            self.actor.stop()
            self.actor = None
        gc.collect()

    # -- busy owner -------------------------------------------------------------
    def set_busy(self, load: BusyLoad | None, own_loop: bool = False) -> None:
        """Start ``load``, or stop the current one (``None``).

        On the engine's owner loop (the engine shares the busy actor's loop), or with
        ``own_loop`` on an actor loop of its own, which reaches the engine through
        loopbridge (the engine keeps its loop to itself).
        """
        if self._busy is not None:
            (runner, task), self._busy = self._busy, None
            if runner.running:
                runner.run(_stop_task, task)
        if load is None or not load.active or self.owner is None:
            return
        engine = self.engine
        runner = self.owner
        if own_loop:
            from loopbridge_vllm.engine import engine_client_proxy

            if self.actor is None:
                self.actor = LoopThread("bench-actor", use_uvloop=self.use_uvloop).start()
            runner, engine = self.actor, engine_client_proxy(self.engine)
        self._busy = (runner, runner.run(_start_task, _busy(engine, load, self.busy_counters)))


def kv_cache_info(engine: Any) -> dict[str, Any]:
    """Blocks, block size and token capacity of ``engine``'s KV cache.

    ``tokens`` is computed as vLLM logs it ("KV cache size: N tokens", which is
    how ``vllm serve``'s is read): the number of max-length requests the blocks
    hold, times ``max_model_len``.
    """
    cache = engine.vllm_config.cache_config
    blocks = int(cache.num_gpu_blocks or 0)
    size = int(cache.block_size)
    mml = int(engine.vllm_config.model_config.max_model_len)
    per_request = -(-mml // size)
    tokens = int(blocks / per_request * mml) if blocks else None
    return {"blocks": blocks or None, "block_size": size, "tokens": tokens}


def engine_overrides(spec: EngineSpec) -> dict[str, Any]:
    """Engine arguments on top of the defaults (the stand-in's, or vLLM's)."""
    overrides: dict[str, Any] = {
        "served_model_name": [SERVED_NAME],
        "max_num_seqs": spec.max_num_seqs,
        "disable_log_stats": not spec.log_stats,
        "enable_prefix_caching": spec.prefix_caching,
    }
    if spec.max_model_len:
        overrides["max_model_len"] = spec.max_model_len
    overrides.update(dict(spec.engine_args))
    return overrides


def engine_args(spec: EngineSpec, model_dir: Path) -> Any:
    """The ``AsyncEngineArgs`` the threaded stack's engine is built from."""
    if spec.model is None:
        from loopbridge_vllm.cpu_engine import engine_args as standin_args

        return standin_args(model_dir, **engine_overrides(spec))
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(model=str(model_dir), **engine_overrides(spec))


def prepare_model(spec: EngineSpec) -> Path:
    """The model directory; for the stand-in also the CPU environment of its engines.

    The environment (``os.environ``) is inherited by every EngineCore spawned
    after this, in this process or in a ``vllm serve`` child.
    """
    if spec.model is not None:
        return spec.model
    from loopbridge_vllm.cpu_engine import STEP_ENV, build_tiny_model, cpu_engine_env

    cpu_engine_env(spec.cache_dir / "vllm")
    os.environ[STEP_ENV] = repr(spec.step_s)  # read by the spawned EngineCore
    return build_tiny_model(spec.cache_dir / "tiny-model")


def _lock_input_socket(engine: Any) -> None:
    """Serialize sends on the engine's input socket (see the module docstring)."""
    sock = engine.engine_core.input_socket
    target = getattr(sock, "_shadow_sock", sock)  # zmq.asyncio sends through its shadow
    send = target.send_multipart
    lock = threading.Lock()

    def locked_send(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return send(*args, **kwargs)

    target.send_multipart = locked_send


async def _shutdown_engine(engine: Any) -> None:
    handler = getattr(engine, "output_handler", None)
    if isinstance(handler, asyncio.Task) and not handler.done():
        handler.cancel()
        try:
            await handler
        except BaseException:
            pass
    engine.shutdown()


async def _resume(engine: Any) -> None:
    """``engine.resume_generation()`` to its end, whatever cancels the caller meanwhile
    (the caller's cancel is raised once the resume is done)."""
    resume = asyncio.ensure_future(engine.resume_generation())
    cancelled = False
    while not resume.done():
        try:
            await asyncio.shield(resume)
        except asyncio.CancelledError:
            cancelled = True
    resume.result()
    if cancelled:
        raise asyncio.CancelledError


async def _start_task(coro: Any) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro)


async def _stop_task(task: asyncio.Task[None]) -> None:
    # Wait for its cleanup (resume_generation) before the next scenario starts.
    task.cancel()
    try:
        await task
    except BaseException:
        pass


async def _make_engine(args: Any) -> Any:
    # On the running (owner) loop: the engine's output handler starts there.
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)
