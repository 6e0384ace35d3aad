"""SGLang's real ``TokenizerManager`` on a machine without a GPU.

The manager is real: its request states, its ``handle_loop``, its pause condition, its
model-update lock and its ZMQ sockets. What stands in for SGLang's scheduler (and, with
``skip_tokenizer_init``, its detokenizer, which the scheduler then bypasses) is
:class:`StandInScheduler`: a separate process that speaks SGLang's real wire format
(``io_struct.sock_recv``/``sock_send``, the same structs) on the same IPC endpoints. It
runs the requests it receives in steps, one token per running request per step, and
answers aborts, pause/continue and weight updates the way the real scheduler does. This
proves wiring, streaming, cancellation and HTTP behaviour, not model numerics.

Build with :func:`make_tokenizer_manager` on the process's main thread (SGLang publishes
its server arguments process-wide, so the last manager built is the one whose
arguments are in force; build one at a time). The model directory holds only a
``config.json`` (:func:`build_tiny_model`): nothing is downloaded, nothing is loaded.

The stand-in reports what it saw on :attr:`StandInScheduler.events`: ``("received",
rid)``, ``("finished", rid)``, ``("aborted", rid)``, ``("paused", mode)``,
``("continued", None)``, ``("weights", model_path)``. Tests synchronise on these, and
force interleavings with :meth:`StandInScheduler.hold` / :meth:`StandInScheduler.release`
(received requests get no token while held).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import queue
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.server_args import PortArgs, ServerArgs

__all__ = [
    "StandInScheduler",
    "build_tiny_model",
    "make_tokenizer_manager",
    "manager_for",
]

# How often a held stand-in looks whether it was released.
_HELD_POLL_MS = 2

#: First token id the stand-in emits; request ``i``'s tokens count up from here.
FIRST_TOKEN = 100

_TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def build_tiny_model(directory: str | os.PathLike[str] | None = None) -> Path:
    """A model directory with only ``config.json`` (a 2-layer Llama, vocabulary 1000)."""
    path = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="lb-sgl-"))
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(_TINY_CONFIG))
    return path


def make_tokenizer_manager(
    model: str | os.PathLike[str],
    ipc_dir: str | os.PathLike[str],
    **server_args: Any,
) -> tuple[TokenizerManager, ServerArgs, PortArgs]:
    """A real ``TokenizerManager`` for ``model``, its sockets under ``ipc_dir``.

    ``server_args`` are ``ServerArgs`` fields (default: ``skip_tokenizer_init=True``,
    ``device="cpu"``). Start a :class:`StandInScheduler` on the returned ``PortArgs``
    before the first request.
    """
    from sglang.srt.server_args import ServerArgs

    options: dict[str, Any] = {"skip_tokenizer_init": True, "device": "cpu"}
    options.update(server_args)
    args = ServerArgs(model_path=str(model), **options)
    manager, ports = manager_for(args, ipc_dir)
    return manager, args, ports


def manager_for(
    args: ServerArgs, ipc_dir: str | os.PathLike[str]
) -> tuple[TokenizerManager, PortArgs]:
    """A real ``TokenizerManager`` built from ``args``, its sockets under ``ipc_dir``.

    ``args`` must have ``skip_tokenizer_init`` (the stand-in sends token ids, and no
    detokenizer runs). Publishes ``args`` as SGLang's launcher does before it builds
    the manager.
    """
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import PortArgs

    if not args.skip_tokenizer_init:
        raise ValueError(
            "the stand-in scheduler sends token ids and no detokenizer runs: "
            "build the server arguments with skip_tokenizer_init=True"
        )
    publish(args, role="tokenizer")
    base = Path(ipc_dir)
    base.mkdir(parents=True, exist_ok=True)

    def ipc(name: str) -> str:
        return f"ipc://{base / name}"

    ports = PortArgs(
        tokenizer_ipc_name=ipc("tokenizer"),
        scheduler_input_ipc_name=ipc("scheduler"),
        detokenizer_ipc_name=ipc("detokenizer"),
        nccl_port=0,
        rpc_ipc_name=ipc("rpc"),
        metrics_ipc_name=ipc("metrics"),
        tokenizer_worker_ipc_name=None,
        decoupled_spec_ipc_config=None,
    )
    manager = TokenizerManager(args, ports)
    # SGLang's Engine copies this from the scheduler's answer at start-up.
    manager.max_req_input_len = manager.context_len - 1
    return manager, ports


@dataclass
class _Running:
    rid: str
    http_worker_ipc: Any
    prompt_tokens: int
    max_new_tokens: int
    produced: int = 0


@dataclass
class _State:
    running: dict[str, _Running] = field(default_factory=dict)
    paused: bool = False

    @property
    def busy(self) -> bool:
        """Requests to step: some running, and not paused."""
        return bool(self.running) and not self.paused


def _reply(cls: Any, **fields: Any) -> Any:
    """An io_struct message: every required field not given is None."""
    import msgspec

    missing = {
        f.name: None for f in msgspec.structs.fields(cls) if f.required and f.name not in fields
    }
    return cls(**missing, **fields)


def _batch(done: list[tuple[_Running, dict[str, Any] | None, list[int]]]) -> Any:
    """One ``BatchTokenIDOutput`` for a step: per request its new tokens and finish reason."""
    from array import array

    from sglang.srt.managers.io_struct import BatchTokenIDOutput

    return _reply(
        BatchTokenIDOutput,
        rids=[r.rid for r, _, _ in done],
        http_worker_ipcs=[r.http_worker_ipc for r, _, _ in done],
        finished_reasons=[reason for _, reason, _ in done],
        decoded_texts=["" for _ in done],
        decode_ids=[array("i", new) for _, _, new in done],
        read_offsets=[0 for _ in done],
        output_ids=[array("i", new) for _, _, new in done],
        skip_special_tokens=[True for _ in done],
        spaces_between_special_tokens=[True for _ in done],
        no_stop_trim=[False for _ in done],
        prompt_tokens=[r.prompt_tokens for r, _, _ in done],
        reasoning_tokens=[0 for _ in done],
        completion_tokens=[r.produced for r, _, _ in done],
        cached_tokens=[0 for _ in done],
        retraction_counts=[0 for _ in done],
    )


@dataclass
class _Answers:
    """What the stand-in process answers the manager: each message, each step."""

    push: Any  # the ZMQ socket to the manager
    events: Any  # the parent's queue of what happened
    state: _State = field(default_factory=_State)

    def finish(self, run: _Running, reason: dict[str, Any], event: str) -> None:
        from sglang.srt.managers import io_struct

        self.state.running.pop(run.rid, None)
        io_struct.sock_send(self.push, _batch([(run, reason, [])]))
        self.events.put((event, run.rid))

    def handle(self, msg: Any) -> None:
        from sglang.srt.managers import io_struct

        state, events = self.state, self.events
        if isinstance(msg, io_struct.BatchTokenizedGenerateReqInput):
            for one in msg.batch:
                self.handle(one)
        elif isinstance(msg, io_struct.TokenizedGenerateReqInput):
            n = msg.sampling_params.max_new_tokens
            run = _Running(msg.rid, msg.http_worker_ipc, len(msg.input_ids), int(n or 16))
            state.running[msg.rid] = run
            events.put(("received", msg.rid))
        elif isinstance(msg, io_struct.AbortReq):
            aborted = {
                "type": "abort",
                "message": "aborted by the tokenizer manager",
                "status_code": None,
                "err_type": None,
            }
            for run in list(state.running.values()):
                # As the real scheduler does: a batch request's rids share a prefix.
                if msg.abort_all or (msg.rid and run.rid.startswith(msg.rid)):
                    self.finish(run, aborted, "aborted")
        elif isinstance(msg, io_struct.PauseGenerationReqInput):
            state.paused = True
            events.put(("paused", msg.mode))
        elif isinstance(msg, io_struct.ContinueGenerationReqInput):
            state.paused = False
            events.put(("continued", None))
        elif isinstance(msg, io_struct.UpdateWeightFromDiskReqInput):
            io_struct.sock_send(
                self.push,
                _reply(
                    io_struct.UpdateWeightFromDiskReqOutput,
                    success=True,
                    message="weights updated by the stand-in scheduler",
                    num_paused_requests=0,
                    http_worker_ipc=msg.http_worker_ipc,
                ),
            )
            events.put(("weights", msg.model_path))
        # Anything else (FreezeGCReq, configure-logging, ...) needs no answer here.

    def step(self) -> None:
        """One token for every running request; the ones at their length finish."""
        from sglang.srt.managers import io_struct

        step: list[tuple[_Running, dict[str, Any] | None, list[int]]] = []
        for run in list(self.state.running.values()):
            token = FIRST_TOKEN + run.produced
            run.produced += 1
            reason = None
            if run.produced >= run.max_new_tokens:
                reason = {"type": "length", "length": run.max_new_tokens}
                del self.state.running[run.rid]
            step.append((run, reason, [token]))
        io_struct.sock_send(self.push, _batch(step))
        for run, reason, _ in step:
            if reason is not None:
                self.events.put(("finished", run.rid))


def _serve(
    scheduler_input: str, tokenizer: str, step_s: float, events: Any, ready: Any, go: Any
) -> None:
    """The stand-in process: receive from the manager, step, answer."""
    import zmq
    from sglang.srt.managers import io_struct

    # Forked: the parent's Python signal handlers (a serve command's SIGTERM, say)
    # would otherwise survive stop()'s terminate(). SIGINT goes to the whole process
    # group on Ctrl-C; the parent stops this process in its order.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(scheduler_input)
    push = ctx.socket(zmq.PUSH)
    push.connect(tokenizer)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    answers = _Answers(push, events)
    state = answers.state
    ready.set()
    cadence = _Cadence(step_s)
    while True:
        timeout = cadence.wait_ms(state.busy, not go.is_set(), time.monotonic())
        while poller.poll(timeout):
            answers.handle(io_struct.sock_recv(pull))
            timeout = 0
        # The messages just handled may have started, ended or paused requests.
        if state.busy and go.is_set() and cadence.step_now(time.monotonic()):
            answers.step()


@dataclass
class _Cadence:
    """When the stand-in steps: every ``step_s`` while requests run, as a forward pass
    takes its time whatever arrives meanwhile. A message handled during the wait never
    brings the next step forward (it did once, and then the step time shrank with the
    request rate: a faster server got more steps). ``step_s`` 0: as fast as the messages
    go."""

    step_s: float
    due: float | None = None  # when the next step is due; None: nothing running

    def wait_ms(self, busy: bool, held: bool, now: float) -> int | None:
        """How long to wait for a message: until the step is due (whole milliseconds,
        rounded up); forever when idle; a short poll when held."""
        if not busy:
            self.due = None
            return None
        if held:
            return _HELD_POLL_MS  # keep receiving, do not step
        if self.due is None:
            self.due = now + self.step_s
        return max(0, math.ceil((self.due - now) * 1000))

    def step_now(self, now: float) -> bool:
        """Whether the running requests step at ``now``; if so, the next step is one
        ``step_s`` later. Work that arrived at an idle stand-in steps ``step_s`` after."""
        if self.due is None:
            self.due = now + self.step_s
        if now < self.due:
            return False
        self.due = now + self.step_s
        return True


class StandInScheduler:
    """SGLang's scheduler replaced by a process that speaks its ZMQ messages.

    ``step_s`` is the time one step takes (0: as fast as the messages go). Use as a
    context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, ports: PortArgs, *, step_s: float = 0.0) -> None:
        # fork: the child needs SGLang's io_struct, which the parent has imported
        # already (a fresh interpreter would spend 15 s importing it again).
        ctx = multiprocessing.get_context("fork")
        self.events: Any = ctx.Queue()
        self._seen: list[tuple[str, Any]] = []  # reported, not yet waited for
        self._ready = ctx.Event()
        self._go = ctx.Event()
        self._go.set()
        self._process = ctx.Process(
            target=_serve,
            args=(
                ports.scheduler_input_ipc_name,
                ports.tokenizer_ipc_name,
                step_s,
                self.events,
                self._ready,
                self._go,
            ),
            name="loopbridge-sglang-standin-scheduler",
            daemon=True,
        )

    def start(self, timeout: float = 60.0) -> StandInScheduler:
        self._process.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError("the stand-in scheduler did not start")
        return self

    def wait_for(self, kind: str, key: Any = None, timeout: float = 60.0) -> Any:
        """Block until the stand-in reports ``kind`` (for ``key``, if given); its key."""
        deadline = time.monotonic() + timeout
        while True:
            for i, (got, value) in enumerate(self._seen):
                if got == kind and (key is None or value == key):
                    del self._seen[i]
                    return value
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"the stand-in scheduler did not report {kind} {key!r} in {timeout} s; "
                    f"its reports no wait has claimed: {self._seen!r}"
                )
            with contextlib.suppress(queue.Empty):
                self._seen.append(self.events.get(timeout=left))

    def hold(self) -> None:
        """Stop stepping: requests are received (and reported) but get no tokens."""
        self._go.clear()

    def release(self) -> None:
        """Step again after :meth:`hold`."""
        self._go.set()

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def stop(self) -> None:
        if self._process.pid is not None and self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        with contextlib.suppress(AssertionError):
            self._process.join(10)
        self.events.close()

    def __enter__(self) -> StandInScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
