"""The raw ``AsyncLLM`` awaited from another loop, under ``LOOPBRIDGE_SANITIZE=raise``.

The misuse shows on the owner's side: vLLM's output handler (the engine's loop)
wakes a collector that the caller parked on its own loop. The sanitizer must fail
that caller, at once, and leave the engine serving: before, it raised inside the
output handler, the engine died, and the caller still hung.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from vllm_engines import start_engine, stop_engine

import loopbridge.sanitizer
from loopbridge_vllm import engine_client_proxy

pytestmark = [pytest.mark.vllm, pytest.mark.every_release]

BOUND_S = 60.0  # hang guard: the failure is expected within one engine step


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def test_raise_mode_fails_the_misusing_caller_and_the_engine_goes_on(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vllm import SamplingParams

    owner, llm = start_engine(tiny_model, "sanitized-raise-owner")
    try:
        owner.run(llm.get_supported_tasks)  # the output handler runs on the owner loop
        params = SamplingParams(max_tokens=4, ignore_eos=True)

        async def raw_from_another_loop() -> BaseException | None:
            try:
                async with asyncio.timeout(BOUND_S):
                    async for _ in llm.generate("x", params, "raw-foreign"):
                        pass
            except TimeoutError as exc:
                return exc
            except Exception as exc:
                return exc
            return None

        with (
            caplog.at_level(logging.ERROR, logger="loopbridge.sanitizer"),
            loopbridge.sanitizer.sanitize("raise") as block,
        ):
            failure = asyncio.run(raw_from_another_loop())
        assert block.reports, "the cross-loop use went unreported"
        errors = [e for e in _chain(failure) if isinstance(e, loopbridge.sanitizer.SanitizerError)]
        assert errors, f"the caller did not get the sanitizer's error: {failure!r}"
        assert "wrong loop" in str(errors[0]) or "wrong thread" in str(errors[0])
        # The engine the sanitizer protects is alive and serves the right way.
        assert not llm.errored

        async def through_the_proxy() -> int:
            n = 0
            async for out in engine_client_proxy(llm).generate("x", params, "proxied"):
                n = len(out.outputs[0].token_ids)
            return n

        assert asyncio.run(through_the_proxy()) >= 1
    finally:
        stop_engine(owner, llm)


def test_without_the_sanitizer_the_raw_engine_from_another_loop_hangs(tiny_model: Path) -> None:
    """What docs/integrations.md says of a trainer that awaits the raw engine in a
    loop of its own: no error, a hang. The engine's side runs on its own thread
    (it finishes the request and hands the outputs to the caller's collector, or,
    on 0.24, its client waits on the caller's loop), and nothing wakes the
    caller's loop."""
    import threading

    from vllm import SamplingParams

    owner, llm = start_engine(tiny_model, "raw-hang-owner")
    try:
        owner.run(llm.get_supported_tasks)
        loop = asyncio.new_event_loop()
        finished = threading.Event()

        async def raw() -> None:
            params = SamplingParams(max_tokens=4, ignore_eos=True)
            async for _ in llm.generate("x", params, "raw-hang"):
                pass

        def caller() -> None:
            try:
                loop.run_until_complete(raw())
            except BaseException:  # cancelled by the clean-up below
                pass
            finally:
                finished.set()

        thread = threading.Thread(target=caller, name="trainer-loop", daemon=True)
        thread.start()

        async def served() -> bool:
            # Polls the engine's own count: nothing announces that it took the
            # request in and finished it (a few steps when it does). The bound
            # is the hang this test is about.
            deadline = asyncio.get_running_loop().time() + 10.0
            seen = False
            while asyncio.get_running_loop().time() < deadline:
                pending = llm.output_processor.get_num_unfinished_requests()
                seen = seen or pending > 0
                if seen and pending == 0:
                    return True
                await asyncio.sleep(0.01)
            return False

        owner.run(served)
        assert not finished.wait(1.0), "the raw call returned: it did not hang"
        assert not llm.errored  # no error anywhere: the caller just waits
        # Clean up: wake the caller's loop (and at last cancel its call).
        for attempt in range(400):
            if finished.is_set():
                break
            if attempt == 200:
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(loop)])
            loop.call_soon_threadsafe(lambda: None)
            finished.wait(0.01)
        thread.join(BOUND_S)
        if not thread.is_alive():
            loop.close()
    finally:
        stop_engine(owner, llm)
