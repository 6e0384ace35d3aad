"""The benchmark's terminal and log files: where each writer's output ends up.

Each case runs a small script in a child process with its stdout and stderr
captured, which stand for the user's terminal; no engine is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loopbridge_bench.vllm._correctness import Outcome, Verdict, verdict_lines

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import logging, os, subprocess, sys, warnings
from pathlib import Path
from loopbridge_bench.common.console import Console

logging.basicConfig(level=logging.INFO)  # a handler bound to sys.stderr, as vLLM's is
console = Console(Path(sys.argv[1]))
with console:
    console.phase("engine")
    print("print to stdout")
    logging.getLogger("vllm").warning("a logged warning")
    warnings.warn("a Python warning")
    os.write(2, b"raw fd 2\n")
    # A child started in this phase keeps writing to its file after the phase changes.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline(); print('child after')"],
        stdin=subprocess.PIPE,
    )
    console.phase("later")
    print("print in the later phase")
    console.phase("empty")
    console.say("a note for the terminal")
    print("the report", file=console.out)
    child.communicate(b"go\n")
    if sys.argv[2] == "fail":
        console.phase("failing")
        for i in range(40):
            print(f"log line {i}")
        raise RuntimeError("engine failed to start")
print("after the block: the terminal again")
print("logs:", [p.name for p in console.logs])
"""


def _run(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "logs"), how],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_logs_go_to_the_phase_files_and_the_report_to_the_terminal(tmp_path: Path) -> None:
    proc = _run(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "the report",
        "after the block: the terminal again",
        "logs: ['engine.log', 'later.log']",  # the empty phase's file is gone
    ]
    assert proc.stderr.splitlines() == ["a note for the terminal"]
    engine = (tmp_path / "logs" / "engine.log").read_text()
    for text in ("print to stdout", "a logged warning", "a Python warning", "raw fd 2"):
        assert text in engine
    assert "child after" in engine  # the child's descriptors are those it started with
    later = (tmp_path / "logs" / "later.log").read_text()
    assert later == "print in the later phase\n"
    assert not (tmp_path / "logs" / "empty.log").exists()


def test_a_failure_shows_the_end_of_its_log(tmp_path: Path) -> None:
    proc = _run(tmp_path, "fail")
    assert proc.returncode == 1
    err = proc.stderr.splitlines()
    failing = tmp_path / "logs" / "failing.log"
    assert err[:2] == ["a note for the terminal", f"bench: failed; the last 30 lines of {failing}:"]
    assert err[2:32] == [f"  | log line {i}" for i in range(10, 40)]
    assert err[32] == "Traceback (most recent call last):"  # the interpreter's, on the terminal
    assert err[-1] == "RuntimeError: engine failed to start"
    assert "after the block" not in proc.stdout


def _outcome(mode: str, verdict: Verdict, expected: bool, log: Path | None) -> Outcome:
    return Outcome(
        mode=mode,
        requests=16,
        ok=16 if verdict is not Verdict.BROKEN else 3,
        errors=0 if verdict is not Verdict.BROKEN else 13,
        error_examples=[],
        engine_alive=verdict is not Verdict.BROKEN,
        handler_error="RuntimeError: deque mutated during iteration"
        if verdict is Verdict.BROKEN
        else None,
        collector_sets=20,
        foreign_sets=0 if mode == "loopbridge" else 20,
        overlaps=0 if mode == "loopbridge" else 5,
        verdict=verdict,
        expected=expected,
        log=None if log is None else str(log),
    )


def test_verdict_lines(tmp_path: Path) -> None:
    log = tmp_path / "correctness-unsafe.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    expected = verdict_lines(
        [
            _outcome("loopbridge", Verdict.SAFE, True, tmp_path / "ours.log"),
            _outcome("unsafe", Verdict.BROKEN, True, log),
        ]
    )
    assert expected == [
        "correctness, loopbridge (engine proxy): passed as expected: every request completed "
        f"(16 of 16), engine healthy; see {tmp_path / 'ours.log'}",
        "correctness, unsafe (raw engine shared across loops): failed as expected: "
        "RuntimeError: deque mutated during iteration; engine dead, 3 of 16 requests "
        f"completed, 5 wake-ups held by the amplifier; see {log}",
    ]
    # Not the expected verdict: said so, with the end of its log.
    odd = verdict_lines([_outcome("unsafe", Verdict.NOT_REPRODUCED, False, log)])
    assert odd[0].startswith("correctness, unsafe (raw engine shared across loops): UNEXPECTED: ")
    assert "did not break the raw engine" in odd[0] and odd[0].endswith(f"see {log}")
    assert odd[1:] == [f"  | line {i}" for i in range(5, 20)]
    failed = verdict_lines([_outcome("loopbridge", Verdict.FAILED, False, None)])
    assert failed[0].startswith("correctness, loopbridge (engine proxy): UNEXPECTED: FAILED")
    assert failed[0].endswith("its log is in the output above") and len(failed) == 1
