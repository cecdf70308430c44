#!/usr/bin/env python3
"""Batches per second through the Python client against the C client on the
same job, measured in the same run against the same daemons. Prints one JSON
line; the target is a ratio of at least 0.9.

All clients read the same spec (range 0..N, batch B) from one worker under
sharding off, with the same iterator options (max_outstanding 8, 2 requests
per worker) and the same libsluice.so, each timed from its first batch to its
last (the wait for the worker to start the job, up to a heartbeat, is no part
of either):

- C: bench_client_rate (bench/client_rate.c): sl_iterator_next(), the first
  dimension of every tensor read, sl_batch_release(), per batch;
- numpy: `for batch in ds.distribute(...)`, as a trainer writes it: every
  batch becomes a dict of NumPy arrays viewing the C batch, every array is
  touched (its length read), and the batch is released when its arrays go;
- torch: the same through `sluice.torch.loader(...)`, every batch a dict of
  torch tensors (torch.from_numpy over those arrays), each touched.

The machine is shared, so one run of each says little: a round runs the
three clients once each, in an order that turns from round to round so that
none always runs first or last, and gives the ratios of the Python runs to
the C run; the figures reported are the medians over the rounds (the lowest
and highest numpy ratio are printed too). "ratio" (numpy against C) is the
one with the target.

Run with /usr/bin/python3 (it has NumPy): bench/python_vs_c.py --build build"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)
sys.path.insert(0, os.path.join(repo, 'tests', 'integration'))
sys.path.insert(0, os.path.join(repo, 'client', 'python'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--elements', type=int, default=2_000_000)
ap.add_argument('--batch', type=int, default=1024)
ap.add_argument('--rounds', type=int, default=21, help='pairs of runs (one of each client); the median ratio counts')
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
os.environ['SLUICE_LIB'] = os.path.join(build, 'client', 'libsluice.so')
from harness import Cluster  # noqa: E402
import sluice  # noqa: E402
import sluice.torch  # noqa: E402

ds = sluice.range(0, args.elements).batch(args.batch)
want_batches = -(-args.elements // args.batch)


def run_c(c):
    argv = [os.path.join(build, 'bench', 'bench_client_rate'), c.dispatcher.addr, ds.to_json(), 'off', '8', '2']
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    try:
        s = json.loads(r.stdout)
    except ValueError:
        s = None
    if r.returncode != 0 or not s or s['batches'] != want_batches - 1 or s['elements'] != args.elements:
        sys.exit('bench: bench_client_rate failed (rc %d): %s %s' % (r.returncode, r.stdout, r.stderr[-2000:]))
    return s['batches'] / s['seconds']


def timed(batches):
    """Batches per second of an iterable of batch dicts, from the first
    batch to the last, touching every value as the C client does; checks
    that all of them came."""
    n = elements = 0
    t0 = None
    for b in batches:
        if t0 is None:
            t0 = time.perf_counter()
        n += 1
        for a in b.values():
            elements += len(a)
    seconds = time.perf_counter() - t0
    if n != want_batches or elements != args.elements:
        sys.exit('bench: the Python client got %d batches, %d elements' % (n, elements))
    return (n - 1) / seconds


def run_python(c):
    with ds.distribute(c.dispatcher.addr, sharding='off', max_outstanding=8, per_worker_outstanding=2) as it:
        return timed(it)


def run_torch(c):
    return timed(sluice.torch.loader(ds, c.dispatcher.addr, sharding='off', max_outstanding=8,
                                     per_worker_outstanding=2))


c = Cluster(workers=1)
try:
    c.wait_workers_registered(1)
    run_python(c)  # warm-up: imports, the worker's first pipeline, page faults
    run_torch(c)
    clients = [('c', run_c), ('numpy', run_python), ('torch', run_torch)]
    rates = {name: [] for name, _ in clients}
    ratios, torch_ratios = [], []
    for r in range(args.rounds):
        k = r % len(clients)
        got = {name: fn(c) for name, fn in clients[k:] + clients[:k]}
        for name in rates:
            rates[name].append(got[name])
        ratios.append(got['numpy'] / got['c'])
        torch_ratios.append(got['torch'] / got['c'])
finally:
    bad = c.close()
    if bad:
        print('bench: daemons did not exit cleanly: %s' % bad, file=sys.stderr)
print(json.dumps({
    "bench": "python_vs_c",
    "spec": "range 0..%d, batch %d, sharding off, 1 worker, %d rounds" % (args.elements, args.batch, args.rounds),
    "python_batches_per_s": round(statistics.median(rates['numpy']), 1),
    "torch_batches_per_s": round(statistics.median(rates['torch']), 1),
    "c_batches_per_s": round(statistics.median(rates['c']), 1),
    "ratio": round(statistics.median(ratios), 3),
    "torch_ratio": round(statistics.median(torch_ratios), 3),
    "ratio_min": round(min(ratios), 3),
    "ratio_max": round(max(ratios), 3),
    "target": 0.9,
}))
