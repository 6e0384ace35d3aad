"""The stock server's process group dies with the benchmark, even when the benchmark is killed.

A parent process starts a group through the guardian (:func:`spawn_group`), the
way the benchmark starts ``vllm serve``; the command spawns a child of its own
(as ``vllm serve`` spawns its EngineCore).  The test kills the parent with
``SIGKILL`` and waits, bounded, on each process's exit through a pidfd: no
sleeping, no polling.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXIT_WAIT_S = 60.0

#: The command under the guardian: a child of its own, both print their pids, then wait.
#: ``stubborn`` ignores SIGTERM (a wedged server); its child always does.
_COMMAND = r"""
import os, signal, subprocess, sys
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"])
print(json.dumps([os.getpid(), child.pid]), flush=True)
signal.pause()
""".replace("import os,", "import json, os,")

#: The parent: starts the group, reports every pid, then waits to be killed (or told to stop).
_PARENT = r"""
import json, os, subprocess, sys
from loopbridge_bench.vllm._group import spawn_group
guardian = spawn_group([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                       env=dict(os.environ), stdout=subprocess.PIPE, grace_s=float(sys.argv[3]))
server, child = json.loads(guardian.stdout.readline())
print(json.dumps({"parent": os.getpid(), "guardian": guardian.pid, "server": server,
                  "child": child}), flush=True)
if sys.stdin.readline().strip() == "stop":
    guardian.terminate()
    print(json.dumps({"guardian_status": guardian.wait(60)}), flush=True)
sys.stdin.readline()
"""


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    )


_started: list[int] = []  # the guardians of this test module's groups


@pytest.fixture(autouse=True)
def _no_group_left() -> Iterator[None]:
    # A failing test must not leave its group running (its processes ignore SIGTERM).
    yield
    while _started:
        try:
            os.killpg(_started.pop(), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _start_parent(kind: str, grace_s: float) -> tuple[subprocess.Popen[str], dict[str, int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, _COMMAND, kind, str(grace_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert parent.stdout is not None
    pids: dict[str, int] = json.loads(parent.stdout.readline())
    _started.append(pids["guardian"])
    return parent, pids


def _wait_all_gone(pidfds: dict[str, int], limit_s: float = EXIT_WAIT_S) -> list[str]:
    """Wait (bounded) until every process has exited; the names of those still running."""
    left = dict(pidfds)
    deadline = time.monotonic() + limit_s
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(list(left.values()), [], [], remaining)
        for fd in ready:
            name = next(n for n, f in left.items() if f == fd)
            del left[name]
    for fd in pidfds.values():
        os.close(fd)
    return sorted(left)


@pytest.mark.parametrize("kind", ["cooperative", "stubborn"])
def test_group_dies_with_a_killed_parent(kind: str) -> None:
    parent, pids = _start_parent(kind, grace_s=1.0)
    group = {name: pids[name] for name in ("guardian", "server", "child")}
    # One group of its own, led by the guardian, apart from the parent's.
    assert {os.getpgid(pid) for pid in group.values()} == {pids["guardian"]}
    assert os.getpgid(pids["parent"]) != pids["guardian"]
    pidfds = {name: os.pidfd_open(pid) for name, pid in group.items()}
    parent.kill()  # SIGKILL: no cleanup of its own runs
    parent.wait(EXIT_WAIT_S)
    assert _wait_all_gone(pidfds) == []


def test_a_clean_stop_reaches_the_whole_group() -> None:
    parent, pids = _start_parent("cooperative", grace_s=30.0)
    pidfds = {name: os.pidfd_open(pids[name]) for name in ("guardian", "server", "child")}
    assert parent.stdin is not None and parent.stdout is not None
    parent.stdin.write("stop\n")
    parent.stdin.flush()
    # The command ended on its SIGTERM; its child, which ignores SIGTERM, was killed.
    status = json.loads(parent.stdout.readline())["guardian_status"]
    assert status == 128 + signal.SIGTERM
    assert _wait_all_gone(pidfds) == []
    parent.stdin.write("\n")
    parent.stdin.flush()
    assert parent.wait(EXIT_WAIT_S) == 0


def test_the_commands_own_exit_takes_the_rest_of_the_group() -> None:
    parent, pids = _start_parent("cooperative", grace_s=30.0)
    pidfds = {name: os.pidfd_open(pids[name]) for name in ("guardian", "child")}
    os.kill(pids["server"], signal.SIGKILL)  # the server crashes; its child is left behind
    assert _wait_all_gone(pidfds) == []
    assert parent.stdin is not None
    parent.stdin.write("\n\n")
    parent.stdin.flush()
    assert parent.wait(EXIT_WAIT_S) == 0


#: The benchmark's own launcher over the stand-in engine: real `vllm serve`, real EngineCore.
_REAL_PARENT = r"""
import json, os, sys
from pathlib import Path
from loopbridge_bench.vllm._group import group_members
from loopbridge_bench.vllm._stack import EngineSpec, engine_args, prepare_model
from loopbridge_bench.vllm._stock import StockServer
spec = EngineSpec(None, Path(sys.argv[1]), 0.001, 4, 256)
stock = StockServer(engine_args(spec, prepare_model(spec)), Path(sys.argv[2]))
stock.start(dict(os.environ))
stock.wait_ready(600)
print(json.dumps({"pgid": stock.pgid, "server": stock.server_pid(),
                  "members": group_members(stock.pgid)}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_real_vllm_serve_group_dies_with_a_killed_benchmark(tmp_path: Path) -> None:
    log = tmp_path / "stock-server.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", _REAL_PARENT, str(REPO / ".cache"), str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert parent.stdout is not None
    line = parent.stdout.readline()
    assert line, f"the parent failed: {log.read_text() if log.exists() else '(no log)'}"
    found = json.loads(line)
    _started.append(found["pgid"])
    members = found["members"]
    # The guardian, vllm serve, its EngineCore (and whatever else it started).
    assert len(members) >= 3 and found["server"] in members and members[0] == found["pgid"]
    pidfds = {str(pid): os.pidfd_open(pid) for pid in members}
    parent.kill()
    parent.wait(EXIT_WAIT_S)
    assert _wait_all_gone(pidfds, 120.0) == [], log.read_text()[-3000:]
