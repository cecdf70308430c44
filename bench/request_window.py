#!/usr/bin/env python3
"""What the iterator's request window does to a stream of small batches: a
range of --elements int64s in batches of 1024 through sluice-cat (--format
count, one consumer) from --workers workers, under OFF and DYNAMIC, with the
default window (sized by bytes: sl_iterator_opts_t.window_bytes, 32 batches
and 16 per worker for these 8 KiB batches) and with a fixed window (--baseline
M,P: sluice-cat --max-outstanding M --per-worker-outstanding P; 8,4, the
default until the window was sized by bytes), the two alternating on the
same cluster for --rounds rounds. Prints one JSON line per policy:
rate_ratio = the median over the rounds of the default's elements per second
over the baseline's run just before it, and cpu_ratio = the baseline's CPU
time per batch (workers, dispatcher and consumer together) over the
default's, median of the rounds: above 1 is the default faster or cheaper.
Run with the Release build: bench/request_window.py --build build-release."""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--elements', type=int, default=40000000)
ap.add_argument('--workers', type=int, default=2)
ap.add_argument('--rounds', type=int, default=5)
ap.add_argument('--baseline', default='8,4', metavar='M,P',
                help='the fixed window compared against (the default before it was sized by bytes)')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, summary  # noqa: E402
from cpu_time import cluster_cpu_seconds  # noqa: E402

SPEC = {"source": {"type": "range", "start": 0, "stop": args.elements},
        "ops": [{"op": "batch", "batch_size": 1024, "drop_remainder": False}]}


def run(c, sharding, window):
    """(elements per second, CPU seconds per batch) of one read of the range."""
    extra = ['--sharding', sharding]
    if window is not None:
        m, p = window.split(',')
        extra += ['--max-outstanding', m, '--per-worker-outstanding', p]
    pids = [d.proc.pid for d in c.daemons]
    cpu0, _ = cluster_cpu_seconds(pids)
    rc, _, err = c.cat(SPEC, extra, fmt='count', timeout=900)
    cpu1, _ = cluster_cpu_seconds(pids)
    if rc != 0:
        sys.exit('bench: sluice-cat failed: ' + err[-2000:])
    s = summary(err)
    want = args.elements * (args.workers if sharding == 'off' else 1)
    if s['elements'] != want:
        sys.exit('bench: %s: %d elements, expected %d' % (sharding, s['elements'], want))
    return s['elements'] / s['seconds'], (cpu1 - cpu0) / s['batches']


c = Cluster(workers=args.workers)
try:
    c.wait_workers_registered(args.workers)
    for sharding in ('off', 'dynamic'):
        run(c, sharding, None)  # warm up: page cache, allocator, dispatcher state
        base, dflt = [], []
        for _ in range(args.rounds):
            base.append(run(c, sharding, args.baseline))
            dflt.append(run(c, sharding, None))
        print(json.dumps({
            "bench": "request_window", "sharding": sharding, "workers": args.workers, "elements": args.elements,
            "baseline": "a fixed window of %s (--max-outstanding, --per-worker-outstanding), alternating on the same "
                        "cluster" % args.baseline,
            "elements_per_s": {"default": round(statistics.median(d[0] for d in dflt)),
                               "baseline": round(statistics.median(b[0] for b in base))},
            "cpu_us_per_batch": {"default": round(statistics.median(d[1] for d in dflt) * 1e6, 1),
                                 "baseline": round(statistics.median(b[1] for b in base) * 1e6, 1)},
            "rate_ratio": round(statistics.median(d[0] / b[0] for b, d in zip(base, dflt)), 3),
            "rate_ratios": [round(d[0] / b[0], 3) for b, d in zip(base, dflt)],
            "cpu_ratio": round(statistics.median(b[1] / d[1] for b, d in zip(base, dflt)), 3),
            "rounds": args.rounds}), flush=True)
finally:
    c.close()
