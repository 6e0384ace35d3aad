"""The plugin's opt-in reaches engine actors started the way Ray's DP backend starts them.

vLLM's Ray DP backend (``CoreEngineActorManager``) cannot start on CPU: it
builds its placement groups from ``current_platform.ray_device_key``, which
the CPU platform leaves empty ("No  found in Ray cluster"). This test runs
everything around it for real instead: a local Ray cluster started *before*
the opt-in is set (so its workers, like a remote node's, do not inherit it),
the front end loading vLLM's general plugins, the actor environment built
from vLLM's own ``get_env_vars_to_copy`` exactly as the actor manager builds
it, and an actor that loads the plugins as an engine core does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from entry_points import REPO, expose

from loopbridge_vllm.dp._plugin import ENV, RAY_COPY_ENV

pytest.importorskip("ray")

SCRIPT = """
import os, sys
import ray

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
os.environ[ENV] = "1"  # set after the cluster started: its workers lack it

from vllm.ray.ray_env import get_env_vars_to_copy
from vllm.v1.executor.ray_utils import WORKER_SPECIFIC_ENV_VARS


def actor_env():
    # What CoreEngineActorManager.__init__ gives the DP engine actors.
    names = get_env_vars_to_copy(
        destination="DPMoEEngineCoreActor", exclude_vars=WORKER_SPECIFIC_ENV_VARS
    )
    return {name: os.environ[name] for name in names if name in os.environ}


without_plugin = actor_env()
from vllm.plugins import load_general_plugins

load_general_plugins()  # the front end, before it starts the engines
with_plugin = actor_env()


@ray.remote(num_cpus=0)
class EngineCoreStandIn:
    def state(self):
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # what EngineCore.__init__ does in the actor
        from loopbridge_vllm.dp import _patch

        return os.environ.get(ENV), _patch.is_installed()


results = [
    ray.get(EngineCoreStandIn.options(runtime_env={"env_vars": env}).remote().state.remote())
    for env in (without_plugin, with_plugin)
]
print("RESULT", results)
ray.shutdown()
"""


def test_ray_engine_actors_get_the_opt_in(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (ENV, RAY_COPY_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(expose(tmp_path / "plugins")), str(REPO / "src")]
        + [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    done = subprocess.run(
        [sys.executable, "-c", f"ENV = {ENV!r}\n" + SCRIPT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # Without the plugin's addition vLLM copies neither the variable nor, so,
    # the filter; with it the actor has both.
    assert "RESULT [(None, False), ('1', True)]" in done.stdout, done.stdout[-2000:]
