"""The servers' entry points take one definition of their options (issue 55, item 6).

``start_openai_server`` and ``astart_openai_server`` each spell out every keyword
parameter, so that users and type checkers see them; ``_StartOptions`` in
``loopbridge_vllm.server`` defines them once, and these tests make the three agree:
the same names in the same order, the same kinds, defaults and annotations. The
server classes take some of the same options: those must have the same defaults, and
a class option the entry point does not offer fails here. SGLang has one entry point,
``start_sglang_server``, over ``SGLangServer``: the same checks. None of this needs an
engine (importing the adapters imports none).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from loopbridge_adapters.free_threaded import FREE_THREADED

if FREE_THREADED:
    pytest.skip(
        "vLLM and SGLang do not support a free-threaded Python yet: their adapters refuse it",
        allow_module_level=True,
    )

from loopbridge_sglang import server as sglang_server
from loopbridge_vllm import server as vllm_server

P = inspect.Parameter


def _params(fn: Callable[..., Any]) -> list[tuple[str, Any, object, object]]:
    """(name, kind, default, annotation) of each parameter, in order."""
    return [
        (p.name, p.kind, p.default, p.annotation) for p in inspect.signature(fn).parameters.values()
    ]


def _fields() -> list[tuple[str, Any, object, object]]:
    return [
        (f.name, P.KEYWORD_ONLY, f.default, f.type)
        for f in dataclasses.fields(vllm_server._StartOptions)
    ]


def test_both_vllm_entry_points_take_exactly_the_options_fields() -> None:
    expected = [
        ("engine", P.POSITIONAL_OR_KEYWORD, P.empty, "Any"),
        *_fields(),
        ("proxy_options", P.VAR_KEYWORD, P.empty, "Any"),
    ]
    assert len(expected) == 21  # the engine, 19 options, the proxy's options
    assert _params(vllm_server.start_openai_server) == expected
    assert _params(vllm_server.astart_openai_server) == expected
    assert inspect.iscoroutinefunction(vllm_server.astart_openai_server)
    assert inspect.signature(vllm_server.start_openai_server).return_annotation == "OpenAIServer"
    assert inspect.signature(vllm_server.astart_openai_server).return_annotation == "OpenAIServer"


def test_the_vllm_server_class_shares_the_options_defaults() -> None:
    """Every OpenAIServer option an entry point also takes has the same default and
    annotation, except the address (the entry point's None means: from serve_argv, else
    the class's default); the class takes no option the entry points lack."""
    fields = {name: (default, annotation) for name, _, default, annotation in _fields()}
    own = {"self", "client", "engine", "watchdog_interval", "name"}  # the class's own
    differ = {"host", "port"}
    server = [p for p in _params(vllm_server.OpenAIServer.__init__) if p[0] not in own]
    assert {name for name, *_ in server} <= set(fields)
    assert {
        name: (default, annotation) for name, _, default, annotation in server if name not in differ
    } == {name: fields[name] for name, *_ in server if name not in differ}
    assert set(vllm_server._SERVER_AS_GIVEN) == {name for name, *_ in server} - {
        "host",
        "port",
        "sock",
        "args",
    }


def test_the_sglang_entry_point_takes_the_server_class_options() -> None:
    """start_sglang_server's keywords are SGLangServer's, with the same defaults and
    annotations, less what the class keeps to itself, plus the start timeout."""
    entry = _params(sglang_server.start_sglang_server)
    server = _params(sglang_server.SGLangServer.__init__)
    assert entry[0] == ("manager", P.POSITIONAL_OR_KEYWORD, P.empty, "Any")
    assert server[:2] == [
        ("self", P.POSITIONAL_OR_KEYWORD, P.empty, P.empty),
        ("manager", P.POSITIONAL_OR_KEYWORD, P.empty, "Any"),
    ]
    own = {"watchdog_interval", "name"}  # the class's own
    assert [p for p in entry[1:] if p[0] != "start_timeout"] == [
        p for p in server[2:] if p[0] not in own
    ]
    assert ("start_timeout", P.KEYWORD_ONLY, 60.0, "float") in entry
