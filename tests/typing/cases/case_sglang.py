# checkers: mypy
"""loopbridge_sglang.async_generate: the stream flag decides the result's type."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import Any

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from typing_extensions import assert_type

from loopbridge_sglang import async_generate, tokenizer_manager_proxy


async def generate(manager: TokenizerManager, obj: GenerateReqInput) -> None:
    p = tokenizer_manager_proxy(manager)
    assert_type(p, TokenizerManager)

    reveal_type(async_generate(p, obj, stream=True))  # R: typing.AsyncIterator[builtins.dict[builtins.str, Any]]
    async for chunk in async_generate(p, obj, stream=True):
        assert_type(chunk, dict[str, Any])

    final = async_generate(p, obj)
    revealed = reveal_type(final)  # R: typing.Coroutine[Any, Any, builtins.dict[builtins.str, Any]]
    assert_type(await revealed, dict[str, Any])
    assert_type(await async_generate(p, obj, stream=False), dict[str, Any])
    chunks = async_generate(p, obj, stream=True)
    assert_type(chunks, AsyncIterator[dict[str, Any]])
    unawaited: Coroutine[Any, Any, dict[str, Any]] = async_generate(p, obj, stream=False)
    await unawaited

    await async_generate(p, obj, stream=True)  # E: [misc] Incompatible types in "await"
    async for _ in async_generate(p, obj):  # E: [attr-defined] has no attribute "__aiter__"
        pass
