#!/usr/bin/env bash
# The core's tests on the other Pythons it supports (3.10: no eager tasks, no
# Task(context=); 3.12+: native eager tasks). Each found interpreter gets its own
# venv with the core's dependencies only (vLLM is not installed there).
set -euo pipefail
cd "$(dirname "$0")/.."
find_python() {  # on PATH, else a pyenv-installed version
    local v=$1 cand
    if command -v "python$v" >/dev/null 2>&1 && "python$v" -c "import sys" >/dev/null 2>&1; then
        echo "python$v"; return
    fi
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
        if [ -x "$cand" ]; then echo "$cand"; return; fi
    done
}
ran=0
for v in 3.10 3.12 3.13; do
    py=$(find_python "$v")
    if [ -z "$py" ]; then
        echo "== Python $v not found: skipped"
        continue
    fi
    venv=".venv-$v"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q anyio trio uvloop pytest pytest-asyncio pytest-timeout \
        hypothesis typing-extensions sniffio prometheus_client
    "$venv/bin/python" -m pip install -q --no-deps -e .
    echo "== $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 120 tests/core tests/metrics "$@"
    ran=$((ran + 1))
done
echo "== core tests ran on $ran other Python version(s)"
