#!/usr/bin/env python3
"""What requests waiting on one task cost another task of the same worker.

One worker serves two jobs: a plain stream (a range of --elements int64s
in batches of 1024, read by one sluice-cat over TCP) and, beside it, a
coordinated job of --consumers consumers whose consumer 0 is stopped
(SIGSTOP): the others ask up to 64 rounds ahead, the rounds past the 16 open
wait for a place, and their requests wait on the worker (64 each of the others,
4,032 with 64 consumers). The stream's rate is measured alone and beside the waiting
requests, --rounds times each, alternating; prints one JSON line: ratio =
the median rate beside them over the median alone (1.0: a task's waiting
requests cost the others nothing), and the waiting requests counted by the
worker's GET /v1/tasks.

Until 2026-12-02 the worker kept one list of waiting requests for all its
tasks and walked it for every request and every batch: 38.8 against 220
million elements a second (ratio 0.18) with 64 consumers. Each task keeps
its own now.

Run with the Release build: bench/parked_requests.py --build build-release"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--consumers', type=int, default=64)
ap.add_argument('--elements', type=int, default=20000000)
ap.add_argument('--rounds', type=int, default=5)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, child_env, get_json, summary, wait_for  # noqa: E402

COORD = {"source": {"type": "range", "stop": 1 << 40}, "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": 4}]}
PLAIN = {"source": {"type": "range", "stop": args.elements}, "ops": [{"op": "batch", "batch_size": 1024}]}


def rate(c):
    rc, _, err = c.cat(PLAIN, ['--no-shm'], fmt='count')
    if rc != 0:
        sys.exit('bench: sluice-cat failed: ' + err[-2000:])
    s = summary(err)
    return s['elements'] / s['seconds']


def waiting(w):
    tasks = [t for t in get_json(w.admin_port, '/v1/tasks')['tasks'] if 'rounds' in t]
    return tasks[0]['requests_waiting'] if tasks else 0


c = Cluster(workers=1)
procs = []
try:
    c.wait_workers_registered(1)
    w = c.workers[0]
    rate(c)  # warm up
    alone, beside, parked = [], [], 0
    for _ in range(args.rounds):
        alone.append(rate(c))
        procs = [subprocess.Popen(c.cat_argv(COORD, ['--job-name', 'waiting-%d' % len(beside), '--num-consumers',
                                                     str(args.consumers), '--consumer-index', str(i),
                                                     '--max-outstanding', '64'], fmt='count'),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
                 for i in range(args.consumers)]
        procs[0].send_signal(signal.SIGSTOP)
        # The others run ahead until every open round waits for consumer 0
        # and each of them has its 64 requests waiting for a place: nothing
        # moves after that.
        wait_for(lambda: waiting(w) >= (args.consumers - 1) * 64, 'the requests to wait', timeout=120)
        parked = waiting(w)
        beside.append(rate(c))
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()
        procs = []
    print(json.dumps({"bench": "parked_requests", "consumers": args.consumers, "requests_waiting": parked,
                      "baseline": "the same stream with no request waiting on the worker, alternating",
                      "alone_elements_per_s": round(statistics.median(alone)),
                      "beside_elements_per_s": round(statistics.median(beside)),
                      "ratio": round(statistics.median(beside) / statistics.median(alone), 3),
                      "rounds": args.rounds}))
finally:
    for p in procs:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
    c.close()
