"""Static typing: what mypy (and pyright) see through ``proxy`` and ``blocking``.

The case files in ``cases/`` are checked, not run.  Their first line names the
checkers that read them (``# checkers: mypy mypy-plugin pyright``); expectations
are trailing comments on the line they are about:

* ``# E: [code] text`` -- the checker reports an error here, with that mypy error
  code and (optionally) a message containing ``text``.  Under pyright only "an
  error on this line" is checked, since its rules are named differently.
* ``# R: type`` -- mypy's ``reveal_type`` prints exactly this type.
* ``# P: type`` -- pyright's ``reveal_type`` prints exactly this type.

Every error or revealed type without an expectation fails the test, as does
every expectation that is not met.  Each checker runs once over all its files;
mypy keeps its cache under ``.mypy_cache/`` so reruns are fast.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed (dependency group: test)")

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
REPO = HERE.parents[1]
CONFIGS = {"mypy": HERE / "mypy.ini", "mypy-plugin": HERE / "mypy-plugin.ini"}

_MARK = re.compile(r"#\s*([ERP]):\s*(.*?)\s*(?=#\s*[ERP]:|$)")
_ERROR_SPEC = re.compile(r"\[([a-z0-9-]+)\]\s*(.*)")
_MYPY_LINE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<sev>error|note|warning): (?P<msg>.*?)"
    r"(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)
_MYPY_REVEAL = re.compile(r'^Revealed type is "(.*)"$')
_PYRIGHT_REVEAL = re.compile(r'^Type of ".*" is "(.*)"$', re.S)


# ----------------------------------------------------------------- expectations
@dataclass
class Expected:
    errors: list[tuple[str, str]] = field(default_factory=list)  # (code, text)
    mypy_reveals: list[str] = field(default_factory=list)
    pyright_reveals: list[str] = field(default_factory=list)


@dataclass
class Found:
    errors: list[tuple[str, str]] = field(default_factory=list)  # (code or rule, message)
    reveals: list[str] = field(default_factory=list)


def checkers_of(path: Path) -> set[str]:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# checkers:"), f"{path.name} must start with '# checkers: ...'"
    return set(first.split(":", 1)[1].split())


def cases_for(checker: str, folder: Path = CASES) -> list[Path]:
    return sorted(p for p in folder.glob("case_*.py") if checker in checkers_of(p))


def expectations(path: Path) -> dict[int, Expected]:
    out: dict[int, Expected] = defaultdict(Expected)
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        for kind, body in _MARK.findall(line):
            exp = out[number]
            if kind == "E":
                spec = _ERROR_SPEC.fullmatch(body)
                assert spec, f"{path.name}:{number}: write '# E: [code] text'"
                exp.errors.append((spec[1], spec[2]))
            elif kind == "R":
                exp.mypy_reveals.append(body)
            else:
                exp.pyright_reveals.append(body)
    return out


def _normal(revealed: str) -> str:
    # Older mypy versions spell builtins with their module and number type variables.
    return re.sub(r"`-?\d+", "", revealed.replace("builtins.", ""))


# --------------------------------------------------------------------- mypy
def run_mypy(checker: str, files: list[Path]) -> tuple[dict[str, dict[int, Found]], list[str]]:
    cache = REPO / ".mypy_cache" / f"typing-{checker}"
    stdout, stderr, status = mypy_api.run(
        [
            "--config-file",
            str(CONFIGS[checker]),
            "--cache-dir",
            str(cache),
            "--show-absolute-path",
            "--no-error-summary",
            "--no-pretty",
            "--no-color-output",
            *map(str, files),
        ]
    )
    problems: list[str] = []
    if status not in (0, 1) or "INTERNAL ERROR" in stdout + stderr:
        problems.append(f"mypy failed to run (status {status}):\n{stdout}\n{stderr}")
    # Keyed by file name: mypy may replay messages of an unchanged file from its
    # cache with the path it had then.
    found: dict[str, dict[int, Found]] = defaultdict(lambda: defaultdict(Found))
    for raw in stdout.splitlines():
        m = _MYPY_LINE.match(raw)
        if m is None:
            continue  # continuation lines of notes
        where = found[Path(m["path"]).name][int(m["line"])]
        if m["sev"] == "error":
            where.errors.append((m["code"] or "", m["msg"]))
        elif (reveal := _MYPY_REVEAL.match(m["msg"])) is not None:
            where.reveals.append(_normal(reveal[1]))
    return found, problems


def compare_mypy(files: list[Path], found: dict[str, dict[int, Found]]) -> list[str]:
    problems: list[str] = []
    for name in set(found) - {f.name for f in files}:
        for number, f in sorted(found[name].items()):
            for code, msg in f.errors:
                problems.append(
                    f"{name}:{number}: unexpected error in a helper module: {msg} [{code}]"
                )
    for path in files:
        exp, got = expectations(path), found.get(path.name, {})
        for number in sorted(set(exp) | set(got)):
            e, g = exp.get(number, Expected()), got.get(number, Found())
            where = f"{path.name}:{number}"
            unmatched = list(g.errors)
            for code, text in e.errors:
                hit = next((x for x in unmatched if x[0] == code and text in x[1]), None)
                if hit is None:
                    problems.append(f"{where}: expected error [{code}] {text!r}, got {g.errors}")
                else:
                    unmatched.remove(hit)
            for code, msg in unmatched:
                problems.append(f"{where}: unexpected error: {msg} [{code}]")
            want = [_normal(r) for r in e.mypy_reveals]
            if want != g.reveals:
                problems.append(f"{where}: revealed {g.reveals}, expected {want}")
    return problems


def check_with_mypy(checker: str, files: list[Path]) -> list[str]:
    found, problems = run_mypy(checker, files)
    return problems + compare_mypy(files, found)


@pytest.mark.parametrize("checker", ["mypy", "mypy-plugin"])
def test_mypy_cases(checker: str) -> None:
    files = cases_for(checker)
    assert files, "no case files found"
    problems = check_with_mypy(checker, files)
    assert not problems, "\n".join(problems)


def test_harness_reports_unmet_expectations(tmp_path: Path) -> None:
    """The comparison above can fail: broken expectations are all reported."""
    shutil.copy(CASES / "_models.py", tmp_path / "_models.py")
    case = tmp_path / "case_broken.py"
    case.write_text(
        "# checkers: mypy\n"
        "from typing_extensions import assert_type\n"
        "from loopbridge import proxy\n"
        "from _models import Engine\n"
        "async def f() -> None:\n"
        "    p = proxy(Engine())\n"
        "    assert_type(await p.generate('x'), int)\n"  # 7: wrong type
        "    await p.generate('x')  # E: [arg-type]\n"  # 8: error that does not happen
        "    reveal_type(p.stream)  # R: def (prompt: int) -> typing.AsyncIterator[_models.Token]\n"
        "    await p.generate(1)  # E: [call-arg]\n"  # 10: wrong code
        "    reveal_type(p.numbers)\n"  # 11: reveal without expectation
    )
    problems = check_with_mypy("mypy", [case])
    lines = sorted({p.split(":")[1] for p in problems})
    assert lines == ["10", "11", "7", "8", "9"], "\n".join(problems)


# ------------------------------------------------------------------- pyright
def _pyright() -> str | None:
    local = Path(sys.executable).parent / "pyright"
    exe = str(local) if local.exists() else shutil.which("pyright")
    if exe is None:
        return None
    try:
        probe = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if probe.returncode == 0 else None


def test_pyright_cases() -> None:
    exe = _pyright()
    if exe is None:
        pytest.skip("pyright is not installed or cannot start (it needs Node.js)")
    files = [f.resolve() for f in cases_for("pyright")]
    assert files, "no case files found"
    proc = subprocess.run(
        [exe, "--outputjson", "--pythonpath", sys.executable, *map(str, files)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    report = json.loads(proc.stdout)
    found: dict[Path, dict[int, Found]] = defaultdict(lambda: defaultdict(Found))
    for d in report["generalDiagnostics"]:
        where = found[Path(d["file"]).resolve()][d["range"]["start"]["line"] + 1]
        if d["severity"] == "error":
            where.errors.append((d.get("rule", ""), d["message"]))
        elif (reveal := _PYRIGHT_REVEAL.match(d["message"])) is not None:
            where.reveals.append(reveal[1])
    problems: list[str] = []
    for path in set(found) - set(files):
        for number, f in sorted(found[path].items()):
            problems += [f"{path.name}:{number}: unexpected error: {m}" for _, m in f.errors]
    for path in files:
        exp, got = expectations(path), found.get(path, {})
        for number in sorted(set(exp) | set(got)):
            e, g = exp.get(number, Expected()), got.get(number, Found())
            where = f"{path.name}:{number}"
            if e.errors and not g.errors:
                problems.append(f"{where}: pyright accepts a line that must be rejected")
            if g.errors and not e.errors:
                problems.append(f"{where}: unexpected pyright errors: {g.errors}")
            if e.pyright_reveals != g.reveals:
                problems.append(f"{where}: revealed {g.reveals}, expected {e.pyright_reveals}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------- the package
def test_package_is_strict_clean() -> None:
    """``mypy --strict`` on the core, the way the packaging promises (py.typed ships)."""
    assert (REPO / "src" / "loopbridge" / "py.typed").exists()
    stdout, stderr, status = mypy_api.run(
        [
            "--strict",
            "--cache-dir",
            str(REPO / ".mypy_cache" / "typing-core"),
            "--no-pretty",
            "--no-color-output",
            str(REPO / "src" / "loopbridge"),
        ]
    )
    assert status == 0, stdout + stderr
