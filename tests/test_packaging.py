"""Declared dependencies are exactly what the code imports.

Read statically from the source, so it runs without any optional package:

- every third-party module that ``import loopbridge`` imports unconditionally
  (following the package's own imports from ``__init__``) is a runtime
  dependency, and every runtime dependency is such an import;
- every other third-party import of the core (lazy, guarded, or in a module the
  package does not import itself, such as an integration) is in an extra, or is
  the tool that loads a plugin module; imports under ``TYPE_CHECKING`` never run
  and are not counted;
- each adapter imports only its engine, what the engine's pinned lists install, or
  extras; what the adapters share (``loopbridge_adapters``) imports only extras;
- every package an extra names is imported somewhere, and no extra pins an engine;
- the benchmarks (``loopbridge_bench``) are the ``loopbridge-bench`` distribution's
  (``bench/pyproject.toml``): it pins this release, its extras bring what it imports
  beside the engines, and the two wheels, built here, each carry their own packages
  and the licence (the ``loopbridge`` wheel no benchmark module).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomllib is in the standard library from 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BENCH_PYPROJECT = tomllib.loads((REPO / "bench" / "pyproject.toml").read_text())
# Import name -> distribution name where they differ.
DISTRIBUTION = {"yaml": "pyyaml", "zmq": "pyzmq", "PIL": "pillow", "cpuinfo": "py-cpuinfo"}
# Plugin modules are loaded by the tool they extend, which is then installed.
# The packages this distribution ships: the core, what the adapters share, the adapters.
OURS = ("loopbridge", "loopbridge_adapters", "loopbridge_sglang", "loopbridge_vllm")
# The loopbridge-bench distribution's one package, and its extra per engine.
BENCH = "loopbridge_bench"
BENCH_EXTRAS = {"vllm": "vllm", "sglang": "sglang"}
ENGINES = {"loopbridge_vllm": "vllm", "loopbridge_sglang": "sglang"}
PLUGIN_HOSTS = {"loopbridge.mypy_plugin": "mypy", "loopbridge.pytest_plugin": "pytest"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return normalize(match.group(1))


def distribution_of(module: str) -> str:
    top = module.split(".")[0]
    return normalize(DISTRIBUTION.get(top, top))


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module doing the import
    module: str  # absolute dotted module imported
    unconditional: bool  # runs whenever the importer is imported


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _for_type_checkers_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _conditional(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    # Inside a function or `try: ... except ImportError`.
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"}
            for h in node.handlers
        ):
            return True
    return False


def imports_of(package: str) -> Iterator[Import]:
    for path in sorted((SRC / package).rglob("*.py")):
        name = _module_name(path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    base = base[: len(base) - node.level + (1 if is_package else 0)]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
            if targets and _for_type_checkers_only(node, parents):
                continue  # never runs
            for target in targets:
                yield Import(name, target, not _conditional(node, parents))


def third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in (*OURS, BENCH)


def reachable_from_package_import() -> set[str]:
    """Core modules that ``import loopbridge`` itself imports (transitively)."""
    edges: dict[str, set[str]] = {}
    modules = {_module_name(p) for p in (SRC / "loopbridge").rglob("*.py")}
    for imp in imports_of("loopbridge"):
        if imp.unconditional and imp.module in modules:
            edges.setdefault(imp.importer, set()).add(imp.module)
    seen = {"loopbridge"}
    todo = ["loopbridge"]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            # importing a.b.c imports the packages a and a.b first
            chain = [".".join(nxt.split(".")[:i]) for i in range(1, nxt.count(".") + 2)]
            for mod in chain:
                if mod in modules and mod not in seen:
                    seen.add(mod)
                    todo.append(mod)
    return seen


def extras(pyproject: dict[str, Any] = PYPROJECT) -> dict[str, set[str]]:
    declared = pyproject["project"].get("optional-dependencies", {})
    return {extra: {requirement_name(r) for r in reqs} for extra, reqs in declared.items()}


def runtime_dependencies() -> set[str]:
    return {requirement_name(r) for r in PYPROJECT["project"].get("dependencies", [])}


def core_imports() -> tuple[set[str], set[tuple[str, str]]]:
    """(runtime imports as distributions, optional (importer, distribution) pairs)."""
    loaded = reachable_from_package_import()
    runtime: set[str] = set()
    optional: set[tuple[str, str]] = set()
    for imp in imports_of("loopbridge"):
        if not third_party(imp.module):
            continue
        if imp.unconditional and imp.importer in loaded:
            runtime.add(distribution_of(imp.module))
        else:
            optional.add((imp.importer, distribution_of(imp.module)))
    return runtime, optional


def engine_install(engine: str) -> set[str]:
    """Distributions the engine's pinned CPU lists install (its own dependencies)."""
    names: set[str] = set()
    for path in (REPO / "requirements").glob(f"{engine}-*.txt"):
        for line in path.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                names.add(requirement_name(line))
    return names


