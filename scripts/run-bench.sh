#!/usr/bin/env bash
# Set up .venv and run the main job: vLLM's OpenAI server on its own thread over the
# real vLLM engine (CPU stand-in executor, tiny local model), driven over HTTP by the
# latency benchmark in three modes (unsafe, per-hop, loopbridge).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "$(bash scripts/setup.sh --venv-path)/bin/python" -m loopbridge_vllm.bench "$@"
