#!/usr/bin/env python3
"""Batches per second through the Python client against the C client on the
same job, measured in the same run against the same daemons. Prints one JSON
line; the target is a ratio of at least 0.9.

Two workloads, each read by all three clients:

- "tokens" (the target's): batches of 64 rows of 1024 int64, 512 KiB each,
  as a language model's trainer reads token ids: range 0..N batched by 1024,
  then by 64;
- "small": batches of 1024 int64 scalars, 8 KiB each, 25,000 to 30,000 a
  second from one worker. No trainer steps that fast; it is here to show
  what the Python layer costs per batch ("small" in the output, no target).

All clients read the same spec from one worker under sharding off, with the
same iterator options (max_outstanding 8, 2 requests per worker) and the same
libsluice.so, each timed from its first batch to its last (the wait for the
worker to start the job, up to a heartbeat, is no part of either):

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
too). "ratio" (numpy against C, tokens) is the one with the target.

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
ap.add_argument('--token-batches', type=int, default=1500, help='batches of the tokens workload')
ap.add_argument('--small-elements', type=int, default=10_000_000, help='elements of the small workload')
ap.add_argument('--rounds', type=int, default=11, help='rounds of one run of each client per workload; the medians count')
ap.add_argument('--client', choices=['numpy', 'torch'], help=argparse.SUPPRESS)
ap.add_argument('--workload', choices=['tokens', 'small'], help=argparse.SUPPRESS)
ap.add_argument('--dispatcher', help=argparse.SUPPRESS)
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
os.environ['SLUICE_LIB'] = os.path.join(build, 'client', 'libsluice.so')
import sluice  # noqa: E402

ROW = 1024
ROWS = 64
# name -> (dataset, batches, rows: the sum of every batch's first dimension)
WORKLOADS = {
    'tokens': (sluice.range(0, args.token_batches * ROWS * ROW).batch(ROW, drop_remainder=True).batch(ROWS),
               args.token_batches, args.token_batches * ROWS),
    'small': (sluice.range(0, args.small_elements).batch(ROW), -(-args.small_elements // ROW), args.small_elements),
}


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


if args.client:
    ds = WORKLOADS[args.workload][0]
    if args.client == 'numpy':
        with ds.distribute(args.dispatcher, sharding='off', max_outstanding=8, per_worker_outstanding=2) as it:
            print(json.dumps(timed(it)))
    else:
        import sluice.torch  # noqa: E402
        print(json.dumps(timed(sluice.torch.loader(ds, args.dispatcher, sharding='off', max_outstanding=8,
                                                   per_worker_outstanding=2))))
    sys.exit(0)

from harness import Cluster  # noqa: E402


def run(c, workload, name, cpu_us):
    ds, batches, rows = WORKLOADS[workload]
    if name == 'c':
        argv = [os.path.join(build, 'bench', 'bench_client_rate'), c.dispatcher.addr, ds.to_json(), 'off', '8', '2']
    else:
        argv = [sys.executable, os.path.abspath(__file__), '--build', build, '--token-batches',
                str(args.token_batches), '--small-elements', str(args.small_elements), '--client', name,
                '--workload', workload, '--dispatcher', c.dispatcher.addr]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    try:
        s = json.loads(r.stdout)
    except ValueError:
        s = None
    if r.returncode != 0 or not s or s['batches'] != batches - 1 or s['elements'] != rows:
        sys.exit('bench: the %s client failed on %s (rc %d): %s %s' % (name, workload, r.returncode, r.stdout,
                                                                        r.stderr[-2000:]))
    cpu_us[name].append(s['cpu_seconds'] / s['batches'] * 1e6)
    return s['batches'] / s['seconds']


def measure(c, workload):
    """The medians over the rounds of one workload."""
    clients = ['c', 'numpy', 'torch']
    cpu_us = {name: [] for name in clients}  # CPU of the client process per batch, all threads
    for name in clients:  # warm-up: the worker's first pipeline, the page cache
        run(c, workload, name, {n: [] for n in clients})
    rates = {name: [] for name in clients}
    ratios, torch_ratios = [], []
    for r in range(args.rounds):
        k = r % len(clients)
        got = {name: run(c, workload, name, cpu_us) for name in clients[k:] + clients[:k]}
        for name in rates:
            rates[name].append(got[name])
        ratios.append(got['numpy'] / got['c'])
        torch_ratios.append(got['torch'] / got['c'])
    med = statistics.median
    return {
        "python_batches_per_s": round(med(rates['numpy']), 1),
        "torch_batches_per_s": round(med(rates['torch']), 1),
        "c_batches_per_s": round(med(rates['c']), 1),
        "ratio": round(med(ratios), 3),
        "torch_ratio": round(med(torch_ratios), 3),
        "ratio_min": round(min(ratios), 3),
        "ratio_max": round(max(ratios), 3),
        "cpu_us_per_batch": {k: round(med(v), 1) for k, v in cpu_us.items()},
    }


c = Cluster(workers=1)
try:
    c.wait_workers_registered(1)
    tokens = measure(c, 'tokens')
    small = measure(c, 'small')
finally:
    bad = c.close()
    if bad:
        print('bench: daemons did not exit cleanly: %s' % bad, file=sys.stderr)
out = {"bench": "python_vs_c",
       "spec": "tokens: %d batches of %dx%d int64 (512 KiB); sharding off, 1 worker, %d rounds"
               % (args.token_batches, ROWS, ROW, args.rounds)}
out.update(tokens)
out["target"] = 0.9
small["spec"] = "range 0..%d in batches of %d (8 KiB)" % (args.small_elements, ROW)
out["small"] = small
print(json.dumps(out))
