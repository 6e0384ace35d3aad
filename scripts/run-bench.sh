#!/usr/bin/env bash
# Set up .venv and run the main job: a short correctness phase (the race made certain,
# raw engine against loopbridge), then the latency benchmark: vLLM's OpenAI server over the
# real vLLM engine (CPU stand-in executor, tiny local model) in four modes (unsafe, per-hop
# and loopbridge on a thread of their own, loopbridge on the engine's loop), against stock
# `vllm serve` over the same engine configuration, streaming and not, on kept-alive
# connections. GPU: scripts/gpu-bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "$(bash scripts/setup.sh --venv-path)/bin/python" -m loopbridge_bench.vllm "$@"
