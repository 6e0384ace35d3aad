#!/usr/bin/env bash
# Set up .venv (CPU torch, real vLLM 0.32.0, loopbridge) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
