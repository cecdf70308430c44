#!/usr/bin/env python3
"""What StatefulDataLoader's state costs per batch: a shuffled DYNAMIC job
(a range source, shuffle(10000), batches of 1024) read by one iterator from
two workers, and after every batch both ways of carrying its state out of a
DataLoader worker process, measured on the same batches in the same run:

- checkpoint (the baseline, what workers sent before): the iterator's whole
  checkpoint after the batch (sl_iterator_checkpoint()), in the worker;
- delta: what the iterator recorded of the batch (sl_iterator_delta()), in
  the worker, and its replay into a checkpoint builder
  (sl_ckpt_builder_apply()), in the main process.

Prints one JSON line: bytes per batch each way and their ratio, and
microseconds per batch each way (the worker's, and the main process's for
deltas) with cost_ratio = checkpoint / (delta + apply). That the builder's
checkpoints are the iterator's bytes is tested (test_iterator), not here."""
import argparse
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, '..', 'tests', 'integration'))
sys.path.insert(0, os.path.join(here, '..', 'client', 'python'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--elements', type=int, default=2000000)
ap.add_argument('--buffer', type=int, default=10000)
ap.add_argument('--batch', type=int, default=1024)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
os.environ['SLUICE_LIB'] = os.path.join(os.path.abspath(args.build), 'client', 'libsluice.so')
from harness import Cluster  # noqa: E402
import sluice  # noqa: E402
from sluice.client import CheckpointBuilder  # noqa: E402

c = Cluster(workers=2)
try:
    c.wait_workers_registered(2)
    ds = sluice.range(0, args.elements).shuffle(args.buffer, seed=7).batch(args.batch)
    it = sluice.distribute(ds, c.dispatcher.addr, sharding='dynamic', checkpointable=True, _deltas=True)
    b = CheckpointBuilder(it.dataset_id)
    batches = 0
    ck_bytes = d_bytes = 0
    ck_s = d_s = apply_s = 0.0
    clock = time.perf_counter
    for batch in it:
        t0 = clock()
        ck = it.checkpoint()
        t1 = clock()
        d = it.delta()
        t2 = clock()
        b.apply(d)
        t3 = clock()
        batches += 1
        ck_bytes += len(ck)
        d_bytes += len(d)
        ck_s += t1 - t0
        d_s += t2 - t1
        apply_s += t3 - t2
    it.close()
    b.close()
    us = 1e6 / batches
    print(json.dumps({'bench': 'stateful_state', 'batches': batches, 'shuffle': args.buffer, 'batch': args.batch,
                      'checkpoint_bytes_per_batch': round(ck_bytes / batches),
                      'delta_bytes_per_batch': round(d_bytes / batches),
                      'bytes_ratio': round(ck_bytes / d_bytes, 1),
                      'checkpoint_us_per_batch': round(ck_s * us, 1), 'delta_us_per_batch': round(d_s * us, 1),
                      'apply_us_per_batch': round(apply_s * us, 1),
                      'cost_ratio': round(ck_s / (d_s + apply_s), 2)}))
finally:
    c.close()
