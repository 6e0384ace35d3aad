"""OpenRLHF's real classes: its agent executor's threaded OpenAI server, broken and fixed.

OpenRLHF 0.11.2's ``RolloutRayActor`` builds vLLM's engine on the Ray actor's
loop and runs its ``AgentExecutor`` there. ``examples/openrlhf_agent_executor.py``
is an executor written against OpenRLHF's ``AgentExecutorBase`` in the shape of
OpenRLHF's OpenAI-server example: uvicorn on a ``threading.Thread``, handlers
awaiting the actor's ``generate`` (and the engine's, for streams) from uvicorn's
loop. The raw executor is that file with docs/integrations.md's OpenRLHF diff
undone, so the two differ by exactly the lines a user changes.

In one run, both actors on a local CPU Ray cluster with the stand-in engine,
the race amplifier of the benchmark's correctness phase installed in each:

* raw: the output handler dies with ``deque mutated during iteration``,
  requests fail, and the trainer's next rollout fails too;
* with loopbridge: every request completes and the engine stays healthy;
* with loopbridge, 16 HTTP streams open: the actor's ``pause_generation``,
  OpenRLHF's weight sync (``init_process_group`` once, then ``update_weight``
  per parameter with the tensor broadcast over gloo to the stand-in worker)
  and ``resume_generation``, called as OpenRLHF's async trainer calls them.
  Every stream ends with all its tokens, switching once from the old weights to
  the new; requests sent during the pause queue and get the new weights; the
  unfinished count returns to 0.

Where setup.sh installs OpenRLHF (requirements/openrlhf-vllm-<release>.txt
exists for the installed vLLM), a missing OpenRLHF is an error, never a skip.
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openrlhf_harness import (
    EXAMPLE,
    REPO,
    engine_report,
    install_amplifier,
    push_weights,
    server_url,
    shutdown,
    start_actor,
    user_change,
    without_loopbridge,
)
from vllm_engines import (
    RAY_CALL_GUARD_S,
    RAY_START_GUARD_S,
    Stream,
    free_port,
    read_stream,
    until,
)


def _lane_list() -> Path:
    from vllm import __version__  # the release, whichever distribution installed it

    release = ".".join(__version__.split(".")[:2])
    return REPO / "requirements" / f"openrlhf-vllm-{release}.txt"


if importlib.util.find_spec("openrlhf") is None:
    if _lane_list().is_file():
        raise RuntimeError(
            f"OpenRLHF is not installed, but {_lane_list().relative_to(REPO)} says this vLLM "
            "release's lane tests it: run scripts/setup.sh for this release"
        )
    pytest.skip(
        f"OpenRLHF is tested only where scripts/setup.sh installs it ({_lane_list().name} "
        "does not exist for this vLLM release)",
        allow_module_level=True,
    )

import openai  # noqa: E402
import ray  # noqa: E402

HERE = Path(__file__).resolve().parent
#: The workers import openrlhf_harness (for __ray_call__); the stand-in's step
#: time makes a 100-token stream live at least 2 s.
RAY_ENV = {
    "PYTHONPATH": os.pathsep.join(
        p for p in [str(HERE), str(REPO / "examples"), os.environ.get("PYTHONPATH", "")] if p
    ),
    "LOOPBRIDGE_STANDIN_STEP_S": "0.02",
}
REQUESTS = 64  # per executor, at
CONCURRENCY = 16
STREAMS = 16  # open when the trainer pauses
DURING = 4  # sent while paused
STREAM_TOKENS = 100
OLD, NEW = 10, 40  # the stand-in's first weights emit 10, 11, ...; the trainer's 40, 41, ...
CYCLE = 20  # the stand-in's tokens repeat every 20 positions


def tokens(base: int, start: int, n: int) -> list[int]:
    return [base + (start + i) % CYCLE for i in range(n)]


@dataclass
class Actors:
    raw: Any
    bridged: Any
    tokenizer: Any
    urls: dict[str, str] = field(default_factory=dict)


def rollout(actor: Any, tokenizer: Any, n: int = 1, max_tokens: int = 5) -> Any:
    """What OpenRLHF's samples generator asks each engine for."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=1.0)
    return actor.generate_responses.remote("two plus two", "4", params, 256, tokenizer, n)


