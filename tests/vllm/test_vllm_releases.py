"""vLLM release differences: each piece resolves on the installed release, and a
piece that is missing is named (not hidden behind a generic start-up failure)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import pytest

from loopbridge_vllm import ServerStartError, start_openai_server
from loopbridge_vllm._vllm_releases import (
    SUPPORTED_RELEASES,
    MissingVllmPiece,
    UntestedReleaseWarning,
    import_piece,
    untested_release_note,
)
from loopbridge_vllm._vllm_releases.moved_imports import make_arg_parser, openai_app_builders

#: Release-sensitive: runs on every tested vLLM release's lane.
pytestmark = pytest.mark.every_release


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Importable modules: one that needs an absent package, one that works."""
    (tmp_path / "lb_home_needs_pkg.py").write_text("import lb_absent_dependency\nthing = 1\n")
    (tmp_path / "lb_home_ok.py").write_text("thing = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lb_home_needs_pkg", "lb_home_ok"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def test_the_installed_release_is_supported_and_its_pieces_resolve() -> None:
    import vllm

    assert ".".join(vllm.__version__.split(".")[:2]) in SUPPORTED_RELEASES
    args = make_arg_parser().parse_args(["--model", "m", "--served-model-name", "tiny"])
    assert args.model == "m" and args.served_model_name == ["tiny"]
    build_app, init_app_state = openai_app_builders()
    assert inspect.iscoroutinefunction(init_app_state) and callable(build_app)


def test_an_absent_newer_home_falls_back_to_an_older_one(homes: Path) -> None:
    assert import_piece("the thing", [("lb_home_absent", "thing"), ("lb_home_ok", "thing")]) == 2


def test_a_home_that_needs_a_missing_package_names_the_package(homes: Path) -> None:
    with pytest.raises(MissingVllmPiece) as caught:
        import_piece("the thing", [("lb_home_needs_pkg", "thing"), ("lb_home_ok", "thing")])
    message = str(caught.value)
    assert "the thing" in message and "'lb_absent_dependency'" in message
    assert "supports vLLM " + ", ".join(SUPPORTED_RELEASES) in message


def test_no_home_lists_every_place_tried(homes: Path) -> None:
    with pytest.raises(MissingVllmPiece) as caught:
        import_piece("the thing", [("lb_home_absent", "thing"), ("lb_home_ok", "other")])
    assert "lb_home_absent.thing" in str(caught.value)
    assert "lb_home_ok.other" in str(caught.value)


def test_server_start_failure_names_the_missing_piece(
    engine_proxy: Any, homes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def builders_needing_a_missing_package() -> Any:
        return import_piece("the OpenAI app factory", [("lb_home_needs_pkg", "thing")])

    monkeypatch.setattr(
        "loopbridge_vllm.server.openai_app_builders", builders_needing_a_missing_package
    )
    with pytest.raises(ServerStartError, match="'lb_absent_dependency'"):
        start_openai_server(engine_proxy, grace=1.0)


def test_stand_in_worker_accepts_the_installed_releases_layout_call() -> None:
    from vllm.v1.executor.abstract import Executor

    from loopbridge_vllm._standin import _StandInWorker

    # The executor forwards its own arguments to the worker: call the stand-in
    # with as many as the installed release's executor takes.
    if not hasattr(Executor, "set_kv_cache_layout"):
        pytest.skip("this release's executor sets no KV-cache layout (0.24)")
    params = list(inspect.signature(Executor.set_kv_cache_layout).parameters)[1:]
    worker = object.__new__(_StandInWorker)
    worker.set_kv_cache_layout("LBNHC", *[1] * (len(params) - 1))


@pytest.mark.parametrize(
    ("version", "nearest"),
    [
        ("0.31.2", "0.32"),
        ("0.30.0", "0.29"),
        ("0.27.1", "0.29"),
        ("0.26.0", "0.24"),
        ("0.25.1", "0.24"),
        ("0.20.0", "0.24"),
        ("0.35.0", "0.34"),
        ("1.0.0", "0.34"),
    ],
)
def test_an_untested_release_is_named_with_the_nearest_tested_one(
    version: str, nearest: str
) -> None:
    note = untested_release_note(version)
    assert note is not None and "\n" not in note
    assert f"vLLM {version} is not a release loopbridge_vllm is tested on" in note
    assert f"the nearest tested release is {nearest} " in note


@pytest.mark.parametrize("version", ["0.24.0", "0.29.0", "0.32.0", "0.33.0", "0.34.0", "0.34.0rc1"])
def test_a_tested_release_has_no_note(version: str) -> None:
    assert untested_release_note(version) is None


def test_the_proxy_says_so_on_an_untested_release(engine_proxy: Any) -> None:
    from unittest import mock

    from loopbridge import unwrap
    from loopbridge_vllm import engine_client_proxy

    with mock.patch("vllm.__version__", "0.31.0"), pytest.warns(UntestedReleaseWarning) as caught:
        engine_client_proxy(unwrap(engine_proxy))
    [warning] = caught
    assert "nearest tested release is 0.32" in str(warning.message)


def test_the_install_check_says_so_on_an_untested_release(tmp_path: Path) -> None:
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys, runpy, vllm; vllm.__version__ = '0.30.1'; "
        f"sys.argv = ['check']; runpy.run_path({str(repo / 'scripts' / 'check-vllm-install.py')!r}, "
        "run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo / "scripts")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("untested: ")]
    assert "vLLM 0.30.1 is not a release" in line and "nearest tested release is 0.29" in line


def test_weight_version_tags_need_the_engines_weight_versions() -> None:
    """vLLM 0.24's AsyncLLM has no get_weight_version: refused at start, by name."""
    from loopbridge_vllm.server import OpenAIServer

    class EngineWithoutVersions:
        pass

    with pytest.raises(ServerStartError, match=r"needs the engine's get_weight_version\(\)"):
        OpenAIServer(EngineWithoutVersions(), weight_version_tags=True)  # type: ignore[arg-type]
