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
# torchvision's ImageNet training crop (RandomResizedCrop) on both sides.
/usr/bin/python3 bench/jpeg_pipeline.py --build "$build" --workers 2 --transform resized
/usr/bin/python3 bench/parallel_map.py --build "$build"
./"$build"/bench/bench_pipeline_ops
/usr/bin/python3 bench/split_handout.py --build "$build"
/usr/bin/python3 bench/job_scale.py --build "$build"
/usr/bin/python3 bench/provenance_cost.py --build "$build"
./"$build"/bench/bench_provenance_batch
./"$build"/bench/bench_provenance_batch --buffer 100000
./"$build"/bench/bench_provenance_batch --files 16
/usr/bin/python3 bench/stateful_state.py --build "$build"
/usr/bin/python3 bench/parked_requests.py --build "$build"
# DYNAMIC against OFF is measured with the Release build when there is one
# (make build-release): the ratio is of the code, not of debug info.
dyn_build=$build
[ -x build-release/client/sluice-cat ] && dyn_build=build-release
/usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build"
# Many ranks of one job against a low --max-outstanding-splits.
/usr/bin/python3 bench/held_clients.py --build "$dyn_build"
# OFF against OFF in the same rounds (A/A): how far two runs of one job read
# apart on this machine, the band within which the ratios above say nothing.
/usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build" --control --shapes plain
# The default request window is sized by bytes: 32 batches and 16 per
# worker for these, where the machine runs flat out and the policies'
# difference stands out of its noise. And with the fixed window of 8 and 4
# it replaced, where the rate follows how round trips and wake-ups
# interleave (docs/sharding.md).
/usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build" --window 8,4 --no-equal-work
# Plain, with runs five times as long: a job's start and end (about 40 ms
# under both policies) weigh twice as much in a DYNAMIC run of 2 workers,
# which delivers half of what its OFF baseline does (the first invocation's
# dynamic_vs_off_equal_work line sets them apart another way).
/usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build" --shapes plain --elements 200000000 --rounds 8 \
    --no-equal-work
# Plain, 2 workers, with the consumer on the first CPU and the workers on the
# others: every job's threads start on one core until the kernel spreads
# them, which weighs twice as much in the half-as-long DYNAMIC job
# (docs/sharding.md, "Where the threads run"); pinned, the ratio is what
# DYNAMIC costs a batch. It needs two CPUs.
if [ "$(nproc)" -ge 2 ]; then
    /usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build" --pin --shapes plain --workers 2
fi
# The same elements as 800 epochs of 50,000 (a repeat over a CIFAR-size
# dataset): a DYNAMIC task crosses an epoch every few milliseconds.
/usr/bin/python3 bench/dynamic_vs_off.py --build "$dyn_build" --shapes epochs --rounds 8 --no-equal-work
# The request window, sized by bytes, against the fixed one it replaced.
/usr/bin/python3 bench/request_window.py --build "$dyn_build"
# The same comparison in instructions (callgrind), which the machine's
# speed does not move.
/usr/bin/python3 bench/dynamic_instructions.py --build "$dyn_build"
