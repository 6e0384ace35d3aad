"""Every option of the installed vLLM's ``vllm serve`` parser is honoured or refused.

The parser is vLLM's own, built at test time: a release that adds an option
fails here until the option has a rule (``loopbridge_vllm._serve_options``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
from serve_options import record

from loopbridge_vllm._serve_options import (
    ENGINE,
    HONOURED,
    REFUSED,
    engine_fields,
    given_options,
    refusals,
    unclassified,
)
from loopbridge_vllm._vllm_releases import SUPPORTED_RELEASES
from loopbridge_vllm.server import _make_parser

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release


def _parse(
    argv: list[str], model: str = "m"
) -> tuple[argparse.ArgumentParser, argparse.Namespace, set[str]]:
    parser = _make_parser()
    ns = parser.parse_args(["--model", model, *argv])
    return parser, ns, given_options(_make_parser(), argv)


def test_every_option_of_vllm_serve_is_in_exactly_one_list() -> None:
    parser = _make_parser()
    assert unclassified(parser) == []
    assert not set(HONOURED) & set(REFUSED)
    dests = {action.dest for action in parser._actions}
    # Engine options are honoured through the engine, all but the refused ones.
    engine_options = dests & engine_fields()
    assert len(engine_options) > 200
    assert engine_options & set(REFUSED) == {
        "data_parallel_size",  # refused only for one API server per rank (see its rule)
        "data_parallel_external_lb",
        "data_parallel_rank",
        "data_parallel_hybrid_lb",
        "data_parallel_start_rank",
        "data_parallel_multi_port_external_lb",
    }


def test_the_recorded_options_are_the_installed_releases() -> None:
    """The per-release option lists (tests/vllm/serve_options) are vLLM's own."""
    name = record.release()
    assert record.recorded(name) == record.dests(), (
        f"vLLM {name}'s serve options differ from tests/vllm/serve_options/{name}.txt: "
        "run tests/vllm/serve_options/record.py with this release's venv"
    )


def test_every_rule_names_an_option_of_a_tested_release() -> None:
    """No rule outlives its option: each names an option some tested release has."""
    lists = {name: record.recorded(name) for name in SUPPORTED_RELEASES}
    assert None not in lists.values(), [name for name, dests in lists.items() if dests is None]
    known = set().union(*(set(dests or ()) for dests in lists.values()))
    assert set(HONOURED) | set(REFUSED) <= known, (set(HONOURED) | set(REFUSED)) - known


def test_an_option_in_neither_list_is_found_and_refused_when_given() -> None:
    parser = _make_parser()
    parser.add_argument("--lb-option-from-a-future-release", type=int, default=3)
    assert unclassified(parser) == ["lb_option_from_a_future_release"]
    ns = parser.parse_args(["--model", "m", "--lb-option-from-a-future-release", "3"])
    assert refusals(parser, ns, set()) == []  # not given: its default is stock's
    [line] = refusals(parser, ns, {"lb_option_from_a_future_release"})
    assert line.startswith("--lb-option-from-a-future-release: ")
    assert "use stock `vllm serve`" in line


def test_given_options_counts_an_option_given_with_its_default() -> None:
    given = given_options(_make_parser(), ["--port", "8000", "--max_num_seqs=3", "-tp", "1"])
    assert given == {"port", "max_num_seqs", "tensor_parallel_size"}
    assert given_options(_make_parser(), []) == set()


