"""The CPU engine kit: tiny model, environment, stand-in executor."""

from __future__ import annotations

import dataclasses
import json
import os
import types
from pathlib import Path
from typing import Any

import pytest

from loopbridge_vllm import cpu_engine

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release


def test_tiny_model_is_complete_and_cached(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = cpu_engine.build_tiny_model(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("Hello world")["input_ids"]
    assert tok.decode(ids) == "Hello world"
    assert tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    ).endswith("assistant: ")
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert cpu_engine.build_tiny_model(path) == path
    assert weights.stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny-model-")]


def test_env_selects_cpu_and_keeps_files_local() -> None:
    env = cpu_engine.cpu_engine_env()
    assert os.environ["LOOPBRIDGE_CPU_PLATFORM"] == "1" == env["LOOPBRIDGE_CPU_PLATFORM"]
    assert "VLLM_TARGET_DEVICE" not in os.environ  # it would bypass the platform plugin
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["DO_NOT_TRACK"] == "1"
    assert Path(env["VLLM_RPC_BASE_PATH"]).is_dir()
    src = str(Path(cpu_engine.__file__).resolve().parent.parent)
    assert src in env["PYTHONPATH"].split(os.pathsep)


def test_standin_backend_resolves_like_vllm_does() -> None:
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.executor.abstract import Executor

    cls = resolve_obj_by_qualname(cpu_engine.STANDIN_BACKEND)
    assert issubclass(cls, Executor) and cls is cpu_engine.StandInExecutor
    with pytest.raises(AttributeError):
        cpu_engine.NoSuchThing  # noqa: B018


def test_step_time_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from loopbridge_vllm._standin import _StandInWorker

    fake = types.SimpleNamespace()
    monkeypatch.setenv(cpu_engine.STEP_ENV, "0.25")
    assert _StandInWorker(fake).step_s == 0.25  # type: ignore[arg-type]
    monkeypatch.setenv(cpu_engine.STEP_ENV, "fast")
    with pytest.raises(ValueError, match=cpu_engine.STEP_ENV):
        _StandInWorker(fake)  # type: ignore[arg-type]
    monkeypatch.delenv(cpu_engine.STEP_ENV)
    worker = _StandInWorker(fake)  # type: ignore[arg-type]
    assert worker.step_s == 0.0
    with pytest.raises(ValueError):
        worker.standin_set_step_s(-1)
    with pytest.raises(ValueError):
        worker.standin_set_token_base(10_000)


def test_the_standin_worker_sleeps_like_a_real_one() -> None:
    """Level 1 keeps the weights, level 2 drops them; a partial wake leaves
    the rest asleep; a forward with tokens while asleep is refused."""
    from loopbridge_vllm._standin import _StandInWorker

    worker = _StandInWorker(types.SimpleNamespace())  # type: ignore[arg-type]
    empty = types.SimpleNamespace(
        total_num_scheduled_tokens=0,
        finished_req_ids=set(),
        scheduled_new_reqs=[],
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={},
    )
    busy = types.SimpleNamespace(total_num_scheduled_tokens=1)
    worker.standin_set_token_base(40)
    worker.sleep(level=1)
    assert worker.standin_sleep_state() == (1, 0)
    worker.execute_model(empty)  # type: ignore[arg-type]  # nothing scheduled: fine
    with pytest.raises(RuntimeError, match="while asleep"):
        worker.execute_model(busy)  # type: ignore[arg-type]
    assert worker.standin_sleep_state() == (1, 1)
    worker.wake_up(["weights"])
    assert worker.standin_sleep_state()[0] == 1  # the KV cache still sleeps
    worker.wake_up(["kv_cache"])
    assert worker.standin_sleep_state()[0] is None
    assert worker.standin_get_token_base() == 40  # level 1 kept the weights
    worker.sleep(level=2)
    worker.wake_up()
    assert worker.standin_sleep_state()[0] is None
    assert worker.standin_get_token_base() == 10  # level 2 discarded them
    with pytest.raises(ValueError, match="sleep level"):
        worker.sleep(level=3)


def _step(new: list[Any], scheduled: dict[str, int]) -> Any:
    return types.SimpleNamespace(
        total_num_scheduled_tokens=sum(scheduled.values()),
        finished_req_ids=set(),
        scheduled_new_reqs=new,
        scheduled_cached_reqs=types.SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens=scheduled,
    )


def test_a_recomputed_request_carries_on_where_it_was() -> None:
    """From 0.34 a preempted request comes back as a new one whose
    ``prefill_token_ids`` is its prompt and what it generated: the stand-in
    emits the next token, never token 0 again."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData

    from loopbridge_vllm._standin import _StandInWorker

    # The installed release resumes a request one of the two ways handled here.
    fields = {f.name for f in dataclasses.fields(NewRequestData)}
    cached = {f.name for f in dataclasses.fields(CachedRequestData)}
    assert "prefill_token_ids" in fields or "resumed_req_ids" in cached
    worker = _StandInWorker(types.SimpleNamespace())  # type: ignore[arg-type]
    prompt = [1, 2, 3]
    fresh = types.SimpleNamespace(
        req_id="r", prompt_token_ids=prompt, prefill_token_ids=prompt, num_computed_tokens=0
    )
    worker.execute_model(_step([fresh], {"r": 3}))
    first = worker.sample_tokens(None).sampled_token_ids
    assert first == [[worker.model.token(0)]]
    generated = [worker.model.token(i) for i in range(3)]
    again = types.SimpleNamespace(
        req_id="r",
        prompt_token_ids=prompt,
        prefill_token_ids=prompt + generated,
        num_computed_tokens=0,
    )
    worker.execute_model(_step([again], {"r": 6}))  # recomputes prompt + 3 tokens
    assert worker.sample_tokens(None).sampled_token_ids == [[worker.model.token(3)]]


def test_the_standin_worker_holds_a_request_until_a_step_reports_it_finished() -> None:
    from loopbridge_vllm._standin import _StandInWorker

    worker = _StandInWorker(types.SimpleNamespace())  # type: ignore[arg-type]
    new = [
        types.SimpleNamespace(
            req_id=rid, prompt_token_ids=[1], prefill_token_ids=[1], num_computed_tokens=0
        )
        for rid in ("b", "a")
    ]
    worker.execute_model(_step(new, {"b": 1, "a": 1}))
    assert worker.standin_active_request_ids() == ["a", "b"]
    assert worker.standin_active_requests() == 2
    finished = _step([], {})
    finished.finished_req_ids = {"b"}
    worker.execute_model(finished)
    assert worker.standin_active_request_ids() == ["a"]


def test_the_model_runner_output_has_the_installed_releases_fields() -> None:
    from vllm.v1.outputs import ModelRunnerOutput

    from loopbridge_vllm._vllm_releases.changed_fields import model_runner_output

    out = model_runner_output(["a", "b"], [[5], []])
    assert isinstance(out, ModelRunnerOutput)
    assert out.req_ids == ["a", "b"] and out.sampled_token_ids == [[5], []]
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        assert out.req_id_to_index == {"a": 0, "b": 1}
