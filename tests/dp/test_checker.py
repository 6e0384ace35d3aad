"""The model checker against the known upstream failures and the filter.

Every check prints its bounds, the states explored and the time taken (run
with ``-s`` to see them, or read the ``checker`` user property in the report).
Bounds are small enough for CI; the CLI runs bigger ones.
"""

from __future__ import annotations

from typing import Any

import pytest

from loopbridge_bench.dp_check import VARIANTS, Config, Result, check


def run(variant: str, record_property: Any, heal: bool = False, **bounds: Any) -> Result:
    res = check(Config(VARIANTS[variant], **bounds), heal_check=heal)
    print(res.summary())
    record_property("checker", res.summary())
    assert res.complete, "search was cut short; the verdict would not be exhaustive"
    assert res.states > 0 and res.seconds >= 0
    return res


def kinds(res: Result) -> set[str]:
    return set(res.violations)


# --- the known upstream failures -------------------------------------------


def test_a_idle_fast_path_deadlock(record_property: Any) -> None:
    """#36594/#38009: a late START_DP_WAVE re-arms one paused rank into a dummy
    forward while its peer sits in the weight-update collective_rpc."""
    res = run("a", record_property, heal=True)
    v = res.violations["deadlock"]
    assert sorted(v.detail.split(": ")[1].split(", ")) == ["r0 in rpc", "r1 in fwd"]
    text = v.timeline(2)
    assert "START_DP_WAVE" in text and "rpc -> enter rpc" in text
    assert v.heals is False


def test_b_naive_guard_busy_peer_hang(record_property: Any) -> None:
    """The guard of #36608/#38009 closes the deadlock but a busy peer now waits
    forever in its forward for a paused rank that dropped the wave start."""
    res = run("b", record_property)
    assert "deadlock" not in kinds(res)
    v = res.violations["hang"]
    assert "in fwd" in v.detail
    assert "START_DP_WAVE" in v.timeline(2)


def test_c33_duplicate_resume_split(record_property: Any) -> None:
    """#55229: with one resume the 0.33 two-phase pause is clean, a duplicate
    resume sends one rank into the resume barrier and the other into a forward."""
    assert run("c33", record_property).ok
    res = run("c33", record_property, resumes=2)
    v = res.violations["deadlock"]
    assert "in barrier" in v.detail and "in fwd" in v.detail
    assert v.timeline(2).count("send resume to all") == 2


def test_d33_idempotent_resume_closes_the_split(record_property: Any) -> None:
    assert run("d33", record_property, resumes=2).ok


# --- vLLM 0.32.0 as installed ----------------------------------------------


def test_c_resume_window_wave_start_is_lost(record_property: Any) -> None:
    """0.32.0, one pause/update/resume, FIRST_REQ forwarded promptly: a wave
    start triggered by a request sent during the resume reaches a peer before
    its resume, the latch drops it, and the resumed target steps alone."""
    res = run("c", record_property, prompt_first_req=True)
    assert kinds(res) == {"hang"}
    v = res.violations["hang"]
    assert "in fwd" in v.detail
    text = v.timeline(2)
    assert "[w1,Pall,latch]" in text and "resume -> enter barrier" in text


def test_c_duplicate_resume_deadlock(record_property: Any) -> None:
    res = run("c", record_property, resumes=2, prompt_first_req=True)
    assert {"deadlock", "hang"} <= kinds(res)
    assert "in barrier" in res.violations["deadlock"].detail


def test_c_hang_without_any_pause(record_property: Any) -> None:
    """0.32.0 needs no pause at all to hang: a starved stats task forwards a
    stale FIRST_REQ after the wave it was for has ended, stamped with the
    current wave, so the coordinator's exclusion survives."""
    res = run("c", record_property, pauses=0, requests=2)
    assert kinds(res) == {"hang"}
    assert "stats task: FIRST_REQ" in res.violations["hang"].timeline(2)
    # Forwarded promptly, the same bounds are clean.
    assert run("c", record_property, pauses=0, requests=2, prompt_first_req=True).ok