@pytest.fixture(scope="module")
def actors(ray_cluster: None, tiny_model: Path, tmp_path_factory: Any) -> Iterator[Actors]:
    from transformers import AutoTokenizer

    raw_file = tmp_path_factory.mktemp("openrlhf") / "raw_agent_executor.py"
    raw_file.write_text(without_loopbridge(EXAMPLE.read_text(), user_change()))
    out = Actors(
        start_actor(tiny_model, raw_file),
        start_actor(tiny_model, EXAMPLE),
        AutoTokenizer.from_pretrained(tiny_model),
    )
    try:
        # The first rollout starts each executor's server (amplifier still off).
        for name, actor in (("raw", out.raw), ("bridged", out.bridged)):
            [sample] = ray.get(rollout(actor, out.tokenizer), timeout=RAY_START_GUARD_S)
            assert sample["observation_tokens"][-5:] == tokens(OLD, 0, 5), name
            out.urls[name] = ray.get(actor.__ray_call__.remote(server_url))
            ray.get(actor.__ray_call__.remote(install_amplifier))
        yield out
    finally:
        for actor in (out.raw, out.bridged):
            try:
                ray.get(actor.__ray_call__.remote(shutdown), timeout=RAY_CALL_GUARD_S)
            finally:
                ray.kill(actor)


async def chat_load(url: str, timeout: float) -> tuple[int, list[str]]:
    """``REQUESTS`` chat completions at ``CONCURRENCY``: (completed, failures);
    ``timeout`` bounds each request (a request still unanswered then has hung)."""
    gate = asyncio.Semaphore(CONCURRENCY)
    failures: list[str] = []
    ok = 0
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=timeout
    ) as client:

        async def one(i: int) -> None:
            nonlocal ok
            async with gate:
                try:
                    reply = await client.chat.completions.create(
                        model="policy",
                        messages=[{"role": "user", "content": f"hello {i}"}],
                        max_tokens=8,
                    )
                except openai.APIError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}")
                    return
            ids = (reply.model_extra or {})["token_ids"]["completion_token_ids"]
            if ids == tokens(OLD, 0, 8):
                ok += 1
            else:
                failures.append(f"wrong tokens {ids}")

        await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    return ok, failures


def test_openrlhf_tests_package_does_not_shadow_ours() -> None:
    # OpenRLHF's wheel installs a top-level ``tests`` package. Ours is not one
    # (no tests/__init__.py): pytest imports each test directory's modules by
    # their own names, with that directory on sys.path, never as ``tests.*``.
    assert not (REPO / "tests" / "__init__.py").exists()
    spec = importlib.util.find_spec("tests")
    assert spec is not None and spec.origin is not None
    origin = Path(spec.origin).resolve()  # OpenRLHF's, in the venv (which may sit in REPO)
    assert REPO / "tests" not in origin.parents and "site-packages" in origin.parts, origin
    ours = {
        name: Path(m.__file__).resolve()
        for name, m in list(sys.modules.items())
        if getattr(m, "__file__", None) and REPO / "tests" in Path(m.__file__).resolve().parents
    }
    assert __name__ in ours and "conftest" in ours  # this module and tests/conftest.py
    assert ours[__name__] == Path(__file__).resolve()
    assert not [n for n in ours if n == "tests" or n.startswith("tests.")], ours


def test_raw_executor_dies_under_the_amplifier(actors: Actors) -> None:
    ok, failures = asyncio.run(chat_load(actors.urls["raw"], timeout=20))
    report = ray.get(actors.raw.__ray_call__.remote(engine_report))
    kinds = collections.Counter(f.split(":")[0] for f in failures)
    print(f"raw executor: {ok} of {REQUESTS} completed, {len(failures)} failed {dict(kinds)}")
    print(f"raw executor's engine: {report}")
    race = "RuntimeError: deque mutated during iteration"
    assert report["foreign_sets"] >= 1 and report["overlaps"] >= 1, report
    assert race in report["logged"] or report["handler_error"] == race, report
    assert report["errored"] and report["handler_done"], report
    assert failures and ok < REQUESTS, (ok, failures[:3])
    assert ok + len(failures) == REQUESTS
    # The replica is dead for the trainer too: its rollout gets the server's 500
    # (Ray re-raises the executor's openai error as an unserializable one).
    with pytest.raises(ray.exceptions.RayError, match="InternalServerError: Error code: 500"):
        ray.get(rollout(actors.raw, actors.tokenizer), timeout=RAY_CALL_GUARD_S)


def test_loopbridge_executor_completes_under_the_amplifier(actors: Actors) -> None:
    ok, failures = asyncio.run(chat_load(actors.urls["bridged"], timeout=RAY_CALL_GUARD_S))
    report = ray.get(actors.bridged.__ray_call__.remote(engine_report))
    print(f"loopbridge executor: {ok} of {REQUESTS} completed, {len(failures)} failed; {report}")
    assert failures == [] and ok == REQUESTS
    assert report["collector_sets"] >= REQUESTS and report["foreign_sets"] == 0, report
    assert not report["errored"] and not report["handler_done"] and report["logged"] == []
    samples = ray.get(rollout(actors.bridged, actors.tokenizer, n=4), timeout=RAY_CALL_GUARD_S)
    assert [s["observation_tokens"][-5:] for s in samples] == [tokens(OLD, 0, 5)] * 4


