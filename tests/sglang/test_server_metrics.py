"""loopbridge's series on the server's ``/metrics``, beside SGLang's own, on by default.

Stock SGLang serves ``/metrics`` only with ``--enable-metrics``: the series of
``prometheus_client``'s multiprocess files. A server with ``metrics=False`` leaves
``/metrics`` to SGLang's app, which is stock's answer; the default adds loopbridge's
series and the owner loop's lag, and keeps every series stock serves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from conftest import Manager
from prometheus_client.parser import text_string_to_metric_families

from loopbridge import LoopThread
from loopbridge_sglang import start_sglang_server, tokenizer_manager_proxy

OWNER_THREAD = "sglang-owner"  # the conftest's owner loop thread


def _families(text: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Each metric family's name -> the label sets of its samples."""
    out: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(family.name, set()).add(tuple(sorted(sample.labels.items())))
    return out


def _generate(url: str, n: int) -> None:
    for i in range(n):
        body = {"input_ids": [1, i], "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{url}/generate", json=body, timeout=30).status_code == 200


def test_bridge_series_and_the_owner_loops_lag_on_metrics(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p) as server:
        _generate(server.url, 3)
        families = _families(httpx.get(f"{server.url}/metrics", timeout=30).text)
    for name in ("loopbridge_calls", "loopbridge_streams", "loopbridge_loop_lag_seconds"):
        assert name in families, name
    loops = {dict(labels).get("loop") for labels in families["loopbridge_loop_lag_seconds"]}
    model = sgl.manager.served_model_name or sgl.manager.model_path
    assert f"{model} on {OWNER_THREAD}" in loops


def test_metrics_off_leaves_metrics_to_sglangs_app(sgl: Manager, owner: LoopThread) -> None:
    p = tokenizer_manager_proxy(sgl.manager, loop=owner.loop)
    with start_sglang_server(p, metrics=False) as server:
        # Without --enable-metrics SGLang's app has no /metrics: stock's 404.
        assert httpx.get(f"{server.url}/metrics", timeout=30).status_code == 404


# One server per process: SGLang's app registers its metrics once (a second lifespan
# with --enable-metrics raises Duplicated timeseries), and prometheus_client reads
# PROMETHEUS_MULTIPROC_DIR when it is imported, so the variable is set first.
_CHILD = """
import asyncio, json, os, sys
from pathlib import Path

tmp, metrics = Path(sys.argv[1]), sys.argv[2] == "on"
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / "prometheus")
(tmp / "prometheus").mkdir()

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loopbridge import LoopThread
from loopbridge_sglang import start_sglang_server, tokenizer_manager_proxy
from loopbridge_sglang.cpu_manager import StandInScheduler, make_tokenizer_manager

manager, _, ports = make_tokenizer_manager(
    sys.argv[3], tmp / "ipc", enable_metrics=True, served_model_name="tiny"
)
scheduler = StandInScheduler(ports).start()
owner = LoopThread("sglang-owner", loop_factory=asyncio.SelectorEventLoop).start()
try:
    proxy = tokenizer_manager_proxy(manager, loop=owner.loop)
    with start_sglang_server(proxy, metrics=metrics) as server:
        body = {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{server.url}/generate", json=body, timeout=30).status_code == 200
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
finally:
    owner.stop()
    scheduler.stop()
print(json.dumps(sorted({f.name for f in text_string_to_metric_families(text)})))
"""


def _families_served(tiny_model: Path, tmp_path: Path, metrics: str) -> set[str]:
    work = tmp_path / metrics
    work.mkdir()
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(work), metrics, str(tiny_model)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert child.returncode == 0, child.stderr[-4000:]
    names: list[str] = json.loads(child.stdout.strip().splitlines()[-1])
    return set(names)


def test_with_enable_metrics_every_series_of_stock_and_loopbridges(
    tiny_model: Path, tmp_path: Path
) -> None:
    stock = _families_served(tiny_model, tmp_path, "off")  # SGLang's app answers /metrics
    ours = _families_served(tiny_model, tmp_path, "on")
    assert any(name.startswith("sglang:") for name in stock), stock
    assert stock <= ours, stock - ours
    assert {"loopbridge_calls", "loopbridge_loop_lag_seconds"} <= ours
    assert not any(name.startswith("loopbridge_") for name in stock)