def test_d_idempotent_resume_is_not_enough_on_032(record_property: Any) -> None:
    res = run("d", record_property, resumes=2, prompt_first_req=True)
    assert kinds(res) == {"hang"}


# --- the filter (variant e) --------------------------------------------------

E_SCENARIOS = [
    pytest.param(dict(ranks=2, mode="keep"), id="n2-keep-any"),
    pytest.param(dict(ranks=2, mode="abort"), id="n2-abort-any"),
    pytest.param(dict(ranks=2, mode="wait", req_len=2), id="n2-wait-any-len2"),
    pytest.param(dict(ranks=2, mode="keep", resumes=2), id="n2-keep-duplicate-resume"),
    pytest.param(dict(ranks=3, mode="keep", when="after"), id="n3-keep-after"),
    pytest.param(dict(ranks=3, mode="abort", when="after"), id="n3-abort-after"),
    pytest.param(dict(ranks=3, resumes=2, when="after"), id="n3-keep-after-duplicate-resume"),
    # Larger N=3 runs (requests at any time, two requests with a duplicate
    # resume) take 1-10 minutes; docs/dp-protocol.md lists them with their
    # CLI lines.
]


@pytest.mark.parametrize("bounds", E_SCENARIOS)
def test_e_filter_clean(bounds: dict[str, Any], record_property: Any) -> None:
    """No deadlock, hang, lost request or failed utility within the bounds.
    ``when="any"`` lets every request be sent before, during or after the pause."""
    res = run("e", record_property, prompt_first_req=True, **bounds)
    assert res.ok, "\n".join(
        f"{k}: {v.detail}\n{v.timeline(bounds['ranks'])}" for k, v in res.violations.items()
    )


@pytest.mark.parametrize(
    "bounds", [dict(ranks=2), dict(ranks=2, resumes=2)], ids=["one-resume", "duplicate-resume"]
)
def test_same_bounds_fail_without_the_filter(bounds: dict[str, Any], record_property: Any) -> None:
    """The scenarios above are not vacuous: unfiltered 0.32.0 fails them."""
    assert not run("c", record_property, prompt_first_req=True, **bounds).ok


def test_starved_stats_task_is_outside_the_filter(record_property: Any) -> None:
    """The pause-free hang needs no pause, so a pause-aware filter cannot help."""
    res = run("e", record_property, pauses=0, requests=2)
    assert kinds(res) == {"hang"}


def test_e_one_request_survives_a_starved_stats_task(record_property: Any) -> None:
    """With the stats task modelled exactly (a pending FIRST_REQ goes out
    before publications are drained while the client believes the engines
    idle), one request and a pause are clean even when the task is starved;
    unfiltered 0.32.0 still hangs there (finding 1)."""
    assert run("e", record_property).ok
    assert kinds(run("c", record_property)) == {"hang"}


@pytest.mark.parametrize("targets", [((0,),), ((0,), (1,))], ids=["one-server", "sequential"])
@pytest.mark.parametrize("variant", ["c", "c33", "d33", "e"])
def test_subset_pause_hangs_even_with_the_filter(
    variant: str, targets: Any, record_property: Any
) -> None:
    """A pause that reaches only rank 0 (one API server of a hybrid/external
    LB deployment, or servers paused one at a time) kicks rank 0 into a dummy
    forward that idle rank 1 never joins; nothing reaches rank 1 that a
    filter could hold or release.  Pausing every rank before waiting is the
    rule (docs/dp-protocol.md)."""
    res = run(variant, record_property, prompt_first_req=True, pause_targets=targets)
    assert kinds(res) == {"hang"}
    assert res.violations["hang"].detail == "r0 in fwd; r1 never join(s)"
    # The same orchestrator pausing both ranks at once is clean on (e).
    if variant == "e":
        assert run(variant, record_property, prompt_first_req=True, pause_targets=((0, 1),)).ok


def test_config_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        Config(VARIANTS["c"], ranks=1)
    with pytest.raises(ValueError):
        Config(VARIANTS["c"], sync_interval=0)
    with pytest.raises(ValueError):
        Config(VARIANTS["c"], pause_targets=((2,),))
