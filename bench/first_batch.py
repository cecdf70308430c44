#!/usr/bin/env python3
"""A small job end to end on a warm cluster of two workers: sluice-cat of a
10-element range (OFF and DYNAMIC), from process start to exit, median of
--runs. The baseline in the same run is the floor any job pays: sluicectl
asking the dispatcher's admin endpoint for its workers (a process start and
one request). Prints one JSON line per policy: milliseconds of each and the
ratio job / floor (issue 16's goal: the job under 100 ms)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--runs', type=int, default=21)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, binary, child_env  # noqa: E402


def timed(argv):
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, env=child_env(), timeout=60)
    if r.returncode != 0:
        sys.exit('bench: %s failed: %s' % (argv[0], r.stderr.decode()[-2000:]))
    return (time.monotonic() - t) * 1000


c = Cluster(workers=2)
try:
    c.wait_workers_registered(2)
    spec = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batch_size": 10}]}
    floor_argv = [binary('sluicectl'), '--admin', '127.0.0.1:%d' % c.dispatcher.admin_port, '--json', 'workers']
    for policy in ('off', 'dynamic'):
        job, floor = [], []
        for _ in range(args.runs):
            job.append(timed(c.cat_argv(spec, ['--sharding', policy], fmt='count')))
            floor.append(timed(floor_argv))
        j, f = statistics.median(job), statistics.median(floor)
        print(json.dumps({
            "bench": "first_batch_10_elements_%s" % policy,
            "job_ms": round(j, 1),
            "baseline": "sluicectl workers against the same dispatcher (process start and one request), same run",
            "floor_ms": round(f, 1),
            "ratio": round(j / f, 2),
            "runs": args.runs,
        }))
finally:
    c.close()
