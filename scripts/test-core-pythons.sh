#!/usr/bin/env bash
# The core's tests (everything under tests/ that does not need vLLM) once per
# supported Python: 3.10 (no eager tasks, no Task(context=)), 3.11, 3.12 and 3.13
# (native eager tasks); every version runs even if one fails. Each interpreter found
# gets its own venv, .venv-core-<version>, holding loopbridge with its optional
# integrations, the test tools and the recipes' clients (docs/recipes.md) only: no
# vLLM, which also proves that the core installs and imports without it.
# tests/servers starts real PostgreSQL and Redis servers when the distribution's
# packages are installed (.ci/run installs them), and skips saying so when not.
# Arguments go to pytest. A Python that is not found is skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests that need vLLM or SGLang (marked so by tests/conftest.py) run in the engines'
# lanes instead; these venvs have neither, so those suites are not even collected.
find_python() { # on PATH, else a pyenv-installed version
    local v=$1 cand
    if command -v "python$v" >/dev/null 2>&1 && "python$v" -c "import sys" >/dev/null 2>&1; then
        echo "python$v"
        return
    fi
    for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/"python$v"; do
        if [ -x "$cand" ]; then
            echo "$cand"
            return
        fi
    done
}
ran=0
failed=()
for v in 3.10 3.11 3.12 3.13; do
    py=$(find_python "$v")
    if [ -z "$py" ]; then
        echo "== Python $v not found: skipped"
        continue
    fi
    venv=.venv-core-$v
    log=$venv/setup.log
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv"
    fi
    # Dependency groups need pip >= 25.1. pip's output goes to the log. The editable
    # install builds metadata in the tree: one at a time with scripts/setup.sh's (.ci/run
    # runs this beside the engine lanes).
    mkdir -p .cache
    {
        "$venv/bin/python" -m pip install -q --upgrade "pip>=25.1" &&
            flock .cache/setup-editable.lock "$venv/bin/python" -m pip install -q \
                -e ".[trio,uvloop,prometheus]" --group test --group recipes
    } >"$log" 2>&1 || {
        tail -n 30 "$log"
        echo "== Python $v: installing loopbridge failed (log: $log)" >&2
        exit 1
    }
    echo "== $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 300 tests \
        -m "not vllm and not sglang" "$@" || failed+=("$v")
    ran=$((ran + 1))
done
echo "== core tests ran on $ran Python version(s)"
if [ ${#failed[@]} -gt 0 ]; then
    echo "== core tests failed on Python ${failed[*]}" >&2
    exit 1
fi
