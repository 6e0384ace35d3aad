"""A vLLM executor that fakes only the forward pass (see ``cpu_engine``).

It pretends to be one worker. Every control call vLLM makes on an executor
goes through ``collective_rpc`` to :class:`_StandInWorker`, which answers the
KV-cache, memory and warm-up questions with small constants and produces one
deterministic token per decode step. Everything around it (EngineCore,
scheduler, KV-cache manager, detokenizer) is the real vLLM code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import SLEEP_TAGS, Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes

from loopbridge_vllm._vllm_releases.changed_signatures import WorkerCalls

_T = TypeVar("_T")

STEP_ENV = "LOOPBRIDGE_STANDIN_STEP_S"
_KV_MEMORY_BYTES = 64 * 1024 * 1024
# Token ids the stand-in emits: ordinary byte-level tokens, never a special
# token, so requests always run to ``max_tokens``.
_FIRST_TOKEN = 10
_TOKEN_CYCLE = 20


@dataclass
class _Progress:
    prompt_len: int
    generated: int = 0


class _StandInWorker(WorkerCalls):
    """The worker side: the methods vLLM reaches through ``collective_rpc``."""

    def __init__(self, executor: StandInExecutor) -> None:
        self._executor = executor
        self._requests: dict[str, _Progress] = {}
        self._pending: ModelRunnerOutput | None = None
        raw = os.environ.get(STEP_ENV, "") or "0"
        try:
            self.step_s = float(raw)
        except ValueError:
            raise ValueError(f"{STEP_ENV} must be a number of seconds, got {raw!r}") from None
        self.token_base = _FIRST_TOKEN
        self.steps = 0
        #: The sleep level while any memory sleeps, None while awake.
        self.asleep: int | None = None
        self._sleeping_tags: set[str] = set()
        #: Forward passes attempted while asleep (always refused).
        self.steps_while_asleep = 0

    # -- set-up ---------------------------------------------------------------
    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        hf = self._executor.model_config.hf_config
        heads = int(hf.num_attention_heads)
        kv_heads = int(getattr(hf, "num_key_value_heads", None) or heads)
        block = self._executor.cache_config.block_size or 16
        spec = FullAttentionSpec(
            block_size=block,
            num_kv_heads=kv_heads,
            head_size=int(hf.hidden_size) // heads,
            dtype=torch.float32,
        )
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(int(hf.num_hidden_layers))}

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return ["LBNHC"]

    def determine_available_memory(self) -> int:
        return _KV_MEMORY_BYTES

    def initialize_from_config(self, kv_cache_configs: Any) -> None:
        pass

    def compile_or_warm_up_model(self) -> CompilationTimes:
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def update_max_model_len(self, max_model_len: int) -> None:
        pass

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def supports_draft_weight_updates(self) -> bool:
        return False

    def list_loras(self) -> set[int]:
        return set()

    # -- the faked forward pass -------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> None:
        if self.asleep is not None and scheduler_output.total_num_scheduled_tokens > 0:
            # A real worker's weights and KV cache are gone while asleep: a
            # forward then is a bug in whoever scheduled it.
            self.steps_while_asleep += 1
            raise RuntimeError(
                f"stand-in worker asked to run a forward while asleep ({self.asleep})"
            )
        for req_id in scheduler_output.finished_req_ids:
            self._requests.pop(req_id, None)
        before: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            prompt = new.prompt_token_ids or []
            self._requests[new.req_id] = _Progress(prompt_len=len(prompt))
            before[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
            before[req_id] = computed
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            state = self._requests.get(req_id)
            tokens: list[int] = []
            if state is not None:
                done = before.get(req_id, 0) + count
                # The prompt plus every emitted token is computed: sample one.
                if done >= state.prompt_len + state.generated:
                    tokens.append(self.token_base + state.generated % _TOKEN_CYCLE)
                    state.generated += 1
            req_ids.append(req_id)
            sampled.append(tokens)
        if self.step_s > 0 and scheduler_output.total_num_scheduled_tokens > 0:
            time.sleep(self.step_s)
        self.steps += 1
        self._pending = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        output, self._pending = self._pending, None
        if output is None:
            return ModelRunnerOutput(req_ids=[], req_id_to_index={})
        return output

    def take_draft_token_ids(self) -> None:
        return None

    # -- stand-ins for weight updates (observable from requests) ----------------
    def standin_set_token_base(self, base: int) -> int:
        """Change the emitted token ids, as a weight update changes outputs."""
        if not 3 <= base <= 200:
            raise ValueError(f"token base must be in [3, 200], got {base}")
        old, self.token_base = self.token_base, base
        return old

    def standin_get_token_base(self) -> int:
        return self.token_base

    def standin_steps(self) -> int:
        return self.steps

    def standin_set_step_s(self, seconds: float) -> float:
        """Change the emulated forward-pass time; returns the previous one."""
        if not 0 <= seconds <= 10:
            raise ValueError(f"step time must be in [0, 10] s, got {seconds}")
        old, self.step_s = self.step_s, float(seconds)
        return old

    def standin_active_requests(self) -> int:
        """Requests the scheduler has sent and not yet reported finished."""
        return len(self._requests)

    def standin_sleep_state(self) -> tuple[int | None, int]:
        """(sleep level or None when awake, forwards attempted while asleep)."""
        return self.asleep, self.steps_while_asleep

    # -- sleep mode (``EngineCore.sleep`` / ``wake_up`` through the executor) --
    def sleep(self, level: int = 1) -> None:
        """Level 1 keeps the weights (in host memory on a real worker), level 2
        discards them: the token base, the stand-in's weights, is reset."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self.asleep = level
        self._sleeping_tags = set(SLEEP_TAGS)
        if level == 2:
            self.token_base = _FIRST_TOKEN

    def wake_up(self, tags: list[str] | None = None) -> None:
        # ``tags`` None wakes everything; a partial wake leaves the rest asleep.
        self._sleeping_tags -= set(SLEEP_TAGS if tags is None else tags)
        if not self._sleeping_tags:
            self.asleep = None

    # Control calls that need no work on a device.
    def _noop(self, *args: Any, **kwargs: Any) -> None:
        return None

    check_health = shutdown = discard = _noop
    reset_mm_cache = reset_encoder_cache = profile = _noop
    execute_dummy_batch = synchronize_device = _noop
    # The RL weight-transfer lifecycle (no weights to move here).
    start_weight_update = start_draft_weight_update = finish_weight_update = _noop
    shutdown_weight_transfer_engine = _noop


