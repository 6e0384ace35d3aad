"""The proxy's member table is derived from the installed vLLM and enforced."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest
from vllm_engines import has_member, wake_up_says_awake

from loopbridge import LoopAffinityError, LoopThread, blocking
from loopbridge_vllm import UnclassifiedMemberError, UnsupportedEngineConfig, engine_client_proxy
from loopbridge_vllm.engine import RULES, Policy, classify_surface, surface

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release


def test_every_installed_member_is_classified(shared_engine: tuple[LoopThread, Any]) -> None:
    from vllm.engine.protocol import EngineClient
    from vllm.v1.engine.async_llm import AsyncLLM

    _, llm = shared_engine
    table = classify_surface(AsyncLLM, llm)
    unclassified = sorted(name for name, (_, rule) in table.items() if rule is None)
    assert unclassified == []
    # The derivation really covers the protocol, the class and the instance.
    for name in ("generate", "encode", "errored", "shutdown", "collective_rpc"):
        assert name in table
    assert ("check_admission" in table) is has_member("check_admission")  # 0.29 adds it
    for name in EngineClient.__annotations__:
        assert table[name][1] is not None and table[name][1].policy is Policy.STABLE
    assert {m.origin for m, _ in table.values()} >= {"AsyncLLM", "instance"}
    assert all(rule is not None and rule.reason for _, rule in table.values())


def test_rules_agree_with_member_kinds() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    kinds = {name: m.kind for name, m in surface(AsyncLLM).items()}
    for name, rule in RULES.items():
        kind = kinds.get(name)
        if kind is None:
            continue  # a member of another vLLM version, or an instance attribute
        if rule.policy is Policy.STREAM:
            assert kind == "asyncgen", name
        elif rule.policy is Policy.MARSHAL:
            assert kind == "async", name
        elif rule.policy is Policy.HEALTH:  # check_health is a coroutine that only reads
            assert kind in ("sync", "property", "data", "async"), name
        elif rule.policy in (Policy.STABLE, Policy.THREADSAFE, Policy.REFUSE):
            assert kind in ("sync", "property", "data"), name


def _in_thread(fn: Any, timeout: float = 10.0) -> Any:
    """Run ``fn`` on a plain thread (a foreign thread for the engine); raise its error."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=main)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "call did not return"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def test_proxy_follows_the_table_for_every_member(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    from vllm.engine.protocol import EngineClient
    from vllm.v1.engine.async_llm import AsyncLLM

    _, llm = shared_engine
    p = engine_proxy
    assert isinstance(p, EngineClient) and isinstance(p, AsyncLLM) and p is not llm
    table = classify_surface(AsyncLLM, llm)
    checked = 0
    for name, (_member, rule) in table.items():
        assert rule is not None
        if rule.policy in (Policy.STABLE, Policy.HEALTH, Policy.THREADSAFE):
            # Read directly from a foreign thread (calling is not needed to prove
            # the proxy lets it through; a refused member raises on access).
            _in_thread(lambda n=name: getattr(p, n))
            checked += 1
        elif rule.policy is Policy.REFUSE:
            with pytest.raises(LoopAffinityError):
                _in_thread(lambda n=name: getattr(p, n))
            checked += 1
        elif rule.policy in (Policy.MARSHAL, Policy.STREAM):
            wrapped = getattr(getattr(type(p), name), "__wrapped__", None)
            assert wrapped is not None, f"{name} is not marshalled"
            checked += 1
    assert checked >= 40
    # Stable data is the engine's own object, not a copy.
    assert p.model_config is llm.model_config and p.renderer is llm.renderer


def test_marshalled_members_run_on_the_owner_loop(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    from vllm import SamplingParams

    owner, llm = shared_engine
    core = llm.engine_core
    seen: list[tuple[str, asyncio.AbstractEventLoop]] = []
    spied = ("collective_rpc_async", "add_request_async")

    def spy(name: str) -> None:
        original = getattr(core, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, asyncio.get_running_loop()))
            return await original(*args, **kwargs)

        setattr(core, name, wrapper)  # instance attribute: what AsyncLLM calls

    for name in spied:
        spy(name)
    try:

        async def main() -> tuple[asyncio.AbstractEventLoop, Any, list[Any]]:
            base = await engine_proxy.collective_rpc("standin_get_token_base")
            params = SamplingParams(max_tokens=3, ignore_eos=True)
            outs = [o async for o in engine_proxy.generate("hi", params, "surface-1")]
            return asyncio.get_running_loop(), base, outs

        caller, base, outs = asyncio.run(main())
    finally:
        for name in spied:
            delattr(core, name)
    assert caller is not owner.loop
    assert isinstance(base[0], int)
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
    assert {name for name, _ in seen} == set(spied)
    assert all(loop is owner.loop for _, loop in seen)


