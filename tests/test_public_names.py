"""Every export of every package reports a public module (issue 55, item 5).

A class or function listed in the ``__all__`` of a public module (one whose dotted
name has no part that starts with ``_``) must say where users find it: its
``__module__`` is a public module that gives it back under its ``__qualname__``, so
reprs, tracebacks and pickles never name a private module (``loopbridge._errors``,
``loopbridge_sglang.manager``'s internals re-exported). A name a package's
``__init__`` exports from its own modules reports the package itself
(``loopbridge_sglang.adopt_manager``); one re-exported from another package keeps that
package's (``loopbridge_adapters.ServerStartError`` from either adapter). The core
publishes with its private ``_public``, the adapters' packages with
:mod:`loopbridge_adapters.public_names`.

The benchmark harness is an instrument, not the product: it is not walked.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil
import subprocess
import sys
import types
from types import ModuleType

import pytest

from loopbridge_adapters.free_threaded import FREE_THREADED

#: On a free-threaded build the engines' adapters refuse to import
#: (tests/adapters/test_free_threaded.py): the core's and the shared names only.
ENGINES = () if FREE_THREADED else ("loopbridge_vllm", "loopbridge_sglang")
PACKAGES = ("loopbridge", "loopbridge_adapters", *ENGINES)


def _public_modules() -> list[str]:
    names = list(PACKAGES)
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, f"{package}."):
            parts = info.name.split(".")
            if not any(p.startswith("_") for p in parts) and "bench" not in parts:
                names.append(info.name)
    return sorted(names)


MODULES = _public_modules()


def _optional(exc: ModuleNotFoundError) -> bool:
    """Whether ``exc`` is an optional dependency missing here (not one of ours)."""
    return exc.name is not None and exc.name.partition(".")[0] not in PACKAGES


def _import(name: str) -> ModuleType:
    """The module; skipped when an optional dependency it needs is missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if not _optional(exc):
            raise
        pytest.skip(f"{name} needs {exc.name}, which is not installed here")


def _exports(module: ModuleType) -> dict[str, object]:
    """The classes and functions ``module`` exports, less those that a lazy attribute
    imports from an optional dependency missing here (constants and aliases have no
    module of their own)."""
    out = {}
    for export in getattr(module, "__all__", ()):
        try:
            obj = getattr(module, export)
        except ModuleNotFoundError as exc:
            if not _optional(exc):
                raise
            continue
        if isinstance(obj, (type, types.FunctionType)):
            out[export] = obj
    return out


def _is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def test_the_walk_finds_every_package_and_their_public_modules() -> None:
    assert set(PACKAGES) <= set(MODULES)
    for expected in (
        "loopbridge.metrics",
        "loopbridge_adapters.threaded",
        *(f"{engine}.server" for engine in ENGINES),
    ):
        assert expected in MODULES
    assert not [m for m in MODULES if not _is_public(m)]


@pytest.mark.parametrize("name", MODULES)
def test_every_export_reports_a_public_module_that_gives_it_back(name: str) -> None:
    wrong = {}
    for export, obj in _exports(_import(name)).items():
        home, qualname = obj.__module__, obj.__qualname__  # type: ignore[attr-defined]
        given_back = _is_public(home) and getattr(importlib.import_module(home), qualname, None)
        if given_back is not obj or qualname != export:
            wrong[export] = f"{home}.{qualname}"
    assert wrong == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_reports_itself_for_what_its_own_modules_define(package: str) -> None:
    module = importlib.import_module(package)
    exported = [getattr(module, name) for name in module.__all__]
    own = [
        obj
        for obj in exported
        if isinstance(obj, (type, types.FunctionType))
        and obj.__module__.partition(".")[0] == package
    ]
    assert len(own) >= 4  # the package's own API, not an empty list
    assert {f"{o.__module__}.{o.__qualname__}" for o in own} == {
        f"{package}.{o.__qualname__}" for o in own
    }


@pytest.mark.skipif(
    FREE_THREADED, reason="vLLM and SGLang do not support a free-threaded Python yet"
)
def test_a_traceback_and_a_pickle_name_the_shared_start_error_by_its_package() -> None:
    """SGLang's and vLLM's start error is the one ``loopbridge_adapters`` exports, and a
    process that imported nothing loads it back from its pickle."""
    code = "import loopbridge_sglang as s; raise s.ServerStartError('bind another port')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == "loopbridge_adapters.ServerStartError: bind another port"
    import loopbridge_vllm

    data = pickle.dumps(loopbridge_vllm.ServerStartError("bind another port"))
    code = "import pickle, sys; e = pickle.loads(sys.stdin.buffer.read()); print(type(e), e)"
    proc = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.decode().strip()
    assert out == "<class 'loopbridge_adapters.ServerStartError'> bind another port"
