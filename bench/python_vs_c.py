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

Each run is a process of its own, started the same way for every client
(the Python ones run this script with --client, so they do not share the
interpreter that drives the daemons). The machine is shared, so one run of
each says little: a round runs the three clients once each, in an order that
turns from round to round so that none always runs first or last, and gives
the ratios of the Python runs to the C run; the figures reported are the
medians over the rounds (the lowest and highest numpy ratio are printed
too). "ratio" (numpy against C) is the one with the target.

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
ap.add_argument('--rounds', type=int, default=21, help='rounds of one run of each client; the medians count')
ap.add_argument('--client', choices=['numpy', 'torch'], help=argparse.SUPPRESS)
ap.add_argument('--dispatcher', help=argparse.SUPPRESS)
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
os.environ['SLUICE_LIB'] = os.path.join(build, 'client', 'libsluice.so')
import sluice  # noqa: E402

ds = sluice.range(0, args.elements).batch(args.batch)
want_batches = -(-args.elements // args.batch)


def timed(batches):
    """{"batches", "elements", "seconds"} of an iterable of batch dicts,
    from the first batch to the last, touching every value as the C client
    does (batches counts those after the first)."""
    n = elements = 0
    t0 = cpu0 = None
    for b in batches:
        if t0 is None:
            t0 = time.perf_counter()
            cpu0 = time.process_time()
        n += 1
        for a in b.values():
            elements += len(a)
    return {'batches': n - 1, 'elements': elements, 'seconds': time.perf_counter() - t0,
            'cpu_seconds': time.process_time() - cpu0}


if args.client == 'numpy':
    with ds.distribute(args.dispatcher, sharding='off', max_outstanding=8, per_worker_outstanding=2) as it:
        print(json.dumps(timed(it)))
    sys.exit(0)
if args.client == 'torch':
    import sluice.torch  # noqa: E402
    print(json.dumps(timed(sluice.torch.loader(ds, args.dispatcher, sharding='off', max_outstanding=8,
                                               per_worker_outstanding=2))))
    sys.exit(0)

from harness import Cluster  # noqa: E402


cpu_us = {'c': [], 'numpy': [], 'torch': []}  # CPU of the client process per batch, all threads


def run(c, name):
    if name == 'c':
        argv = [os.path.join(build, 'bench', 'bench_client_rate'), c.dispatcher.addr, ds.to_json(), 'off', '8', '2']
    else:
        argv = [sys.executable, os.path.abspath(__file__), '--build', build, '--elements', str(args.elements),
                '--batch', str(args.batch), '--client', name, '--dispatcher', c.dispatcher.addr]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    try:
        s = json.loads(r.stdout)
    except ValueError:
        s = None
    if r.returncode != 0 or not s or s['batches'] != want_batches - 1 or s['elements'] != args.elements:
        sys.exit('bench: the %s client failed (rc %d): %s %s' % (name, r.returncode, r.stdout, r.stderr[-2000:]))
    cpu_us[name].append(s['cpu_seconds'] / s['batches'] * 1e6)
    return s['batches'] / s['seconds']


c = Cluster(workers=1)
try:
    c.wait_workers_registered(1)
    for name in ('c', 'numpy', 'torch'):  # warm-up: the worker's first pipeline, the page cache
        run(c, name)
    clients = ['c', 'numpy', 'torch']
    rates = {name: [] for name in clients}
    ratios, torch_ratios = [], []
    for r in range(args.rounds):
        k = r % len(clients)
        got = {name: run(c, name) for name in clients[k:] + clients[:k]}
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
    "cpu_us_per_batch": {k: round(statistics.median(v), 1) for k, v in cpu_us.items()},
    "ratio_max": round(max(ratios), 3),
    "target": 0.9,
}))
