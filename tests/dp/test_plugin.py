"""The opt-in vLLM general plugin that installs the DP filter."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from entry_points import GROUP, REPO, declared, expose
from test_conformance import RealRank
from vllm.v1.engine import EngineCoreRequestType as T
from vllm.v1.engine.core import DPEngineCoreProc

from loopbridge_vllm.dp import _filter, _patch, _plugin


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_plugin.ENV, raising=False)
    monkeypatch.delenv("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", raising=False)
    monkeypatch.delenv(_patch.UNCHECKED_ENV, raising=False)
    monkeypatch.delenv(_plugin.RAY_COPY_ENV, raising=False)
    monkeypatch.delenv(_patch.CHECK_ENV, raising=False)
    _patch.uninstall_filter()
    yield
    _patch.uninstall_filter()


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    name = f"vllm.plugins.{_plugin.PLUGIN_NAME}"
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == name]


def test_pyproject_declares_the_entry_point() -> None:
    target = declared()[_plugin.PLUGIN_NAME]
    module, _, attr = target.partition(":")
    assert getattr(importlib.import_module(module), attr) is _plugin.load
    assert GROUP == "vllm.general_plugins"


@pytest.mark.every_release
def test_off_unless_opted_in(caplog: pytest.LogCaptureFixture) -> None:
    # On the plugin's own logger: once vLLM has configured its logging, the
    # "vllm" logger's level (INFO) would otherwise hide the debug line.
    caplog.set_level(logging.DEBUG, logger=f"vllm.plugins.{_plugin.PLUGIN_NAME}")
    _plugin.load()
    assert not _patch.is_installed()
    assert [lvl for lvl, _ in lines(caplog)] == [logging.DEBUG]


@pytest.mark.every_release
def test_installs_and_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(_plugin.ENV, "1")
    import vllm

    if vllm.__version__ not in _patch.CHECKED_VERSIONS:
        # A release the lanes run but the filter was not checked on: refused.
        with pytest.raises(_plugin.FilterRefused, match=f"vLLM {vllm.__version__} is not"):
            _plugin.load()
        assert not _patch.is_installed()
        return
    _plugin.load()
    assert _patch.is_installed()

    [(level, text)] = lines(caplog)
    assert "installed" in text and f"for vLLM {vllm.__version__}" in text
    if vllm.__version__.startswith("0.32."):
        # Finding 3 needs no pause: the filter cannot help, the line says so.
        assert level == logging.WARNING
        assert "can still wedge without any pause (finding 3" in text
        assert "vLLM 0.33 is clean there, use it" in text
    else:
        assert level == logging.INFO and "finding 3" not in text


@pytest.mark.parametrize("version", _patch.CHECKED_VERSIONS)
def test_the_0_32_line_warns_about_finding_3(
    version: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(_plugin.ENV, "1")
    with mock.patch("vllm.__version__", version):
        _plugin.load()
    assert _patch.is_installed()
    [(level, text)] = lines(caplog)
    if version == "0.32.0":
        assert level == logging.WARNING and "finding 3" in text
    else:
        assert level == logging.INFO and "finding 3" not in text


@pytest.mark.parametrize(
    "version",
    [
        "0.31.2",
        "0.29.0",
        "0.24.0",
        "0.34.1",
        "0.35.0",
        "0.33.1",
        "0.32.1",
        "0.33.0rc1",
        "0.33.0.dev12+g1234abc",
        "0.32.0.post1",
        "0.33.0+cpu",
        "0.33",
    ],
)
def test_refuses_an_unchecked_version(
    version: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    with mock.patch("vllm.__version__", version), pytest.raises(_plugin.FilterRefused) as caught:
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.ERROR and text == str(caught.value)
    checked = ", ".join(_patch.CHECKED_VERSIONS)
    # The release, the checked ones, the override variable, and vLLM stays down.
    assert f"vLLM {version} is not supported (checked: {checked})" in text
    assert f"set {_patch.UNCHECKED_ENV}={version} to install it anyway" in text
    assert "vLLM is not started without the filter" in text


def test_the_override_installs_on_the_named_build_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.33.1rc2")
    with mock.patch("vllm.__version__", "0.33.1rc2"):
        _plugin.load()
    assert _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and ": installed (pid " in text
    checked = ", ".join(_patch.CHECKED_VERSIONS)
    assert f"NOT checked (checked: {checked}), installed because {_patch.UNCHECKED_ENV}" in text


def test_the_override_names_one_build_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.33.1")
    with mock.patch("vllm.__version__", "0.33.2"), pytest.raises(_plugin.FilterRefused):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.ERROR and "refused" in text
    assert f"{_patch.UNCHECKED_ENV}=0.33.1 does not name it" in text


def test_the_override_does_not_skip_the_structural_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.35.0")
    monkeypatch.delattr(DPEngineCoreProc, "_pause_complete")
    with mock.patch("vllm.__version__", "0.35.0"), pytest.raises(_plugin.FilterRefused):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.ERROR and "_pause_complete missing" in text


def test_refuses_an_elastic_ep_scale_up_launch(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", "1")
    with (
        mock.patch("vllm.__version__", "0.32.0"),  # refused for elastic EP alone
        pytest.raises(_plugin.FilterRefused),
    ):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.ERROR and "elastic EP" in text


def latched_rank(elastic: bool) -> RealRank:
    rr = RealRank(1, 2)
    rr.e.ignore_start_dp_wave = True  # consensus reached: wave starts are dropped
    rr.e.vllm_config.parallel_config = SimpleNamespace(enable_elastic_ep=elastic)
    return rr


def test_an_elastic_ep_engine_is_left_unfiltered(caplog: pytest.LogCaptureFixture) -> None:
    assert _patch.install_filter()
    fixed, elastic = latched_rank(False), latched_rank(True)
    for rr in (fixed, elastic):
        DPEngineCoreProc._handle_client_request(rr.e, T.START_DP_WAVE, (1, 0))
    # The filter holds the late wave start on a fixed group; the elastic
    # engine runs vLLM's own handler, which drops it.
    assert len(fixed.e._loopbridge_held) == 1
    assert "_loopbridge_held" not in elastic.e.__dict__
    [(level, text)] = lines(caplog)
    assert level == logging.ERROR and "elastic EP" in text


def test_the_line_is_not_lost_before_vllm_configures_logging(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A front-end may load plugins before vLLM has set up its log handlers."""
    bare = logging.getLogger("loopbridge-test-unconfigured")
    bare.propagate = False
    monkeypatch.setattr(_plugin, "_logger", lambda: bare)
    monkeypatch.setenv(_plugin.ENV, "1")
    _plugin.load()
    assert _patch.is_installed()
    err = capsys.readouterr().err
    assert err.count("loopbridge_dp_filter: installed (pid ") == 1


