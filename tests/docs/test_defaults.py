"""Facts the docs state in more than one place agree with the code that sets them.

* The GPU benchmark's default vLLM release: ``scripts/gpu-bench.sh`` sets it;
  CONTRIBUTING.md (and the performance history) say which it is.
* ``stream_window``: the core's default (``proxy``), and the engine adapters' own
  (``engine_client_proxy``, ``tokenizer_manager_proxy``); the API pages, concepts,
  the adapters' pages and performance.md state them.
* The vLLM release ``scripts/setup.sh`` puts in ``.venv`` (the newest CPU list under
  ``requirements/``): README.md and CONTRIBUTING.md name it.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import loopbridge

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _read(path: str) -> str:
    return (ROOT / path).read_text()


def _keyword_default(module: str, function: str, name: str) -> object:
    """A keyword-only parameter's default, read from the source (no engine imported)."""
    tree = ast.parse((SRC / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
                if arg.arg == name and default is not None:
                    return ast.literal_eval(default)
    raise AssertionError(f"{module}: no keyword {name!r} with a default in {function}()")


def gpu_bench_default() -> str:
    found = re.search(r'^vllm_version="([\d.]+)"$', _read("scripts/gpu-bench.sh"), re.M)
    assert found, "scripts/gpu-bench.sh sets no vllm_version default"
    return found[1]


def test_the_gpu_benchmarks_default_vllm_is_the_one_the_docs_name() -> None:
    default = gpu_bench_default()
    contributing = _read("CONTRIBUTING.md")
    assert f"(`--vllm {default}`, the\ndefault" in contributing or (
        f"`--vllm {default}`, the default" in contributing.replace("\n", " ")
    ), f"CONTRIBUTING.md does not give {default} as gpu-bench.sh's default"
    history = _read("docs/dev/performance-history.md").replace("\n", " ")
    said = set(re.findall(r"vllm==([\d.]+)` \(the default\)", history))
    assert said == {default}, f"the performance history names {said}, the script {default}"
    assert f"(default {default};" in _read("scripts/gpu-bench.sh"), "the script's --help"


def test_the_newest_release_is_the_one_setup_installs_and_the_docs_name() -> None:
    lists = sorted(
        (
            tuple(int(x) for x in p.name.split("-")[1].split("."))
            for p in (ROOT / "requirements").glob("vllm-*-cpu.txt")
        ),
    )
    newest = ".".join(map(str, lists[-1]))
    assert f"vLLM\n{newest}.0 on CPU" in _read("README.md") or (
        f"vLLM {newest}.0 on CPU" in _read("README.md").replace("\n", " ")
    ), f"README.md does not say setup.sh installs vLLM {newest}.0"
    assert f"| {newest}.0 | newest; the default `.venv` |" in _read("CONTRIBUTING.md")
    assert gpu_bench_default() == f"{newest}.0", "the GPU benchmark defaults to the newest"


def _windows_said(path: str, subject: str) -> set[int]:
    """Every 'stream_window ... default N' (or '=N') the page says near ``subject``."""
    text = _read(path).replace("\n", " ")
    found = set()
    for m in re.finditer(r"stream_window`?(?:=|[^.;|]{0,40}?default )(\d+)", text):
        if subject in text[max(0, m.start() - 400) : m.end() + 400]:
            found.add(int(m[1]))
    return found


def test_the_cores_stream_window_default_is_the_one_the_docs_give() -> None:
    core = inspect.signature(loopbridge.proxy).parameters["stream_window"].default
    for page in ("docs/api.md", "docs/concepts.md", "docs/performance.md"):
        said = _windows_said(page, "stream")
        assert core in said, f"{page} does not give proxy()'s stream_window default {core}"


def test_the_adapters_stream_window_default_is_the_one_the_docs_give() -> None:
    vllm = _keyword_default("loopbridge_vllm/engine.py", "engine_client_proxy", "stream_window")
    sglang = _keyword_default(
        "loopbridge_sglang/manager.py", "tokenizer_manager_proxy", "stream_window"
    )
    assert vllm == sglang, "the two adapters' stream_window defaults differ: the docs say one"
    core = inspect.signature(loopbridge.proxy).parameters["stream_window"].default
    for page in ("docs/vllm.md", "docs/sglang.md"):
        said = _windows_said(page, "stream")
        assert said == {vllm}, f"{page} gives stream_window {said}; the adapter's default is {vllm}"
    performance = _read("docs/performance.md").replace("\n", " ")
    assert f"`stream_window={core}` items" in performance and f"use {vllm}:" in performance, (
        "docs/performance.md's 'Why the stream window differs' must give both defaults"
    )
