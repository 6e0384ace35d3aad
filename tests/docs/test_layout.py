"""The tree as CONTRIBUTING.md and docs/concepts.md describe it, and the tests as a mirror of
the core.

* CONTRIBUTING.md's "## Layout" block: every file and folder it names is where it says,
  and every module of the core (``src/loopbridge/_*.py``) is in it.
* docs/concepts.md: its table of the core's modules names each module, every module
  it names exists, and every name a row gives is defined by one of that row's
  modules (a public name may only be mentioned); every ``Class.member`` its table of
  cross-thread handshakes points at is defined there; every file it names exists.
* Tests mirror the code: each module of the core with behaviour of its own has its
  test module, ``tests/core/test_<name>.py`` (``tests/metrics/`` for the modules
  behind :mod:`loopbridge.metrics`).  :data:`EXEMPT` lists the modules without one,
  each with why.  Test modules of behaviour that crosses modules (races, stress,
  interleavings, lost wake-ups, public names, proxies of classes of every shape,
  foreign runtimes) are named for what they test.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import keyword
import re
from pathlib import Path

import pytest

import loopbridge

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "src" / "loopbridge"

#: Modules of the core with no test module of their own, and why.
EXEMPT = {
    "_errors": "declares the exception classes only; test_public_names.py checks their names",
    "_outcome": "the Outcome and Cancel values only: leaf values, no behaviour",
    "_labels": "the format of loop and thread names; checked where errors and dumps show it",
    "_public": "sets __module__ of exported names; test_public_names.py checks every one",
    "_interleave": "test-only: the hook the interleaving tests install (tests/core/interleave.py)",
}
#: The modules behind loopbridge.metrics: their test modules are in tests/metrics.
OBSERVABILITY = frozenset({"_metrics", "_histogram", "_lag", "_diagnose", "_snapshot"})


def core_modules() -> list[str]:
    return sorted(p.stem for p in CORE.glob("_*.py") if p.name != "__init__.py")


def mirror(module: str) -> Path:
    suite = "metrics" if module in OBSERVABILITY else "core"
    return ROOT / "tests" / suite / f"test_{module.removeprefix('_')}.py"


# ------------------------------------------------------------- CONTRIBUTING.md
# An entry of the layout block: its names (files end in .py, folders in /), then
# what it holds.  A description that runs on continues on lines indented to its
# column; an entry is indented by its folder's depth.
_ENTRY = re.compile(r"(?P<names>[\w./-]+(?:\.py|/)(?:, [\w./-]+(?:\.py|/))*)(?:\s.*)?")
_CONTINUED = 20


def layout() -> list[tuple[str, str]]:
    """(path from the repository root, its line) for each name in CONTRIBUTING.md's layout block."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    block = text.split("\n## Layout\n", 1)[1].split("```", 2)[1]
    named: list[tuple[str, str]] = []
    folders: list[tuple[int, str]] = []  # the enclosing entries: (indent, path)
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= _CONTINUED:
            continue
        entry = _ENTRY.fullmatch(line.strip())
        assert entry is not None, (
            f"CONTRIBUTING.md's layout: not an entry (names, then what): {line!r}"
        )
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        names = entry["names"].split(", ")
        named += [(parent + name, line) for name in names]
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, parent + names[0]))
    return named


def test_every_file_and_folder_in_the_layout_is_where_it_says() -> None:
    wrong = [
        f"{path} ({line.strip()!r})"
        for path, line in layout()
        if not ((ROOT / path).is_dir() if path.endswith("/") else (ROOT / path).is_file())
    ]
    assert not wrong, f"CONTRIBUTING.md's layout names what the tree lacks: {wrong}"


def test_the_layout_names_every_core_module() -> None:
    named = {path for path, _ in layout()}
    missing = [m for m in core_modules() if f"src/loopbridge/{m}.py" not in named]
    assert not missing, f"add to CONTRIBUTING.md's layout, with what each holds: {missing}"


# ------------------------------------------------------------ docs/concepts.md
def _section(heading: str) -> list[str]:
    """The lines under ``heading`` in docs/concepts.md, up to the next heading."""
    lines = (ROOT / "docs" / "concepts.md").read_text().splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if re.match(r"#{2,} ", lines[i])), None)
    return lines[start:end]


def _rows(heading: str) -> list[list[str]]:
    """The cells of each body row of the table under ``heading``."""
    rows = [line.strip().strip("|").split("|") for line in _section(heading)]
    table = [[c.strip() for c in row] for row in rows if len(row) > 1]
    return table[2:]  # past the header and its rule


