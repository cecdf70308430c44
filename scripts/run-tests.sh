#!/usr/bin/env bash
# Runs every test against one build directory: the Criterion unit tests
# through ctest, then the integration tests that start real daemons.
set -euo pipefail
build=${1:?usage: run-tests.sh BUILD_DIR}
cd "$(dirname "$0")/.."
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== unit tests ($build)"
ctest --test-dir "$build" --output-on-failure -j2
echo "== integration tests ($build)"
/usr/bin/python3 tests/integration/run.py --build "$build"
echo "== python client tests ($build)"
/usr/bin/python3 tests/python/run.py --build "$build"
