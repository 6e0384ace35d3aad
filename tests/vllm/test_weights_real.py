"""Pause, weight update (collective_rpc) and resume from a trainer thread or another loop.

The stand-in worker's ``standin_set_token_base`` plays the weight update: it
changes which token ids the engine emits, so the effect is observable in
later requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_engines import unfinished_requests
from vllm_load import run_load

from loopbridge import LoopAffinityError, LoopThread, blocking
from loopbridge_vllm import OpenAIServer, adopt_engine, bind_owner_loop

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release


def _first_tokens(proxy: Any, rid: str, n: int = 3) -> list[int]:
    from vllm import SamplingParams

    async def main() -> list[int]:
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        outs = [o async for o in proxy.generate("weights", params, rid)]
        return list(outs[-1].outputs[0].token_ids)

    return asyncio.run(main())


@pytest.fixture
def restore_weights(engine_proxy: Any) -> Iterator[None]:
    yield
    engine = blocking(engine_proxy)
    engine.resume_generation()  # never leave the shared engine paused
    engine.collective_rpc("standin_set_token_base", args=(10,))
    engine.collective_rpc("standin_set_step_s", args=(0.0,))


def test_update_from_trainer_thread_under_http_load(
    engine_proxy: Any, shared_server: OpenAIServer, restore_weights: None
) -> None:
    engine = blocking(engine_proxy)
    # 10 ms per engine step: each request lives >= 0.16 s, so the pause below
    # certainly lands on requests in flight.
    engine.collective_rpc("standin_set_step_s", args=(0.01,))
    trainer_log: list[str] = []
    errors: list[BaseException] = []
    in_flight: list[int] = []

    def trainer() -> None:
        try:
            deadline = time.monotonic() + 20
            while unfinished_requests(engine_proxy) < 8:
                if time.monotonic() > deadline:
                    raise TimeoutError("load never reached the engine")
                time.sleep(0.002)
            engine.pause_generation(mode="keep")
            in_flight.append(unfinished_requests(engine_proxy))
            trainer_log.append(f"paused={engine.is_paused()}")
            old = engine.collective_rpc("standin_set_token_base", args=(40,))
            trainer_log.append(f"old={old}")
            engine.resume_generation()
            trainer_log.append(f"paused={engine.is_paused()}")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    try:
        result = asyncio.run(
            run_load(
                shared_server.url, 160, 16, stream_fraction=0.5, max_tokens=16, seed=3, timeout=30
            )
        )
    finally:
        thread.join(30)
    assert not errors and not thread.is_alive()
    assert trainer_log == ["paused=True", "old=[10]", "paused=False"]
    # Requests were in flight during the pause, were kept, and none failed.
    assert in_flight and in_flight[0] > 0
    assert result.failures == [] and result.ok == 160
    engine.collective_rpc("standin_set_step_s", args=(0.0,))
    assert _first_tokens(engine_proxy, "after-update") == [40, 41, 42]


def test_update_from_another_event_loop(engine_proxy: Any, restore_weights: None) -> None:
    async def refit() -> tuple[bool, list[int], bool]:
        await engine_proxy.pause_generation(mode="abort")
        paused = await engine_proxy.is_paused()
        old = await engine_proxy.collective_rpc("standin_set_token_base", args=(60,))
        await engine_proxy.resume_generation()
        return paused, old, await engine_proxy.is_paused()

    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.update(result=asyncio.run(refit())))
    thread.start()
    thread.join(30)
    assert box["result"] == (True, [10], False)
    assert _first_tokens(engine_proxy, "after-loop-update") == [60, 61, 62]


def test_worker_errors_come_back_to_the_trainer(engine_proxy: Any) -> None:
    with pytest.raises(Exception, match="token base must be in"):
        blocking(engine_proxy).collective_rpc("standin_set_token_base", args=(999,))
    assert not engine_proxy.errored


def test_blocking_on_the_owner_thread_is_refused(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    owner, _ = shared_engine

    async def on_owner() -> None:
        blocking(engine_proxy).is_paused()

    with pytest.raises(LoopAffinityError):
        owner.run(on_owner)

    async def awaited_on_owner() -> bool:
        return bool(await engine_proxy.is_paused())  # same loop: straight through

    assert owner.run(awaited_on_owner) is False


def test_owner_loop_is_recorded_once_and_never_moved(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    owner, llm = shared_engine
    assert adopt_engine(llm) is llm  # idempotent
    bind_owner_loop(llm, owner.loop)  # the loop it already has: fine
    other = asyncio.new_event_loop()
    try:
        with pytest.raises(LoopAffinityError, match="cannot change loops"):
            bind_owner_loop(engine_proxy, other)
    finally:
        other.close()
    with pytest.raises(LoopAffinityError, match="needs a loop"):
        bind_owner_loop(llm)  # no running loop here and none given
