"""Every Python snippet in README.md, CONTRIBUTING.md and docs/ runs, or type-checks.

A fenced ``python`` block is run as a complete program (a fresh interpreter,
loopbridge from this tree), unless the line just above the fence is a marker::

    <!-- snippet: typecheck because REASON; given: NAME, NAME -->
    <!-- snippet: skip because REASON -->
    <!-- snippet: recipe because REASON; name: NAME -->
    <!-- snippet: from examples/FILE.py because REASON -->

``typecheck`` is for snippets that cannot run here: they need vLLM's engine, or
show calls from several loops and threads in one listing.  The block becomes
the body of an ``async def`` (so ``await`` and ``async for`` may appear at the
top level), whose parameters are the ``given`` names, typed ``Any``: the objects
the prose says you already have.  mypy then checks every loopbridge name and
signature the snippet uses.  ``skip`` is for blocks that are not code to check
(a sample of interactive output).  ``recipe`` is for the recipes' code
(docs/recipes.md): ``tests/recipes`` loads the blocks of each name as a module
and runs them against real servers, so a recipe is exactly what its tests
execute.  ``from`` is for a block that is a piece of an example file: it must
be that file's lines, verbatim, and a test must import the example (the
recipes in docs/integrations.md are run that way, by the tests of the vLLM
lane).  The reason is mandatory: a reader of the Markdown source sees why a
block is not run here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import loopbridge

ROOT = Path(__file__).resolve().parents[2]
SRC = str(Path(loopbridge.__file__).resolve().parent.parent)
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^```python\s*$")
_MARKER = re.compile(
    r"^<!-- snippet: (?P<kind>typecheck|skip|recipe|from) (?:(?P<source>examples/[\w.]+\.py) )?"
    r"because (?P<reason>[^;]+?)(?:; given: (?P<given>[\w, ]+))?(?:; name: (?P<name>[\w-]+))? -->$"
)


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    kind: str  # "run", "typecheck", "skip" or "from"
    code: str
    given: tuple[str, ...]
    name: str | None = None  # a recipe's name
    source: str | None = None  # for "from": the example file, relative to the root

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    out: list[Snippet] = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("<!-- snippet:"):
                assert _MARKER.match(line), f"{path}:{i + 1}: malformed marker {line!r}"
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                assert _FENCE.match(nxt), f"{path}:{i + 1}: marker not followed by a python block"
            if _FENCE.match(line):
                marker = _MARKER.match(lines[i - 1]) if i else None
                end = i + 1
                while not lines[end].startswith("```"):
                    end += 1
                given = marker.group("given") if marker else None
                out.append(
                    Snippet(
                        path,
                        i + 1,
                        marker.group("kind") if marker else "run",
                        "\n".join(lines[i + 1 : end]) + "\n",
                        tuple(n.strip() for n in given.split(",")) if given else (),
                        marker.group("name") if marker else None,
                        marker.group("source") if marker else None,
                    )
                )
                i = end
            i += 1
    return out


ALL = snippets()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPBRIDGE_")}
    env["PYTHONPATH"] = SRC
    return env


@pytest.mark.parametrize("snippet", [s for s in ALL if s.kind == "run"], ids=lambda s: s.id)
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{snippet.id} failed:\n{result.stdout}{result.stderr}"


def _as_function(snippet: Snippet) -> str:
    params = ", ".join(f"{name}: Any" for name in snippet.given)
    body = textwrap.indent(snippet.code, "    ")
    return (
        f"# {snippet.id}\nfrom typing import Any\n\n\n"
        f"async def snippet({params}) -> None:\n{body}    return None\n"
    )


def test_typecheck_snippets_pass_mypy(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (dependency group: test)")
    checked = [s for s in ALL if s.kind == "typecheck"]
    assert checked
    files = []
    for n, snippet in enumerate(checked):
        f = tmp_path / f"snippet_{n}.py"
        f.write_text(_as_function(snippet))
        files.append(str(f))
    config = tmp_path / "mypy.ini"
    # The engines' own types are not what these snippets check, and analysing
    # them would take minutes: their modules are taken as Any, and the core's
    # per-Python venvs, which have no engine, check the same snippets. The same
    # goes for the other libraries the RL recipes call (Ray, openai, torch).
    config.write_text(
        "[mypy]\nwarn_unused_ignores = True\n\n"
        "[mypy-vllm.*,sglang.*,ray.*,openai.*,torch.*]\nfollow_imports = skip\n"
        "ignore_missing_imports = True\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--check-untyped-defs",
            *files,
        ],
        cwd=tmp_path,
        env={**_env(), "MYPYPATH": SRC},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, "\n".join(
        [result.stdout, *(f"{f}: from {s.id}" for f, s in zip(files, checked))]
    )


@pytest.mark.parametrize("snippet", [s for s in ALL if s.kind == "from"], ids=lambda s: s.id)
def test_example_snippets_are_the_tested_code(snippet: Snippet) -> None:
    assert snippet.source is not None, f"{snippet.id}: 'from' needs an examples/ file"
    example = ROOT / snippet.source
    assert ("\n" + snippet.code) in ("\n" + example.read_text()), (
        f"{snippet.id} is not verbatim lines of {snippet.source}"
    )
    module = f'"{example.stem}"'  # imported by name, as the example tests do
    assert any(module in t.read_text() for t in (ROOT / "tests").rglob("*.py")), (
        f"no test imports {snippet.source}"
    )


def test_every_block_is_accounted_for() -> None:
    kinds = {s.kind for s in ALL}
    assert "run" in kinds and "typecheck" in kinds
    for s in ALL:
        assert s.code.strip(), f"{s.id}: empty block"
        assert (s.kind == "recipe") == (s.name is not None), (
            f"{s.id}: a recipe, and only one, has a name"
        )
        assert (s.kind == "from") == (s.source is not None), f"{s.id}: source only with 'from'"
    # Every recipe is loaded by a test under tests/recipes or tests/servers (which runs it).
    tests = "\n".join(
        p.read_text()
        for d in ("recipes", "servers")
        for p in (ROOT / "tests" / d).glob("test_*.py")
    )
    for s in ALL:
        if s.kind == "recipe":
            assert f'load_recipe("{s.name}")' in tests, f"{s.id}: no test loads recipe {s.name!r}"