# -- Ray's DP backend --------------------------------------------------------
#
# ``vllm serve --data-parallel-backend ray`` starts each engine core as a Ray
# actor (``CoreEngineActorManager``) whose environment is only what
# ``vllm.ray.ray_env.get_env_vars_to_copy`` names.  A full Ray DP start cannot
# run on CPU: ``CoreEngineActorManager.create_dp_placement_groups`` looks the
# devices up under ``current_platform.ray_device_key``, which is empty on the
# CPU platform, and asserts "No  found in Ray cluster".  So these tests stop
# at vLLM's own env-copy function, called as the actor manager calls it;
# test_plugin_ray.py carries the result into real Ray actors.


def actor_env() -> dict[str, str]:
    """The environment ``CoreEngineActorManager`` gives the DP engine actors."""
    from vllm.ray.ray_env import get_env_vars_to_copy
    from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS

    names = get_env_vars_to_copy(
        destination="DPMoEEngineCoreActor", exclude_vars=WORKER_SPECIFIC_ENV_VARS
    )
    return {name: os.environ[name] for name in names if name in os.environ}


def test_ray_would_not_copy_the_opt_in_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: without the plugin's help the actors never see it."""
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.33.0")
    env = actor_env()
    assert _plugin.ENV not in env and _patch.UNCHECKED_ENV not in env


def test_the_plugin_names_its_variables_for_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.33.0")
    monkeypatch.setenv(_plugin.RAY_COPY_ENV, "MY_VAR, OTHER")
    monkeypatch.setenv("MY_VAR", "x")
    _plugin.load()
    _plugin.load()  # idempotent
    copied = os.environ[_plugin.RAY_COPY_ENV].split(",")
    assert copied == ["MY_VAR", "OTHER", _plugin.ENV, _patch.UNCHECKED_ENV]
    env = actor_env()
    assert env[_plugin.ENV] == "1" and env[_patch.UNCHECKED_ENV] == "0.33.0"
    assert env["MY_VAR"] == "x"  # the user's own list still works


def test_not_opted_in_leaves_the_ray_list_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin.load()
    assert _plugin.RAY_COPY_ENV not in os.environ
    assert _plugin.ENV not in actor_env()


