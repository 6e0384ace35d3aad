"""A vLLM executor that fakes only the forward pass (see ``cpu_engine``).

It pretends to be one worker. Every control call vLLM makes on an executor
goes through ``collective_rpc`` to :class:`_StandInWorker`, which answers the
KV-cache, memory and warm-up questions with small constants and produces one
deterministic token per decode step. Everything around it (EngineCore,
scheduler, KV-cache manager, detokenizer) is the real vLLM code.

The tokens come from the worker's weights: :class:`StandInModel` holds one
parameter, ``token_table`` (``[20, vocab]``), and the ``g``-th token a request
generates is the arg-max of row ``g % 20``. The weights change only through
the model's ``load_weights`` (vLLM's native weight-transfer API, with the
:mod:`loopbridge_vllm.weight_transfer` backend, the test shortcut
``standin_set_token_base``, or sleep level 2), so a weight update is
observable in what the engine generates.

The weight-transfer lifecycle follows vLLM's GPU worker: without
``weight_transfer_config`` every call raises; ``start_weight_update`` twice,
``update_weights`` or ``finish_weight_update`` without a start, and
``shutdown_weight_transfer_engine`` during an update raise; a failed
``update_weights`` ends the update.

It also answers the calls OpenRLHF's ``WorkerWrap`` worker extension takes
(``RolloutRayActor.init_process_group`` / ``update_weight`` reach them through
``collective_rpc``): ``init_process_group`` joins the trainer's group, over
gloo (:func:`weight_sync_group`; the worker is rank ``rank_offset``, as a
single GPU worker is), and each ``update_weight(name, dtype, shape)`` receives
that tensor by broadcast from rank 0 and loads it. The tensor is received
before it is checked, so a bad name, dtype or shape is refused with the
trainer's broadcast complete: the trainer gets the error, never a hang, and the
weights are unchanged. NCCL, ``ray.util.collective`` and CUDA IPC need GPUs and
are refused by name.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes

from loopbridge_vllm._vllm_releases.changed_fields import (
    model_runner_output,
    sleep_tags,
    tokens_generated_before,
)
from loopbridge_vllm._vllm_releases.changed_signatures import WorkerCalls, create_transfer_engine
from loopbridge_vllm.weight_transfer import register_inline_backend

_T = TypeVar("_T")

STEP_ENV = "LOOPBRIDGE_STANDIN_STEP_S"
_KV_MEMORY_BYTES = 64 * 1024 * 1024
# Token ids the stand-in emits: ordinary byte-level tokens, never a special
# token, so requests always run to ``max_tokens``.
_FIRST_TOKEN = 10
_TOKEN_CYCLE = 20


class StandInModel(torch.nn.Module):
    """The stand-in's weights: which token each generated position emits."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.token_table = torch.nn.Parameter(torch.zeros(_TOKEN_CYCLE, vocab_size))
        self.tokens: list[int] = []
        self.set_token_base(_FIRST_TOKEN)

    @staticmethod
    def table_for(base: int, vocab_size: int) -> torch.Tensor:
        """Weights that emit ``base, base + 1, ...`` (cycling every 20 tokens)."""
        if not 0 <= base <= vocab_size - _TOKEN_CYCLE:
            raise ValueError(
                f"token base must be in [0, {vocab_size - _TOKEN_CYCLE}] for a vocabulary "
                f"of {vocab_size}, got {base}"
            )
        table = torch.zeros(_TOKEN_CYCLE, vocab_size)
        for row in range(_TOKEN_CYCLE):
            table[row, base + row] = 1.0
        return table

    def set_token_base(self, base: int) -> None:
        self.load_weights([("token_table", self.table_for(base, self.vocab_size))])

    def load_weights(self, weights: Any) -> set[str]:
        """Copy ``(name, tensor)`` pairs into the parameters (vLLM's model API)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)
                loaded.add(name)
        # What the forward pass reads: one arg-max per row, taken once per load.
        self.tokens = [int(i) for i in self.token_table.argmax(dim=1).tolist()]
        return loaded

    def token(self, position: int) -> int:
        return self.tokens[position % _TOKEN_CYCLE]


@dataclass
class _Progress:
    prompt_len: int
    generated: int = 0


def weight_sync_group(
    address: str, port: int, rank: int, world_size: int, timeout_s: float = 300.0
) -> Any:
    """A gloo process group of its own (no default group needed), for weights.

    Rank 0 (the trainer) hosts the rendezvous store at ``address:port``; every
    rank calls this at the same time and it returns once all have joined.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    # Exported only by torch builds with distributed support (the Linux wheels).
    store = dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout)  # type: ignore[attr-defined]
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def broadcast_from_trainer(group: Any, tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group`` (in place on the others)."""
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


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
        hf = getattr(getattr(executor, "model_config", None), "hf_config", None)
        vocab = int(getattr(hf, "vocab_size", 0) or 256)
        self.model = StandInModel(vocab)
        config = getattr(executor, "vllm_config", None)
        transfer = getattr(config, "weight_transfer_config", None)
        self.weight_transfer_engine: Any = None
        #: OpenRLHF's weight-sync group with the trainer, once joined.
        self.sync_group: Any = None
        self._weight_update_active = False
        if config is not None and transfer is not None:
            from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

            register_inline_backend()
            self.weight_transfer_engine = create_transfer_engine(
                WeightTransferEngineFactory, transfer, config, torch.device("cpu"), self.model
            )
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
            known = self._requests.get(new.req_id)
            generated = tokens_generated_before(new)
            if generated is None:  # a release that resumes requests as cached ones
                generated = known.generated if known is not None else 0
            # A recomputed request carries on where it was, never from token 0.
            self._requests[new.req_id] = _Progress(prompt_len=len(prompt), generated=generated)
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
                    tokens.append(self.model.token(state.generated))
                    state.generated += 1
            req_ids.append(req_id)
            sampled.append(tokens)
        if self.step_s > 0 and scheduler_output.total_num_scheduled_tokens > 0:
            time.sleep(self.step_s)
        self.steps += 1
        self._pending = model_runner_output(req_ids, sampled)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        output, self._pending = self._pending, None
        if output is None:
            output = model_runner_output([], [])
        return output

    def take_draft_token_ids(self) -> None:
        return None

    # -- stand-ins for weight updates (observable from requests) ----------------
    def standin_set_token_base(self, base: int) -> int:
        """Load weights that emit ``base, base + 1, ...``; returns the old first token.

        A shortcut around the weight-transfer API, for tests.
        """
        if not 3 <= base <= 200 or base + _TOKEN_CYCLE > self.model.vocab_size:
            raise ValueError(
                f"token base must be in [3, 200] and leave {_TOKEN_CYCLE} tokens below the "
                f"vocabulary size {self.model.vocab_size}, got {base}"
            )
        old = self.model.token(0)
        self.model.set_token_base(base)
        return old

    def standin_get_token_base(self) -> int:
        """The first token the current weights emit."""
        return self.model.token(0)

    def standin_tokens(self) -> list[int]:
        """The tokens the current weights emit at positions 0 to 19."""
        return list(self.model.tokens)

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

    def standin_active_request_ids(self) -> list[str]:
        """The ids of those requests (vLLM's internal ones), sorted."""
        return sorted(self._requests)

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
        self._sleeping_tags = set(sleep_tags())
        if level == 2:
            self.model.set_token_base(_FIRST_TOKEN)

    def wake_up(self, tags: list[str] | None = None) -> None:
        # ``tags`` None wakes everything; a partial wake leaves the rest asleep.
        self._sleeping_tags -= set(sleep_tags() if tags is None else tags)
        if not self._sleeping_tags:
            self.asleep = None

    # Control calls that need no work on a device.
    def _noop(self, *args: Any, **kwargs: Any) -> None:
        return None

    check_health = discard = _noop
    reset_mm_cache = reset_encoder_cache = profile = _noop
    execute_dummy_batch = synchronize_device = _noop

    def shutdown(self) -> None:
        self.sync_group = None
        if self.weight_transfer_engine is not None:
            self.weight_transfer_engine.shutdown()

    # -- the native weight-transfer API (the worker side) ----------------------
    def _transfer_engine(self) -> Any:
        if self.weight_transfer_engine is None:
            raise RuntimeError(
                "Weight transfer not configured: build the engine with "
                "weight_transfer_config={'backend': ...} to enable weight transfer."
            )
        return self.weight_transfer_engine

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        engine = self._transfer_engine()
        engine.init_transfer_engine(engine.parse_init_info(init_info))

    def shutdown_weight_transfer_engine(self) -> None:
        if self._weight_update_active:
            raise RuntimeError("Cannot release a trainer connection during a weight update")
        if self.weight_transfer_engine is not None:
            self.weight_transfer_engine.shutdown()

    def _begin_weight_update(self) -> None:
        engine = self._transfer_engine()
        if self._weight_update_active:
            raise RuntimeError(
                "start_weight_update called while a weight update is already active. "
                "Call finish_weight_update first."
            )
        engine.start_weight_update()
        self._weight_update_active = True

    def start_draft_weight_update(self) -> None:
        self._transfer_engine()
        raise RuntimeError("the stand-in worker has no draft model to update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        engine = self._transfer_engine()
        if not self._weight_update_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        # A list is indexed by global worker rank; the stand-in is rank 0 of one.
        local = update_info[0] if isinstance(update_info, list) else update_info
        try:
            engine.update_weights(local)
        except BaseException:
            self._weight_update_active = False
            raise

    def finish_weight_update(self) -> None:
        engine = self._transfer_engine()
        if not self._weight_update_active:
            raise RuntimeError(
                "finish_weight_update called without a matching start_weight_update."
            )
        engine.finish_weight_update()
        self._weight_update_active = False

    # -- OpenRLHF's WorkerWrap calls (its trainer's weight sync) ----------------
    def init_process_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
        use_ray: bool = False,
    ) -> None:
        """Join the trainer's weight-sync group as rank ``rank_offset``."""
        if use_ray or backend != "gloo":
            raise ValueError(
                f"the stand-in worker joins a weight-sync group over gloo only, got "
                f"backend={backend!r}, use_ray={use_ray}: pass backend='gloo' and "
                "use_ray=False (NCCL and ray.util.collective need GPUs)"
            )
        if self.sync_group is not None:
            raise RuntimeError(
                f"init_process_group({group_name!r}): already in a weight-sync group"
            )
        self.sync_group = weight_sync_group(master_address, master_port, rank_offset, world_size)

    def update_weight(
        self, name: str, dtype: torch.dtype, shape: Any, empty_cache: bool = False
    ) -> None:
        """Receive ``name`` from the trainer's broadcast, then load it."""
        if self.sync_group is None:
            raise RuntimeError("update_weight before init_process_group: join the group first")
        weight = torch.empty(tuple(shape), dtype=dtype)
        broadcast_from_trainer(self.sync_group, weight)
        params = dict(self.model.named_parameters())
        if name not in params:
            raise KeyError(
                f"update_weight: the stand-in model has no weight {name!r} ({sorted(params)})"
            )
        target = params[name]
        if weight.dtype != target.dtype or weight.shape != target.shape:
            raise ValueError(
                f"update_weight({name!r}): got {weight.dtype} {tuple(weight.shape)}, the model "
                f"holds {target.dtype} {tuple(target.shape)}; nothing was loaded"
            )
        self.model.load_weights([(name, weight)])

    def update_weight_cuda_ipc(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "update_weight_cuda_ipc needs CUDA: the stand-in worker takes update_weight "
            "over a gloo group (init_process_group with backend='gloo')"
        )


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
        self.worker.shutdown()
