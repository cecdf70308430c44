#!/usr/bin/env python3
"""Batches per second through the Python client (sluice.distribute, touching
every array) against the C client (sluice-cat --format count) on the same
job spec, one worker, sharding off, measured in the same run against the same
daemons. Prints one JSON line; the target is a ratio of at least 0.9.

Run with /usr/bin/python3 (it has NumPy): bench/python_vs_c.py --build build"""
import argparse
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)
sys.path.insert(0, os.path.join(repo, 'tests', 'integration'))
sys.path.insert(0, os.path.join(repo, 'client', 'python'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--elements', type=int, default=20_000_000)
ap.add_argument('--batch', type=int, default=1024)
ap.add_argument('--rounds', type=int, default=2, help='runs of each client; the best one counts')
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
os.environ['SLUICE_LIB'] = os.path.join(build, 'client', 'libsluice.so')
from harness import Cluster, summary  # noqa: E402
import sluice  # noqa: E402

ds = sluice.range(0, args.elements).batch(args.batch)
want_batches = -(-args.elements // args.batch)


def run_c(c):
    rc, _, err = c.cat(ds.spec, ['--sharding', 'off'], fmt='count', timeout=600)
    s = summary(err)
    if rc != 0 or not s or s['batches'] != want_batches:
        sys.exit('bench: sluice-cat failed (rc %d): %s' % (rc, err[-2000:]))
    return s['batches'] / s['seconds']


def run_python(c):
    # Timed like sluice-cat: from the open iterator to the last batch.
    batches = elements = 0
    with ds.distribute(c.dispatcher.addr, sharding='off') as it:
        t0 = time.perf_counter()
        for b in it:
            batches += 1
            for a in b.values():
                elements += len(a)
        seconds = time.perf_counter() - t0
    if batches != want_batches or elements != args.elements:
        sys.exit('bench: the Python client got %d batches, %d elements' % (batches, elements))
    return batches / seconds


c = Cluster(workers=1)
try:
    c.wait_workers_registered(1)
    c_rates, py_rates = [], []
    for _ in range(args.rounds):
        c_rates.append(run_c(c))
        py_rates.append(run_python(c))
finally:
    bad = c.close()
    if bad:
        print('bench: daemons did not exit cleanly: %s' % bad, file=sys.stderr)
py, cc = max(py_rates), max(c_rates)
print(json.dumps({
    "bench": "python_vs_c",
    "spec": "range 0..%d, batch %d, sharding off, 1 worker" % (args.elements, args.batch),
    "python_batches_per_s": round(py, 1),
    "c_batches_per_s": round(cc, 1),
    "ratio": round(py / cc, 3),
    "target": 0.9,
}))