def test_runtime_dependencies_are_exactly_the_unconditional_imports() -> None:
    runtime, _ = core_imports()
    declared = runtime_dependencies()
    assert runtime - declared == set(), "imported by `import loopbridge` but not declared"
    assert declared - runtime == set(), "declared but not imported by `import loopbridge`"


def test_optional_core_imports_are_in_an_extra() -> None:
    _, optional = core_imports()
    in_extras = set().union(*extras().values())
    missing = {
        (importer, dist)
        for importer, dist in optional
        if dist not in in_extras and PLUGIN_HOSTS.get(importer) != dist
    }
    assert missing == set(), "optional imports no extra provides"


@pytest.mark.parametrize("adapter", sorted(ENGINES))
def test_adapter_imports_come_with_its_engine_or_an_extra(adapter: str) -> None:
    engine = ENGINES[adapter]
    provided = engine_install(engine) | set().union(*extras().values()) | {engine}
    missing = {
        (imp.importer, distribution_of(imp.module))
        for imp in imports_of(adapter)
        if third_party(imp.module) and distribution_of(imp.module) not in provided
    }
    assert missing == set()


def test_shared_adapter_code_needs_no_engine() -> None:
    in_extras = set().union(*extras().values())
    imported = {
        distribution_of(imp.module)
        for imp in imports_of("loopbridge_adapters")
        if third_party(imp.module)
    }
    assert imported <= in_extras


def test_every_extra_requirement_is_imported() -> None:
    imported = {
        distribution_of(imp.module)
        for package in OURS
        for imp in imports_of(package)
        if third_party(imp.module)
    }
    unused = {(extra, name) for extra, names in extras().items() for name in names - imported}
    assert unused == set()


def test_no_extra_pins_an_engine_and_tools_live_in_groups() -> None:
    assert all(not set(ENGINES.values()) & names for names in extras().values())
    groups = PYPROJECT.get("dependency-groups", {})
    tools = {requirement_name(r) for reqs in groups.values() for r in reqs if isinstance(r, str)}
    assert {"pytest", "ray", "ruff"} <= tools
    assert not {"pytest", "ray", "ruff", "mypy"} & set().union(*extras().values())


def test_licence_metadata_follows_pep_639() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_scan_sees_what_it_must() -> None:
    # The rules above mean something only if the scan finds these known imports.
    _, optional = core_imports()
    assert ("loopbridge._trio", "trio") in optional
    assert ("loopbridge.pytest_plugin", "pytest") in optional
    assert "loopbridge._proxy" in reachable_from_package_import()
    for adapter, engine in ENGINES.items():
        assert any(imp.module.startswith(f"{engine}.") for imp in imports_of(adapter))


def test_the_adapter_wall_names_every_private_core_module() -> None:
    """import-linter's wall between adapters and the core lists the private
    modules by name (it has no wildcard for a name prefix): keep it whole, and
    keep every package beside the core behind it."""
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    (wall,) = [
        c
        for c in contracts
        if "loopbridge_vllm" in c.get("source_modules", ())
        and "forbidden_modules" in c
        and "loopbridge._ports" in c["forbidden_modules"]
    ]
    assert sorted(wall["source_modules"]) == sorted((*OURS[1:], BENCH))
    private = {
        f"loopbridge.{p.stem}"
        for p in (REPO / "src" / "loopbridge").glob("_*.py")
        if p.stem != "__init__"
    }
    assert set(wall["forbidden_modules"]) == private


