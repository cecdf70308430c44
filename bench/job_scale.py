#!/usr/bin/env python3
"""DYNAMIC split hand-outs of one active job as the dispatcher holds more
live jobs: starts a real sluice-dispatcher on a fresh work dir and runs
bench_job_scale against it, which creates idle jobs through the protocol up
to each level (10, 1,000, 10,000 by default) and measures hand-outs per
second and the p99 latency of a GetSplit at each. The first level is the
baseline, measured in the same run; the ratios compare the last with it.
Prints one JSON line. Run: bench/job_scale.py --build build"""
import argparse
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--levels', default='10,1000,10000')
ap.add_argument('--workers', type=int, default=4)
ap.add_argument('--seconds', type=float, default=2.0)
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
from harness import Cluster  # noqa: E402

top = max(int(x) for x in args.levels.split(','))
# The idle jobs' clients and the fake workers never heartbeat: their leases
# must outlast the run. Splits of one element, none confirmed: no hold-back.
c = Cluster(dispatcher_args=['--split-size', '1', '--max-jobs', str(top + 16),
                             '--client-timeout-ms', '3600000', '--worker-timeout-ms', '3600000',
                             '--max-outstanding-splits', str(1 << 24)])
try:
    r = subprocess.run([os.path.join(build, 'bench', 'bench_job_scale'), c.dispatcher.addr, args.levels,
                        str(args.workers), str(args.seconds), str(c.dispatcher.proc.pid)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit('bench: bench_job_scale failed: %s' % r.stderr[-2000:])
    sys.stdout.write(r.stdout)
finally:
    c.close()
