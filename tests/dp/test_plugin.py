"""The opt-in vLLM general plugin that installs the DP filter."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from entry_points import GROUP, REPO, declared, expose
from test_conformance import RealRank
from vllm.v1.engine import EngineCoreRequestType as T
from vllm.v1.engine.core import DPEngineCoreProc

from loopbridge_vllm.dp import _patch, _plugin


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_plugin.ENV, raising=False)
    monkeypatch.delenv("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", raising=False)
    monkeypatch.delenv(_patch.UNCHECKED_ENV, raising=False)
    monkeypatch.delenv(_plugin.RAY_COPY_ENV, raising=False)
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


def test_off_unless_opted_in(caplog: pytest.LogCaptureFixture) -> None:
    # On the plugin's own logger: once vLLM has configured its logging, the
    # "vllm" logger's level (INFO) would otherwise hide the debug line.
    caplog.set_level(logging.DEBUG, logger=f"vllm.plugins.{_plugin.PLUGIN_NAME}")
    _plugin.load()
    assert not _patch.is_installed()
    assert [lvl for lvl, _ in lines(caplog)] == [logging.DEBUG]


def test_installs_and_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv(_plugin.ENV, "1")
    _plugin.load()
    assert _patch.is_installed()
    import vllm

    [(level, text)] = lines(caplog)
    assert "installed" in text and f"for vLLM {vllm.__version__}" in text
    if vllm.__version__.startswith("0.32."):
        # Finding 3 needs no pause: the filter cannot help, the line says so.
        assert level == logging.WARNING
        assert "can still wedge without any pause (finding 3" in text
        assert "vLLM 0.33 is clean there, use it" in text
    else:
        assert level == logging.INFO and "finding 3" not in text


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
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
        "0.34.0",
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
    with mock.patch("vllm.__version__", version):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and "NOT installed" in text
    assert f"vLLM {version} is not supported (checked: 0.32.0, 0.33.0)" in text
    assert f"set {_patch.UNCHECKED_ENV}={version} to install it anyway" in text


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
    assert (
        f"NOT checked (checked: 0.32.0, 0.33.0), installed because {_patch.UNCHECKED_ENV}" in text
    )


def test_the_override_names_one_build_only(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.33.1")
    with mock.patch("vllm.__version__", "0.33.2"):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and "NOT installed" in text
    assert f"{_patch.UNCHECKED_ENV}=0.33.1 does not name it" in text


def test_the_override_does_not_skip_the_structural_check(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv(_patch.UNCHECKED_ENV, "0.35.0")
    monkeypatch.delattr(DPEngineCoreProc, "_pause_complete")
    with mock.patch("vllm.__version__", "0.35.0"):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and "_pause_complete missing" in text


def test_refuses_an_elastic_ep_scale_up_launch(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    monkeypatch.setenv("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", "1")
    with mock.patch("vllm.__version__", "0.32.0"):  # refused for elastic EP alone
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and "elastic EP" in text


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
# at vLLM's own env-copy function, called as the actor manager calls it.


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