def _assigned(node: ast.stmt) -> list[str]:
    """The plain names a statement assigns (none unless it is an assignment)."""
    targets = (
        node.targets
        if isinstance(node, ast.Assign)
        else [node.target]
        if isinstance(node, ast.AnnAssign)
        else []
    )
    return [t.id for t in targets if isinstance(t, ast.Name)]


@functools.cache
def _defined(module: str) -> dict[str, ast.ClassDef | None]:
    """The names a core module defines at its top level (a class's node, else None)."""
    out: dict[str, ast.ClassDef | None] = {}
    for node in ast.parse((CORE / f"{module}.py").read_text()).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node if isinstance(node, ast.ClassDef) else None
        out.update((name, None) for name in _assigned(node))
    return out


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class defines: in its body, in its ``__slots__``, or on ``self`` in a method."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        for name in _assigned(node):
            names.add(name)
            if name == "__slots__" and isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
                slots = ast.literal_eval(node.value)
                names.update([slots] if isinstance(slots, str) else slots)
    for sub in ast.walk(cls):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name)
            and sub.value.id == "self"
        ):
            names.add(sub.attr)
    return names


_MODULE_TABLE = "## How the core is built"
_HANDSHAKES = "### What each cross-thread handshake relies on"
_WITHOUT_GIL = "## Without the GIL"
_PUBLIC = frozenset(loopbridge.__all__)


def test_concepts_names_only_modules_the_core_has() -> None:
    named = set(re.findall(r"`(_\w+)`", "\n".join(_section(_MODULE_TABLE))))
    assert named, f"no module found under {_MODULE_TABLE!r} in docs/concepts.md"
    missing = sorted(m for m in named if not (CORE / f"{m}.py").is_file())
    assert not missing, f"docs/concepts.md names modules the core lacks: {missing}"


def test_concepts_table_has_every_core_module() -> None:
    rows = {m for row in _rows(_MODULE_TABLE) for m in re.findall(r"`(_\w+)`", row[0])}
    missing = [m for m in core_modules() if m not in rows]
    assert not missing, f"add to docs/concepts.md's table of modules: {missing}"


def test_each_name_in_the_concepts_table_is_defined_by_its_rows_modules() -> None:
    wrong = []
    for modules_cell, holds in _rows(_MODULE_TABLE):
        modules = re.findall(r"`(_\w+)`", modules_cell)
        for name in re.findall(r"`([A-Za-z]\w*)`", holds):
            if keyword.iskeyword(name) or hasattr(builtins, name):
                continue
            if not any(name in _defined(m) for m in modules) and name not in _PUBLIC:
                wrong.append(f"{name} is not defined in {', '.join(modules)}")
    assert not wrong, f"docs/concepts.md's table of modules: {wrong}"


def _where_is(dotted: str) -> bool:
    """``Class.member`` of the core, or an attribute of a standard library module."""
    owner, member = dotted.split(".", 1)
    classes = [c for m in core_modules() if (c := _defined(m).get(owner)) is not None]
    if classes:
        return any(member in _members(c) for c in classes)
    try:
        return hasattr(importlib.import_module(owner), member)
    except ImportError:
        return False


@pytest.mark.parametrize("heading", [_HANDSHAKES, _WITHOUT_GIL])
def test_each_place_the_handshake_table_points_at_is_defined(heading: str) -> None:
    rows = _rows(heading)
    assert rows, f"no table under {heading!r} in docs/concepts.md"
    places = [p for row in rows for p in re.findall(r"`(\w+\.\w+)`", row[1])]
    wrong = [p for p in places if not _where_is(p)]
    assert not wrong, f"docs/concepts.md's handshake table points at what the core lacks: {wrong}"


def test_each_file_concepts_names_exists() -> None:
    text = (ROOT / "docs" / "concepts.md").read_text()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # no code blocks
    spans = re.findall(r"`([^`]+)`", prose)
    files = {p for span in spans for p in re.findall(r"[\w.-]+/[\w./-]+\.py\b", span)}
    missing = sorted(p for p in files if not (ROOT / p).is_file())
    assert not missing, f"docs/concepts.md names files the tree lacks: {missing}"


# --------------------------------------------------------- tests mirror the code
def test_each_core_module_has_its_test_module_or_a_reason_why_not() -> None:
    missing = [
        f"{m} -> {mirror(m).relative_to(ROOT)}"
        for m in core_modules()
        if m not in EXEMPT and not mirror(m).is_file()
    ]
    assert not missing, f"no test module (add it, or a reason to EXEMPT): {missing}"


def test_each_exempt_module_exists_and_has_no_test_module() -> None:
    stale = [m for m in EXEMPT if not (CORE / f"{m}.py").is_file() or mirror(m).is_file()]
    assert not stale, f"drop from EXEMPT: {stale}"
