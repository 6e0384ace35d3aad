"""The vLLM general plugin that installs the pause-aware DP filter.

vLLM calls every entry point of the ``vllm.general_plugins`` group in each of
its processes (front end, engine cores, workers) before it builds an engine.
This one is registered as ``loopbridge_dp_filter`` and does nothing unless the
operator opts in with ``LOOPBRIDGE_DP_FILTER=1``; ``vllm serve
--data-parallel-size N`` and ``AsyncLLM`` DP users then get the filter in
every engine-core process without a code change.

When opted in it either logs exactly one line per process (through vLLM's
own logger, so it shows wherever vLLM's lines show), ``installed`` with the
vLLM version (a warning on vLLM 0.32, which can wedge without any pause,
finding 3 of ``docs/dp-protocol.md``, and when
``LOOPBRIDGE_DP_FILTER_UNCHECKED_VLLM`` overrides the version check), or it
refuses: :class:`FilterRefused` is raised, so that vLLM does not start, with
the reason: a vLLM release whose DP protocol the filter was not checked
against (its message names the release, the checked ones and the override
variable), or an elastic-EP scale-up launch.  A user who asked for the filter
never gets a vLLM that runs without it.

vLLM's Ray DP backend starts the engine cores as Ray actors and gives them
only the variables ``vllm.ray.ray_env.get_env_vars_to_copy`` names
(``VLLM_*``, ``NCCL_*``, ``HF_*``, ... and ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``).
When opted in, the plugin therefore adds its own variables to
``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` in the front-end process, which loads
plugins before it starts the engines, so the actors see the opt-in too.

Elastic EP is refused because a scaled-up worker joins with a fresh rank
state: the consensus latch it sets would stay set for good and held wave
starts would pile up without bound.  The launch flag is visible when the
plugin loads; the engine's own ``enable_elastic_ep`` setting is only known
once the engine object exists, so the installed filter checks it again on an
engine's first message and stands aside (with one error line) there.
"""

from __future__ import annotations

import logging
import os
import sys

from ._patch import FilterRefused

__all__ = ["ENV", "PLUGIN_NAME", "RAY_COPY_ENV", "FilterRefused", "load", "propagate_to_ray_actors"]

#: The opt-in switch; "1" installs, anything else (or unset) leaves vLLM alone.
ENV = "LOOPBRIDGE_DP_FILTER"
#: vLLM's list of extra variables its Ray backends copy to the actors.
RAY_COPY_ENV = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
#: Entry-point name in ``vllm.general_plugins`` (``VLLM_PLUGINS`` filters on it).
PLUGIN_NAME = "loopbridge_dp_filter"


def _logger() -> logging.Logger:
    # A child of vLLM's logger inherits its handler and level, so the line
    # appears next to vLLM's own start-up lines in every process.
    return logging.getLogger(f"vllm.plugins.{PLUGIN_NAME}")


def _say(level: int, text: str) -> None:
    # The front-end process may load plugins before vLLM configures its
    # logging; the one line per process must not be lost there.
    log = _logger()
    if log.isEnabledFor(level) and log.hasHandlers():
        log.log(level, text)
    else:
        print(f"{logging.getLevelName(level)} {log.name}: {text}", file=sys.stderr, flush=True)


def propagate_to_ray_actors() -> None:
    """Name this plugin's variables in ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``.

    Additive and idempotent: the names already listed are kept, in order.
    """
    from . import _patch

    names = [n.strip() for n in os.environ.get(RAY_COPY_ENV, "").split(",") if n.strip()]
    wanted = [ENV] + ([_patch.UNCHECKED_ENV] if _patch.UNCHECKED_ENV in os.environ else [])
    missing = [n for n in wanted if n not in names]
    if missing:
        os.environ[RAY_COPY_ENV] = ",".join(names + missing)


def load() -> None:
    """Entry point: install the filter when ``LOOPBRIDGE_DP_FILTER=1``.

    Raises :class:`FilterRefused` when it was asked for and cannot apply.
    """
    if os.environ.get(ENV, "") != "1":
        _logger().debug("%s: not installed (%s is not 1)", PLUGIN_NAME, ENV)
        return
    propagate_to_ray_actors()
    from . import _patch

    ok, why = _patch.installed_version_supported()
    if ok and os.environ.get("VLLM_ELASTIC_EP_SCALE_UP_LAUNCH", "0") not in ("", "0"):
        ok, why = False, "elastic EP scale-up launch: the filter assumes a fixed DP group"
    if not ok:
        line = (
            f"{PLUGIN_NAME}: refused (pid {os.getpid()}): {why}; vLLM is not started "
            f"without the filter {ENV}=1 asks for (unset {ENV} to run vLLM unfiltered)"
        )
        _say(logging.ERROR, line)
        raise FilterRefused(line)
    _patch.install_filter()
    import vllm

    version = str(vllm.__version__)
    clean = version in _patch.CHECKED_VERSIONS and not version.startswith("0.32.")
    level = logging.INFO if clean else logging.WARNING
    _say(level, f"{PLUGIN_NAME}: installed (pid {os.getpid()}) for {why}")
