"""Refit under live HTTP traffic inside a Ray actor (the NeMo-RL shape).

The actor from ``examples/ray_actor_server.py`` owns a real ``AsyncLLM`` on its
loop and serves vLLM's OpenAI app from a thread through loopbridge. Agents
stream completions over HTTP with the official ``openai`` client while a
trainer (this test, through Ray calls on the actor's loop) runs refit cycles
with vLLM's native API: ``pause_generation(mode)``, ``start_weight_update``,
``update_weights`` (the ``loopbridge_inline`` backend), ``finish_weight_update
(weight_version=...)``, ``resume_generation``. Every cycle has ``STREAMS``
streams open when the pause is issued (they are sent during a short ``keep``
pause first, so that they start in one batch however loaded the machine is),
and ``DURING`` more sent while paused.

Each request must end the way vLLM documents for the mode:

* ``keep``: streams in flight are frozen and continue after the resume; their
  tokens switch once, from the old weights to the new ones. Requests sent
  while paused are queued and produced by the new weights.
* ``abort``: streams in flight end with finish reason ``abort``, with old
  tokens only.
* ``wait``: the pause returns once the streams in flight have finished, all
  from the old weights.
* requests sent during an ``abort`` or ``wait`` pause get vLLM's retryable
  error (503 ``ServiceUnavailableError``) on 0.33, which refuses them; on 0.32,
  which queues them, they wait and are produced by the new weights.

After each cycle a fresh request gets the new weights' tokens, the version
is the one the trainer set, and the engine's unfinished-request count is 0.
The stand-in's tokens are the arg-max of its weights, so "old" and "new" are
read from the token ids (``return_token_ids``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from vllm_engines import RAY_CALL_GUARD_S, RAY_START_GUARD_S, Stream, read_stream, until

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")

MODES = ("keep", "abort", "wait")
CYCLES = 5  # per mode
STREAMS = 16  # open when each pause is issued
DURING = 4  # sent while paused
MAX_TOKENS = 48
RAY_ENV = {"LOOPBRIDGE_STANDIN_STEP_S": "0.01"}  # per step: a stream lives >= 0.48 s
CYCLE = 20  # the stand-in's tokens repeat every 20 positions


def tokens(base: int, start: int, n: int) -> list[int]:
    """The ids the weights for ``base`` emit at positions ``start`` on."""
    return [base + (start + i) % CYCLE for i in range(n)]


def vllm_refuses_during_pause(mode: str) -> bool:
    """Whether stock vLLM refuses new requests during a ``mode`` pause: from 0.33
    its engine core has ``_reject_add_while_paused``; 0.32 and earlier queue them."""
    from vllm.v1.engine.core import EngineCoreProc

    return mode != "keep" and hasattr(EngineCoreProc, "_reject_add_while_paused")


async def stream_one(client: Any, prompt: str, max_tokens: int, out: Stream) -> None:
    start = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    await read_stream(start, out)


async def refit_cycle(
    worker: Any, client: Any, model: Path, mode: str, cycle: int, old: int, new: int
) -> dict[str, Any]:
    from loopbridge_vllm.cpu_engine import standin_weights
    from loopbridge_vllm.weight_transfer import inline_update

    # The streams start together whatever the load: sent during a keep pause,
    # they queue, and the resume schedules them in one batch.
    await worker.pause.remote("keep")
    streams = [Stream() for _ in range(STREAMS)]
    tasks = [
        asyncio.create_task(stream_one(client, f"{mode} {cycle} {i}", MAX_TOKENS, s))
        for i, s in enumerate(streams)
    ]

    async def all_queued() -> bool:
        return int(await worker.unfinished_requests.remote()) == STREAMS

    await until(all_queued, f"{mode} cycle {cycle}: the streams never reached the engine")
    await worker.resume.remote()
    await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 60)
    open_at_pause = sum(not s.done.is_set() for s in streams)
    await worker.pause.remote(mode)
    frozen = await worker.unfinished_requests.remote()

    during = [Stream() for _ in range(DURING)]
    tasks += [
        asyncio.create_task(stream_one(client, f"during {cycle} {i}", 8, s))
        for i, s in enumerate(during)
    ]
    refused = vllm_refuses_during_pause(mode)
    if refused:  # answered at once
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in during)), 30)
    else:  # queued: wait until the engine holds them all

        async def queued() -> bool:
            waiting = int(await worker.unfinished_requests.remote())
            return waiting == DURING + (STREAMS if mode == "keep" else 0)

        await until(queued, f"{mode} cycle {cycle}: requests sent while paused never queued")
    before_transfer = [len(s.ids) for s in during]

    update = inline_update(standin_weights(model, new)).update_info
    version = await worker.push_weights.remote(update, f"{mode}-{cycle}")
    await worker.resume.remote()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)

    probe = await client.completions.create(
        model="tiny",
        prompt="probe",
        max_tokens=5,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )

    # Every request has ended at the client, and vLLM drops a request from its
    # count in the pass that queues its final output (or error): one read is final.
    left = int(await worker.unfinished_requests.remote())
    return {
        "left": left,
        "open_at_pause": open_at_pause,
        "frozen": frozen,
        "streams": streams,
        "during": during,
        "during_before_transfer": before_transfer,
        "version": version,
        "probe": list(probe.choices[0].token_ids),
        "refused": refused,
    }


def check_in_flight(mode: str, s: Stream, old: int, new: int) -> None:
    assert s.error is None, s.error
    if mode == "abort":
        assert s.finish == "abort" and 0 < len(s.ids) < MAX_TOKENS
        assert s.ids == tokens(old, 0, len(s.ids))
    elif mode == "wait":
        assert s.finish == "length" and s.ids == tokens(old, 0, MAX_TOKENS)
    else:  # keep: one switch, from the old weights to the new
        assert s.finish == "length" and len(s.ids) == MAX_TOKENS
        cut = next(g for g, t in enumerate(s.ids) if t != tokens(old, g, 1)[0])
        assert 0 < cut < MAX_TOKENS
        assert s.ids == tokens(old, 0, cut) + tokens(new, cut, MAX_TOKENS - cut)


def test_refit_cycles_under_http_streams(example: Any, ray_cluster: None, tiny_model: Path) -> None:
    worker = example.GenerationWorker.remote(str(tiny_model))
    url = ray.get(worker.post_init.remote(), timeout=RAY_START_GUARD_S)
    ray.get(worker.init_weight_transfer.remote(), timeout=RAY_CALL_GUARD_S)

    async def main() -> list[tuple[str, int, int, int, dict[str, Any]]]:
        results = []
        old = 10  # the CPU engine's first weights
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60
        ) as client:
            for mode in MODES:
                for cycle in range(CYCLES):
                    new = 20 + 7 * len(results)  # distinct weights every cycle
                    got = await refit_cycle(worker, client, tiny_model, mode, cycle, old, new)
                    results.append((mode, cycle, old, new, got))
                    old = new
        return results

    results = asyncio.run(main())
    assert len(results) == len(MODES) * CYCLES
    for mode, cycle, old, new, got in results:
        where = f"{mode} cycle {cycle}"
        assert got["open_at_pause"] == STREAMS, where
        if mode == "keep":
            assert got["frozen"] == STREAMS, where  # all still in the engine, frozen
        for s in got["streams"]:
            check_in_flight(mode, s, old, new)
        for s in got["during"]:
            if got["refused"]:
                # vLLM's RetryableRequestError, as its streaming error event.
                assert isinstance(s.error, openai.APIError), (where, s.error)
                body = s.error.body if isinstance(s.error.body, dict) else {}
                assert (body.get("type"), body.get("code")) == ("ServiceUnavailableError", 503), (
                    where,
                    s.error,
                    s.error.body,
                )
                assert "Generation is paused" in str(s.error) and s.ids == []
            else:
                assert s.error is None and s.finish == "length", (where, s.error)
                assert s.ids == tokens(new, 0, 8), where  # produced by the new weights
        assert got["during_before_transfer"] == [0] * DURING, where
        assert got["version"] == f"{mode}-{cycle}", where
        assert got["probe"] == tokens(new, 0, 5), where
        assert got["left"] == 0, where  # no request left in the engine
    ray.get(worker.shutdown.remote(), timeout=RAY_CALL_GUARD_S)
    ray.kill(worker)
