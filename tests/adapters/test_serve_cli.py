"""A ``serve`` command line, engine aside (loopbridge_adapters.serve_cli).

A small argparse parser stands in for an engine's server parser; each adapter's own
table is checked against its real engine's parser in tests/vllm and tests/sglang.
"""

from __future__ import annotations

import argparse
import errno
import sys
import types
from pathlib import Path

import pytest

from loopbridge_adapters.serve_cli import (
    Delegate,
    OptionTable,
    Refusal,
    UsageError,
    add_listen_options,
    add_loop_options,
    bind_failure,
    given_options,
    listen_conflicts,
    listen_on,
    option_name,
    report_usage_error,
    run_subcommand,
    server_loop_options,
    switch_interval,
)


def _engine_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine", add_help=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--max-seqs", "-n", dest="max_seqs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--new-in-this-release", default="x")
    return parser


_TABLE = OptionTable(
    honoured={"log_level": "the server's log level"},
    refused={"workers": Refusal(lambda ns: ns.workers != 1, "use --workers 1")},
    engine_fields=lambda: frozenset({"model", "max_seqs", "workers"}),
    engine_rule="an engine field",
    release="this engine release",
    stock="engine serve",
)


def test_each_option_is_honoured_refused_or_unclassified() -> None:
    assert _TABLE.rule("model") == "an engine field"
    assert _TABLE.rule("log_level") == "the server's log level"
    # A refusal wins over the engine field of the same name.
    refusal = _TABLE.rule("workers")
    assert isinstance(refusal, Refusal) and refusal.fix == "use --workers 1"
    assert _TABLE.rule("new_in_this_release") is None
    assert _TABLE.unclassified(_engine_parser()) == ["new_in_this_release"]


def test_the_listing_has_one_line_per_option() -> None:
    assert _TABLE.listing(_engine_parser()) == [
        "--model\thonoured: an engine field",
        "--max-seqs\thonoured: an engine field",
        "--workers\trefused: use --workers 1",
        "--log-level\thonoured: the server's log level",
        "--new-in-this-release\tUNCLASSIFIED: refused when given",
    ]


def test_refusals_name_the_option_and_the_fix() -> None:
    parser = _engine_parser()
    argv = ["--model", "m", "--workers", "2"]
    ns = parser.parse_args(argv)
    assert _TABLE.refusals(parser, ns, given_options(parser, argv)) == [
        "--workers: use --workers 1"
    ]
    ns = parser.parse_args(["--model", "m", "--workers", "1"])
    assert _TABLE.refusals(parser, ns, {"workers"}) == []  # refused for other values only


def test_an_unclassified_option_is_refused_only_when_given() -> None:
    parser = _engine_parser()
    ns = parser.parse_args(["--model", "m"])
    assert _TABLE.refusals(parser, ns, set()) == []  # its default is stock's own
    [line] = _TABLE.refusals(parser, ns, {"new_in_this_release"})
    assert line == (
        "--new-in-this-release: this engine release's option is not known to loopbridge, "
        "so its effect is not known to be honoured; use stock `engine serve`"
    )


def test_given_options_counts_an_option_given_with_its_default_and_restores_the_parser() -> None:
    parser = _engine_parser()
    assert given_options(parser, ["--max-seqs", "8", "-n", "8"]) == {"max_seqs"}
    assert given_options(parser, []) == set()  # --model is required, yet not asked for
    # The parser is as it was: defaults and required options.
    assert parser.parse_args(["--model", "m"]).max_seqs == 8
    with pytest.raises(SystemExit):
        parser.parse_args([])


def test_option_name_is_the_first_long_flag() -> None:
    parser = _engine_parser()
    assert option_name(parser, "max_seqs") == "--max-seqs"
    assert option_name(parser, "no_such_dest") == "no_such_dest"


def _listen_opts(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_listen_options(parser, "127.0.0.1", 8000)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("before", "after", "where"),
    [
        ([], {}, ("127.0.0.1", 8000)),  # the defaults
        (["--host", "::1", "--port", "0"], {}, ("::1", 0)),  # before '--'
        ([], {"host": "0.0.0.0", "port": 9001}, ("0.0.0.0", 9001)),  # after '--'
        (["--host", "::1"], {"port": 9001}, ("::1", 9001)),  # one in each place
    ],
)
def test_where_to_listen_has_one_source(
    before: list[str], after: dict[str, object], where: tuple[str, int]
) -> None:
    opts = _listen_opts(before)
    ns = argparse.Namespace(**{"host": "engine-default", "port": 1, **after})
    assert listen_conflicts(opts, set(after)) == []
    assert listen_on(opts, ns, set(after), "127.0.0.1", 8000) == where


def test_a_listening_option_given_twice_is_a_conflict() -> None:
    opts = _listen_opts(["--host", "::1", "--port", "1"])
    assert listen_conflicts(opts, {"host", "port"}) == [
        "--host is given before and after '--'; give it once",
        "--port is given before and after '--'; give it once",
    ]


def test_a_usage_error_is_one_line_per_problem_and_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert report_usage_error(UsageError("first\nsecond")) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: first\nerror: second\n"


