#!/usr/bin/env bash
# One entry point for working on rethook.
#
#   ./dev.sh demo            set up .venv (if needed), record and show a trace of a bundled example
#   ./dev.sh test [ARGS]     set up .venv (if needed) and run the whole test suite on every core
#                            (ARGS go to pytest; RETHOOK_TEST_JOBS=N sets the number of workers)
#   ./dev.sh setup           only set up .venv
#   ./dev.sh bench [ARGS]    run the benchmarks in bench/ (installs the bench extra: the peers)
#
# rethook needs CPython >= 3.12 (it is built on sys.monitoring). The interpreter is found in this
# order: $RETHOOK_PYTHON; python3.13, python3.12, python3 on PATH; pyenv's installed versions
# ($(pyenv root)/versions/3.1x.y). Candidates are run to check their version, because pyenv
# shims can exist on PATH for versions that are not selected.
# $RETHOOK_VENV names the environment directory (default .venv at the repo root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$root"
venv="${RETHOOK_VENV:-$root/.venv}"

good_python() {  # prints the interpreter's path if it runs and is >= 3.12
    "$1" -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' 2>/dev/null
}

find_python() {
    local cand found
    if [ -n "${RETHOOK_PYTHON:-}" ]; then
        if found=$(good_python "$RETHOOK_PYTHON"); then echo "$found"; return 0; fi
        echo "dev.sh: RETHOOK_PYTHON=$RETHOOK_PYTHON is not a runnable Python >= 3.12" >&2
        return 1
    fi
    for cand in python3.13 python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 && found=$(good_python "$cand"); then
            echo "$found"; return 0
        fi
    done
    local proot=""
    if command -v pyenv >/dev/null 2>&1; then proot=$(pyenv root 2>/dev/null || true); fi
    [ -n "$proot" ] || proot="${PYENV_ROOT:-$HOME/.pyenv}"
    if [ -d "$proot/versions" ]; then
        # newest first: 3.13.x before 3.12.x
        for cand in $(ls -d "$proot"/versions/3.1[2-9]* 2>/dev/null | sort -t. -k2,2nr -k3,3nr); do
            if [ -x "$cand/bin/python" ] && found=$(good_python "$cand/bin/python"); then
                echo "$found"; return 0
            fi
        done
    fi
    cat >&2 <<MSG
dev.sh: rethook needs CPython 3.12 or newer (it is built on sys.monitoring, new in 3.12),
and none was found. Looked at: \$RETHOOK_PYTHON, python3.13, python3.12 and python3 on PATH,
and pyenv's versions under ${proot}/versions.
Install one (for example 'pyenv install 3.13') or point RETHOOK_PYTHON at it.
MSG
    return 1
}

setup() {
    # One setup at a time per environment (parallel test runs would race on the venv).
    if command -v flock >/dev/null 2>&1 && [ -z "${RETHOOK_SETUP_LOCKED:-}" ]; then
        mkdir -p "$(dirname "$venv")"
        RETHOOK_SETUP_LOCKED=1 flock "$venv.lock" "$0" setup
        return
    fi
    local stamp="$venv/.rethook-setup" want cstamp="$venv/.rethook-ccore" cwant
    want="$(cksum pyproject.toml setup.py)"
    # every C source and header of the extensions (drainround.h and pyframe.h too: a stale
    # build of a changed header is the kind of bug no test names)
    cwant="$(find src/rethook -name '*.[ch]' | LC_ALL=C sort | xargs cat | cksum)"
    if [ -x "$venv/bin/python" ] && good_python "$venv/bin/python" >/dev/null \
        && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        if [ "$(cat "$cstamp" 2>/dev/null)" != "$cwant" ]; then  # a C source changed: rebuild
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -e .
            echo "$cwant" > "$cstamp"
        fi
        return 0
    fi
    local py
    py=$(find_python)
    echo "dev.sh: setting up $venv with $py ($("$py" --version 2>&1))" >&2
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    echo "$want" > "$stamp"
    echo "$cwant" > "$cstamp"
    "$venv/bin/python" -m rethook.engine.select >&2 || true  # says which core runs, and why
}

need_chromium() {
    # tests/test_view.py loads the HTML view in Debian's Chromium (driven by Playwright, which
    # never downloads a browser of its own). Installed here when missing and we may (root with
    # apt-get, as on CI); otherwise the test says what is missing and skips (fails under CI).
    command -v chromium >/dev/null 2>&1 && return 0
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    echo "dev.sh: installing chromium for the HTML view's browser test" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
        >/dev/null 2>&1 || echo "dev.sh: could not install chromium" >&2
}

cmd="${1:-help}"
[ $# -gt 0 ] && shift
case "$cmd" in
    setup) setup ;;
    demo)
        setup
        exec "$venv/bin/python" -m rethook demo "$@" ;;
    test)
        setup
        need_chromium
        # Byte code for src/ even under PYTHONDONTWRITEBYTECODE: the suite starts rethook in
        # hundreds of subprocesses, each of which would otherwise compile every module it loads.
        "$venv/bin/python" -m compileall -q src >/dev/null
        # One worker per core (pytest-xdist); RETHOOK_TEST_JOBS=0 runs in this process.
        exec "$venv/bin/python" -m pytest -n "${RETHOOK_TEST_JOBS:-auto}" "$@" ;;
    bench)
        setup
        # the peers bench/bench_peers.py measures against (trace0, viztracer) and its workloads
        bstamp="$venv/.rethook-bench"
        if [ "$(cat "$bstamp" 2>/dev/null)" != "$(cksum pyproject.toml)" ]; then
            "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[bench]"
            cksum pyproject.toml > "$bstamp"
        fi
        for b in bench/bench_*.py; do "$venv/bin/python" "$b" "$@"; done ;;
    lint)
        setup
        "$venv/bin/python" -m ruff check src tests bench
        # the layers contract in pyproject.toml (the README's layout)
        "$venv/bin/lint-imports" --config pyproject.toml ;;
    *)
        sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
        [ "$cmd" = help ] || exit 2 ;;
esac
