#!/usr/bin/env python3
"""This build against another: a range of --elements int64s in batches of
1024 (plain, or behind shuffle(10000) with --shape shuffle) streamed to
sluice-cat (--format count, one consumer) from --workers workers, under OFF
and DYNAMIC, once through this build and once through the baseline, the two
alternating for --rounds rounds. The baseline is either
- --baseline-cat PATH: another sluice-cat, on the same cluster of this
  build's daemons (a change to the client alone), or
- --baseline-build DIR: another build's daemons and sluice-cat, on a
  cluster of their own that stands by while this build's runs (a change
  to the daemons, or to both).
Prints one JSON line per policy: rate_ratio = the median over the rounds of
this build's elements per second over the baseline's run just before it,
cpu_ratio = the median of the baseline's CPU time per batch over this
build's (workers, dispatcher and consumer together), consumer_cpu_ratio the
same for the consumer alone. Above 1 is this build faster or cheaper.

To compare with commit REV: git worktree add /tmp/rev REV && cmake -S /tmp/rev
-B /tmp/rev/br -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/rev/br, then
bench/client_vs.py --build build-release --baseline-build /tmp/rev/br (or
--baseline-cat /tmp/rev/br/client/sluice-cat for the client alone)."""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
side = ap.add_mutually_exclusive_group(required=True)
side.add_argument('--baseline-cat', help='the sluice-cat to compare with, on this build\'s cluster')
side.add_argument('--baseline-build', help='the build (daemons and sluice-cat) to compare with, on its own cluster')
ap.add_argument('--elements', type=int, default=40000000)
ap.add_argument('--workers', type=int, default=2)
ap.add_argument('--shape', choices=['plain', 'shuffle'], default='plain')
ap.add_argument('--rounds', type=int, default=5)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, binary, child_env, using_build, summary  # noqa: E402
from cpu_time import cluster_cpu_seconds  # noqa: E402

OPS = [{"op": "shuffle", "buffer_size": 10000, "seed": 7}] if args.shape == 'shuffle' else []
SPEC = {"source": {"type": "range", "start": 0, "stop": args.elements},
        "ops": OPS + [{"op": "batch", "batch_size": 1024, "drop_remainder": False}]}


CATS = {'build': binary('sluice-cat')}
if args.baseline_cat:
    CATS['baseline'] = os.path.abspath(args.baseline_cat)
    BASELINE = CATS['baseline'] + ', alternating on the same cluster'
else:
    with using_build(os.path.abspath(args.baseline_build)):
        CATS['baseline'] = binary('sluice-cat')
    BASELINE = os.path.abspath(args.baseline_build) + ' (its daemons and sluice-cat), alternating'


def cluster(build):
    """A cluster of build's daemons, its workers registered."""
    with using_build(build):
        c = Cluster(workers=args.workers)
    try:
        c.wait_workers_registered(args.workers)
    except BaseException:
        c.close()
        raise
    return c


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


clusters = {'build': cluster(os.environ['SLUICE_BUILD'])}
try:
    clusters['baseline'] = cluster(os.path.abspath(args.baseline_build)) if args.baseline_build else clusters['build']
    for sharding in ('off', 'dynamic'):
        for which in ('baseline', 'build'):
            run(clusters[which], sharding, which)  # warm up: page cache, allocator, dispatcher state
        base, new = [], []
        for _ in range(args.rounds):
            base.append(run(clusters['baseline'], sharding, 'baseline'))
            new.append(run(clusters['build'], sharding, 'build'))
        print(json.dumps({
            "bench": "client_vs", "sharding": sharding, "shape": args.shape, "workers": args.workers,
            "elements": args.elements, "baseline": BASELINE,
            "elements_per_s": {"build": round(statistics.median(n[0] for n in new)),
                               "baseline": round(statistics.median(b[0] for b in base))},
            "rate_ratio": round(statistics.median(n[0] / b[0] for b, n in zip(base, new)), 3),
            "rate_ratios": [round(n[0] / b[0], 3) for b, n in zip(base, new)],
            "cpu_ratio": round(statistics.median(b[1] / n[1] for b, n in zip(base, new)), 3),
            "consumer_cpu_ratio": round(statistics.median(b[2] / n[2] for b, n in zip(base, new)), 3),
            "rounds": args.rounds}), flush=True)
finally:
    for c in set(clusters.values()):
        c.close()
