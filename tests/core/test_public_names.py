"""Every exported name reports its public module (:mod:`loopbridge._public`):
reprs, tracebacks and pickles say ``loopbridge.LoopAffinityError``, never the
private module it is defined in."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types
from types import ModuleType

import pytest

import loopbridge
import loopbridge.metrics
import loopbridge.sanitizer

PUBLIC = [loopbridge, loopbridge.metrics, loopbridge.sanitizer]


def _exported(module: ModuleType) -> list[tuple[str, object]]:
    """The classes and functions a public module exports (constants and type
    aliases such as ``Policy`` have no module of their own)."""
    out = [(name, getattr(module, name)) for name in module.__all__]
    return [(n, o) for n, o in out if isinstance(o, (type, types.FunctionType))]


@pytest.mark.parametrize("module", PUBLIC, ids=lambda m: m.__name__)
def test_every_exported_name_reports_its_public_module(module: ModuleType) -> None:
    exported = _exported(module)
    assert len(exported) >= 5  # the walk sees the API, not an empty list
    wrong = {
        name: f"{obj.__module__}.{obj.__qualname__}"  # type: ignore[attr-defined]
        for name, obj in exported
        if (obj.__module__, obj.__qualname__) != (module.__name__, name)  # type: ignore[attr-defined]
    }
    assert wrong == {}


EXCEPTIONS = [
    loopbridge.LoopAffinityError,
    loopbridge.OwnerLoopClosed,
    loopbridge.UnsupportedRuntime,
]


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda c: c.__qualname__)
def test_exceptions_pickle_by_their_public_name(cls: type[Exception]) -> None:
    data = pickle.dumps(cls("what to do instead"))
    assert f"{cls.__module__}\n{cls.__qualname__}".encode() in pickle.dumps(cls, protocol=0)
    back = pickle.loads(data)
    assert type(back) is cls and back.args == ("what to do instead",)


def test_a_traceback_names_the_public_class() -> None:
    code = "import loopbridge; raise loopbridge.LoopAffinityError('declare it')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == "loopbridge.LoopAffinityError: declare it"


def test_a_pickled_exception_loads_in_a_process_that_imported_nothing() -> None:
    data = pickle.dumps(loopbridge.OwnerLoopClosed("transfer it"))
    code = "import pickle, sys; e = pickle.loads(sys.stdin.buffer.read()); print(type(e), e)"
    proc = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().strip() == "<class 'loopbridge.OwnerLoopClosed'> transfer it"
