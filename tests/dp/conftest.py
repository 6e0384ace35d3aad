"""Environment for the DP protocol tests; set before anything imports vLLM."""

from __future__ import annotations

import os

for _key, _value in {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}.items():
    os.environ.setdefault(_key, _value)