async def stream_one(client: Any, prompt: str, max_tokens: int, out: Stream) -> None:
    start = client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
    )
    await read_stream(start, out)


async def unfinished_is(actor: Any, n: int) -> bool:
    return int(await actor.get_num_unfinished_requests.remote()) == n


async def weight_sync_under_streams(
    actor: Any, url: str, model: Path, group: Any
) -> dict[str, Any]:
    from loopbridge_vllm.cpu_engine import standin_weights

    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:
        # The streams start together whatever the load: sent during a pause,
        # they queue, and the resume schedules them in one batch.
        await actor.pause_generation.remote()
        streams = [Stream() for _ in range(STREAMS)]
        tasks = [
            asyncio.create_task(stream_one(client, f"stream {i}", STREAM_TOKENS, s))
            for i, s in enumerate(streams)
        ]
        await until(lambda: unfinished_is(actor, STREAMS), "the streams never reached the engine")
        await actor.resume_generation.remote()
        await asyncio.wait_for(asyncio.gather(*(s.first.wait() for s in streams)), 60)

        # The trainer's broadcast_to_vllm with partial rollouts: pause, sync, resume.
        await actor.pause_generation.remote()
        open_at_pause = sum(not s.done.is_set() for s in streams)
        frozen = int(await actor.get_num_unfinished_requests.remote())
        during = [Stream() for _ in range(DURING)]
        tasks += [
            asyncio.create_task(stream_one(client, f"during {i}", 8, s))
            for i, s in enumerate(during)
        ]
        await until(
            lambda: unfinished_is(actor, STREAMS + DURING),
            "requests sent while paused never queued",
        )
        weights = standin_weights(model, NEW)
        await asyncio.to_thread(push_weights, actor, group, weights, RAY_CALL_GUARD_S)
        before_resume = [len(s.ids) for s in streams]
        during_before_resume = [len(s.ids) for s in during]
        await actor.resume_generation.remote()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
        # Every stream has ended at the client, and vLLM drops a request from its
        # count in the pass that queues its final output: one read is final.
        left = int(await actor.get_num_unfinished_requests.remote())
    return {
        "left": left,
        "open_at_pause": open_at_pause,
        "frozen": frozen,
        "streams": streams,
        "during": during,
        "before_resume": before_resume,
        "during_before_resume": during_before_resume,
    }


def test_pause_and_weight_sync_under_open_streams(actors: Actors, tiny_model: Path) -> None:
    from loopbridge_vllm._standin import weight_sync_group

    actor = actors.bridged
    # Once, as the trainer's _init_vllm_sync_group does: the engine joins as rank 1.
    port = free_port()
    joined = actor.init_process_group.remote(
        "127.0.0.1", port, 1, 2, "openrlhf", backend="gloo", use_ray=False
    )
    group = weight_sync_group("127.0.0.1", port, 0, 2)
    ray.get(joined, timeout=RAY_CALL_GUARD_S)

    got = asyncio.run(weight_sync_under_streams(actor, actors.urls["bridged"], tiny_model, group))
    print(
        f"weight sync: {got['open_at_pause']} streams open at the pause, {got['frozen']} "
        f"frozen in the engine, {DURING} sent during it"
    )
    assert got["open_at_pause"] == STREAMS and got["frozen"] == STREAMS
    for i, s in enumerate(got["streams"]):
        assert s.error is None and s.finish == "length", (i, s.error)
        assert len(s.request_ids) == 1 and len(s.ids) == STREAM_TOKENS, i  # none lost or doubled
        cut = next((g for g, t in enumerate(s.ids) if t != tokens(OLD, g, 1)[0]), None)
        assert cut is not None, f"stream {i} never got the new weights"
        assert s.ids == tokens(OLD, 0, cut) + tokens(NEW, cut, STREAM_TOKENS - cut), i
        assert 0 < got["before_resume"][i] <= cut < STREAM_TOKENS, (i, cut)
    for s in got["during"]:
        assert s.error is None and s.finish == "length" and s.ids == tokens(NEW, 0, 8)
    assert got["during_before_resume"] == [0] * DURING
    assert got["left"] == 0  # no request left in the engine
    ids = [next(iter(s.request_ids)) for s in got["streams"] + got["during"]]
    assert len(set(ids)) == STREAMS + DURING
    report = ray.get(actor.__ray_call__.remote(engine_report))
    assert report["foreign_sets"] == 0 and not report["errored"] and report["logged"] == []
    [sample] = ray.get(rollout(actor, actors.tokenizer), timeout=RAY_CALL_GUARD_S)
    assert sample["observation_tokens"][-5:] == tokens(NEW, 0, 5)
