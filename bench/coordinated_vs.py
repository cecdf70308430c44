#!/usr/bin/env python3
"""Coordinated reads through shared memory, this build against another:
--consumers sluice-cat processes on the worker's host read one named job
of an infinite range in batches of --batch int64s (1 MiB by default, where
the worker lends blocks made in each consumer's region instead of copying,
docs/protocol.md "Blocks made in the region"), --limit batches each, at
once, from one worker; this build's cluster and the baseline build's (its
daemons and sluice-cat) alternate for --rounds rounds. Prints one JSON
line: wall_ratio = the median over the rounds of this build's time from
the consumers' start to the last one's exit over the baseline's run just
before it, worker_cpu_ratio this build's worker CPU time summed over the
rounds over the baseline's (counted in clock ticks), consumer_cpu_ratio
the same of the consumers (sluice-cat processes, from getrusage of the
children), and the share of the batches lent in this build's runs. Below
1 is this build faster or cheaper. --shuffle N reads a range of 2^50 (one
epoch without end) behind shuffle(N) instead, where each consumer's ledger
gets scattered records of every split.

To compare with commit REV: git worktree add /tmp/rev REV && cmake -S /tmp/rev
-B /tmp/rev/br -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/rev/br, then
bench/coordinated_vs.py --build build-release --baseline-build /tmp/rev/br
(--sharding dynamic: a DYNAMIC job, where the consumers track what they
receive to make a worker loss exactly once)."""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--baseline-build', required=True, help='the build (daemons and sluice-cat) to compare with')
ap.add_argument('--consumers', type=int, default=2)
ap.add_argument('--batch', type=int, default=131072, help='int64s a batch')
ap.add_argument('--limit', type=int, default=600, help='batches each consumer reads')
ap.add_argument('--rounds', type=int, default=7)
ap.add_argument('--sharding', default='off', choices=['off', 'dynamic'],
                help='the job\'s policy (dynamic: the consumers track what they receive, for worker losses)')
ap.add_argument('--shuffle', type=int, default=0,
                help='a shuffle buffer of this many records over a range of 2^50 (0: none, a range of 50 batches)')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, binary, child_env, using_build, metric  # noqa: E402
from cpu_time import process_cpu_seconds  # noqa: E402

SPEC = {"source": {"type": "range", "start": 0, "stop": args.batch * 50},
        "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": args.batch}]}
if args.shuffle:
    SPEC = {"source": {"type": "range", "start": 0, "stop": 1 << 50},
            "ops": [{"op": "shuffle", "buffer_size": args.shuffle, "seed": 1}, {"op": "repeat"},
                    {"op": "batch", "batch_size": args.batch}]}


def children_cpu():
    """CPU seconds of the children waited for so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cluster(build):
    """A cluster of one of build's workers, registered, and build's sluice-cat."""
    with using_build(build):
        c = Cluster(workers=1)
        cat = binary('sluice-cat')
    try:
        c.wait_workers_registered(1)
    except BaseException:
        c.close()
        raise
    return c, cat


def run(c, cat, job):
    """(seconds until the last consumer exits, the worker's CPU seconds, batches lent, the consumers' CPU
    seconds) of one job."""
    worker = c.workers[0]
    cpu0, lent0, t0 = process_cpu_seconds(worker.proc.pid), metric(worker.admin_port,
                                                                    'sluice_worker_batches_shm_lent_total'), time.time()
    ccpu0 = children_cpu()
    procs = []
    for i in range(args.consumers):
        argv = c.cat_argv(SPEC, ['--job-name', job, '--num-consumers', str(args.consumers), '--consumer-index',
                                 str(i), '--limit', str(args.limit), '--sharding', args.sharding], 'count')
        argv[0] = cat
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()))
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            sys.exit('bench: sluice-cat failed: %s' % err.decode(errors='replace')[-2000:])
    lent = metric(worker.admin_port, 'sluice_worker_batches_shm_lent_total') or 0
    return (time.time() - t0, process_cpu_seconds(worker.proc.pid) - cpu0, lent - (lent0 or 0),
            children_cpu() - ccpu0)


sides = {'build': cluster(os.environ['SLUICE_BUILD'])}
try:
    sides['baseline'] = cluster(os.path.abspath(args.baseline_build))
    for which in ('baseline', 'build'):
        run(*sides[which], 'warm')  # page cache, allocator, the regions' first pages
    base, new = [], []
    for r in range(args.rounds):
        base.append(run(*sides['baseline'], 'r%d' % r))
        new.append(run(*sides['build'], 'r%d' % r))
    print(json.dumps({
        "bench": "coordinated_vs", "consumers": args.consumers, "batch_bytes": args.batch * 8, "limit": args.limit,
        "sharding": args.sharding, "shuffle": args.shuffle,
        "baseline": os.path.abspath(args.baseline_build) + ' (its daemons and sluice-cat), alternating',
        "wall_ratio": round(statistics.median(n[0] / b[0] for b, n in zip(base, new)), 3),
        "worker_cpu_ratio": round(sum(n[1] for n in new) / sum(b[1] for b in base), 3),
        "consumer_cpu_ratio": round(sum(n[3] for n in new) / sum(b[3] for b in base), 3),
        "lent_share": round(statistics.median(n[2] / (args.consumers * args.limit) for n in new), 3),
        "rounds": args.rounds}), flush=True)
finally:
    for c, _ in sides.values():
        c.close()
