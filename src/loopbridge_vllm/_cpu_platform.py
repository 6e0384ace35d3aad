"""vLLM's CPU platform for the CPU engines, with only its Triton requirement lifted.

vLLM 0.34 refuses to build any engine on an x86 CPU without Triton's CPU
backend (``RuntimeError: vLLM on x86 CPUs requires Triton (triton-cpu).``,
raised by ``CpuPlatform.check_and_update_config`` in the front end and again
in the EngineCore), and no ``triton-cpu`` package is on the index. The CPU
stand-in executor runs no kernel at all, so the requirement does not apply to
it; vLLM 0.33 only warned here. And vLLM 0.24 never selects the CPU platform
on its own: it ignores ``VLLM_TARGET_DEVICE`` and fails with "Failed to infer
device type".

This module is a vLLM platform plugin (entry point ``loopbridge_cpu`` in the
``vllm.platform_plugins`` group). It is inactive unless :data:`ENV` is
``"1"``, which :func:`loopbridge_vllm.cpu_engine.cpu_engine_env` sets. Active,
it selects :class:`StandInCpuPlatform`: vLLM's own ``CpuPlatform`` in every
respect but one, that ``check_and_update_config`` sees Triton as present for
the length of that one call. Nothing else in vLLM reads that answer
differently. vLLM resolves an out-of-tree platform plugin that activates over
its built-in ones, on every release from 0.24 to 0.34; only
``VLLM_TARGET_DEVICE=cpu`` bypasses the plugins (0.34 takes its CPU platform
straight away), so ``cpu_engine_env`` removes that variable.

Invariants: the plugin applies per process from the environment, so every
process that inherits it (the front end, the spawned EngineCore, stock ``vllm
serve`` and its EngineCore in the benchmark's comparisons) runs the same
platform; a process without :data:`ENV` runs vLLM untouched.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENV", "PLATFORM", "ENTRY_POINT", "registration_problem", "select"]

#: The opt-in switch, set by ``cpu_engine_env``; "1" activates the plugin.
ENV = "LOOPBRIDGE_CPU_PLATFORM"
#: The class the plugin selects.
PLATFORM = "loopbridge_vllm._cpu_platform.StandInCpuPlatform"


#: The plugin's name in vLLM's ``vllm.platform_plugins`` entry-point group.
ENTRY_POINT = "loopbridge_cpu"


def registration_problem() -> str | None:
    """Why vLLM would not find this plugin, in one line; ``None`` when it would.

    vLLM finds platform plugins through installed package metadata only, so a
    source tree on ``PYTHONPATH`` that was never installed has none.
    """
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.platform_plugins") if ep.name == ENTRY_POINT]
    if any(ep.value == f"{__name__}:select" for ep in found):
        return None
    return (
        f"vLLM's CPU platform plugin {ENTRY_POINT!r} is not registered: install loopbridge "
        "(pip install -e . in the source tree, or bash scripts/setup.sh) so that vLLM can "
        "select its CPU platform without the x86 Triton requirement"
    )


def select() -> str | None:
    """Entry point: :data:`PLATFORM` when opted in, else None."""
    return PLATFORM if os.environ.get(ENV, "") == "1" else None


def __getattr__(name: str) -> Any:
    # vLLM imports the platform class by its qualified name once it resolves
    # the plugin; building it imports vLLM, so it is made only then.
    if name == "StandInCpuPlatform":
        cls = _build()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build() -> type:
    from unittest import mock

    import vllm.triton_utils
    from vllm.platforms.cpu import CpuPlatform

    class StandInCpuPlatform(CpuPlatform):
        """vLLM's CPU platform; its config check runs as if Triton were present."""

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            # The check reads ``vllm.triton_utils.HAS_TRITON`` when it runs
            # (a lazy import inside the method, from 0.34); nothing else is
            # changed, and a release without the name is left as it is.
            if not hasattr(vllm.triton_utils, "HAS_TRITON"):
                super().check_and_update_config(vllm_config)
                return
            with mock.patch.object(vllm.triton_utils, "HAS_TRITON", True):
                super().check_and_update_config(vllm_config)

    StandInCpuPlatform.__module__ = __name__
    return StandInCpuPlatform
