"""The opt-in vLLM general plugin that installs the DP filter."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from unittest import mock

import pytest
from entry_points import GROUP, declared
from test_conformance import RealRank
from vllm.v1.engine import EngineCoreRequestType as T
from vllm.v1.engine.core import DPEngineCoreProc

from loopbridge_vllm.dp import _patch, _plugin


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(_plugin.ENV, raising=False)
    monkeypatch.delenv("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", raising=False)
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
    assert level == logging.INFO and "installed" in text and vllm.__version__ in text


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0"])
def test_refuses_an_unchecked_version(
    version: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_plugin.ENV, "1")
    with mock.patch("vllm.__version__", version):
        _plugin.load()
    assert not _patch.is_installed()
    [(level, text)] = lines(caplog)
    assert level == logging.WARNING and "NOT installed" in text
    assert f"vLLM {version} is not supported (checked: 0.32.x, 0.33.x)" in text


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