class StandInExecutor(Executor):
    """One pretend worker; only the forward pass is fake.

    Select it with ``distributed_executor_backend=
    "loopbridge_vllm.cpu_engine.StandInExecutor"``.
    """

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        self.worker = _StandInWorker(self)

    def collective_rpc(  # type: ignore[override]
        self,
        method: str | Callable[..., _T],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> list[Any] | Future[list[Any]]:
        if isinstance(method, str):
            fn = getattr(self.worker, method, None)
            if fn is None or method.startswith("_"):
                raise AttributeError(f"stand-in worker has no method {method!r}")
            result = [fn(*args, **(kwargs or {}))]
        else:
            result = [method(self.worker, *args, **(kwargs or {}))]
        if non_block:
            done: Future[list[Any]] = Future()
            done.set_result(result)
            return done
        return result

    def execute_model(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput | None] | None:
        self.worker.execute_model(scheduler_output)
        if non_block:
            done: Future[ModelRunnerOutput | None] = Future()
            done.set_result(None)
            return done
        return None

    def sample_tokens(  # type: ignore[override]
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        output = self.worker.sample_tokens(grammar_output)
        if non_block:
            done: Future[ModelRunnerOutput] = Future()
            done.set_result(output)
            return done
        return output

    def take_draft_token_ids(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None
