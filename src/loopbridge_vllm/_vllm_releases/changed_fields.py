"""vLLM data whose fields or constants differ between supported releases.

The CPU stand-in worker (``loopbridge_vllm._standin``) builds and reads vLLM's
scheduler and model-runner data; each function here adapts to the fields the
installed vLLM's classes have, never to its version string.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["model_runner_output", "sleep_tags", "tokens_generated_before"]

#: The tags ``Executor.sleep`` puts to sleep when given none: what 0.29 and
#: 0.24 hard-code in that method, and what later releases name ``SLEEP_TAGS``.
_HARD_CODED_SLEEP_TAGS = ("weights", "kv_cache")


@functools.cache
def sleep_tags() -> frozenset[str]:
    """The memory tags a sleep releases and a tag-less ``wake_up`` restores.

    ``vllm.v1.executor.abstract.SLEEP_TAGS`` from 0.32 (0.33 and 0.34 alike);
    0.29 and 0.24 have no such name and hard-code the same two tags in
    ``Executor.sleep``.
    """
    from vllm.v1.executor import abstract

    return frozenset(getattr(abstract, "SLEEP_TAGS", _HARD_CODED_SLEEP_TAGS))


@functools.cache
def _model_runner_output_fields() -> frozenset[str]:
    from vllm.v1.outputs import ModelRunnerOutput

    return frozenset(f.name for f in dataclasses.fields(ModelRunnerOutput))


def model_runner_output(req_ids: Sequence[str], sampled_token_ids: list[list[int]]) -> Any:
    """A ``ModelRunnerOutput`` for ``req_ids`` in order, with their sampled tokens.

    0.34 removed ``req_id_to_index`` (the index is the position in
    ``req_ids``); earlier releases require it.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    kwargs: dict[str, Any] = {"req_ids": list(req_ids), "sampled_token_ids": sampled_token_ids}
    if "req_id_to_index" in _model_runner_output_fields():
        kwargs["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(**kwargs)


def tokens_generated_before(new_request: Any) -> int | None:
    """How many tokens a newly scheduled request had already generated, if vLLM says.

    From 0.34 a preempted or recomputed request comes back as a new request
    whose ``prefill_token_ids`` is its prompt followed by the tokens it already
    generated; earlier releases resume it as a cached request instead, and have
    no such field (``None`` here: the caller keeps what it knows).
    """
    prefill = getattr(new_request, "prefill_token_ids", None)
    if prefill is None:
        return None
    return max(0, len(prefill) - len(new_request.prompt_token_ids or []))
