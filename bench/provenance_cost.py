#!/usr/bin/env python3
"""What element provenance costs a DYNAMIC iterator: the demo's shuffled job
(a range source, a shuffle, batches of 1024) streamed through sluice-cat
from two workers, with provenance off (the baseline) and on (the workers
send every batch's provenance and the client keeps its ledger of what it
handed out), in the same run on the same cluster. The runs alternate and
each side keeps its best, so that a slow moment of the shared machine does
not land on one side only. Prints one JSON line: ratio is the throughput
on / off; cpu_ratio is the CPU time (user + system) that sluice-cat, the
workers and the dispatcher spent on the job off / on, what the throughput
ratio would be with every process on one machine bound by its cores, and
less disturbed by other load than the wall clock."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--elements', type=int, default=4000000)
ap.add_argument('--rounds', type=int, default=5, help='runs of each side')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, summary  # noqa: E402

SPEC = {"source": {"type": "range", "start": 0, "stop": args.elements},
        "ops": [{"op": "shuffle", "buffer_size": 4096, "seed": 7},
                {"op": "batch", "batch_size": 1024, "drop_remainder": False}]}


def daemon_cpu(c):
    """Seconds of CPU the cluster's daemons have used so far (/proc/PID/stat)."""
    total = 0
    for d in c.daemons:
        with open('/proc/%d/stat' % d.proc.pid) as f:
            fields = f.read().rsplit(')', 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf('SC_CLK_TCK')


def run(c, provenance):
    """(elements per second, CPU seconds of sluice-cat and the daemons)."""
    # On is what a DYNAMIC iterator does by default; --with-provenance only
    # prints it, so on means the default and off means --no-provenance.
    extra = ['--sharding', 'dynamic'] + ([] if provenance else ['--no-provenance'])
    d0, r0 = daemon_cpu(c), os.times()
    rc, _, err = c.cat(SPEC, extra, fmt='count', timeout=600)
    d1, r1 = daemon_cpu(c), os.times()
    if rc != 0:
        sys.exit('bench: sluice-cat failed: ' + err[-2000:])
    s = summary(err)
    if s['elements'] != args.elements:
        sys.exit('bench: %d elements, expected %d' % (s['elements'], args.elements))
    cpu = (d1 - d0) + (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return s['elements'] / s['seconds'], cpu


c = Cluster(workers=2)
try:
    c.wait_workers_registered(2)
    run(c, False)  # warm up: page cache, allocator, dispatcher state
    off, on = [], []
    for _ in range(args.rounds):
        off.append(run(c, False))
        on.append(run(c, True))
finally:
    c.close()
best_on, best_off = max(r for r, _ in on), max(r for r, _ in off)
cpu_on, cpu_off = min(t for _, t in on), min(t for _, t in off)
print(json.dumps({
    "bench": "provenance_cost_shuffled_dynamic",
    "elements": args.elements,
    "on_elements_per_s": round(best_on),
    "on_cpu_s": round(cpu_on, 2),
    "baseline": "the same job with provenance off",
    "off_elements_per_s": round(best_off),
    "off_cpu_s": round(cpu_off, 2),
    "ratio": round(best_on / best_off, 3),
    "cpu_ratio": round(cpu_off / cpu_on, 3),
}))
