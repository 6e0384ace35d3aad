#!/usr/bin/env bash
# Create (or update) the virtual environment for one engine release: torch, the
# real engine from its pinned CPU list (requirements/<engine>-<release>-cpu.txt),
# loopbridge and its benchmarks (loopbridge-bench, bench/pyproject.toml; both editable)
# and the test tools.
#
#   LOOPBRIDGE_VLLM=0.32 bash scripts/setup.sh      # another supported vLLM release
#   LOOPBRIDGE_ENGINE=sglang bash scripts/setup.sh  # SGLang 0.5 (.venv-sglang)
#   bash scripts/setup.sh --venv-path               # print the venv's path and exit
#
# The newest supported vLLM release is the default and lives in .venv; another
# release lives in .venv-vllm-<release>; SGLang lives in .venv-sglang. Prints one
# progress line per step; pip's own output goes to <venv>/setup.log. Idempotent: a
# second run only re-installs loopbridge itself.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${LOOPBRIDGE_ENGINE:-vllm}
case "$engine" in
vllm)
    releases=$(ls requirements/vllm-*-cpu.txt | sed 's|.*/vllm-\(.*\)-cpu\.txt|\1|' | sort -V)
    newest=$(echo "$releases" | tail -n 1)
    release=${LOOPBRIDGE_VLLM:-$newest}
    if ! grep -qxF "$release" <<<"$releases"; then
        echo "setup: LOOPBRIDGE_VLLM=$release is not a supported vLLM release (supported: $(echo $releases))" >&2
        exit 2
    fi
    if [ "$release" = "$newest" ]; then venv=.venv; else venv=.venv-vllm-$release; fi
    engine_name=vLLM
    extras="trio,uvloop,prometheus,vllm-server"
    groups=(--group test --group recipes --group ray --group bench)
    default_python=python3 python_wanted=">= 3.11" python_check="sys.version_info >= (3, 11)"
    ;;
sglang)
    release=0.5
    venv=.venv-sglang
    engine_name=SGLang
    extras="trio,uvloop,prometheus,sglang"
    groups=(--group test)
    # The SGLang wheel is built for CPython 3.11 only.
    default_python=python3.11 python_wanted="3.11" python_check="sys.version_info[:2] == (3, 11)"
    ;;
*)
    echo "setup: LOOPBRIDGE_ENGINE=$engine is not a supported engine (supported: vllm sglang)" >&2
    exit 2
    ;;
esac
if [ "${1:-}" = "--venv-path" ]; then
    echo "$venv"
    exit 0
fi

engine_list=requirements/$engine-$release-cpu.txt
torch_list=requirements/$engine-$release-torch.txt
engine_pin=$(grep -m1 "^$engine==" "$engine_list" | cut -d= -f3)
torch_pin=$(grep -m1 '^torch==' "$torch_list" | cut -d= -f3)
VPY=$venv/bin/python
log=$venv/setup.log
step() { echo "setup: $*"; }

# pip run quietly into the log. With --no-deps, pip's resolver reports every
# dependency of the engine left out on purpose as "ERROR: ... requires X, which is not
# installed" (and this is not an error: the import check below is the real test);
# a pip configured with unreachable file:// indexes warns "Location ... is ignored".
# Both are dropped; anything else pip says is shown, and on failure the log's end.
pip_quiet() {
    local rc=0
    echo "+ pip $*" >>"$log"
    PIP_PROGRESS_BAR=off "$VPY" -m pip --no-color "$@" >>"$log.step" 2>&1 || rc=$?
    cat "$log.step" >>"$log"
    grep -v \
        -e "^ERROR: pip's dependency resolver does not currently take into account" \
        -e "^[A-Za-z0-9._-]\+ [^ ]\+ requires [^ ].*, which is not installed\.\$" \
        -e "^[A-Za-z0-9._-]\+ [^ ]\+ has requirement .*, but you have .*\$" \
        -e "^[A-Za-z0-9._-]\+ [^ ]\+ requires [^ ].*, but you have .* which is incompatible\.\$" \
        -e "^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.\$" \
        -e "^\[notice\] " \
        -e "^\s*\$" \
        "$log.step" | sed 's/^/  pip: /' || true
    rm -f "$log.step"
    if [ "$rc" -ne 0 ]; then
        echo "setup: pip failed (exit $rc); the full log is $log" >&2
        exit "$rc"
    fi
}

