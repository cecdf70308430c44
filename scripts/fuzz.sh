#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_*.c) with clang, ASan and
# UBSan in build-fuzz, and runs each for a bounded time over a copy of its
# seed corpus (tests/fuzz/corpus/<target>/; the copy grows, the seeds do
# not). Exits nonzero when a fuzzer finds a crash, a leak, a timeout or a
# failed check; the input that did it is kept in build-fuzz/fuzz-artifacts/
# and the line to reproduce it is printed.
#
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   space-separated targets to run (default: all)
#   FUZZ_BUILD     build directory (default build-fuzz)
#   JOBS           build parallelism (default 2)
#
# Installs nothing: clang must be on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${FUZZ_BUILD:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-2}

if ! command -v clang >/dev/null; then
    echo "fuzz.sh: clang not found; libFuzzer needs clang" >&2
    exit 1
fi

targets=${FUZZ_TARGETS:-}
if [[ -z $targets ]]; then
    for src in tests/fuzz/fuzz_*.c; do
        [[ -e $src ]] || continue
        targets+=" $(basename "$src" .c)"
    done
fi
if [[ -z ${targets// /} ]]; then
    echo "fuzz.sh: no fuzz targets in tests/fuzz/" >&2
    exit 1
fi

# -DSL_FUZZ=ON instruments the project's libraries with
# -fsanitize=fuzzer-no-link, so that coverage inside the codec guides the
# fuzzer (the targets themselves link with -fsanitize=fuzzer).
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSL_FUZZ=ON -DSL_SANITIZE=ON >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" -j"$jobs" --target $targets

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failed=()
for t in $targets; do
    bin=$build/tests/$t
    corpus=$tmp/$t
    mkdir -p "$corpus"
    if [[ -d tests/fuzz/corpus/$t ]]; then
        cp -R tests/fuzz/corpus/"$t"/. "$corpus"/
    fi
    echo "== $t: ${seconds}s over $(find "$corpus" -type f | wc -l) seed(s)"
    rc=0
    "$bin" -max_len=4096 -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$artifacts/$t-" "$corpus" >"$tmp/$t.log" 2>&1 || rc=$?
    tail -n 20 "$tmp/$t.log"
    if ((rc != 0)); then
        echo "== $t: FAILED (exit $rc); inputs kept in $artifacts:" >&2
        for a in "$artifacts/$t-"*; do
            [[ -e $a ]] && echo "   $a" >&2
        done
        echo "   reproduce: $bin $artifacts/$t-<file>" >&2
        cp "$tmp/$t.log" "$artifacts/$t.log"
        failed+=("$t")
    else
        echo "== $t: ok, corpus grew to $(find "$corpus" -type f | wc -l) input(s)"
    fi
done

if ((${#failed[@]})); then
    echo "fuzz.sh: failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: all fuzz targets ran ${seconds}s without a finding"