#: The RL members an RL framework drives from its trainer, and the engine-core
#: client calls each makes (``collective_rpc_async`` labelled by its method).
RL_CALLS = [
    ("get_weight_version", ["get_weight_version_async"]),
    ("pause_generation", ["pause"]),
    ("init_weight_transfer_engine", ["collective_rpc_async:init_weight_transfer_engine"]),
    ("start_weight_update", ["collective_rpc_async:start_weight_update"]),
    ("update_weights", ["collective_rpc_async:update_weights"]),
    (
        "finish_weight_update",
        ["collective_rpc_async:finish_weight_update", "set_weight_version_async"],
    ),
    ("shutdown_weight_transfer_engine", ["collective_rpc_async:shutdown_weight_transfer_engine"]),
    ("resume_generation", ["resume"]),
    ("sleep", ["sleep_async"]),
    ("wake_up", ["wake_up_async"]),
]


def test_rl_members_run_on_the_owner_loop(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    """Every weight-transfer, pause and sleep member, called from another loop,
    reaches the engine-core client on the owner loop (on each vLLM release)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    from loopbridge_vllm._standin import StandInModel
    from loopbridge_vllm.weight_transfer import inline_update

    owner, llm = shared_engine
    core = llm.engine_core
    seen: list[tuple[str, asyncio.AbstractEventLoop]] = []
    # 0.33 pauses through pause_generation_async, 0.32 through pause_scheduler_async.
    labels = {
        "pause_generation_async": "pause",
        "pause_scheduler_async": "pause",
        "resume_scheduler_async": "resume",
        "resume_generation_async": "resume",
    }
    spied = [
        "collective_rpc_async",
        "get_weight_version_async",
        "set_weight_version_async",
        "sleep_async",
        "wake_up_async",
        *labels,
    ]
    spied = [name for name in spied if hasattr(core, name)]

    def spy(name: str) -> None:
        original = getattr(core, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            label = labels.get(name, name)
            if name == "collective_rpc_async":
                label += f":{args[0]}"
            seen.append((label, asyncio.get_running_loop()))
            return await original(*args, **kwargs)

        setattr(core, name, wrapper)  # instance attribute: what AsyncLLM calls

    # 0.29 has no shutdown_weight_transfer_engine (0.32 adds it): the proxy, a
    # subclass of the installed AsyncLLM, refuses it by name there. Its wake_up
    # returns None (0.32 and later: whether the engine is awake).
    has_shutdown = has_member("shutdown_weight_transfer_engine")
    calls = [c for c in RL_CALLS if has_shutdown or c[0] != "shutdown_weight_transfer_engine"]
    wake_returns = wake_up_says_awake()
    # 0.24 has no weight versions: finish_weight_update takes none, nothing is read back.
    versions = has_member("get_weight_version")
    if not versions:
        calls = [
            (member, [c for c in made if c != "set_weight_version_async"])
            for member, made in calls
            if member != "get_weight_version"
        ]
    first = blocking(engine_proxy).collective_rpc("standin_tokens")[0][0]
    same = StandInModel.table_for(first, llm.model_config.get_vocab_size())
    for name in spied:
        spy(name)
    done: list[str] = []
    try:

        async def main() -> tuple[asyncio.AbstractEventLoop, str, str, bool]:
            p = engine_proxy
            before = await p.get_weight_version() if versions else ""
            if versions:
                done.append("get_weight_version")
            await p.pause_generation(mode="keep")
            done.append("pause_generation")
            # The CPU engine's in-request backend: the calls really run there.
            await p.init_weight_transfer_engine(WeightTransferInitRequest(init_info={}))
            done.append("init_weight_transfer_engine")
            await p.start_weight_update()
            done.append("start_weight_update")
            await p.update_weights(inline_update({"token_table": same}))  # the weights it has
            done.append("update_weights")
            if versions:
                await p.finish_weight_update(weight_version="surface-v2")
            else:
                await p.finish_weight_update()
            done.append("finish_weight_update")
            if has_shutdown:
                await p.shutdown_weight_transfer_engine()
                done.append("shutdown_weight_transfer_engine")
            else:
                with pytest.raises(AttributeError, match="shutdown_weight_transfer_engine"):
                    await p.shutdown_weight_transfer_engine()
            await p.resume_generation()
            done.append("resume_generation")
            await p.sleep(level=1)
            done.append("sleep")
            awake = await p.wake_up()
            done.append("wake_up")
            if not versions:  # refused by name on this release, never dropped
                for name in ("get_weight_version", "update_weight_version"):
                    with pytest.raises(AttributeError, match=name):
                        getattr(p, name)
                return asyncio.get_running_loop(), before, before, awake
            after = await p.get_weight_version()
            await llm_version(before)
            return asyncio.get_running_loop(), before, after, awake

        async def llm_version(version: str) -> None:  # put the shared engine's back
            await engine_proxy.update_weight_version(version)

        caller, before, after, awake = asyncio.run(main())
    finally:
        for name in spied:
            delattr(core, name)
        # The engine is shared: never leave it paused for the next test.
        blocking(engine_proxy).resume_generation()
    assert caller is not owner.loop
    assert done == [member for member, _ in calls]
    assert not versions or (after == "surface-v2" and before != after)
    assert awake is (True if wake_returns else None)
    expected = [label for _, made in calls for label in made]
    got = [label for label, _ in seen]
    # Ignore the trailing get/set that restore the version; everything else in order.
    assert got[: len(expected)] == expected, got
    assert all(loop is owner.loop for _, loop in seen)


def test_health_reads_do_not_wait_for_the_owner_loop(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    owner, _ = shared_engine
    release = threading.Event()
    blocked = threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(30)

    owner.loop.call_soon_threadsafe(block)
    assert blocked.wait(10)
    try:
        # The owner loop is stuck: anything marshalled would hang here.
        status = _in_thread(
            lambda: (
                engine_proxy.errored,
                engine_proxy.is_running,
                engine_proxy.is_stopped,
                type(engine_proxy.dead_error).__name__,
            )
        )
        assert status == (False, True, False, "EngineDeadError")
        # check_health (behind /health) runs on the caller's loop: it answers too.
        _in_thread(lambda: asyncio.run(engine_proxy.check_health()))

        # A short cancel grace: the timed-out call's cleanup needs the stuck loop.
        quick = engine_client_proxy(shared_engine[1], cancel_grace=0.1)

        async def tasks() -> None:
            await quick.get_supported_tasks()

        # ... and a marshalled call indeed waits for it (contrast).
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(tasks(), 0.3))
    finally:
        release.set()


def test_unclassified_member_fails_at_startup() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    def check_budget(self: Any) -> None:  # a sync member no rule knows
        pass

    newer = types.new_class(
        "AsyncLLM", (AsyncLLM,), exec_body=lambda ns: ns.update(check_budget=check_budget)
    )
    bare = object.__new__(newer)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(UnclassifiedMemberError, match="check_budget"):
            engine_client_proxy(bare, loop=loop)
    finally:
        loop.close()

    # New async members need no rule: they are marshalled by kind.
    async def refresh(self: Any) -> None:
        pass

    newer_async = types.new_class(
        "AsyncLLM", (AsyncLLM,), exec_body=lambda ns: ns.update(refresh=refresh)
    )
    table = classify_surface(newer_async)
    assert table["refresh"][1] is not None and table["refresh"][1].policy is Policy.MARSHAL


def test_unsafe_admission_config_is_refused() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    bare = object.__new__(AsyncLLM)
    bare.scheduler_config = types.SimpleNamespace(max_num_queued_tokens=100)
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(UnsupportedEngineConfig, match="max_num_queued_tokens"):
            engine_client_proxy(bare, loop=loop)
    finally:
        loop.close()


def test_proxy_is_idempotent_and_loop_mismatch_is_refused(
    shared_engine: tuple[LoopThread, Any], engine_proxy: Any
) -> None:
    _, llm = shared_engine
    assert engine_client_proxy(engine_proxy) is engine_proxy
    other = asyncio.new_event_loop()
    try:
        with pytest.raises(LoopAffinityError, match="another loop"):
            engine_client_proxy(llm, loop=other)
    finally:
        other.close()
