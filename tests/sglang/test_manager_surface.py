"""The TokenizerManager member table against the installed SGLang: the drift guard.

Every member of the real manager (class, mixins and instance attributes) has a rule;
rules agree with what the members are; a member SGLang adds later, which no rule
covers, stops the proxy at start-up instead of failing requests later.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from conftest import Manager
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager

from loopbridge import LoopAffinityError, LoopThread, owner_loop, unwrap
from loopbridge_sglang import (
    UnclassifiedMemberError,
    adopt_manager,
    async_generate,
    is_tokenizer_manager_proxy,
    tokenizer_manager_proxy,
)
from loopbridge_sglang.manager import RULES, Policy, classify_surface


def test_every_member_of_the_real_manager_is_classified(sgl: Manager) -> None:
    table = classify_surface(TokenizerManager, sgl.manager)
    assert [name for name, (_, rule) in table.items() if rule is None] == []
    # The members the issue names are routed as it says.
    for name in (
        "pause_generation",
        "continue_generation",
        "update_weights_from_disk",
        "update_weights_from_tensor",
        "update_weights_from_distributed",
        "update_weights_from_ipc",
        "flush_cache",
        "release_memory_occupation",
        "resume_memory_occupation",
    ):
        assert table[name][1] is not None and table[name][1].policy is Policy.MARSHAL, name
    assert table["generate_request"][1].policy is Policy.STREAM  # type: ignore[union-attr]
    for name in ("is_pause_cond", "model_update_lock", "lora_update_lock", "rid_to_state"):
        assert table[name][1].policy is Policy.REFUSE, name  # type: ignore[union-attr]


def test_rules_agree_with_member_kinds(sgl: Manager) -> None:
    table = classify_surface(TokenizerManager, sgl.manager)
    for name, rule in RULES.items():
        if name not in table:
            continue  # a member of another SGLang release
        member, _ = table[name]
        if rule.policy is Policy.STREAM:
            assert member.kind == "asyncgen", name
        elif rule.policy is Policy.MARSHAL:
            assert member.kind == "async", name
        else:
            assert member.kind not in ("async", "asyncgen"), name


def test_an_unclassified_member_stops_the_proxy(sgl: Manager, owner: LoopThread) -> None:
    class NewerManager(TokenizerManager):
        def check_budget(self) -> int:  # a sync member no rule covers
            return 0

        async def refresh(self) -> None:  # async: marshalled by its kind
            pass

    table = classify_surface(NewerManager)
    assert table["refresh"][1] is not None and table["refresh"][1].policy is Policy.MARSHAL
    manager = sgl.manager
    manager.__class__ = NewerManager
    try:
        with pytest.raises(UnclassifiedMemberError, match="check_budget"):
            tokenizer_manager_proxy(manager, loop=owner.loop)
    finally:
        manager.__class__ = TokenizerManager
    manager.surprise = 1  # an attribute SGLang starts setting
    with pytest.raises(UnclassifiedMemberError, match=r"surprise \(data, from instance\)"):
        tokenizer_manager_proxy(manager, loop=owner.loop)


def test_the_proxy_routes_each_member_as_its_rule_says(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    assert is_tokenizer_manager_proxy(p) and isinstance(p, TokenizerManager)
    assert tokenizer_manager_proxy(p) is p
    assert owner_loop(p) is owner.loop
    assert unwrap(p) is sgl.manager
    # Stable data and health reads: direct, never through the owner loop.
    assert p.context_len == 2048 and p.model_config is sgl.manager.model_config
    assert p.is_healthy() is False  # no server has declared it up
    # Owner-loop state and internals: refused, naming the member.
    for name in ("rid_to_state", "is_pause_cond", "model_update_lock", "send_to_scheduler"):
        with pytest.raises(LoopAffinityError, match=name):
            getattr(p, name)
    with pytest.raises(LoopAffinityError, match="auto_create_handle_loop"):
        p.auto_create_handle_loop()
    with pytest.raises(LoopAffinityError, match="server_status"):
        p.server_status = None


def test_adoption_refuses_another_loop_once_handle_loop_runs(
    sgl: Manager, owner: LoopThread
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    obj = GenerateReqInput(input_ids=[1], sampling_params={"max_new_tokens": 1})
    asyncio.run(async_generate(p, obj))
    assert sgl.manager.event_loop is owner.loop  # handle_loop started on the owner
    other = LoopThread("other").start()
    try:
        with pytest.raises(LoopAffinityError, match="already runs on another loop"):
            adopt_manager(sgl.manager, other.loop)
    finally:
        other.stop()


def test_abort_request_from_a_plain_thread_runs_on_the_owner(
    sgl: Manager, owner: LoopThread
) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    sgl.scheduler.hold()
    obj = GenerateReqInput(
        input_ids=[1], sampling_params={"max_new_tokens": 8}, rid="abort-me", stream=True
    )

    async def consume() -> list[dict[str, Any]]:
        return [out async for out in p.generate_request(obj)]

    outs: list[list[dict[str, Any]]] = []
    consumer = threading.Thread(target=lambda: outs.append(asyncio.run(consume())))
    consumer.start()
    sgl.scheduler.wait_for("received", "abort-me")
    # Where the AbortReq is sent: the manager's socket belongs to the owner loop.
    threads: list[str] = []
    send = sgl.manager._dispatch_to_scheduler

    def recording(msg: Any) -> None:
        threads.append(threading.current_thread().name)
        send(msg)

    sgl.manager._dispatch_to_scheduler = recording
    p.abort_request("abort-me")  # from this (plain) thread
    sgl.scheduler.wait_for("aborted", "abort-me")
    consumer.join(30)
    assert threads == ["sglang-owner"]
    (stream,) = outs
    assert stream[-1]["meta_info"]["finish_reason"]["type"] == "abort"
