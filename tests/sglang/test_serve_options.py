"""Every option of the installed SGLang's server parser is honoured or refused.

The parser is SGLang's own (``ServerArgs.add_cli_args`` on a fresh parser), built at
test time: a release that adds an option fails here until the option has a rule
(``loopbridge_sglang._serve_options``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from loopbridge_adapters.serve_cli import UsageError
from loopbridge_sglang import __main__ as cli
from loopbridge_sglang._serve_options import (
    ENGINE,
    HONOURED,
    REFUSED,
    TABLE,
    engine_fields,
    given_options,
    refusals,
    server_parser,
    unclassified,
)


def _parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace, set[str]]:
    parser = server_parser()
    ns = parser.parse_args(["--model-path", "m", *argv])
    return parser, ns, given_options(server_parser(), argv)


def test_every_option_of_sglang_is_in_exactly_one_list() -> None:
    parser = server_parser()
    assert unclassified(parser) == []
    assert not set(HONOURED) & set(REFUSED)
    dests = {action.dest for action in parser._actions}
    # The lists are about this parser: every rule names an option it has.
    assert set(HONOURED) <= dests, set(HONOURED) - dests
    assert set(REFUSED) <= dests, set(REFUSED) - dests
    # Almost every option is a ServerArgs field, honoured through SGLang's launcher.
    engine_options = dests & engine_fields() - set(HONOURED) - set(REFUSED)
    assert len(engine_options) > 400
    assert all(TABLE.rule(dest) == ENGINE for dest in engine_options)
    # The listing has one line per option, none unclassified.
    listing = TABLE.listing(parser)
    assert len(listing) == len(parser._actions)
    assert not [line for line in listing if "UNCLASSIFIED" in line]
    assert "--tokenizer-worker-num\trefused: " in "\n".join(listing)


def test_an_option_in_neither_list_is_found_and_refused_when_given() -> None:
    parser = server_parser()
    parser.add_argument("--lb-option-from-a-future-release", type=int, default=3)
    assert unclassified(parser) == ["lb_option_from_a_future_release"]
    ns = parser.parse_args(["--model-path", "m", "--lb-option-from-a-future-release", "3"])
    assert refusals(parser, ns, set()) == []  # not given: its default is stock's
    [line] = refusals(parser, ns, {"lb_option_from_a_future_release"})
    assert line.startswith("--lb-option-from-a-future-release: this SGLang release's option")
    assert "use stock `python -m sglang.launch_server`" in line
    assert "lb-option-from-a-future-release\tUNCLASSIFIED" in "\n".join(TABLE.listing(parser))


@pytest.mark.parametrize(
    ("argv", "flag", "hint"),
    [
        (["--tokenizer-worker-num", "2"], "--tokenizer-worker-num", "--tokenizer-worker-num 1"),
        (["--grpc-mode"], "--grpc-mode", "gRPC mode"),
        (["--grpc-port", "50051"], "--grpc-port", "native gRPC"),
        (["--enable-http2"], "--enable-http2", "HTTP/2"),
        (["--ssl-certfile", "c.pem"], "--ssl-certfile", "terminate TLS"),
        (["--enable-ssl-refresh"], "--enable-ssl-refresh", "terminate TLS"),
        (["--warmups", "voice_chat"], "--warmups", "warm-up requests yourself"),
        (["--node-rank", "1"], "--node-rank", "no HTTP server"),
        (["--use-ray"], "--use-ray", "Ray"),
        (["--skip-server-warmup"], "--skip-server-warmup", "drop it"),
    ],
)
def test_options_whose_effect_lives_in_replaced_parts_are_refused_by_name(
    argv: list[str], flag: str, hint: str
) -> None:
    parser, ns, given = _parse(argv)
    [line] = refusals(parser, ns, given)
    assert line.startswith(f"{flag}: ") and hint in line


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--tokenizer-worker-num", "1"],
        ["--node-rank", "0", "--port", "0"],
        ["--log-level-http", "warning", "--fastapi-root-path", "/api"],
        ["--api-key", "k", "--admin-api-key", "a"],
        ["--http2-max-concurrent-streams", "10"],  # stock ignores it without --enable-http2
        ["--max-running-requests", "7", "--context-length", "512", "--enable-metrics"],
    ],
)
def test_supported_settings_are_not_refused(argv: list[str]) -> None:
    parser, ns, given = _parse(argv)
    assert refusals(parser, ns, given) == []


def _plan_of(before: list[str], after: list[str], tiny_model: Path) -> cli._Plan:
    opts = cli._serve_parser().parse_args(before)
    return cli._plan(
        opts,
        ["--model-path", str(tiny_model), "--skip-tokenizer-init", "--device", "cpu", *after],
    )


def test_engine_options_reach_sglangs_server_args(tiny_model: Path) -> None:
    """Built by SGLang's own prepare_server_args: what the launcher starts the engine from."""
    after = ["--max-running-requests", "7", "--context-length", "512", "--random-seed", "11"]
    plan = _plan_of([], after, tiny_model)
    args = plan.server_args
    assert (args.max_running_requests, args.context_length, args.random_seed) == (7, 512, 11)
    assert (plan.host, plan.port) == ("127.0.0.1", 30000)  # stock's port, loopbridge's host


@pytest.mark.parametrize(
    ("before", "after", "where"),
    [
        (["--host", "::1", "--port", "0"], [], ("::1", 0)),
        ([], ["--host", "0.0.0.0", "--port", "9001"], ("0.0.0.0", 9001)),
    ],
)
def test_where_to_listen_has_one_source(
    before: list[str], after: list[str], where: tuple[str, int], tiny_model: Path
) -> None:
    plan = _plan_of(before, after, tiny_model)
    assert (plan.host, plan.port) == where


def test_a_setting_given_twice_is_an_error(tiny_model: Path) -> None:
    with pytest.raises(UsageError, match=re.escape("--port is given before and after '--'")):
        _plan_of(["--port", "1"], ["--port", "2"], tiny_model)


def test_refused_command_line_exits_2_with_one_line_per_option(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--cpu-standin", "--port", "0", "--", "--model-path", str(tiny_model)]
    code = cli.main([*argv, "--ssl-keyfile", "k.pem", "--tokenizer-worker-num", "4"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("error: --tokenizer-worker-num: ")
    assert lines[1].startswith("error: --ssl-keyfile: ")


def test_sglangs_own_checks_are_one_error_line(
    tiny_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SGLang's launcher's own checks, run before the engine starts.
    argv = ["serve", "--cpu-standin", "--port", "0", "--", "--model-path", str(tiny_model)]
    code = cli.main([*argv, "--watermark-config", "{}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # SGLang's log
    assert lines == ["error: --watermark-config requires --enable-watermark"], err


def test_list_options_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--list-options"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(server_parser()._actions)
    assert "--model-path\thonoured: a ServerArgs field" in "\n".join(lines)
