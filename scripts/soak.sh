#!/usr/bin/env bash
# Soak: the core, metrics and sanitizer suites again and again, round-robin over the
# supported Pythons, beside busy processes, until each Python has passed --runs times
# in a row on this core, or a STOP file appears in the output folder.
#
#   bash scripts/soak.sh [--runs N] [--busy K] [--jobs J] [--out DIR] [--pythons "V ..."]
#
# --runs N   passes in a row wanted per Python (default 200)
# --busy K   CPU-bound processes kept running beside the soak (default 2)
# --jobs J   suites run at once (default 1; on a 2-core machine with two busy processes,
#            6 gave the most runs a minute: about 2.9, against 2.3 with 3 and 2.7 with 8;
#            3.13t alone, 6 gave about 13 runs an hour and 2 about 7: its runs wait for
#            the CPU far more than they use it, 95 s of CPU in a 17-minute run, when
#            the busy processes shared the runs' session: see below)
# --out DIR  where results.txt and the logs of failed runs go (default soak, which
#            is in git: commit it, and the count carries over to another machine)
# --pythons  which of them (default: every one with a venv), e.g. --pythons 3.13t
#
# The busy processes run in a session of their own. With the kernel's autogroup
# scheduling (/proc/sys/kernel/sched_autogroup_enabled), the processes of one session
# share one group's CPU, and a thread that calls sched_yield() gives its turn to the
# busy ones in its group for a whole slice. CPython 3.13.5's free-threaded build spins
# with sched_yield() before it parks on a lock it finds taken, 40 times, since its loop
# does not read the lock again meanwhile (CPython gh-135871, docs/free-threading.md); the
# stacks (strace -k) show it on a buffered file's flush inside that file's own close,
# and in dict lookups (gdb): about 41,500 yields to import pytest, hypothesis, uvloop
# and trio (strace -f -c), none on 3.11. With the busy processes in
# the runs' session, that import took 37 to 106 s on 3.13t (GIL on or off) against 6.5 s
# on 3.11, runs took 25 to 40 minutes at 3-5% of a core each, and tests with many such
# locks (tests/metrics/test_dead_objects.py) ran past pytest's 300 s.
#
# Needs the venvs of scripts/test-core-pythons.sh (.venv-core-<version>; 3.13t, the
# free-threaded build of scripts/build-python-ft.sh, runs with the GIL off). Every run
# is two lines of DIR/results.txt, one when it starts and one when it ends, with
# the identity of what it tested (the git trees of src/loopbridge and of the three
# suites), the run's tag, and on the end line its exit status, time, the number of
# busy processes and of runs at once, and pytest's summary. Counts are per identity,
# so the soak resumes across invocations and machines and starts over when the core
# or its tests change; a failure starts that Python's count over and keeps its log
# as DIR/fail-*.log. A run with a start line and no end line was interrupted (the
# soak was killed): it counts as neither, and the summary says how many there were.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=200 busy=2 jobs=1 out=soak wanted="3.10 3.11 3.12 3.13 3.13t"
while [ $# -gt 0 ]; do
    case $1 in
    --runs) runs=$2 ;;
    --busy) busy=$2 ;;
    --jobs) jobs=$2 ;;
    --out) out=$2 ;;
    --pythons) wanted=$2 ;;
    *)
        echo "soak.sh: unknown option $1 (see the header of scripts/soak.sh)" >&2
        exit 2
        ;;
    esac
    shift 2
done
suites=(tests/core tests/metrics tests/sanitizer)
pythons=()
for v in $wanted; do
    [ -x ".venv-core-$v/bin/python" ] && pythons+=("$v")
done
if [ ${#pythons[@]} -eq 0 ]; then
    echo "soak.sh: no .venv-core-<version> venv: run 'bash scripts/test-core-pythons.sh' first" >&2
    exit 2
fi
# What is tested: committed trees only, so that a count means one exact core.
if ! git diff --quiet HEAD -- src/loopbridge "${suites[@]}"; then
    echo "soak.sh: src/loopbridge or its suites have uncommitted changes: commit them first" >&2
    exit 2
fi
id=$(git rev-parse "HEAD:src/loopbridge" | cut -c1-12)-$(git rev-parse "${suites[@]/#/HEAD:}" | cut -c1-4 | tr -d '\n')
mkdir -p "$out"
results=$out/results.txt
touch "$results"

tally() { # one Python on this identity: passes in a row (newest last), failed runs, interrupted runs
    awk -v id="$id" -v py="$1" '$3 != id || $4 != "py=" py { next }
        $5 == "started" { pending[$6] = 1; next }
        { delete pending[$6]; if ($5 == "rc=0") n++; else { n = 0; fails++ } }
        END { print n + 0, fails + 0, length(pending) }' "$results"
}
streak() { local n _; read -r n _ <<<"$(tally "$1")"; echo "$n"; }

burners=()
stop_burners() { [ ${#burners[@]} -gt 0 ] && kill "${burners[@]}" 2>/dev/null; }
trap stop_burners EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$busy"); do
    # In a session of their own: with autogroup scheduling, a busy process in the runs'
    # session takes the slice of every thread there that yields the CPU, and 3.13t's
    # locks spin with sched_yield (see the header).
    setsid python3 -c "while True: pass" &
    burners+=($!)
done

one_run() { # python version: run the suites once, append the result line
    local v=$1 log start rc tag
    log=$(mktemp)
    start=$(date +%s)
    tag=run=$start-$BASHPID
    echo "$(date -u +%FT%TZ) $(cut -d' ' -f1 /proc/loadavg) $id py=$v started $tag" >>"$results"
    local gil=() # the free-threaded build: without the GIL (a standard build refuses PYTHON_GIL=0)
    [ "$v" != 3.13t ] || gil=(PYTHON_GIL=0)
    env "${gil[@]}" ".venv-core-$v/bin/python" -m pytest "${suites[@]}" -m "not vllm and not sglang" \
        -q -p no:cacheprovider --timeout 300 >"$log" 2>&1
    rc=$?
    echo "$(date -u +%FT%TZ) $(cut -d' ' -f1 /proc/loadavg) $id py=$v rc=$rc $tag secs=$(($(date +%s) - start)) busy=$busy,own-session jobs=$jobs $(tail -n 1 "$log")" >>"$results"
    [ $rc -eq 0 ] || cp "$log" "$out/fail-$(date -u +%Y%m%dT%H%M%S)-$v.log"
    rm -f "$log"
}

pids=() # the suites' runs started and not yet waited for (never the busy processes)
reap() { # wait until fewer than $1 runs are going
    local alive
    while [ ${#pids[@]} -ge "$1" ]; do
        wait -n "${pids[@]}" 2>/dev/null
        alive=()
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive+=("$pid")
        done
        pids=("${alive[@]}")
    done
}

echo "soak: core $id, ${pythons[*]}, $runs in a row each, beside $busy busy process(es), $jobs at once"
while [ ! -e "$out/STOP" ]; do
    todo=()
    for v in "${pythons[@]}"; do
        [ "$(streak "$v")" -lt "$runs" ] && todo+=("$v")
    done
    [ ${#todo[@]} -gt 0 ] || break
    for v in "${todo[@]}"; do
        [ -e "$out/STOP" ] && break
        one_run "$v" &
        pids+=($!)
        reap "$jobs"
    done
done
reap 1
status=0
for v in "${pythons[@]}"; do
    read -r n fails cut <<<"$(tally "$v")"
    echo "soak: Python $v: $n passes in a row on core $id ($fails failed and $cut interrupted run(s) on it in all)"
    [ "$n" -ge "$runs" ] || status=1
done
exit $status
