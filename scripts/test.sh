#!/usr/bin/env bash
# Set up the venv (CPU torch, real vLLM, loopbridge) and run the test suite; arguments
# go to pytest. LOOPBRIDGE_VLLM=<release> selects a vLLM release other than the newest;
# LOOPBRIDGE_ENGINE=sglang selects SGLang's venv instead (for tests/sglang).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=$(bash scripts/setup.sh --venv-path)
exec "$venv/bin/python" -m pytest "$@"
