#!/usr/bin/env python3
"""This build's client against another: a range of --elements int64s in
batches of 1024 (plain, or behind shuffle(10000) with --shape shuffle)
streamed to sluice-cat (--format count, one consumer) from --workers workers
of this build, under OFF and DYNAMIC, once through this build's sluice-cat
and once through --baseline-cat (an earlier commit's, built alike), the two
alternating on the same cluster for --rounds rounds. Prints one JSON line
per policy: rate_ratio = the median over the rounds of this build's elements
per second over the baseline's run just before it, cpu_ratio = the median of
the baseline's CPU time per batch over this build's (workers, dispatcher and
consumer together), consumer_cpu_ratio the same for the consumer alone.
Above 1 is this build faster or cheaper.

To compare with commit REV: git worktree add /tmp/rev REV && cmake -S /tmp/rev
-B /tmp/rev/br -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/rev/br
--target sluice-cat, then
bench/client_vs.py --build build-release --baseline-cat /tmp/rev/br/client/sluice-cat."""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--baseline-cat', required=True, help='the sluice-cat to compare with')
ap.add_argument('--elements', type=int, default=40000000)
ap.add_argument('--workers', type=int, default=2)
ap.add_argument('--shape', choices=['plain', 'shuffle'], default='plain')
ap.add_argument('--rounds', type=int, default=5)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, binary, child_env, summary  # noqa: E402
from cpu_time import cluster_cpu_seconds  # noqa: E402

OPS = [{"op": "shuffle", "buffer_size": 10000, "seed": 7}] if args.shape == 'shuffle' else []
SPEC = {"source": {"type": "range", "start": 0, "stop": args.elements},
        "ops": OPS + [{"op": "batch", "batch_size": 1024, "drop_remainder": False}]}
CATS = {'build': binary('sluice-cat'), 'baseline': os.path.abspath(args.baseline_cat)}


def run(c, sharding, which):
    """(elements per second, CPU seconds per batch, the consumer's CPU seconds per batch)."""
    argv = c.cat_argv(SPEC, ['--sharding', sharding], 'count')
    argv[0] = CATS[which]
    pids = [d.proc.pid for d in c.daemons]
    all0, cat0 = cluster_cpu_seconds(pids)
    p = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=900)
    all1, cat1 = cluster_cpu_seconds(pids)
    if p.returncode != 0:
        sys.exit('bench: %s sluice-cat failed: %s' % (which, p.stderr[-2000:]))
    s = summary(p.stderr)
    want = args.elements * (args.workers if sharding == 'off' else 1)
    if s['elements'] != want:
        sys.exit('bench: %s %s: %d elements, expected %d' % (which, sharding, s['elements'], want))
    return s['elements'] / s['seconds'], (all1 - all0) / s['batches'], (cat1 - cat0) / s['batches']


c = Cluster(workers=args.workers)
try:
    c.wait_workers_registered(args.workers)
    for sharding in ('off', 'dynamic'):
        run(c, sharding, 'build')  # warm up: page cache, allocator, dispatcher state
        base, new = [], []
        for _ in range(args.rounds):
            base.append(run(c, sharding, 'baseline'))
            new.append(run(c, sharding, 'build'))
        print(json.dumps({
            "bench": "client_vs", "sharding": sharding, "shape": args.shape, "workers": args.workers,
            "elements": args.elements, "baseline": CATS['baseline'] + ", alternating on the same cluster",
            "elements_per_s": {"build": round(statistics.median(n[0] for n in new)),
                               "baseline": round(statistics.median(b[0] for b in base))},
            "rate_ratio": round(statistics.median(n[0] / b[0] for b, n in zip(base, new)), 3),
            "rate_ratios": [round(n[0] / b[0], 3) for b, n in zip(base, new)],
            "cpu_ratio": round(statistics.median(b[1] / n[1] for b, n in zip(base, new)), 3),
            "consumer_cpu_ratio": round(statistics.median(b[2] / n[2] for b, n in zip(base, new)), 3),
            "rounds": args.rounds}), flush=True)
finally:
    c.close()