# Editable installs of this tree build its metadata in the tree: one at a time, so
# that venvs can be set up concurrently (.ci/run builds older releases' in advance).
editable() { # pip arguments
    mkdir -p .cache
    (
        flock 9
        pip_quiet "$@"
    ) 9>.cache/setup-editable.lock
}

# RL frameworks whose real classes the tests drive on this release (a list per
# framework, requirements/<framework>-<engine>-<release>.txt): installed with --no-deps,
# because their own dependency lists pin CUDA-only packages.
frameworks=$(ls requirements/*-"$engine-$release".txt 2>/dev/null || true)
install_frameworks() {
    local list
    for list in $frameworks; do
        step "      and $list (an RL framework whose classes the tests drive)"
        pip_quiet install -q --no-deps -r "$list"
    done
}

stamp=$venv/.loopbridge-deps
want=$(cat "$engine_list" "$torch_list" $frameworks pyproject.toml bench/pyproject.toml scripts/setup.sh |
    sha1sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VPY" ]; then
    : >"$log"
    editable install -q --no-deps -e . -e ./bench
    step "$venv is up to date ($engine_name $engine_pin)"
    exit 0
fi

if [ ! -x "$VPY" ]; then
    PY=${PYTHON:-$default_python}
    if ! "$PY" -c "import sys; sys.exit(not ($python_check))" 2>/dev/null; then
        echo "setup: $engine_name $engine_pin needs Python $python_wanted; $PY is $("$PY" --version 2>&1) (set PYTHON=...)" >&2
        exit 2
    fi
    step "creating $venv with $("$PY" --version 2>&1) for $engine_name $engine_pin"
    "$PY" -m venv "$venv"
else
    step "updating $venv for $engine_name $engine_pin"
fi
: >"$log"
step "[1/5] upgrading pip (dependency groups need pip >= 25.1)"
pip_quiet install -q --upgrade "pip>=25.1"
step "[2/5] installing torch $torch_pin (what $engine_name $engine_pin pins; runs on CPU)"
pip_quiet install -q -r "$torch_list"
# Without --no-deps pip would also resolve the engine's CUDA-only dependencies:
# several GB that do not import on CPU (and pull in CUDA kernels and torchaudio).
step "[3/5] installing $engine_name $engine_pin and the packages it needs on CPU"
pip_quiet install -q --no-deps -r "$engine_list"
install_frameworks
step "[4/5] installing loopbridge and its benchmarks (editable) with the test tools"
# The benchmark's extra is named for its engine: loopbridge-bench[vllm], [sglang].
editable install -q -e ".[$extras]" -e "./bench[$engine]" "${groups[@]}"
step "[5/5] checking the $engine_name install: importing what the adapter imports"
if ! "$VPY" "scripts/check-$engine-install.py" 2>>"$log"; then
    echo "setup: the $engine_name $engine_pin install in $venv is incomplete (see above; log: $log)" >&2
    exit 1
fi
echo "$want" >"$stamp"
# The venvs of other releases hold many of the same files (torch, CUDA libraries):
# one copy on disk for each (scripts/share-venv-files.py says how it stays safe).
shopt -s nullglob
"$VPY" scripts/share-venv-files.py "$venv" .venv .venv-vllm-* .venv-sglang ||
    echo "setup: sharing files with the other venvs failed; $venv is complete without it" >&2
step "ready: $venv ($engine_name $("$VPY" -c "import importlib.metadata as m; print(m.version('$engine'))"))"