def test_vllm_front_end_plugin_loading_reaches_the_ray_actor_env(tmp_path: Path) -> None:
    """Through vLLM's own plugin loader, as a front end loads it before it
    starts the engines; in a fresh process, so that the loader really runs."""
    env = {k: v for k, v in os.environ.items() if k != _plugin.RAY_COPY_ENV}
    env[_plugin.ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(expose(tmp_path)), str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    script = (
        "import os\n"
        "from vllm.plugins import load_general_plugins\n"
        "from vllm.ray.ray_env import get_env_vars_to_copy\n"
        "from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS\n"
        "from loopbridge_vllm.dp import _patch\n"
        "before = get_env_vars_to_copy(exclude_vars=WORKER_SPECIFIC_ENV_VARS)\n"
        "load_general_plugins()\n"
        "after = get_env_vars_to_copy(exclude_vars=WORKER_SPECIFIC_ENV_VARS)\n"
        f"print('RESULT', {_plugin.ENV!r} in before, {_plugin.ENV!r} in after,"
        " _patch.is_installed())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT False True True" in done.stdout, done.stdout[-2000:]


# -- all or none (P5): the start-up check in the DP group's own store ---------


@pytest.fixture
def store() -> Any:
    """A real TCP store, the kind vLLM builds the DP group on (``dp_store``)."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def ranks_on(store: Any, size: int, elastic: bool = False) -> list[Any]:
    """Real ``DPEngineCoreProc`` ranks, each with its own client of ``store``
    (as each engine-core process has)."""
    from torch.distributed import TCPStore

    out = []
    for idx in range(size):
        rr = RealRank(idx, size)
        del rr.e._loopbridge_group_checked  # the conformance harness skips the check
        rr.e.dp_store = TCPStore("127.0.0.1", store.port, is_master=False)
        rr.e.vllm_config.parallel_config = SimpleNamespace(enable_elastic_ep=elastic)
        out.append(rr.e)
    return out


def test_a_group_that_all_has_the_filter_starts(store: Any) -> None:
    engines = ranks_on(store, 3)
    errors: list[BaseException] = []

    def check(engine: Any) -> None:
        try:
            _patch.check_group(engine, timeout_s=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=check, args=(e,)) for e in engines[1:]]
    for t in threads:
        t.start()
    _patch.check_group(engines[0], timeout_s=60)  # returns once every rank reported
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_a_rank_without_the_filter_stops_the_group(store: Any) -> None:
    engines = ranks_on(store, 3)
    store.set("loopbridge_dp_filter/rank/2", "1")  # rank 2 reported; rank 1 never does
    with pytest.raises(_patch.FilterMismatchError) as err:
        _patch.check_group(engines[0], timeout_s=0.5)
    assert "DP rank 0 has the filter, but rank(s) 1 of 3 did not report it" in str(err.value)
    assert "LOOPBRIDGE_DP_FILTER=1 (precondition P5)" in str(err.value)


def test_the_check_runs_before_the_busy_loop(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _patch.install_filter()
    monkeypatch.setenv(_patch.CHECK_ENV, "0.5")
    lonely, peer = ranks_on(store, 2)
    entered: list[int] = []
    for e in (lonely, peer):
        # One busy-loop round: the real loop asks this and exits when it is False.
        e._handle_shutdown = lambda e=e: entered.append(e.dp_rank) or False
    with pytest.raises(_patch.FilterMismatchError, match=r"rank\(s\) 1 of 2"):
        DPEngineCoreProc.run_busy_loop(lonely)
    assert entered == []  # the group never started serving
    store.set("loopbridge_dp_filter/rank/1", "1")  # now the peer reports too
    with pytest.raises(SystemExit):
        DPEngineCoreProc.run_busy_loop(lonely)
    assert entered == [0]


def test_elastic_ep_engines_are_not_checked(
    store: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _patch.install_filter()
    monkeypatch.setenv(_patch.CHECK_ENV, "0.5")
    [engine, _] = ranks_on(store, 2, elastic=True)
    engine._handle_shutdown = lambda: False
    with pytest.raises(SystemExit):
        DPEngineCoreProc.run_busy_loop(engine)  # no peer reported: still runs
    assert not store.check(["loopbridge_dp_filter/rank/0"])
    assert [lvl for lvl, _ in lines(caplog)] == [logging.ERROR]  # said once


def test_the_check_time_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _patch._check_seconds() == _patch.DEFAULT_CHECK_S
    monkeypatch.setenv(_patch.CHECK_ENV, "12.5")
    assert _patch._check_seconds() == 12.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(_patch.CHECK_ENV, bad)
        with pytest.raises(ValueError, match=_patch.CHECK_ENV):
            _patch._check_seconds()


# -- vLLM 0.34's paths outside the model: refused, never run unfiltered -------


@pytest.mark.parametrize("method", sorted(_filter.REFUSED_METHODS))
def test_checkpoint_utilities_are_refused_by_name(method: str) -> None:
    assert _patch.install_filter()
    rr = RealRank(0, 2)
    called: list[Any] = []
    setattr(rr.e, method, lambda *args: called.append(args))  # what vLLM would run
    DPEngineCoreProc._handle_client_request(rr.e, T.UTILITY, (0, 9, method, ()))
    [(client, outputs)] = [rr.e.output_queue.get_nowait()]
    reply = outputs.utility_output
    assert client == 0 and reply.call_id == 9 and reply.result is None
    assert f"{method} is refused" in reply.failure_message
    assert "LOOPBRIDGE_DP_FILTER=1" in reply.failure_message
    assert called == []  # not handled: no pause started, nothing resumed


@pytest.mark.parametrize(
    ("section", "field", "flag"),
    [(section, field, why.split(":")[0]) for section, field, why in _patch.UNMODELLED_SETTINGS],
)
def test_unmodelled_settings_stop_the_engine_core(section: str, field: str, flag: str) -> None:
    assert _patch.install_filter()
    rr = RealRank(0, 2)
    config = getattr(rr.e.vllm_config, section, None) or SimpleNamespace()
    setattr(config, field, True)
    setattr(rr.e.vllm_config, section, config)
    rr.e._loopbridge_group_checked = False  # the start-up checks run
    with pytest.raises(_patch.FilterRefused, match=f"refused on DP rank 0: {flag}"):
        rr.e.run_busy_loop()
