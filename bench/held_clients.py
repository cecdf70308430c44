#!/usr/bin/env python3
"""What holds at --max-outstanding-splits cost many clients of one job.

--clients sluice-cat ranks read one named DYNAMIC job over --workers
workers: a range of --elements int64s in batches of 6, one element a split
(--split-size 1), so that each batch settles splits and a task reaches a low
bound every few batches. The job runs on a cluster whose dispatcher has
--max-outstanding-splits --bound, and on one with the default bound (16384),
which it never reaches; --rounds times each, alternating. Prints one JSON
line: ratio = the median time of the job without holds over the median with
them (1.0: a hold costs nothing).

The holds go on as soon as the clients acknowledge what reached them
(docs/fault-tolerance.md, "The worker's word"): a batch of a task at the
bound is acknowledged at once (GetElementResponse.ack_at_once), any other
within 50 ms. Before 2026-12-05 those waited for each client's heartbeat
tick: seed 101 of ClientsAgainstTheBound, the shape here, took 10.7 s
against 1.3 s.

Run with the Release build: bench/held_clients.py --build build-release"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--clients', type=int, default=22)
ap.add_argument('--workers', type=int, default=3)
ap.add_argument('--bound', type=int, default=16)
ap.add_argument('--elements', type=int, default=200000)
ap.add_argument('--rounds', type=int, default=5)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, child_env, get_json, wait_for  # noqa: E402

SPEC = {"source": {"type": "range", "stop": args.elements}, "ops": [{"op": "batch", "batch_size": 6}]}
SPLITS = ['--split-size', '1', '--max-split-size', '1', '--client-stall-ms', '0']


def job_seconds(c, name):
    """The time from the first rank's start to the last one's exit, every
    rank joined before the workers run the job (they are stopped until then:
    none comes after it ended)."""
    argv = c.cat_argv(SPEC, ['--sharding', 'dynamic', '--job-name', name], fmt='count')
    port = c.dispatcher.admin_port
    for w in c.workers:
        w.kill(signal.SIGSTOP)
    try:
        procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())
                 for _ in range(args.clients)]
        wait_for(lambda: any(j['name'] == name and j['num_consumers'] == args.clients
                             for j in get_json(port, '/v1/jobs')['jobs']), 'the ranks to join')
    finally:
        start = time.monotonic()
        for w in c.workers:
            w.kill(signal.SIGCONT)
    for p in procs:
        _, err = p.communicate(timeout=600)
        if p.returncode != 0:
            sys.exit('bench: sluice-cat failed: ' + err.decode()[-2000:])
    return time.monotonic() - start


held = Cluster(workers=args.workers, dispatcher_args=SPLITS + ['--max-outstanding-splits', str(args.bound)])
free = Cluster(workers=args.workers, dispatcher_args=SPLITS)
try:
    held.wait_workers_registered(args.workers)
    free.wait_workers_registered(args.workers)
    job_seconds(held, 'warm')
    job_seconds(free, 'warm')
    with_holds, without = [], []
    for r in range(args.rounds):
        with_holds.append(job_seconds(held, 'held-%d' % r))
        without.append(job_seconds(free, 'free-%d' % r))
finally:
    held.close()
    free.close()
a, b = statistics.median(with_holds), statistics.median(without)
print(json.dumps({"bench": "held_clients", "clients": args.clients, "workers": args.workers, "bound": args.bound,
                  "elements": args.elements, "baseline": "the same job with the default bound, never reached",
                  "seconds_with_holds": round(a, 3), "seconds_without": round(b, 3), "ratio": round(b / a, 3),
                  "rounds_with_holds": [round(x, 3) for x in with_holds],
                  "rounds_without": [round(x, 3) for x in without]}))
