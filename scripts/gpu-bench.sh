#!/usr/bin/env bash
# The latency benchmark on a GPU machine: loopbridge (threaded and on the engine's loop),
# per-hop and unsafe against stock `vllm serve`, on a real model and vLLM's own GPU
# executor, with the correctness phase first. No model hub is needed: the model is a local
# directory.
#
#   bash scripts/gpu-bench.sh [--setup] [--vllm X.Y.Z] [--model DIR] [--out DIR]
#                             [--dry-run] [-- BENCH ARGS...]
#
#   --setup       create .venv-gpu (or $PYTHON's venv is left alone: see below) with
#                 the official vLLM wheel from the package index, which brings its CUDA
#                 build of torch, loopbridge with the vllm-server extra and its
#                 benchmarks (loopbridge-bench's vllm extra, from bench/); then run
#                 (add --dry-run to check the set-up only)
#   --vllm X.Y.Z  the vLLM release --setup installs (default 0.34.0; any release of CONTRIBUTING.md's table)
#   --model DIR   a local Hugging Face model directory (default: the tiny model built
#                 locally into .cache/tiny-model, random weights, bfloat16)
#   --out DIR     results (default results/gpu-latency): latency.json, latency.md,
#                 correctness.json, correctness.md, latency_cdf.png, latency_itl.png,
#                 latency_p99.png, and the engine and server logs under logs/
#   --dry-run     check the arguments, resolve the model, place the engines on the
#                 GPUs, build the engine arguments and the stock command line (parsed
#                 by vLLM's own parser), print the plan and start nothing; needs no GPU
#                 (CI runs this with --fake-gpus)
#   BENCH ARGS    passed on to `python -m loopbridge_bench.vllm` (--help lists them);
#                 they come after this script's workload defaults and override them
#
# Relative paths are taken from the directory you run the script in.
# Python: $PYTHON, else .venv-gpu/bin/python, else python3; it needs a CUDA build of a
# supported vLLM release, loopbridge and its benchmarks (`pip install vllm==X.Y.Z` and
# `pip install -e ".[vllm-server]" -e "./bench[vllm]"`, or --setup).
# Engines start one at a time. With two GPUs or more (2 x --tensor-parallel-size) stock
# and the threaded stack each get their own; with fewer they share, each taking 0.9 of
# half the free memory, unless `--engine-arg gpu_memory_utilization=...` says otherwise.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "gpu-bench.sh: $*" >&2; echo "run 'bash scripts/gpu-bench.sh --help' for usage" >&2; exit 2; }
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }

model=""
out="results/gpu-latency"
dry_run=0
setup=0
vllm_version="0.34.0"
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model) [ $# -ge 2 ] || die "--model needs a directory"; model=$2; shift 2 ;;
        --model=*) model=${1#--model=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --vllm) [ $# -ge 2 ] || die "--vllm needs a version"; vllm_version=$2; shift 2 ;;
        --vllm=*) vllm_version=${1#--vllm=}; shift ;;
        --setup) setup=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; bench_args=("$@"); break ;;
        *) die "unknown argument '$1' (benchmark options go after --)" ;;
    esac
done
# From the caller's directory, before the script moves to the repository root.
[ -z "$model" ] || model=$(abspath "$model")
out=$(abspath "$out")
cd "$(dirname "$0")/.."
root=$PWD

if [ "$setup" = 1 ]; then
    if [ -n "${PYTHON:-}" ]; then
        PY=$PYTHON
    else
        python3 -m venv .venv-gpu
        PY=.venv-gpu/bin/python
    fi
    "$PY" -m pip install --upgrade pip
    # The package index's vLLM wheel is the CUDA build; it pins its CUDA torch.
    "$PY" -m pip install "vllm==$vllm_version"
    "$PY" -m pip install -e ".[vllm-server]" -e "./bench[vllm]"
elif [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv-gpu/bin/python ]; then PY=.venv-gpu/bin/python
else PY=python3
fi
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# One line, not a traceback, when the chosen Python has no vLLM (a fresh clone).
"$PY" -c 'import torch, vllm' >/dev/null 2>&1 ||
    die "$PY cannot import torch and vllm: run 'bash scripts/gpu-bench.sh --setup' once (it creates .venv-gpu), or set PYTHON to a Python that has vLLM"

# The workload of a GPU run (bench args given after -- override these): both endpoints,
# and an open-loop sweep at half and 90% of stock's measured capacity.
extra=(--endpoint both --rate-fractions 0.5,0.9)
if [ -z "$model" ]; then
    model=$("$PY" -c 'import sys; from loopbridge_vllm.cpu_engine import build_tiny_model; print(build_tiny_model(sys.argv[1]))' "$root/.cache/tiny-model")
    # Its config says float32, which the GPU attention kernels do not take.
    extra+=(--engine-arg dtype=bfloat16)
elif [ ! -f "$model/config.json" ]; then
    die "--model $model: not a Hugging Face model directory (no config.json)"
fi

if [ "$dry_run" = 0 ]; then
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || die "no CUDA device visible to $PY (torch.cuda.is_available() is False); --setup installs vLLM's CUDA build; --dry-run checks the set-up without a GPU"
else
    extra+=(--dry-run)
fi

exec "$PY" -m loopbridge_bench.vllm --model "$model" --out "$out" "${extra[@]}" "${bench_args[@]}"
