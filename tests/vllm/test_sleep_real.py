"""``sleep(level=1)`` and ``wake_up()`` through the proxy while HTTP traffic is open.

The reference is stock vLLM: the same scenario run on the raw ``AsyncLLM``
on its owner loop, with no loopbridge in the way. Through the proxy, from a
trainer thread, with the requests arriving over the threaded OpenAI server,
every request must end the way it ends there:

* requests in flight when ``sleep`` is called are aborted (mode ``abort``,
  vLLM's default) or kept and finished after the wake-up (mode ``keep``);
* requests sent while the engine sleeps are accepted and queued: they get no
  token before ``wake_up`` and finish after it;
* nothing is lost or duplicated: each request ends once, a finished one has
  exactly the tokens an undisturbed request has, and the engine's
  unfinished-request counts return to 0.

The stand-in worker refuses a forward while asleep (and counts the attempt),
so an engine that stepped during sleep fails here instead of passing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from vllm_engines import settled_counts, unfinished_requests, wake_up_says_awake

from loopbridge import LoopThread, blocking
from loopbridge_vllm import OpenAIServer

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release

IN_FLIGHT = 4  # streams open when sleep is called
DURING = 4  # requests sent while the engine sleeps
MAX_TOKENS = 24
STEP_S = 0.01  # per engine step: in-flight requests live >= 0.24 s
MODES = ["abort", "keep"]


@dataclass
class Outcome:
    """How one request ended: finish reason, text, outputs before wake-up."""

    finish: str | None = None
    text: str = ""
    ends: int = 0  # final outputs seen: exactly 1 for every request
    before_wake: int = 0  # outputs that arrived before wake_up was called


@dataclass
class Run:
    in_flight: list[Outcome]
    during: list[Outcome]
    sleep_state: tuple[Any, ...]  # the worker's (level, forwards attempted) while asleep
    slept: bool
    awake: bool

    def summary(self) -> tuple[Any, ...]:
        return (
            sorted(str(o.finish) for o in self.in_flight),
            sorted(str(o.finish) for o in self.during),
            [o.ends for o in self.in_flight + self.during],
            [o.before_wake for o in self.during],
            self.sleep_state,
            self.slept,
            self.awake,
        )


async def wait_until(cond: Callable[[], Awaitable[bool]], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.005)  # the poll interval of a condition, not a wait for it


@pytest.fixture
def slow_steps(engine_proxy: Any) -> Iterator[None]:
    engine = blocking(engine_proxy)
    engine.collective_rpc("standin_set_step_s", args=(STEP_S,))
    yield
    if engine.is_sleeping():
        engine.wake_up()  # never leave the shared engine asleep
    engine.resume_generation()
    engine.collective_rpc("standin_set_step_s", args=(0.0,))


def reference(engine_proxy: Any) -> tuple[str, int]:
    """The text and token count of one undisturbed request (the stand-in's
    output depends only on how many tokens a request has generated)."""
    from vllm import SamplingParams

    async def main() -> tuple[str, int]:
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        outs = [o async for o in engine_proxy.generate("sleep reference", params, "sleep-ref")]
        return outs[-1].outputs[0].text, len(outs[-1].outputs[0].token_ids)

    return asyncio.run(main())


# -- stock: the raw engine on its owner loop -----------------------------------


async def stock_scenario(llm: Any, mode: str) -> Run:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    woke = asyncio.Event()

    async def one(rid: str, out: Outcome, started: asyncio.Event | None) -> None:
        async for o in llm.generate(f"sleep {rid}", params, rid):
            if not woke.is_set():
                out.before_wake += 1
            if started is not None and o.outputs[0].text:
                started.set()
            if o.finished:
                out.ends += 1
                out.finish = o.outputs[0].finish_reason
            out.text = o.outputs[0].text  # cumulative

    in_flight = [Outcome() for _ in range(IN_FLIGHT)]
    started = [asyncio.Event() for _ in range(IN_FLIGHT)]
    tasks = [
        asyncio.create_task(one(f"stock-{mode}-a{i}", in_flight[i], started[i]))
        for i in range(IN_FLIGHT)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    await llm.sleep(level=1, mode=mode)
    slept = await llm.is_sleeping()
    during = [Outcome() for _ in range(DURING)]
    tasks += [
        asyncio.create_task(one(f"stock-{mode}-d{i}", during[i], None)) for i in range(DURING)
    ]
    held = IN_FLIGHT + DURING if mode == "keep" else DURING

    async def accepted() -> bool:
        return bool(unfinished_requests(llm) == held)

    await wait_until(accepted, "requests sent during sleep never reached the engine")
    [state] = await llm.collective_rpc("standin_sleep_state")
    woke.set()
    awake = await llm.wake_up()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return Run(in_flight, during, tuple(state), slept, awake)


# -- loopbridge: proxy from a trainer thread, requests over HTTP ----------------


async def http_scenario(url: str, engine_proxy: Any, mode: str) -> Run:
    engine = blocking(engine_proxy)  # the trainer's face: a plain thread, not the owner
    woke = asyncio.Event()
    body = {
        "model": "tiny",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }

    async def one(
        client: httpx.AsyncClient, rid: str, out: Outcome, started: asyncio.Event | None
    ) -> None:
        req = dict(body, prompt=f"sleep {rid}")
        async with client.stream("POST", "/v1/completions", json=req) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if not woke.is_set():
                    out.before_wake += 1
                if "error" in chunk:
                    out.ends += 1
                    out.finish = f"error {chunk['error']}"
                    if started is not None:
                        started.set()
                for choice in chunk.get("choices", ()):
                    out.text += choice.get("text") or ""
                    if started is not None and out.text:
                        started.set()
                    if choice.get("finish_reason") is not None:
                        out.ends += 1
                        out.finish = choice["finish_reason"]

    limits = httpx.Limits(max_connections=IN_FLIGHT + DURING)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        in_flight = [Outcome() for _ in range(IN_FLIGHT)]
        started = [asyncio.Event() for _ in range(IN_FLIGHT)]
        tasks = [
            asyncio.create_task(one(client, f"a{i}", in_flight[i], started[i]))
            for i in range(IN_FLIGHT)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
        await asyncio.to_thread(engine.sleep, level=1, mode=mode)
        slept = await asyncio.to_thread(engine.is_sleeping)
        during = [Outcome() for _ in range(DURING)]
        tasks += [asyncio.create_task(one(client, f"d{i}", during[i], None)) for i in range(DURING)]
        held = IN_FLIGHT + DURING if mode == "keep" else DURING

        async def accepted() -> bool:
            return bool(unfinished_requests(engine_proxy) == held)

        await wait_until(accepted, "requests sent during sleep never reached the engine")
        [state] = await asyncio.to_thread(engine.collective_rpc, "standin_sleep_state")
        woke.set()
        awake = await asyncio.to_thread(engine.wake_up)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return Run(in_flight, during, tuple(state), slept, awake)


@pytest.mark.parametrize("mode", MODES)
def test_sleep_and_wake_up_under_http_traffic_match_stock(
    mode: str,
    shared_engine: tuple[LoopThread, Any],
    engine_proxy: Any,
    shared_server: OpenAIServer,
    slow_steps: None,
) -> None:
    owner, llm = shared_engine
    awake = True if wake_up_says_awake() else None  # wake_up()'s answer on this release
    ref, count = reference(engine_proxy)
    assert count == MAX_TOKENS and ref

    stock = owner.run(lambda: stock_scenario(llm, mode))
    assert owner.run(lambda: settled_counts(llm)) == (0, 0)
    ours = asyncio.run(http_scenario(shared_server.url, engine_proxy, mode))
    assert owner.run(lambda: settled_counts(llm)) == (0, 0)

    # What stock vLLM does, spelled out, so that the comparison cannot pass
    # on two equally wrong runs.
    kept = "length" if mode == "keep" else "abort"
    assert stock.summary() == (
        [kept] * IN_FLIGHT,
        ["length"] * DURING,
        [1] * (IN_FLIGHT + DURING),
        [0] * DURING,  # nothing before the wake-up
        (1, 0),  # asleep at level 1; no forward was attempted
        True,  # is_sleeping() after sleep
        awake,
    )
    assert ours.summary() == stock.summary()
    for run in (stock, ours):
        for out in run.during + (run.in_flight if mode == "keep" else []):
            assert out.text == ref  # no token lost or repeated across the sleep
        for out in run.in_flight if mode == "abort" else []:
            assert ref.startswith(out.text) and len(out.text) < len(ref)
    [state] = blocking(engine_proxy).collective_rpc("standin_sleep_state")
    assert tuple(state) == (None, 0)
    assert not engine_proxy.errored


def test_requests_after_wake_up_are_served(
    engine_proxy: Any, shared_server: OpenAIServer, slow_steps: None
) -> None:
    engine = blocking(engine_proxy)
    engine.sleep(level=1)
    assert engine.is_sleeping()
    assert engine.wake_up() is (True if wake_up_says_awake() else None)
    assert not engine.is_sleeping()
    resp = httpx.post(
        f"{shared_server.url}/v1/completions",
        json={"model": "tiny", "prompt": "after", "max_tokens": 4, "ignore_eos": True},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["finish_reason"] == "length"
