"""Drive one real vLLM DP=2 group through forced races and refit cycles.

Run by ``test_real_group.py`` as its own process session (so that a hung group
is killed as one process group): ``python dp_group_driver.py EVENTS MODEL
SCENARIO...``.  The group is two ``DPEngineCoreProc`` engine cores, the DP
coordinator and a gloo DP group behind a real ``AsyncLLM``, on the stand-in
executor.  Whether the pause-aware filter is installed is decided only by the
environment the engine cores inherit (``LOOPBRIDGE_DP_FILTER``), i.e. by the
package's vLLM plugin.

Each step appends one JSON line to EVENTS, so the parent sees progress and
can tell a hang (no line for a while) from a slow start.  Every wait here is
bounded; a scenario whose request does not finish within ``HANG_S`` after
the group was up reports ``finished: false`` and the driver stops (a group
blocked in a gloo collective cannot be used or shut down any more).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

#: A request that does not finish within this many seconds, on a group that
#: finishes the same request in well under a second when healthy, is stuck.
HANG_S = float(os.environ.get("LOOPBRIDGE_DP_HANG_S", "25"))
#: Bound for each step that must complete (pause, resume, a probe).
STEP_S = float(os.environ.get("LOOPBRIDGE_DP_STEP_S", "90"))
CYCLES = 5
#: How long finding 1's gate waits for the wave start (0.32: milliseconds).
GATE_S = 15.0

_T = TypeVar("_T")


class Driver:
    def __init__(self, events: Path, llm: Any) -> None:
        self.events = events
        self.llm = llm
        self.client = llm.engine_core
        self.engines = self.client.core_engines
        self.ids = 0
        self.warm = False

    def emit(self, event: str, **data: Any) -> None:
        with self.events.open("a") as f:
            f.write(json.dumps({"event": event, "t": time.monotonic(), **data}) + "\n")

    async def bounded(self, what: str, aw: Awaitable[_T], timeout: float = STEP_S) -> _T:
        try:
            result = await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError:
            self.emit("stuck", step=what, after_s=timeout)
            raise
        self.emit("step", step=what)
        return result

    async def util(self, rank: int, method: str, *args: Any) -> Any:
        return await self.client._call_utility_async(method, *args, engine=self.engines[rank])

    async def probe(self, rank: int) -> dict[str, Any]:
        state: dict[str, Any] = await self.bounded(
            f"probe r{rank}", self.util(rank, "loopbridge_probe")
        )
        return state

    async def send(self, rank: int, max_tokens: int = 4) -> Any:
        """Send one request routed to ``rank``; returns once the ADD is sent."""
        from vllm import SamplingParams

        self.ids += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        return await self.llm.add_request(
            f"r{self.ids}", "hello world", params, data_parallel_rank=rank
        )

    @staticmethod
    async def finish(collector: Any) -> str:
        """The finish reason of a sent request: ``length``, ``abort``, or
        ``engine_paused`` (0.33 rejects new requests during abort/wait pauses
        with this retryable error)."""
        while True:
            try:
                out = await collector.get()
            except Exception as e:
                if "engine_paused" in repr(e) or "paused" in str(e).lower():
                    return "engine_paused"
                raise
            if out.finished:
                return str(out.outputs[0].finish_reason)

    async def generate(self, rank: int, max_tokens: int = 4) -> str:
        return await self.finish(await self.send(rank, max_tokens))

    async def gate(self, rank: int, kind: str, timeout: float = STEP_S) -> asyncio.Task[Any]:
        """Hold ``rank``'s busy loop until a ``kind`` message is queued there
        (the task's result says whether one came within ``timeout``)."""
        started = Path(tempfile.mkdtemp(prefix="gate-")) / "started"
        task = asyncio.ensure_future(
            self.util(rank, "loopbridge_gate", kind, timeout, str(started))
        )
        deadline = time.monotonic() + STEP_S
        while not started.exists():  # poll with a deadline: the gate is in place
            if time.monotonic() > deadline or task.done():
                raise RuntimeError("gate did not start")
            await asyncio.sleep(0.01)
        return task

    async def warm_up(self) -> None:
        # The first request starts the client's stats task; a FIRST_REQ sent
        # while that task's socket is still connecting can be lost, so the
        # forced races start only once a request has gone through.
        if not self.warm:
            await self.bounded("warm-up request", self.generate(1))
            self.warm = True

    async def pause_all(self, mode: str = "keep") -> None:
        await self.bounded(f"pause {mode}", self.llm.pause_generation(mode=mode, clear_cache=False))

    async def wait_request(self, task: asyncio.Task[str]) -> str | None:
        done, _ = await asyncio.wait({task}, timeout=HANG_S)
        return task.result() if done else None

    def report(self, scenario: str, reason: str | None, **data: Any) -> None:
        """Emit a race's result; stop if its request is stuck (the group is
        wedged in a gloo collective: the parent kills it)."""
        self.emit("result", scenario=scenario, finished=reason is not None, reason=reason, **data)
        if reason is None:
            raise SystemExit(0)

    # --- scenarios -------------------------------------------------------

    async def serve(self) -> None:
        """One request to each rank, or how the group stops instead (a rank
        without the filter stops a filtered group at start-up: P5)."""
        tasks = [asyncio.ensure_future(self.generate(rank)) for rank in (0, 1)]
        deadline = time.monotonic() + STEP_S
        # Poll with a deadline: the engine's death shows in ``errored``, not
        # necessarily in the requests' collectors.
        while not all(t.done() for t in tasks) and not self.llm.errored:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        if all(t.done() and t.exception() is None for t in tasks):
            reasons = [t.result() for t in tasks]
            self.emit("result", scenario="serve", finished=True, reasons=reasons, error=None)
            return
        error = type(self.llm.dead_error).__name__ if self.llm.errored else "TimeoutError"
        for t in tasks:
            t.cancel()
        self.emit("result", scenario="serve", finished=False, error=error)
        raise SystemExit(0)

    async def finding1(self) -> None:
        """Resume reaches rank 0; a request to rank 0 while the client sees the
        engines idle makes the stats task send FIRST_REQ; its START_DP_WAVE
        reaches rank 1 (still latched from the pause) before rank 1's resume.

        On 0.33 only engines start waves: rank 0 handles the request after the
        resume barrier, i.e. after rank 1's resume, so no wave start can reach
        rank 1 first; the gate then gives up after ``GATE_S`` and the scenario
        shows that the request finishes."""
        await self.warm_up()
        await self.pause_all("keep")
        gate = await self.gate(1, "START_DP_WAVE", GATE_S)
        resume0 = asyncio.ensure_future(self.util(0, "resume_scheduler"))
        request = asyncio.ensure_future(self.generate(0))
        gated = await self.bounded("START_DP_WAVE queued on r1", gate)
        resume1 = asyncio.ensure_future(self.util(1, "resume_scheduler"))
        await self.bounded("resume both", asyncio.gather(resume0, resume1))
        reason = await self.wait_request(request)
        r1 = await self.probe(1)
        self.report("finding1", reason, gated=gated, rank1=r1)

    async def dup_resume(self) -> None:
        """A duplicate resume reaches idle rank 1 before the wave start of a
        request that keeps rank 0 busy; rank 0 gets its copy afterwards."""
        await self.warm_up()
        gate = await self.gate(1, "START_DP_WAVE")
        dup1 = asyncio.ensure_future(self.util(1, "resume_scheduler"))
        request = asyncio.ensure_future(self.generate(0))
        gated = await self.bounded("START_DP_WAVE queued on r1", gate)
        dup0 = asyncio.ensure_future(self.util(0, "resume_scheduler"))
        reason = await self.wait_request(request)
        replies = await asyncio.wait({dup0, dup1}, timeout=HANG_S)
        errors = [repr(t.exception()) for t in replies[0] if t.exception() is not None]
        self.report(
            "dup_resume",
            reason,
            gated=gated,
            resumes_answered=len(replies[0]),
            resume_errors=errors,
        )

    async def refit(self) -> None:
        """CYCLES x (pause keep/abort/wait, collective_rpc, resume) under load."""
        reasons: list[str] = []
        modes = ("keep", "abort", "wait")
        for cycle in range(CYCLES):
            mode = modes[cycle % 3]
            before = [await self.send(r, 24) for r in (0, 1, 0, 1)]
            await self.pause_all(mode)
            during = [await self.send(r, 8) for r in (0, 1)]  # sent while paused
            await self.bounded(
                f"collective_rpc c{cycle}", self.llm.collective_rpc("standin_tokens")
            )
            await self.bounded(f"resume c{cycle}", self.llm.resume_generation())
            after = [await self.send(r, 8) for r in (1, 0)]
            done = await self.bounded(
                f"requests c{cycle}",
                asyncio.gather(*(self.finish(c) for c in before + during + after)),
            )
            reasons += done
            self.emit("cycle", cycle=cycle, mode=mode, reasons=done)
        probes = [await self.probe(r) for r in (0, 1)]
        unfinished = self.llm.output_processor.get_num_unfinished_requests()
        self.emit(
            "result",
            scenario="refit",
            cycles=CYCLES,
            reasons=reasons,
            ranks=probes,
            client_unfinished=unfinished,
        )


def mixtral_model(tiny: Path, out: Path) -> Path:
    """The tiny Llama's files with a 2-expert Mixtral ``config.json``."""
    out.mkdir(parents=True, exist_ok=True)
    for item in tiny.iterdir():
        if item.name != "config.json" and not (out / item.name).exists():
            (out / item.name).symlink_to(item.resolve())
    cfg = json.loads((tiny / "config.json").read_text())
    cfg.update(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=None,
    )
    (out / "config.json").write_text(json.dumps(cfg))
    return out


async def main(events: Path, model: Path, scenarios: list[str]) -> None:
    from loopbridge_vllm.cpu_engine import cpu_engine_env, engine_args

    cpu_engine_env()
    # Each stand-in forward takes a few ms, so requests are still in flight
    # when a pause arrives (abort mode then has something to abort).
    os.environ.setdefault("LOOPBRIDGE_STANDIN_STEP_S", "0.005")
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.monotonic()
    llm = AsyncLLM.from_engine_args(engine_args(model, data_parallel_size=2))
    d = Driver(events, llm)
    pids = [p.pid for p in llm.engine_core.resources.engine_manager.processes]
    d.emit("up", start_s=time.monotonic() - t0, engine_pids=pids, pid=os.getpid())
    for name in scenarios:
        await getattr(d, name)()
    llm.shutdown()
    d.emit("done")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]))
