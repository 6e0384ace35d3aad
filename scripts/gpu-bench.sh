#!/usr/bin/env bash
# The latency benchmark on a GPU machine: loopbridge, per-hop and unsafe against stock
# `vllm serve`, on a real model and vLLM's own GPU executor, with the correctness phase
# first. No model hub is needed: the model is a local directory.
#
#   bash scripts/gpu-bench.sh [--model DIR] [--out DIR] [--dry-run] [-- BENCH ARGS...]
#
#   --model DIR   a local Hugging Face model directory (default: the tiny model built
#                 locally into .cache/tiny-model, random weights, bfloat16)
#   --out DIR     results (default results/gpu-latency): latency.json, latency.md,
#                 correctness.json, correctness.md, latency_cdf.png, latency_p99.png
#   --dry-run     check the arguments, resolve the model, build the engine arguments
#                 and the stock command line (parsed by vLLM's own parser), print the
#                 plan and start nothing; needs no GPU (CI runs this)
#   BENCH ARGS    passed on to `python -m loopbridge_vllm.bench` (--help lists them)
#
# Python: $PYTHON, else .venv/bin/python, else python3. It needs a CUDA build of a
# supported vLLM release (`pip install vllm==X.Y.Z`) and loopbridge (`pip install -e ".[server,bench]"`).
# Both engines (ours and stock's) share the GPU; each takes 0.4 of its memory unless
# `--engine-arg gpu_memory_utilization=...` says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "gpu-bench.sh: $*" >&2; echo "run 'bash scripts/gpu-bench.sh --help' for usage" >&2; exit 2; }

model=""
out="results/gpu-latency"
dry_run=0
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model) [ $# -ge 2 ] || die "--model needs a directory"; model=$2; shift 2 ;;
        --model=*) model=${1#--model=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; bench_args=("$@"); break ;;
        *) die "unknown argument '$1' (benchmark options go after --)" ;;
    esac
done

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

extra=()
if [ -z "$model" ]; then
    model=$("$PY" -c 'import sys; from loopbridge_vllm.cpu_engine import build_tiny_model; print(build_tiny_model(sys.argv[1]))' "$PWD/.cache/tiny-model")
    # Its config says float32, which the GPU attention kernels do not take.
    extra+=(--engine-arg dtype=bfloat16)
elif [ ! -f "$model/config.json" ]; then
    die "--model $model: not a Hugging Face model directory (no config.json)"
fi

if [ "$dry_run" = 0 ]; then
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || die "no CUDA device visible to $PY (torch.cuda.is_available() is False); --dry-run checks the set-up without one"
else
    extra+=(--dry-run)
fi

exec "$PY" -m loopbridge_vllm.bench --model "$model" --out "$out" "${extra[@]}" "${bench_args[@]}"
