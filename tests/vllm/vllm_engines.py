"""Engine start-up helpers shared by the vLLM tests (no fixtures here), and the
stream reader and wait of the Ray tests that stream over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopbridge import LoopThread, unwrap

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"

# Hang guards for ray.get, not expectations: an actor that dies fails ray.get at
# once.  On a loaded 2-core CI machine an engine's start inside an actor has
# taken over 180 s, so the guards sit just under the lanes' 600 s per test.
RAY_START_GUARD_S = 500
RAY_CALL_GUARD_S = 300


@dataclass
class Stream:
    """What one streamed completion gave: its tokens, how it ended, the ids of
    its responses; ``first`` is set at its first token (or its end)."""

    ids: list[int] = field(default_factory=list)
    finish: str | None = None
    error: BaseException | None = None
    request_ids: set[str] = field(default_factory=set)
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def read_stream(start: Awaitable[Any], out: Stream) -> None:
    """Read the chunks of a streamed ``openai`` completion or chat completion
    (``start``: its ``create(..., stream=True)``) into ``out``; an API error,
    at the start or mid-stream, ends up in ``out.error``."""
    import openai

    try:
        stream = await start
        async for chunk in stream:
            out.request_ids.add(chunk.id)
            for choice in chunk.choices:
                out.ids += (choice.model_extra or {}).get("token_ids") or []
                out.finish = choice.finish_reason or out.finish
            if out.ids:
                out.first.set()
    except openai.APIError as exc:
        out.error = exc
    finally:
        out.first.set()
        out.done.set()


async def until(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = RAY_CALL_GUARD_S
) -> None:
    """Ask ``check`` again until it holds; ``TimeoutError(what)`` after ``timeout``.

    A poll, kept for what no event announces: how many requests a Ray actor's
    engine holds (requests sent during a pause reach it with no reply to the
    client, vLLM signals nothing when one is added, and an actor pushes nothing
    to its caller). The bound is a hang guard."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.01)  # the poll interval, not a wait for the condition


def _async_llm() -> Any:
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM


def has_member(name: str) -> bool:
    """Whether the installed release's ``AsyncLLM`` has ``name``: 0.29 lacks
    ``shutdown_weight_transfer_engine``, 0.24 also the weight versions,
    ``check_admission`` and ``get_num_unfinished_requests``."""
    return hasattr(_async_llm(), name)


def wake_up_says_awake() -> bool:
    """``wake_up()`` returns whether the engine is awake from 0.32; None before."""
    return "bool" in str(inspect.signature(_async_llm().wake_up).return_annotation)


def finish_weight_update(engine: Any, version: str) -> None:
    """``finish_weight_update`` with the version where the release takes one (0.29+)."""
    if "weight_version" in inspect.signature(_async_llm().finish_weight_update).parameters:
        engine.finish_weight_update(weight_version=version)
    else:
        engine.finish_weight_update()


def unfinished_requests(engine: Any) -> int:
    """``get_num_unfinished_requests()`` (0.29+; through a proxy too), else the
    output processor's own count (0.24): a len() of its dict either way."""
    if has_member("get_num_unfinished_requests"):
        return int(engine.get_num_unfinished_requests())
    return int(unwrap(engine).output_processor.get_num_unfinished_requests())


async def settled_counts(llm: Any) -> tuple[int, int]:
    """(front-end unfinished, EngineCore-side active) requests, on the owner loop,
    once the caller has seen every request it made end. Nothing here waits for
    the counts to fall: each read is ordered after what it must see.

    The front end's count is final at once: vLLM's output processor drops a
    request in the same synchronous pass that queues its final output, and
    ``abort`` drops it before it sends the abort to the EngineCore (a call
    cancelled or a stream closed through loopbridge returns only after that
    abort ran).

    The worker (the stand-in's count) hears of a finish or an abort only with
    the scheduler's next step, so a round trip right after an abort still finds
    the request there. A one-token probe request goes first: it leaves on the
    same input socket as the aborts, behind them; the EngineCore handles its
    inputs in that order, and the first step that schedules the probe hands the
    worker every finish collected before it. Once the probe's output is here the
    worker holds at most the probe, which is not counted.
    """
    from vllm import SamplingParams

    front = unfinished_requests(llm)
    probe = f"settle-probe-{uuid.uuid4().hex}"
    async for _ in llm.generate("probe", SamplingParams(max_tokens=1), probe):
        pass
    [held] = await llm.collective_rpc("standin_active_request_ids")
    # The worker sees the internal id: the request id, or it with a suffix.
    core = [rid for rid in held if rid != probe and not rid.startswith(f"{probe}-")]
    return front, len(core)


def start_engine(model: Path, name: str, **overrides: Any) -> tuple[LoopThread, Any]:
    """An ``AsyncLLM`` created on (and so owned by) a fresh loop thread."""
    from loopbridge_vllm.cpu_engine import make_async_llm

    owner = LoopThread(name).start()
    try:
        llm = owner.run(lambda: make_async_llm(model, **overrides))
    except BaseException:
        owner.stop()
        raise
    return owner, llm


def stop_engine(owner: LoopThread, llm: Any) -> None:
    from loopbridge_vllm import shutdown_engine

    shutdown_engine(llm)
    owner.stop(30)
    gc.collect()


def serve_env() -> dict[str, str]:
    """The environment for a server process, with this tree's sources first."""
    env = dict(os.environ)
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """A server process (ours or stock ``vllm serve``) whose merged output is read
    line by line on a thread; :meth:`wait_for` blocks until a line matches."""

    def __init__(self, argv: list[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            argv,
            env=serve_env(),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # one process group: the server and its EngineCore
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # end of output
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match[str]:
        """The first match of ``pattern`` in a line from index ``start`` on."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if match := regex.search(line):
                        return match
                seen = len(self.lines)
                ended = bool(self.lines) and self.lines[-1] == ""
                left = deadline - time.monotonic()
                if ended or left <= 0:
                    tail = "".join(self.lines[-40:])
                    raise AssertionError(f"no line matches {pattern!r}; output ends:\n{tail}")
                self._changed.wait(left)

    def stop(self, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # an EngineCore left behind
        self.proc.wait(10)
        self._reader.join(10)
