"""Environment for the DP protocol tests; set before anything imports vLLM."""

from __future__ import annotations

import os

for _key, _value in {
    # vLLM's CPU platform without its x86 Triton check (loopbridge_vllm._cpu_platform).
    "LOOPBRIDGE_CPU_PLATFORM": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_key, _value)