def test_bind_failures_name_the_address_and_the_fix() -> None:
    busy = OSError(errno.EADDRINUSE, "Address already in use")
    assert bind_failure("::1", 8000, None, busy) == (
        "error: port 8000 is already in use ([::1]:8000): stop the process that listens "
        "on it, or choose another port with --port (0 picks a free one)"
    )
    other = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    assert bind_failure("10.9.9.9", 80, None, other) == (
        "error: cannot listen on 10.9.9.9:80: Cannot assign requested address; check "
        "--host and --port"
    )
    missing = OSError(errno.ENOENT, "No such file or directory")
    assert bind_failure("127.0.0.1", 8000, "/run/x.sock", missing) == (
        "error: cannot listen on the Unix socket /run/x.sock: No such file or directory; "
        "check --uds"
    )


class _Subcommands:
    def __init__(self) -> None:
        self.served: list[list[str]] = []

    def serve(self, argv: list[str]) -> int:
        self.served.append(argv)
        return 7

    def run(self, argv: list[str], delegated: dict[str, str] | None = None) -> int:
        modules = {
            name: Delegate(module, f"{module}-dist") for name, module in (delegated or {}).items()
        }
        return run_subcommand(argv, "the doc", self.serve, modules)


def test_serve_gets_the_rest_of_the_command_line() -> None:
    commands = _Subcommands()
    assert commands.run(["serve", "m", "--", "--x"]) == 7
    assert commands.served == [["m", "--", "--x"]]


@pytest.mark.parametrize(("argv", "status"), [([], 2), (["-h"], 0), (["--help"], 0)])
def test_help_lists_the_subcommands(
    argv: list[str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _Subcommands().run(argv, {"bench": "somewhere"}) == status
    assert capsys.readouterr().out == "the doc\nsubcommands: serve, bench\n"


def test_an_unknown_subcommand_is_status_2_naming_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _Subcommands().run(["frobnicate"], {"bench": "somewhere"}) == 2
    assert capsys.readouterr().err == "unknown subcommand 'frobnicate' (known: serve, bench)\n"


def test_a_delegated_subcommand_runs_its_modules_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []
    module = types.ModuleType("lb_test_delegate")
    module.main = lambda argv: seen.append(argv)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lb_test_delegate", module)
    commands = _Subcommands()
    assert commands.run(["bench", "--quick"], {"bench": "lb_test_delegate"}) == 0
    assert seen == [["--quick"]]
    module.main = lambda argv: 3  # type: ignore[attr-defined]
    assert commands.run(["bench"], {"bench": "lb_test_delegate"}) == 3
    # Not installed: said so with what to install, not a traceback.
    assert commands.run(["gpu"], {"gpu": "lb_test_no_such_module"}) == 2
    assert capsys.readouterr().err == (
        "subcommand 'gpu' needs lb_test_no_such_module, which is not installed: "
        "install lb_test_no_such_module-dist\n"
    )


def test_a_delegated_subcommand_in_a_package_not_installed_names_what_to_install(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The missing module is the package above the target (another distribution's).
    assert _Subcommands().run(["bench"], {"bench": "lb_test_no_such_package.vllm"}) == 2
    assert capsys.readouterr().err == (
        "subcommand 'bench' needs lb_test_no_such_package.vllm, which is not installed: "
        "install lb_test_no_such_package.vllm-dist\n"
    )


def test_a_module_the_delegated_module_imports_being_missing_is_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lb_test_broken.py").write_text("import lb_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="lb_test_missing_dependency"):
        _Subcommands().run(["bench"], {"bench": "lb_test_broken"})


def test_loop_options_and_the_switch_interval(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="serve")
    add_loop_options(parser, "uvloop")
    opts = parser.parse_args([])
    # Both loops: None is uvloop when installed (LoopThread's use_uvloop).
    assert (opts.uvloop, opts.server_uvloop, switch_interval(opts)) == (None, None, 0.001)
    assert parser.parse_args(["--uvloop"]).uvloop is True
    assert parser.parse_args(["--no-uvloop"]).uvloop is False
    opts = parser.parse_args(["--no-server-uvloop", "--switch-interval-ms", "0.5"])
    assert (opts.server_uvloop, switch_interval(opts)) == (False, 0.0005)
    assert switch_interval(parser.parse_args(["--switch-interval-ms", "off"])) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--switch-interval-ms", "0"])
    assert "a positive number of ms or off, not '0'" in capsys.readouterr().err


def test_on_engine_loop_as_the_servers_keyword_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A server thread's loop choice, or the owner loop (which takes none of its own);
    asking for both is refused by the parser, naming the two options."""
    parser = argparse.ArgumentParser(prog="serve")
    add_loop_options(parser, "uvloop")
    assert server_loop_options(parser.parse_args([])) == {
        "use_uvloop": None,
        "on_engine_loop": False,
        "switch_interval": 0.001,
    }
    assert server_loop_options(parser.parse_args(["--no-server-uvloop"]))["use_uvloop"] is False
    opts = parser.parse_args(["--on-engine-loop", "--switch-interval-ms", "off"])
    assert server_loop_options(opts) == {
        "use_uvloop": None,
        "on_engine_loop": True,
        "switch_interval": None,
    }
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--on-engine-loop", "--no-server-uvloop"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --no-server-uvloop: not allowed with argument --on-engine-loop" in err
