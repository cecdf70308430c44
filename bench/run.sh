#!/usr/bin/env bash
# make bench: every benchmark, each printing one JSON line with its baseline
# measured in the same run and the ratio against it.
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
/usr/bin/python3 bench/stream.py --build "$build"
/usr/bin/python3 bench/tls_stream.py --build "$build"
/usr/bin/python3 bench/first_batch.py --build "$build"
/usr/bin/python3 bench/heal_to_batch.py --build "$build"
/usr/bin/python3 bench/tfrecord_read.py --build "$build"
/usr/bin/python3 bench/python_vs_c.py --build "$build"
/usr/bin/python3 bench/jpeg_pipeline.py --build "$build" --workers 1
/usr/bin/python3 bench/jpeg_pipeline.py --build "$build" --workers 2
/usr/bin/python3 bench/parallel_map.py --build "$build"
./"$build"/bench/bench_pipeline_ops
/usr/bin/python3 bench/split_handout.py --build "$build"
/usr/bin/python3 bench/provenance_cost.py --build "$build"
