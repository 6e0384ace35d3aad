"""Opt-in installation of the pause-aware filter into vLLM's ``DPEngineCoreProc``.

Importing this module does nothing; :func:`install_filter` imports vLLM and
wraps ``DPEngineCoreProc._handle_client_request`` in the engine-core process.
Call it in every engine-core process (for example from a plugin loaded by the
engine) before the busy loop starts.

The wrapper asks :func:`._filter.decide` about each message:

* deliver: call the original handler, then offer the held messages again
  (handling a message, a resume in particular, may clear the condition);
* drop: do not handle it; a utility gets its successful ``None`` reply so the
  client's fan-out completes;
* hold: keep it, in arrival order, on the instance until a later decision
  delivers it.

An engine configured for elastic EP is left unfiltered (checked on its first
message, with one error line): a scaled-up rank would set the consensus latch
for good and held wave starts would pile up without bound.

All or none (precondition P5): before its busy loop starts, each filtered rank
writes a key into the DP group's own store (``dp_store``, the TCP store the
ranks' gloo group was built on) and waits for every peer's key.  A rank that
runs without the filter writes none, so the filtered ranks stop with an error
naming it after :data:`CHECK_ENV` seconds (default 300), and vLLM reports the
engine core dead: a mixed group does not start serving.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ._filter import Decision, FilterView, MessageKind, decide

#: The exact vLLM releases whose ``DPEngineCoreProc`` the filter was checked
#: against (model variant, per-rank conformance with and without the filter,
#: and a real DP=2 group); any other version string is refused, release
#: candidates, dev, post and local builds of these included.
CHECKED_VERSIONS = ("0.32.0", "0.33.0", "0.34.0")

#: Explicit override: set to the installed vLLM version string (exactly) to
#: install the filter on a build it was not checked against.  The structural
#: check still applies, and the plugin's line says the override was used.
UNCHECKED_ENV = "LOOPBRIDGE_DP_FILTER_UNCHECKED_VLLM"

#: What vLLM 0.32 users must know even with the filter installed.
FINDING_3 = (
    "on vLLM 0.32 a DP group can still wedge without any pause (finding 3: two "
    "requests to different ranks while the front end's stats task runs late, "
    "e.g. on a busy event loop), which no filter can fix; vLLM 0.33 is clean "
    "there, use it"
)

#: Seconds a filtered rank waits at start-up for every peer to report the filter.
CHECK_ENV = "LOOPBRIDGE_DP_FILTER_CHECK_S"
DEFAULT_CHECK_S = 300.0
_STORE_KEY = "loopbridge_dp_filter/rank/{}"

_ORIGINAL_ATTR = "_loopbridge_original_handle_client_request"
_HELD_ATTR = "_loopbridge_held"
_ACTIVE_ATTR = "_loopbridge_filter_active"
_CHECKED_ATTR = "_loopbridge_group_checked"

Handler = Callable[[Any, Any, Any], None]


def _view(engine: Any) -> FilterView:
    from vllm.v1.core.sched.interface import PauseState

    return FilterView(
        paused=engine.scheduler.pause_state != PauseState.UNPAUSED,
        pending_pause=bool(engine.pending_pause),
        ignore_start_dp_wave=bool(engine.ignore_start_dp_wave),
        engines_running=bool(engine.engines_running),
    )


def _classify(request_type: Any, request: Any) -> tuple[MessageKind, str | None]:
    from vllm.v1.engine import EngineCoreRequestType as T

    if request_type == T.UTILITY:
        return "UTILITY", str(request[2])
    kinds: dict[Any, MessageKind] = {
        T.ADD: "ADD",
        T.ABORT: "ABORT",
        T.START_DP_WAVE: "START_DP_WAVE",
    }
    return kinds.get(request_type, "OTHER"), None


def _reply_none(engine: Any, request: Any) -> None:
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput
    from vllm.v1.serial_utils import UtilityResult

    client_idx, call_id = request[0], request[1]
    out = UtilityOutput(call_id, result=UtilityResult(None))
    engine.output_queue.put_nowait((client_idx, EngineCoreOutputs(utility_output=out)))


def _refusal(method: str | None) -> str:
    return (
        f"loopbridge_dp_filter: {method} is refused on a DP group with the pause-aware "
        "filter (LOOPBRIDGE_DP_FILTER=1): the filter's protocol model does not cover "
        "process checkpoints (rule R3); run without the filter to checkpoint"
    )


def _reply_failure(engine: Any, request: Any, message: str) -> None:
    from vllm.v1.engine import EngineCoreOutputs, UtilityOutput

    client_idx, call_id = request[0], request[1]
    out = UtilityOutput(call_id, failure_message=message)
    engine.output_queue.put_nowait((client_idx, EngineCoreOutputs(utility_output=out)))


def _answer_unhandled(
    engine: Any, decision: Decision, kind: str, method: str | None, request: Any
) -> None:
    # DROP and REFUSE: the message is not handled; a utility still gets its reply.
    if kind != "UTILITY":
        return
    if decision is Decision.REFUSE:
        _reply_failure(engine, request, _refusal(method))
    else:
        _reply_none(engine, request)


def _make_wrapper(original: Handler) -> Handler:
    def _handle_client_request(self: Any, request_type: Any, request: Any) -> None:
        active = self.__dict__.get(_ACTIVE_ATTR)
        if active is None:
            active = self.__dict__[_ACTIVE_ATTR] = _applies_to(self)
        if not active:
            original(self, request_type, request)
            return
        held: list[tuple[Any, Any]] = self.__dict__.setdefault(_HELD_ATTR, [])
        kind, method = _classify(request_type, request)
        decision = decide(kind, method, _view(self))
        if decision is Decision.HOLD:
            held.append((request_type, request))
            return
        if decision is not Decision.DELIVER:
            _answer_unhandled(self, decision, kind, method, request)
            return
        original(self, request_type, request)
        _release(self, original, held)

    _handle_client_request.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(_handle_client_request, _ORIGINAL_ATTR, original)
    return _handle_client_request


def _applies_to(engine: Any) -> bool:
    parallel = getattr(getattr(engine, "vllm_config", None), "parallel_config", None)
    if getattr(parallel, "enable_elastic_ep", False):
        if engine.__dict__.get("_loopbridge_elastic_logged"):
            return False
        engine.__dict__["_loopbridge_elastic_logged"] = True
        logging.getLogger("vllm.plugins.loopbridge_dp_filter").error(
            "loopbridge_dp_filter: NOT active on DP rank %s: elastic EP is enabled and "
            "the filter assumes a fixed DP group",
            getattr(engine, "dp_rank", "?"),
        )
        return False
    return True


class FilterMismatchError(RuntimeError):
    """Some ranks of a DP group run without the filter (precondition P5)."""


def _check_seconds() -> float:
    raw = os.environ.get(CHECK_ENV, "")
    try:
        seconds = float(raw) if raw else DEFAULT_CHECK_S
    except ValueError:
        raise ValueError(f"{CHECK_ENV} must be a number of seconds, got {raw!r}") from None
    if seconds <= 0:
        raise ValueError(f"{CHECK_ENV} must be positive, got {raw!r}")
    return seconds


def check_group(engine: Any, timeout_s: float | None = None) -> None:
    """Report this rank's filter in the DP store and wait for every peer's.

    Raises :class:`FilterMismatchError` naming the ranks that did not report
    within ``timeout_s`` (default: :data:`CHECK_ENV`, else 300 s).
    """
    from datetime import timedelta

    timeout = _check_seconds() if timeout_s is None else timeout_s
    store, rank, size = engine.dp_store, int(engine.dp_rank), int(engine.dp_size)
    store.set(_STORE_KEY.format(rank), "1")
    keys = [_STORE_KEY.format(r) for r in range(size)]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # torch raises DistStoreError or RuntimeError on a timeout
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            return
        raise FilterMismatchError(
            f"loopbridge_dp_filter: DP rank {rank} has the filter, but rank(s) "
            f"{', '.join(map(str, missing))} of {size} did not report it within "
            f"{timeout:g} s: every engine core of the group must run with "
            "LOOPBRIDGE_DP_FILTER=1 (precondition P5); stopping this engine core"
        ) from None


class FilterRefused(RuntimeError):
    """``LOOPBRIDGE_DP_FILTER=1`` was set where the filter cannot apply."""


#: Engine settings (vLLM 0.34) whose DP paths are outside the filter's model:
#: ``(config, field, what it changes)``.
UNMODELLED_SETTINGS = (
    (
        "parallel_config",
        "enable_fault_tolerance",
        "--enable-fault-tolerance: resume_scheduler and the DP finish sync take "
        "fault-tolerance branches (a disabled coordinator) the model does not cover",
    ),
    (
        "model_config",
        "checkpoint_prepare_on_startup",
        "--checkpoint-prepare-on-startup: checkpoint_prepare starts a DP pause that "
        "no orchestrator waits for (rule R3)",
    ),
)


def refuse_unmodelled(engine: Any) -> None:
    """Raise :class:`FilterRefused` when the engine enables a setting of
    :data:`UNMODELLED_SETTINGS`; vLLM then reports the engine core dead."""
    config = getattr(engine, "vllm_config", None)
    found = [
        why
        for section, field, why in UNMODELLED_SETTINGS
        if getattr(getattr(config, section, None), field, False) is True
    ]
    if found:
        raise FilterRefused(
            f"loopbridge_dp_filter: refused on DP rank {getattr(engine, 'dp_rank', '?')}: "
            f"{'; '.join(found)}; unset LOOPBRIDGE_DP_FILTER or the setting"
        )


def _make_busy_loop(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def run_busy_loop(self: Any) -> None:
        # Once per engine: vLLM calls this once; a test harness may step it.
        if not self.__dict__.get(_CHECKED_ATTR) and _applies_to(self):
            refuse_unmodelled(self)
            check_group(self)
        self.__dict__[_CHECKED_ATTR] = True
        original(self)

    run_busy_loop.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(run_busy_loop, _ORIGINAL_ATTR, original)
    return run_busy_loop


def _release(engine: Any, original: Handler, held: list[tuple[Any, Any]]) -> None:
    # Offer held messages again, in order; stop at the first still held so
    # that their relative order is kept.
    while held:
        request_type, request = held[0]
        kind, method = _classify(request_type, request)
        decision = decide(kind, method, _view(engine))
        if decision is Decision.HOLD:
            return
        held.pop(0)
        if decision is Decision.DELIVER:
            original(engine, request_type, request)
        else:
            _answer_unhandled(engine, decision, kind, method, request)


def installed_version_supported() -> tuple[bool, str]:
    """Whether the installed vLLM is one the filter applies to, and why.

    The reason names the version; on 0.32 it carries the finding-3 warning,
    and with :data:`UNCHECKED_ENV` it says the override was used.
    """
    import vllm

    version = str(vllm.__version__)
    override = os.environ.get(UNCHECKED_ENV, "")
    why = f"vLLM {version}"
    if version not in CHECKED_VERSIONS:
        checked = ", ".join(CHECKED_VERSIONS)
        if override != version:
            hint = f"set {UNCHECKED_ENV}={version} to install it anyway"
            if override:
                hint = f"{UNCHECKED_ENV}={override} does not name it; " + hint
            return False, (
                f"vLLM {version} is not supported (checked: {checked}): the filter's "
                "rules were checked only against those releases' DP engine-core "
                f"protocol ({hint})"
            )
        why += f", NOT checked (checked: {checked}), installed because {UNCHECKED_ENV}={override}"
    from vllm.v1.engine.core import DPEngineCoreProc

    for attr in ("_pause_complete", "resume_scheduler", "_has_global_unfinished_reqs"):
        if attr not in vars(DPEngineCoreProc):
            return False, f"DPEngineCoreProc.{attr} missing: not the two-phase pause"
    if version.startswith("0.32."):
        why += f"; WARNING: {FINDING_3}"
    return True, why


def install_filter() -> bool:
    """Wrap ``DPEngineCoreProc._handle_client_request``; idempotent.

    Returns True when the filter is (now) installed, False when the installed
    vLLM is not one it applies to (then nothing is changed).
    """
    ok, _why = installed_version_supported()
    if not ok:
        return False
    from vllm.v1.engine.core import DPEngineCoreProc

    current = vars(DPEngineCoreProc)["_handle_client_request"]
    if hasattr(current, _ORIGINAL_ATTR):
        return True
    # setattr: replacing a method on the class is the point of the patch.
    setattr(DPEngineCoreProc, "_handle_client_request", _make_wrapper(current))  # noqa: B010
    loop = vars(DPEngineCoreProc)["run_busy_loop"]
    setattr(DPEngineCoreProc, "run_busy_loop", _make_busy_loop(loop))  # noqa: B010
    return True


def uninstall_filter() -> None:
    """Restore the original handler (held messages on live engines are kept)."""
    from vllm.v1.engine.core import DPEngineCoreProc

    for name in ("_handle_client_request", "run_busy_loop"):
        original = getattr(vars(DPEngineCoreProc)[name], _ORIGINAL_ATTR, None)
        if original is not None:
            setattr(DPEngineCoreProc, name, original)


def is_installed() -> bool:
    from vllm.v1.engine.core import DPEngineCoreProc

    return hasattr(vars(DPEngineCoreProc)["_handle_client_request"], _ORIGINAL_ATTR)
