"""The pause-aware filter on a real vLLM DP=2 group, installed by its plugin.

Four groups (three on 0.33) run side by side, each driven by ``dp_group_driver.py`` in its
own process session (two ``DPEngineCoreProc`` engine cores, the DP
coordinator and a gloo DP group behind a real ``AsyncLLM``, on the stand-in
executor, with a 2-expert Mixtral config so that vLLM uses its MoE DP path):

* ``plain-finding1`` and ``plain-dup-resume``: stock vLLM 0.32 (plugin not
  opted in), each forced into one race; both are expected to wedge, so each
  gets a group of its own (on 0.33 one ``plain`` group runs both: finding 1
  cannot be forced there and its request finishes);
* ``filtered``: ``LOOPBRIDGE_DP_FILTER=1``, so the package's
  ``vllm.general_plugins`` entry point installs the filter in both engine
  cores; the same two races, then refit cycles under load.
* ``mixed``: filtered, but rank 1 skips the filter's start-up report (as a
  rank without the filter would): the P5 check must stop the group.

Races are forced with a test-only plugin (``dp_probe_plugin``) that lets the
driver hold one rank's busy loop until a given message is queued there.

Hangs are bounded twice: the driver gives a request ``HANG_S`` (a healthy
group finishes it in well under a second), and this module kills a driver's
whole process group when its event log shows no progress for
``NO_PROGRESS_S`` after the group came up, or when the group is not up after
``START_S`` (start-up is about a minute on an idle 2-core machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dp_group_driver import CYCLES, HANG_S, STEP_S, mixtral_model
from dp_probe_plugin import UNREPORTED_ENV
from entry_points import expose
from test_conformance import PLAIN

from loopbridge_vllm.cpu_engine import build_tiny_model
from loopbridge_vllm.dp._patch import CHECK_ENV
from loopbridge_vllm.dp._plugin import ENV

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
START_S = float(os.environ.get("LOOPBRIDGE_DP_START_S", "480"))
NO_PROGRESS_S = STEP_S + HANG_S + 30
#: How long the mixed group's filtered rank waits for its peer's report.
MIXED_CHECK_S = 20.0

# The module's own bounds (START_S, NO_PROGRESS_S) end a stuck run first; this
# outer one only has to be larger than their sum.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(START_S + 2 * NO_PROGRESS_S + 120)]
#: 0.33.0 admits no FIRST_REQ race and rejects requests sent during abort/wait
#: pauses (retryable ``engine_paused``); 0.32.0 queues them.
ON_033 = PLAIN == "c33"


@dataclass
class GroupRun:
    name: str
    proc: subprocess.Popen[bytes]
    events_path: Path
    log_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "running"

    def poll_events(self) -> bool:
        """Read new event lines; True when something new arrived."""
        if not self.events_path.exists():
            return False
        lines = self.events_path.read_text().splitlines()
        new = [json.loads(x) for x in lines[len(self.events) :] if x.strip()]
        self.events += new
        return bool(new)

    def results(self) -> dict[str, dict[str, Any]]:
        return {e["scenario"]: e for e in self.events if e["event"] == "result"}

    def up(self) -> dict[str, Any]:
        [event] = [e for e in self.events if e["event"] == "up"]
        return event

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _kill(run: GroupRun) -> None:
    # The engine cores and the coordinator are the driver's children in its
    # session: one signal to the process group ends every one of them.
    try:
        os.killpg(run.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    run.proc.wait(timeout=30)


def _watch(runs: list[GroupRun]) -> None:
    started = time.monotonic()
    last = {r.name: started for r in runs}
    active = list(runs)
    while active:
        now = time.monotonic()
        for r in list(active):
            if r.poll_events():
                last[r.name] = now
            finished = r.proc.poll() is not None
            is_up = any(e["event"] == "up" for e in r.events)
            if finished:
                r.poll_events()
                r.outcome = "done" if r.events and r.events[-1]["event"] == "done" else "stopped"
            elif not is_up and now - started > START_S:
                r.outcome = "no start-up"
            elif is_up and now - last[r.name] > NO_PROGRESS_S:
                r.outcome = "no progress"
            else:
                continue
            _kill(r)
            active.remove(r)
        time.sleep(0.5)


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GroupRun]]:
    tmp = tmp_path_factory.mktemp("dp-group")
    plugins = expose(tmp / "plugins", {"loopbridge_dp_probe": "dp_probe_plugin:load"})
    model = mixtral_model(build_tiny_model(REPO / ".cache" / "tiny-model"), tmp / "mixtral")
    plan = {
        "filtered": (True, ["finding1", "dup_resume", "refit"]),
        # Rank 1 skips the filter's start-up report, as a rank without the
        # filter would (P5): the group must stop instead of serving.
        "mixed": (True, ["serve"]),
        # On 0.32 both races wedge stock vLLM, so each needs its own group; on
        # 0.33 finding 1 cannot be forced and the request finishes, so one
        # group runs it before the duplicate resume.
        **(
            {"plain": (False, ["finding1", "dup_resume"])}
            if ON_033
            else {
                "plain-finding1": (False, ["finding1"]),
                "plain-dup-resume": (False, ["dup_resume"]),
            }
        ),
    }
    runs: dict[str, GroupRun] = {}
    try:
        for name, (filtered, scenarios) in plan.items():
            env = dict(os.environ)
            # This checkout's code first, whatever the environment's install
            # holds (absolute: the drivers run in a temporary directory).
            env["PYTHONPATH"] = os.pathsep.join(
                [str(plugins), str(HERE), str(REPO / "src")]
                + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            )
            env.pop(ENV, None)
            if filtered:
                env[ENV] = "1"
            if name == "mixed":
                env[UNREPORTED_ENV] = "1"
                env[CHECK_ENV] = str(MIXED_CHECK_S)
            events, log = tmp / f"{name}.jsonl", tmp / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(HERE / "dp_group_driver.py"), str(events), str(model)]
                    + scenarios,
                    env=env,
                    cwd=tmp,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            runs[name] = GroupRun(name, proc, events, log)
        _watch(list(runs.values()))
        for r in runs.values():
            print(
                f"{r.name}: {r.outcome}, up after {r.up()['start_s']:.0f} s"
                if any(e["event"] == "up" for e in r.events)
                else f"{r.name}: {r.outcome}"
            )
        yield runs
    finally:
        for r in runs.values():
            if r.proc.poll() is None:
                _kill(r)


def _result(run: GroupRun, scenario: str) -> dict[str, Any]:
    results = run.results()
    assert scenario in results, f"{run.name}: {run.outcome}\n{run.log()[-4000:]}"
    return results[scenario]


def test_plugin_installs_the_filter_in_every_engine_core(groups: dict[str, GroupRun]) -> None:
    filtered = groups["filtered"]
    log = filtered.log()
    import vllm

    # One line in each process vLLM loads plugins in: the front end and both
    # engine cores.
    up = filtered.up()
    for pid in [up["pid"], *up["engine_pids"]]:
        line = f"loopbridge_dp_filter: installed (pid {pid}) for vLLM {vllm.__version__}"
        assert log.count(line) == 1, (pid, log[-3000:])
    for name in groups:
        if name not in ("filtered", "mixed"):
            assert "loopbridge_dp_filter: installed" not in groups[name].log()


def test_a_rank_without_the_filter_stops_the_group(groups: dict[str, GroupRun]) -> None:
    """P5: rank 1 does not report the filter; rank 0 stops at start-up, vLLM
    reports its engine core dead, and no request is served."""
    mixed = groups["mixed"]
    res = _result(mixed, "serve")
    assert not res["finished"] and res["error"] == "EngineDeadError", res
    log = mixed.log()
    assert "DP rank 0 has the filter, but rank(s) 1 of 2 did not report it" in log, log[-3000:]
    assert "DP rank 1 has the filter" not in log  # rank 1 never checked
    # The healthy filtered group passed the same check on both ranks.
    assert "did not report it" not in groups["filtered"].log()


def test_finding1_hangs_without_the_filter_and_finishes_with_it(
    groups: dict[str, GroupRun],
) -> None:
    fixed = _result(groups["filtered"], "finding1")
    if ON_033:
        # Only engines start waves: rank 0 takes the request after the resume
        # barrier, so its wave start cannot overtake rank 1's resume, and the
        # request finishes with or without the filter.
        plain = _result(groups["plain"], "finding1")
        assert not plain["gated"] and not fixed["gated"]
        assert plain["finished"] and fixed["finished"], (plain, fixed)
        return
    plain = _result(groups["plain-finding1"], "finding1")
    # The race was forced the same way in both groups.
    assert plain["gated"] and fixed["gated"]
    # Stock 0.32: rank 1 dropped the wave start (latched from the pause) and
    # stays idle; rank 0 runs the request alone and blocks in the DP sync.
    assert not plain["finished"], plain
    assert plain["rank1"]["running"] is False and plain["rank1"]["requests"] == 0
    assert groups["plain-finding1"].outcome != "done"  # wedged: killed, not shut down
    # Filtered: rank 1 held the wave start and joined the wave after resume.
    assert fixed["finished"] and fixed["reason"] == "length", fixed
    assert fixed["rank1"]["held"] == 0


def test_duplicate_resume_with_a_busy_peer(groups: dict[str, GroupRun]) -> None:
    plain = _result(groups["plain" if ON_033 else "plain-dup-resume"], "dup_resume")
    fixed = _result(groups["filtered"], "dup_resume")
    assert plain["gated"] and fixed["gated"]
    # Stock 0.32 and 0.33 (vLLM #55229): idle rank 1 enters the resume barrier while
    # rank 0 is in its wave's DP sync; the request never finishes.
    assert not plain["finished"], plain
    # Filtered: the duplicate is answered as a no-op on both ranks.
    assert fixed["finished"] and fixed["resumes_answered"] == 2 and not fixed["resume_errors"]


def test_refit_cycles_under_load(groups: dict[str, GroupRun]) -> None:
    run = groups["filtered"]
    res = _result(run, "refit")
    assert run.outcome == "done", run.outcome  # clean shutdown afterwards
    cycles = [e for e in run.events if e["event"] == "cycle"]
    assert res["cycles"] == CYCLES == len(cycles) >= 5
    for c in cycles:
        before, during, after = c["reasons"][:4], c["reasons"][4:6], c["reasons"][6:]
        # In-flight requests finish, or are aborted by an abort-mode pause
        # (vLLM's documented outcome). Requests sent during the pause are
        # queued and finish (0.32; 0.33 in keep mode), or get 0.33's
        # documented retryable ``engine_paused`` error (abort/wait modes).
        allowed = {"length", "abort"} if c["mode"] == "abort" else {"length"}
        assert set(before) <= allowed, c
        rejects = ON_033 and c["mode"] != "keep"
        assert set(during) == ({"engine_paused"} if rejects else {"length"}), c
        assert set(after) == {"length"}, c
    assert res["client_unfinished"] == 0
    for rank in res["ranks"]:
        assert rank["requests"] == 0 and not rank["running"] and rank["pause"] == 0
        assert rank["held"] == 0
