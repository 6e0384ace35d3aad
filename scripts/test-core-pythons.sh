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
#
# 3.13t is the free-threaded build scripts/build-python-ft.sh makes (cached under
# .cache/python-ft; built first when LOOPBRIDGE_BUILD_FT=1, as .ci/run asks). It runs
# the suites that do not need vLLM or SGLang's installs (core, metrics, sanitizer,
# recipes and their servers, docs) with the GIL disabled (PYTHON_GIL=0). Its venv gets
# each test and recipes package that has a wheel for it, one at a time (hypothesis
# below 6.140, whose Rust extension has none); a recipe whose client has no wheel
# there skips, naming it. LOOPBRIDGE_CORE_PYTHONS picks versions (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests that need vLLM or SGLang (marked so by tests/conftest.py) run in the engines'
# lanes instead; these venvs have neither, so those suites are not even collected.
find_python() { # on PATH, else a pyenv-installed version (3.13t: the cached build)
    local v=$1 cand
    if [ "$v" = 3.13t ] && [ -x .cache/python-ft/3.13t/bin/python3.13t ]; then
        echo "$PWD/.cache/python-ft/3.13t/bin/python3.13t"
        return
    fi
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
# 3.13t's processes, without a terminal (.ci/run's job), run in a session of their own:
# its locks spin with sched_yield() before they park, and with autogroup scheduling each
# yield hands a slice to the busy processes of the same session, the engine lanes there
# (docs/free-threading.md). --wait: the status is the command's, whether setsid forks or
# not. From a terminal, Ctrl-C must still reach them: no new session.
ft_session=()
[ -t 0 ] || ft_session=(setsid --wait)
ft_install() { # venv: loopbridge, then each test and recipes package that installs there
    local venv=$1 req missing=()
    flock .cache/setup-editable.lock "${ft_session[@]}" "$venv/bin/python" -m pip install -q \
        -e ".[trio,uvloop,prometheus]" || return 1
    while read -r req; do
        [ -n "$req" ] || continue
        PIP_ONLY_BINARY=:all: "${ft_session[@]}" "$venv/bin/python" -m pip install -q "$req" \
            "hypothesis<6.140" || missing+=("$req")
    done < <("$venv/bin/python" scripts/_dependency_groups.py test recipes)
    echo "no wheel for this free-threaded Python: ${missing[*]:-none}" | tee "$venv/missing-wheels.txt"
}

ft_suites=(tests/core tests/metrics tests/sanitizer tests/recipes tests/servers tests/docs
    tests/adapters/test_free_threaded.py)
ran=0
failed=()
for v in ${LOOPBRIDGE_CORE_PYTHONS:-3.10 3.11 3.12 3.13 3.13t}; do
    if [ "$v" = 3.13t ] && [ "${LOOPBRIDGE_BUILD_FT:-0}" = 1 ]; then
        # Cached, or built now (or waited for: .ci/run starts the build beside the lanes).
        if ! bash scripts/build-python-ft.sh; then
            echo "== the free-threaded build failed (log: .cache/python-ft/build.log)" >&2
            failed+=("3.13t (its build)")
            continue
        fi
    fi
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
            if [ "$v" = 3.13t ]; then
                ft_install "$venv"
            else
                flock .cache/setup-editable.lock "$venv/bin/python" -m pip install -q \
                    -e ".[trio,uvloop,prometheus]" --group test --group recipes
            fi
    } >"$log" 2>&1 || {
        tail -n 30 "$log"
        echo "== Python $v: installing loopbridge failed (log: $log)" >&2
        exit 1
    }
    echo "== $("$venv/bin/python" --version)"
    if [ "$v" = 3.13t ]; then
        cat "$venv/missing-wheels.txt"
        PYTHON_GIL=0 "${ft_session[@]}" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
            --timeout 300 "${ft_suites[@]}" -m "not vllm and not sglang" "$@" || failed+=("$v")
    else
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 300 tests \
            -m "not vllm and not sglang" "$@" || failed+=("$v")
    fi
    ran=$((ran + 1))
done
echo "== core tests ran on $ran Python version(s)"
if [ ${#failed[@]} -gt 0 ]; then
    echo "== core tests failed on Python ${failed[*]}" >&2
    exit 1
fi
