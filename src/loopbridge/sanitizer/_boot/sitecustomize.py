"""Turns the loopbridge sanitizer on at interpreter start-up.

This directory is put first on ``PYTHONPATH`` when ``LOOPBRIDGE_SANITIZE`` is
set, so every Python child process runs this file before its own code. If the
interpreter cannot import loopbridge (another environment), it does nothing.
A ``sitecustomize`` that this one shadows is still run.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _activate() -> None:
    if os.environ.get("LOOPBRIDGE_SANITIZE", "").strip().lower() in ("", "0", "off"):
        return
    try:
        from loopbridge.sanitizer import install_from_env
    except ImportError:
        return
    try:
        install_from_env()
    except ValueError as exc:
        sys.stderr.write(f"loopbridge: sanitizer not activated: {exc}\n")


_chain()
_activate()