@pytest.mark.parametrize(
    ("argv", "flag", "hint"),
    [
        (["--api-server-count", "2"], "--api-server-count", "--api-server-count 1"),
        (["--data-parallel-size", "2"], "--data-parallel-size", "one API server process per rank"),
        (["--headless"], "--headless", "headless"),
        (["--grpc"], "--grpc", "vllm serve --grpc"),
        (["--grpc-port", "50051"], "--grpc-port", "VLLM_USE_RUST_FRONTEND=1"),
        (["--data-parallel-external-lb"], "--data-parallel-external-lb", "external"),
        (["--data-parallel-rank", "1"], "--data-parallel-rank", "external"),
        (["--data-parallel-hybrid-lb"], "--data-parallel-hybrid-lb", "hybrid"),
        (["--data-parallel-start-rank", "1"], "--data-parallel-start-rank", "hybrid"),
        (["-dpm"], "--data-parallel-multi-port-external-lb", "multi-port"),
    ],
)
def test_topology_options_are_refused_by_name(argv: list[str], flag: str, hint: str) -> None:
    if argv[0].startswith("--") and not _make_parser()._option_string_actions.get(argv[0]):
        # This release has no such option: its parser refuses it, as stock's does.
        with pytest.raises(SystemExit):
            _parse(argv)
        return
    parser, ns, given = _parse(argv)
    [line] = refusals(parser, ns, given)
    assert line.startswith(f"{flag}: ") and hint in line


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--api-server-count", "1"],
        ["--data-parallel-size", "2", "--api-server-count", "1"],  # one server, two ranks
        ["--port", "0", "--ssl-keyfile", "k", "--ssl-certfile", "c", "--enable-ssl-refresh"],
        ["--data-parallel-supervisor-port", "9000"],  # stock ignores it too here
    ],
)
def test_supported_settings_are_not_refused(argv: list[str]) -> None:
    parser, ns, given = _parse(argv)
    assert refusals(parser, ns, given) == []


def test_engine_options_reach_the_engine_arguments(tiny_model: Path) -> None:
    """A sample of engine-only options: the engine is built from what they set.

    (``test_cli_real`` checks one of them on a running engine, through HTTP.)
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    argv = [
        "--max-num-seqs",
        "7",
        "--max-model-len",
        "123",
        "--seed",
        "11",
        "--enable-prefix-caching",
        "--shutdown-timeout",
        "4",
        "--enable-log-requests",
    ]
    parser, ns, given = _parse(argv, str(tiny_model))
    assert refusals(parser, ns, given) == []
    assert all(HONOURED.get(dest, ENGINE).startswith(ENGINE) for dest in given)
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    assert (engine_args.max_num_seqs, engine_args.max_model_len, engine_args.seed) == (7, 123, 11)
    assert engine_args.enable_prefix_caching is True
    assert engine_args.shutdown_timeout == 4 and engine_args.enable_log_requests is True


def _plan_of(before: list[str], after: list[str]) -> Any:
    from loopbridge_vllm.__main__ import _plan, _serve_parser

    return _plan(_serve_parser().parse_args(["m", *before]), after)


@pytest.mark.parametrize(
    ("before", "after", "where"),
    [
        ([], [], ("127.0.0.1", 8000, 5.0)),  # loopbridge's defaults
        (["--host", "::1", "--port", "0", "--grace", "2"], [], ("::1", 0, 2.0)),
        ([], ["--host", "0.0.0.0", "--port", "9001"], ("0.0.0.0", 9001, 5.0)),
        ([], ["--port", "8000"], ("127.0.0.1", 8000, 5.0)),  # stock's default, given
        ([], ["--shutdown-timeout", "3"], ("127.0.0.1", 8000, 3.0)),  # the drain
        ([], ["--shutdown-timeout", "0"], ("127.0.0.1", 8000, 0.0)),  # no drain
    ],
)
def test_where_to_listen_and_the_drain_have_one_source(
    before: list[str], after: list[str], where: tuple[str, int, float]
) -> None:
    plan = _plan_of(before, after)
    assert (plan.host, plan.port, plan.grace) == where
    assert (plan.ns.host, plan.ns.port) == where[:2]  # the app sees the truth


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        (["--host", "::1"], ["--host", "::1"], "--host is given before and after '--'"),
        (["--port", "1"], ["--port", "2"], "--port is given before and after '--'"),
        (["--port", "1"], ["--uds", "/nonexistent/s.sock"], "--uds listens on a Unix socket"),
        (["--grace", "1"], ["--shutdown-timeout", "1"], "--grace and --shutdown-timeout"),
        ([], ["other-model"], "the model is given twice"),
        ([], ["--model", "other-model"], "the model is given twice"),
    ],
)
def test_a_setting_given_twice_is_an_error(
    before: list[str], after: list[str], message: str
) -> None:
    from loopbridge_vllm.__main__ import _UsageError

    with pytest.raises(_UsageError, match=re.escape(message)):
        _plan_of(before, after)
