#!/usr/bin/env bash
# Runs the tests (or any command) while CPU-bound processes keep the cores
# busy, so that a test that passes only on a quiet machine shows itself.
# The load is stopped however the command ends (also on Ctrl-C or SIGTERM),
# and the elapsed time is printed.
#
#   scripts/run-tests-under-load.sh                 # make test
#   scripts/run-tests-under-load.sh /usr/bin/python3 tests/integration/run.py --build build
#   LOAD_PROCS=4 scripts/run-tests-under-load.sh make test
set -uo pipefail
cd "$(dirname "$0")/.."
nprocs=${LOAD_PROCS:-2}
if [ $# -eq 0 ]; then
    set -- make test
fi

load=()
cmd=
stop_load() {
    if [ ${#load[@]} -gt 0 ]; then
        kill "${load[@]}" 2>/dev/null
        wait "${load[@]}" 2>/dev/null
        load=()
    fi
}
on_signal() {
    # The command runs in the background, in a process group of its own, so
    # that this shell handles the signal at once: pass it on to the whole
    # group (make, the test runners, their daemons), wait, stop the load.
    local sig=$1 code=$2
    shift 2
    if [ -n "$cmd" ]; then
        kill -"$sig" -- -"$cmd" 2>/dev/null
        wait "$cmd" 2>/dev/null
        echo "== under load: '$*' stopped by SIG$sig after $(($(date +%s) - start)) s"
    fi
    exit "$code"
}
trap stop_load EXIT
trap 'on_signal INT 130 "$@"' INT
trap 'on_signal TERM 143 "$@"' TERM

for _ in $(seq "$nprocs"); do
    sh -c 'while :; do :; done' &
    load+=($!)
done
echo "== load: $nprocs busy loops (pids ${load[*]}); running: $*"

start=$(date +%s)
set -m  # the command's own process group
"$@" &
cmd=$!
set +m
wait "$cmd"
rc=$?
cmd=
echo "== under load: '$*' exited $rc after $(($(date +%s) - start)) s"
exit $rc