# --------------------------------------------------- the loopbridge-bench distribution
def test_the_benchmarks_pin_this_release_and_share_its_version() -> None:
    version = PYPROJECT["project"]["version"]
    bench = BENCH_PYPROJECT["project"]
    assert bench["name"] == "loopbridge-bench"
    assert bench["version"] == version
    assert bench["dependencies"] == [f"loopbridge=={version}"]
    for extra, requirements in bench["optional-dependencies"].items():
        pins = [r for r in requirements if requirement_name(r) == "loopbridge"]
        assert [r.endswith(f"=={version}") for r in pins] == [True], (extra, pins)


@pytest.mark.parametrize("engine", sorted(BENCH_EXTRAS))
def test_each_benchmark_imports_its_engine_its_extra_or_loopbridges_extras(engine: str) -> None:
    """A benchmark's third-party imports come with its engine, or with its extra (which
    also brings the adapter's server extra: loopbridge's own extras count)."""
    extra = BENCH_EXTRAS[engine]
    provided = (
        engine_install(engine)
        | extras(BENCH_PYPROJECT)[extra]
        | set().union(*extras().values())
        | {engine}
    )
    missing = {
        (imp.importer, distribution_of(imp.module))
        for imp in imports_of(f"{BENCH}/{engine}")
        if third_party(imp.module) and distribution_of(imp.module) not in provided
    }
    assert missing == set()


def test_what_the_benchmarks_share_needs_only_what_every_benchmark_extra_brings() -> None:
    every = set.intersection(*extras(BENCH_PYPROJECT).values())
    imported = {
        distribution_of(imp.module)
        for imp in imports_of(f"{BENCH}/common")
        if third_party(imp.module)
    }
    assert imported <= every


def test_every_benchmark_extra_requirement_is_imported() -> None:
    imported = {distribution_of(imp.module) for imp in imports_of(BENCH) if third_party(imp.module)}
    unused = {
        (extra, name)
        for extra, names in extras(BENCH_PYPROJECT).items()
        for name in names - imported - {"loopbridge"}
    }
    assert unused == set()


def _source_copy(into: Path) -> Path:
    """What the two wheels are built from: a copy, so a build leaves the tree alone
    (the engines' set-up builds editable metadata in it at the same time in CI)."""
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, into / name)
    shutil.copytree(REPO / "src", into / "src", ignore=skip)
    shutil.copytree(REPO / "bench", into / "bench", symlinks=True, ignore=skip)
    return into


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each distribution's name -> the files of its wheel, as pip builds them."""
    source = _source_copy(tmp_path_factory.mktemp("source"))
    out = tmp_path_factory.mktemp("wheels")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), ".", "./bench"],
        cwd=source,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    return {w.name.split("-")[0]: zipfile.ZipFile(w).namelist() for w in out.glob("*.whl")}


def test_the_loopbridge_wheel_carries_the_product_and_no_benchmark(
    wheels: dict[str, list[str]],
) -> None:
    files = wheels["loopbridge"]
    packages = {f.split("/")[0] for f in files if ".dist-info/" not in f}
    assert packages == set(OURS)
    assert [f for f in files if "bench" in f] == []
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)


def test_the_benchmarks_wheel_carries_them_only(wheels: dict[str, list[str]]) -> None:
    files = wheels["loopbridge_bench"]
    packages = {f.split("/")[0] for f in files if ".dist-info/" not in f}
    assert packages == {BENCH}
    shipped = {f for f in files if f.endswith(".py")}
    assert shipped == {p.relative_to(SRC).as_posix() for p in (SRC / BENCH).rglob("*.py")}
    assert f"{BENCH}/py.typed" in files
    assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files)
