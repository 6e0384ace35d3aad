"""vLLM's native weight-transfer API through the proxy, on the real engine.

The CPU engine is built with ``weight_transfer_config={"backend":
"loopbridge_inline"}``: the stand-in worker creates that backend through
vLLM's ``WeightTransferEngineFactory`` and its emitted tokens are the arg-max
of its ``token_table`` weights, so a transfer changes what the engine
generates, and the version passed to ``finish_weight_update`` is what vLLM's
EngineCore stamps on the outputs produced after it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_engines import finish_weight_update, has_member

from loopbridge import blocking

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release

VERSION_0 = "default"  # vLLM's weight version before any update
#: 0.24 has no weight versions (finish_weight_update takes none); 0.29 has no
#: shutdown_weight_transfer_engine; 0.29 and 0.24 no per-token weight_versions.
VERSIONS = has_member("get_weight_version")
SHUTDOWN = has_member("shutdown_weight_transfer_engine")


def _generate(proxy: Any, rid: str, n: int = 3) -> Any:
    from vllm import SamplingParams

    async def main() -> Any:
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        outs = [o async for o in proxy.generate("transfer", params, rid)]
        return outs[-1].outputs[0]

    return asyncio.run(main())


def _table(llm: Any, base: int) -> Any:
    from loopbridge_vllm._standin import StandInModel

    return StandInModel.table_for(base, llm.model_config.get_vocab_size())


@pytest.fixture
def engine(shared_engine: tuple[Any, Any], engine_proxy: Any) -> Iterator[Any]:
    """The blocking face; the shared engine's weights and version put back after."""
    face = blocking(engine_proxy)
    version = face.get_weight_version() if VERSIONS else None
    yield face
    face.resume_generation()
    face.collective_rpc("standin_set_token_base", args=(10,))
    if VERSIONS:
        face.update_weight_version(version)


def test_a_transfer_changes_what_the_engine_generates(
    shared_engine: tuple[Any, Any], engine_proxy: Any, engine: Any
) -> None:
    """init, pause, start, update, finish(version), resume from a trainer thread."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    from loopbridge_vllm.weight_transfer import inline_update

    _, llm = shared_engine
    before = _generate(engine_proxy, "wt-before")
    assert list(before.token_ids) == [10, 11, 12]
    log: list[Any] = []
    errors: list[BaseException] = []

    def trainer() -> None:
        try:
            engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
            engine.pause_generation(mode="keep")
            engine.start_weight_update()
            engine.update_weights(inline_update({"token_table": _table(llm, 70)}))
            finish_weight_update(engine, "step-1")
            engine.resume_generation()
            log.append(engine.get_weight_version() if VERSIONS else "step-1")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=trainer, name="trainer")
    thread.start()
    thread.join(60)
    assert not errors and log == ["step-1"]
    after = _generate(engine_proxy, "wt-after")
    assert list(after.token_ids) == [70, 71, 72]
    if hasattr(after, "weight_versions"):  # 0.32 and later
        # vLLM's own per-token spans: every token from the new weights.
        spans = [(s.version, s.start, s.end) for s in after.weight_versions or []]
        assert spans == [("step-1", 0, 3)]
    assert engine.collective_rpc("standin_tokens")[0][:3] == [70, 71, 72]


def test_transfer_errors_come_back_and_leave_the_weights(engine: Any, shared_engine: Any) -> None:
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    from loopbridge_vllm.weight_transfer import inline_update

    _, llm = shared_engine
    engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
    good = inline_update({"token_table": _table(llm, 90)})
    with pytest.raises(Exception, match="start_weight_update must be called before"):
        engine.update_weights(good)
    with pytest.raises(Exception, match="without a matching start_weight_update"):
        engine.finish_weight_update()
    engine.start_weight_update()
    with pytest.raises(Exception, match="already active"):
        engine.start_weight_update()
    if SHUTDOWN:
        with pytest.raises(Exception, match="Cannot release a trainer connection"):
            engine.shutdown_weight_transfer_engine()
    else:  # not on this release: refused by name
        with pytest.raises(AttributeError, match="shutdown_weight_transfer_engine"):
            engine.shutdown_weight_transfer_engine()
    wrong_name = inline_update({"lm_head.weight": _table(llm, 90)})
    with pytest.raises(Exception, match=r"no parameter 'lm_head\.weight'"):
        engine.update_weights(wrong_name)
    # A failed chunk ends the update, as on vLLM's GPU worker.
    with pytest.raises(Exception, match="start_weight_update must be called before"):
        engine.update_weights(good)
    engine.start_weight_update()
    with pytest.raises(Exception, match=r"'token_table' is \(4, 4\)"):
        engine.update_weights(inline_update({"token_table": _table(llm, 90)[:4, :4]}))
    assert engine.collective_rpc("standin_tokens")[0][:2] == [10, 11]  # nothing loaded
    engine.start_weight_update()
    engine.update_weights(good)
    engine.finish_weight_update()
    assert engine.collective_rpc("standin_tokens")[0][:2] == [90, 91]
    if SHUTDOWN:
        engine.shutdown_weight_transfer_engine()
        with pytest.raises(Exception, match="not initialised"):
            engine.start_weight_update()
    assert not engine.errored
