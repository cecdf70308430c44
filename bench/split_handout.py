#!/usr/bin/env python3
"""DYNAMIC split hand-outs per second with the durable state store (issue 5;
target at least 50,000 per second): starts a real sluice-dispatcher on a
fresh work dir and runs bench_split_handout against it, which measures its
baseline (requests that commit nothing) in the same run. Prints one JSON
line. Run: bench/split_handout.py --build build"""
import argparse
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--workers', type=int, default=64)
ap.add_argument('--max-splits', type=int, default=4, help="what each request asks for (workerd asks up to 4)")
ap.add_argument('--seconds', type=float, default=3.0)
args = ap.parse_args()
build = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = build
from harness import Cluster  # noqa: E402

c = Cluster(dispatcher_args=['--split-size', '1'])
try:
    r = subprocess.run([os.path.join(build, 'bench', 'bench_split_handout'), c.dispatcher.addr,
                        str(args.workers), str(args.max_splits), str(args.seconds)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit('bench: bench_split_handout failed: %s' % r.stderr[-2000:])
    sys.stdout.write(r.stdout)
finally:
    c.close()
