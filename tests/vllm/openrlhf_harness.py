"""What tests/vllm/test_openrlhf_server.py needs around OpenRLHF's real classes.

* :func:`user_change` reads the change a user makes to an OpenRLHF agent
  executor (the ``diff`` blocks of docs/integrations.md's OpenRLHF section) and
  :func:`without_loopbridge` undoes it in ``examples/openrlhf_agent_executor.py``:
  the executor as OpenRLHF's example has it, with no bridge.
* :func:`start_actor` starts OpenRLHF's ``RolloutRayActor`` on the stand-in
  engine, with an executor file.
* The functions taking ``actor`` run inside a ``RolloutRayActor`` process through
  ``actor.__ray_call__``: they install the race amplifier there and report the
  engine's state (this module is on the Ray workers' ``PYTHONPATH``).
* :func:`push_weights` is the trainer's side of OpenRLHF's weight sync, called
  as its ``broadcast_to_vllm`` calls it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "openrlhf_agent_executor.py"
DOCS = REPO / "docs" / "integrations.md"
_SECTION = "## OpenRLHF"

# -- the user's change ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hunk:
    before: str  # the lines as OpenRLHF's shape has them
    after: str  # the lines with loopbridge
    changed: int  # lines removed plus lines added (blank ones included)


def user_change() -> list[Hunk]:
    """The ``diff`` blocks of the OpenRLHF section of docs/integrations.md."""
    text = DOCS.read_text()
    start = text.index(_SECTION)
    end = text.find("\n## ", start + len(_SECTION))
    section = text[start : end if end >= 0 else len(text)]
    hunks = []
    for block in re.findall(r"^```diff\n(.*?)^```$", section, flags=re.S | re.M):
        before: list[str] = []
        after: list[str] = []
        changed = 0
        for line in block.splitlines():
            op, rest = line[:1], line[1:]
            assert op in " +-", f"diff line without an operation: {line!r}"
            if op in " -":
                before.append(rest)
            if op in " +":
                after.append(rest)
            changed += op != " "
        hunks.append(Hunk("\n".join(before) + "\n", "\n".join(after) + "\n", changed))
    assert hunks, f"no diff block in {DOCS.name}'s OpenRLHF section"
    return hunks


def without_loopbridge(source: str, hunks: list[Hunk]) -> str:
    """``source`` (the example) with each hunk undone; each must occur once."""
    for hunk in hunks:
        assert source.count(hunk.after) == 1, f"not exactly once in the example:\n{hunk.after}"
        source = source.replace(hunk.after, hunk.before)
    assert "loopbridge" not in source.split('"""', 2)[2], "loopbridge left in the raw executor"
    return source


# -- OpenRLHF's actor on the stand-in engine ----------------------------------------


def engine_kwargs(model: Path) -> dict[str, Any]:
    """The stand-in engine's arguments, as ``AsyncEngineArgs`` keywords."""
    from loopbridge_vllm.cpu_engine import engine_args

    ours = engine_args(model)
    out = {}
    for f in dataclasses.fields(ours):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if getattr(ours, f.name) != default:
            out[f.name] = getattr(ours, f.name)
    return out


def start_actor(model: Path, executor: Path) -> Any:
    """OpenRLHF's ``RolloutRayActor`` as ``create_vllm_engines`` makes one, on CPU."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    return RolloutRayActor.options(num_cpus=1, num_gpus=0).remote(
        num_gpus=0, agent_func_path=str(executor), **engine_kwargs(model)
    )


# -- run inside the actor's process (actor.__ray_call__) ------------------------------

_HANDLER_LOGGER = "vllm.v1.engine.async_llm"  # where the output handler logs its death
_state: dict[str, Any] = {}


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            self.seen.append(f"{type(exc).__name__}: {exc}")


def install_amplifier(actor: Any) -> None:
    """The benchmark's correctness-phase hook, process-wide, and an error log."""
    from loopbridge_bench.vllm import CollectorSetHold

    assert "hook" not in _state, "amplifier already installed in this actor"
    _state["errors"] = errors = _Errors()
    logging.getLogger(_HANDLER_LOGGER).addHandler(errors)
    _state["hook"] = CollectorSetHold().install()


def engine_report(actor: Any) -> dict[str, Any]:
    """The engine's health, the output handler's fate and the amplifier's counts."""
    llm = actor.llm
    handler = llm.output_handler
    died = None
    if handler is not None and handler.done() and not handler.cancelled():
        exc = handler.exception()
        died = None if exc is None else f"{type(exc).__name__}: {exc}"
    hook = _state["hook"]
    return {
        "errored": bool(llm.errored),
        "handler_done": handler is not None and handler.done(),
        "handler_error": died,
        "logged": list(_state["errors"].seen),
        "collector_sets": hook.collector_sets,
        "foreign_sets": hook.foreign_sets,
        "overlaps": hook.overlaps,
    }


def server_url(actor: Any) -> str:
    """The executor's OpenAI server (started by the first rollout)."""
    url = actor.executor.base_url
    assert url is not None, "no rollout has started the executor's server yet"
    return str(url)


def shutdown(actor: Any) -> None:
    """Stop the executor's server and the engine (before the actor is killed)."""
    server = getattr(actor.executor, "server", None)
    if server is not None:
        server.should_exit = True
        actor.executor.thread.join(30)
    _state.pop("hook").uninstall()
    from loopbridge_vllm import shutdown_engine

    shutdown_engine(actor.llm)


# -- the trainer's side of OpenRLHF's weight sync --------------------------------------


def push_weights(actor: Any, group: Any, weights: dict[str, Any], guard_s: float) -> None:
    """As ``broadcast_to_vllm`` does per parameter: ``update_weight.remote``, the
    broadcast from rank 0, then ``ray.get``."""
    import ray

    from loopbridge_vllm._standin import broadcast_from_trainer

    for count, (name, tensor) in enumerate(weights.items(), 1):
        ref = actor.update_weight.remote(
            name, dtype=tensor.dtype, shape=tensor.shape, empty_cache=count == len(weights)
        )
        broadcast_from_trainer(group, tensor)
        ray.get(ref, timeout=guard_s)
