#!/usr/bin/env bash
# A free-threaded CPython (built with --disable-gil), cached under the checkout at
# .cache/python-ft/<version>t. Its source is the distribution's source package of
# python3.<minor> (Debian's trixie has 3.13), fetched with `apt-get source` from a
# private apt directory: the system's sources, lists and caches are left as they are.
# The upstream tarball is built as it is (the distribution's patches are not needed).
#
# The newest version in LOOPBRIDGE_FT_VERSIONS whose source downloads is built; a
# cached interpreter that runs with the GIL disabled is used as it is (nothing to do).
# On success, one line: the interpreter's path. Takes about 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=${LOOPBRIDGE_FT_VERSIONS:-"3.15 3.14 3.13"}
suites=${LOOPBRIDGE_FT_SUITES:-"trixie"}
cache=$PWD/.cache/python-ft
jobs=${LOOPBRIDGE_FT_JOBS:-2}

works() { # interpreter: runs, and without the GIL
    [ -x "$1" ] && "$1" -c 'import sys; sys.exit(sys._is_gil_enabled())' >/dev/null 2>&1
}

cached() { # the newest cached interpreter that works: its line, and status 0
    local v
    for v in $versions; do
        if works "$cache/${v}t/bin/python${v}t"; then
            echo "free-threaded CPython $v: $cache/${v}t/bin/python${v}t"
            return 0
        fi
    done
    return 1
}

cached && exit 0
# One build at a time (.ci/run starts one beside the lanes; the core lane may ask too):
# whoever waited finds the other's interpreter.
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
cached && exit 0

apt_dir=$cache/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
: >"$apt_dir/sources.list.d/ft.sources"
for suite in $suites; do
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: %s\n\n' \
        "$suite" /usr/share/keyrings/debian-archive-keyring.gpg >>"$apt_dir/sources.list.d/ft.sources"
done
apt_opts=(-o Dir::Etc::sourcelist=/dev/null -o Dir::Etc::sourceparts="$apt_dir/sources.list.d"
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache")
log=$cache/build.log
: >"$log"
apt-get "${apt_opts[@]}" update -qq >>"$log" 2>&1 || {
    tail -n 20 "$log"
    echo "build-python-ft: apt-get update of the private source list failed (log: $log)" >&2
    exit 1
}

src=$cache/src
for v in $versions; do
    rm -rf "$src" && mkdir -p "$src"
    if (cd "$src" && apt-get "${apt_opts[@]}" source --download-only "python$v") >>"$log" 2>&1; then
        break
    fi
    echo "build-python-ft: no source for python$v, trying the next" >>"$log"
    v=
done
[ -n "${v:-}" ] || {
    echo "build-python-ft: none of python{${versions// /,}} has a source package in $suites (log: $log)" >&2
    exit 1
}
orig=$(ls "$src"/python"$v"_*.orig.tar.* | head -n 1)
prefix=$cache/${v}t
build=$cache/build-$v
rm -rf "$build" "$prefix" && mkdir -p "$build"
tar -xf "$orig" -C "$build" --strip-components=1
{
    cd "$build" &&
        ./configure --disable-gil --prefix="$prefix" --with-ensurepip=install &&
        make -j"$jobs" && make install
} >>"$log" 2>&1 || {
    tail -n 30 "$log"
    echo "build-python-ft: building CPython $v with --disable-gil failed (log: $log)" >&2
    exit 1
}
rm -rf "$build" "$src"
works "$prefix/bin/python${v}t" || {
    echo "build-python-ft: $prefix/bin/python${v}t does not run with the GIL disabled" >&2
    exit 1
}
echo "free-threaded CPython $v: $prefix/bin/python${v}t"
