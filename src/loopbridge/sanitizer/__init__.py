"""Affinity sanitizer: finds asyncio objects used from a thread or loop that
does not own them, on the first occurrence, whether or not the race fires.

Turn it on with ``sanitize()`` (a context manager), ``install()``, the
``LOOPBRIDGE_SANITIZE`` environment variable (``install_from_env()``), or the
pytest option ``--loopbridge-sanitize``. While nothing turns it on nothing is
patched, and the patches themselves (``_instrument``) are not even imported.
``python -m loopbridge.sanitizer`` prints :func:`boot_dir`. See
docs/sanitizer.md for what is covered and why.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import MutableMapping
from types import TracebackType

from .._public import publish as _publish
from ._report import (
    POLICIES,
    Collector,
    Kind,
    Policy,
    SanitizerError,
    SanitizerReport,
    SanitizerWarning,
    emitter,
)
from ._sites import Site

__all__ = [
    "sanitize",
    "install",
    "uninstall",
    "install_from_env",
    "boot_dir",
    "ENV_VAR",
    "Policy",
    "SanitizerError",
    "SanitizerWarning",
    "SanitizerReport",
    "Kind",
    "Site",
]

ENV_VAR = "LOOPBRIDGE_SANITIZE"
_INSTRUMENT = f"{__name__}._instrument"

_lock = threading.RLock()
_base: Policy | None = None  # set by install() / the environment variable
_blocks: list[tuple[object, Policy, Collector]] = []  # active sanitize() blocks


def _validate(policy: object) -> Policy:
    for p in POLICIES:
        if policy == p:
            return p
    raise ValueError(f"sanitizer policy must be one of {', '.join(POLICIES)}; got {policy!r}")


def _apply() -> None:
    """Bring patches, policy and collectors in line with _base and _blocks."""
    policy: Policy = _blocks[-1][1] if _blocks else (_base or "off")
    wanted = (_base not in (None, "off")) or any(p != "off" for _, p, _ in _blocks)
    # The patches are imported the first time something wants them, so that
    # a process that never turns the sanitizer on never loads them.
    loaded = wanted or _INSTRUMENT in sys.modules
    if loaded:
        from . import _instrument

        _instrument.set_active(False)
        if wanted and not _instrument.patched():
            emitter.seen.clear()
            _instrument.patch()
        elif not wanted and _instrument.patched():
            _instrument.unpatch()
    with emitter.lock:
        emitter.policy = policy
        emitter.collectors = [c for _, _, c in _blocks]
    if loaded:
        _instrument.set_active(wanted and policy != "off")


class sanitize:
    """Run a block with the sanitizer on (or, with ``"off"``, paused).

    ``policy`` is ``"raise"`` (raise :class:`SanitizerError` in the offending
    thread before the operation runs), ``"warn"`` (a :class:`SanitizerWarning`
    once per offending line, then carry on), ``"log"`` (an error on the
    ``loopbridge.sanitizer`` logger once per line, repeats at debug level) or
    ``"off"``. The sanitizer is process-wide: the block instruments every
    thread, not only the one that entered it. Blocks nest; the innermost
    policy wins. ``reports`` lists every misuse seen while this block was the
    innermost one, including those raised in other threads or swallowed by an
    event loop's exception handler.
    """

    def __init__(self, policy: Policy = "raise") -> None:
        self.policy: Policy = _validate(policy)
        self._collector = Collector()
        self._token: object | None = None

    @property
    def reports(self) -> list[SanitizerReport]:
        with emitter.lock:
            return list(self._collector.reports)

    def __enter__(self) -> sanitize:
        with _lock:
            if self._token is not None:
                raise RuntimeError("this sanitize() block is already active")
            self._token = object()
            _blocks.append((self._token, self.policy, self._collector))
            _apply()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        with _lock:
            _blocks[:] = [b for b in _blocks if b[0] is not self._token]
            self._token = None
            _apply()


def install(policy: Policy = "raise") -> None:
    """Turn the sanitizer on for the whole process until :func:`uninstall`."""
    global _base
    checked = _validate(policy)
    with _lock:
        _base = checked
        _apply()


def uninstall() -> None:
    """Undo :func:`install`. Patches are removed, originals restored, once no
    ``sanitize()`` block is active either."""
    global _base
    with _lock:
        _base = None
        _apply()


def boot_dir() -> str:
    """Directory holding the ``sitecustomize`` that activates the sanitizer in
    a fresh interpreter. Put it first on ``PYTHONPATH``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")


def install_from_env(environ: MutableMapping[str, str] | None = None) -> Policy | None:
    """Read ``LOOPBRIDGE_SANITIZE`` (raise, warn, log, off or empty) and install.

    When it turns the sanitizer on, it also puts :func:`boot_dir` first on
    ``PYTHONPATH`` in ``environ``, so that Python child processes (spawned
    multiprocessing workers such as vLLM's EngineCore, subprocesses) inherit
    both the variable and the activation, even if they never import loopbridge.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR, "").strip().lower()
    if raw in ("", "0", "off"):
        return None
    try:
        policy = _validate(raw)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}={env.get(ENV_VAR)!r}: expected raise, warn, log or off"
        ) from None
    install(policy)
    boot = boot_dir()
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if boot not in parts:
        env["PYTHONPATH"] = os.pathsep.join([boot, *parts])
    return policy


_publish(__name__, globals(), __all__)
