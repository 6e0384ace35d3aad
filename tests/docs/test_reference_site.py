"""The reference the site is built from covers the code.

* docs/troubleshooting.md names every exception and warning class that loopbridge and its
  adapters define (found in the source, so a new one fails here until it has an entry).
* ``start_openai_server``'s docstring documents each of its parameters (``:param``), so
  the API reference lists every server option; ``astart_openai_server`` takes the same.
* Every public package has an API reference page generated from its docstrings
  (a ``::: module`` directive under docs/reference/), and every page under docs/ is in
  mkdocs.yml's navigation.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
from pathlib import Path

import pytest

from loopbridge_adapters.free_threaded import FREE_THREADED

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGES = ("loopbridge", "loopbridge_adapters", "loopbridge_vllm", "loopbridge_sglang")
_BUILTIN_EXCEPTIONS = {
    name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}


def exception_classes() -> dict[str, str]:
    """Every class of the packages that derives from an exception: name -> file."""
    classes: dict[str, tuple[list[str], str]] = {}
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [
                        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                        for b in node.bases
                    ]
                    classes[node.name] = (bases, str(path.relative_to(ROOT)))
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for name, (bases, where) in classes.items():
            if (
                not name.startswith("_")
                and name not in found
                and any(b in _BUILTIN_EXCEPTIONS or b in found for b in bases)
            ):
                found[name] = where
                grew = True
    return found


def test_troubleshooting_names_every_error_type() -> None:
    errors = exception_classes()
    assert {"LoopAffinityError", "OwnerLoopClosed", "ServerStartError"} <= set(errors)
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    headed = set(re.findall(r"^###? .*?`(\w+)`", text, re.M)) | set(
        re.findall(r"^### `\w+` and `(\w+)`", text, re.M)
    )
    missing = sorted(f"{name} ({where})" for name, where in errors.items() if name not in headed)
    assert not missing, (
        f"give each an entry (a heading naming it) in docs/troubleshooting.md: {missing}"
    )


@pytest.mark.skipif(
    FREE_THREADED,
    reason="vLLM and SGLang do not support a free-threaded Python yet: their adapters refuse it",
)
def test_every_server_option_is_documented() -> None:
    from loopbridge_vllm import astart_openai_server, start_openai_server

    params = inspect.signature(start_openai_server).parameters
    assert len(params) > 20
    doc = inspect.getdoc(start_openai_server) or ""
    missing = [name for name in params if f":param {name}:" not in doc]
    assert not missing, f"start_openai_server's docstring lacks ':param' for {missing}"
    assert list(inspect.signature(astart_openai_server).parameters) == list(params)


def test_every_public_package_has_a_generated_reference_page() -> None:
    directives = {
        m
        for page in (ROOT / "docs" / "reference").glob("*.md")
        for m in re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M)
    }
    wanted = {
        "loopbridge",
        "loopbridge.metrics",
        "loopbridge.metrics.prometheus",
        "loopbridge.sanitizer",
        "loopbridge_vllm",
        "loopbridge_sglang",
        "loopbridge_adapters",
        "loopbridge_adapters.engine_loop",
    }
    assert not wanted - directives, f"no reference page generates {sorted(wanted - directives)}"


def test_every_docs_page_is_in_the_sites_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if f": {p}\n" not in nav]
    assert not missing, f"add to mkdocs.yml's nav: {missing}"
