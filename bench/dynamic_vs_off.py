#!/usr/bin/env python3
"""What DYNAMIC sharding costs against OFF: a range of --elements int64s in
batches of 1024 streamed through sluice-cat (one consumer, provenance on, as
a DYNAMIC iterator has it by default) from 1 and from 2 workers, plain and
behind a shuffle(10000), each shape once under OFF (the baseline: every
worker reads the whole range) and once under DYNAMIC (the workers share it
split by split), in the same run on the same cluster. The rate is elements
delivered per second, so OFF with 2 workers delivers the range twice. The
runs alternate and each side keeps its best of --rounds, so that a slow
moment of the shared machine does not land on one side only. Prints one
JSON line per shape: ratio = DYNAMIC / OFF of the best runs, pair_ratio =
the median over the rounds of each DYNAMIC run over the OFF run next to it
(the two closest in time, so a slow stretch of the machine mostly cancels;
OFF runs first in even rounds and second in odd ones, so that an advantage
of either place goes to both sides, and pair_ratio_by_order gives the
median of each order; pair_ratios lists them
all, in round order, to show how far they spread, and
pair_ratio_ci95 is the interval in which the median of such rounds falls 95
times in 100, by resampling them (a fixed seed: the same rounds give the
same interval), to tell a change from this machine's noise),
steady_pair_ratio the same of the rates from the first batch to the last
(sluice-cat's summary: without the job's start and the wait for its end,
which weigh twice as much in a DYNAMIC job of 2 workers, half as long as
its OFF baseline), machine_busy the median share of the whole machine's CPU
time that was busy during a run of each side (from /proc/stat: below 1 while
its processes wait on each other rather than for a core), and cpu_ratio = the CPU time per element under OFF over the same
under DYNAMIC (workers, dispatcher and consumer together, best of each:
what DYNAMIC costs the machine, whatever else it is doing); cpu_us_per_batch
splits it into the consumer's, the workers' and the dispatcher's CPU time a
batch over all rounds (the dispatcher's from its threads' scheduler run time,
to the nanosecond: in clock ticks of 10 ms its few ms a run read 0 or 10),
and cpu_ratio_all_rounds is cpu_ratio from those sums (less moved by one lucky run than the best of each), with
cpu_user_share the median share of user time in it (the rest is the
kernel's: sockets, wake-ups; instructions counted by
dynamic_instructions.py are the user part only). Then one line with the
smallest of each.
With 2 workers or more, each round also runs DYNAMIC over a range as many
times as long as there are workers (--no-equal-work leaves it out), which
delivers as many elements as its OFF baseline and gives each worker as much
to read, in as long a run: its line (dynamic_vs_off_equal_work) sets it
against the same OFF runs, so that the cost a batch of DYNAMIC stands apart
from the job's start and end, which a DYNAMIC run of the range pays on half
as many elements (2 workers).
The shape `epochs` (not in the default --shapes) is the same number of
elements as a small dataset repeated: a range of --epoch-elements (default
50,000, a CIFAR-size epoch) under a repeat of --elements over it, so that a
DYNAMIC task crosses hundreds of epochs (the hand-out gives it the next
epochs' splits once its own ran out: docs/sharding.md, Epochs ahead).
--pin fixes where the threads run: this process and the consumer on the
first CPU, the workers (every thread, the tasks' threads they start too) on
the others. Without it the kernel places them, and on the 2-core machines
here it starts every job's threads on one core and spreads them only after
tens of ms, which weighs twice as much in a DYNAMIC run of 2 workers, half
as long as its OFF baseline (docs/sharding.md, "Where the threads run").
--control runs an A/A invocation: the second side of each round is the same
OFF job again (its lines are dynamic_vs_off_control, their "dynamic" fields
that second OFF run's): its pair ratio and interval are how far two runs of
one job read apart on this machine, the band within which a DYNAMIC ratio
cannot be told from OFF. Four invocations of 1 worker, plain, read
0.942-1.027 on 2026-12-02 (docs/sharding.md).
Run with the Release build: bench/dynamic_vs_off.py --build build-release
(--elements 4000000 --rounds 1 for a short run while developing)."""
import argparse
import json
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--elements', type=int, default=40000000, help='the range (issue 16 measures 40,000,000)')
ap.add_argument('--rounds', type=int, default=12,
                help='runs of each side (at the sized window a run lasts about a quarter of a second here, '
                'and six rounds of one build read pair ratios from 0.81 to 0.97)')
ap.add_argument('--workers', default='1,2', help='cluster sizes, comma-separated')
ap.add_argument('--shapes', default='plain,shuffle', help='plain, shuffle, epochs, comma-separated')
ap.add_argument('--epoch-elements', type=int, default=50000,
                help='the epochs shape: elements an epoch (--elements of them in all, rounded down to whole epochs)')
ap.add_argument('--no-provenance', action='store_true', help='DYNAMIC without provenance (at least once)')
ap.add_argument('--no-shm', action='store_true',
                help='both sides read over TCP, not through shared memory (sluice-cat --no-shm)')
ap.add_argument('--no-equal-work', action='store_true',
                help='without the DYNAMIC runs over workers times the range (see above)')
ap.add_argument('--no-length-control', action='store_true',
                help='without the OFF runs over the range divided by the workers (see above)')
ap.add_argument('--window', metavar='M,P',
                help='both sides with sluice-cat --max-outstanding M --per-worker-outstanding P (default: the '
                'iterator sizes its window by bytes, 32,16 for these batches)')
ap.add_argument('--pin', action='store_true',
                help='the consumer on the first CPU, the workers on the others (see above; needs 2 CPUs or more)')
ap.add_argument('--control', action='store_true',
                help='A/A: the second side of each round runs OFF too, and the lines are named '
                'dynamic_vs_off_control (no equal-work or length runs): how far two runs of one job read apart '
                'on this machine, the band within which a DYNAMIC ratio is not told from OFF')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, summary  # noqa: E402
from cpu_time import (busy_share, children_cpu_seconds, cpu_user_system, machine_ticks,  # noqa: E402
                      process_cpu_seconds, threads_cpu_seconds)


BATCH = 1024
CPUS = sorted(os.sched_getaffinity(0))
if args.pin and len(CPUS) < 2:
    sys.exit('bench: --pin needs 2 CPUs or more, this process may run on %d' % len(CPUS))
WORKER_CPUS = set(CPUS[1:])
if args.pin:
    os.sched_setaffinity(0, {CPUS[0]})  # the consumer, a child, inherits it; the daemons start before
PLACEMENT = ('pinned: the consumer on CPU %d, the workers on %s' % (CPUS[0], ','.join(map(str, CPUS[1:])))
             if args.pin else 'the kernel\'s')


def spec(shape, elements):
    if shape == 'epochs':
        return {"source": {"type": "range", "start": 0, "stop": args.epoch_elements},
                "ops": [{"op": "repeat", "count": elements // args.epoch_elements},
                        {"op": "batch", "batch_size": BATCH, "drop_remainder": False}]}
    ops = [{"op": "shuffle", "buffer_size": 10000, "seed": 7}] if shape == 'shuffle' else []
    ops.append({"op": "batch", "batch_size": BATCH, "drop_remainder": False})
    return {"source": {"type": "range", "start": 0, "stop": elements}, "ops": ops}


def pin_workers(c):
    """Every thread of every worker onto the CPUs after the first. A task's
    thread inherits its creator's CPUs, but each run pins again, threads
    that came since included."""
    for w in c.workers:
        for tid in os.listdir('/proc/%d/task' % w.proc.pid):
            try:
                os.sched_setaffinity(int(tid), WORKER_CPUS)
            except ProcessLookupError:
                pass  # a thread that ended meanwhile


def run(c, workers, shape, sharding, elements=None):
    """(elements delivered per second, CPU seconds of the whole cluster and consumer per element,
    the user time's share of that CPU time, elements per second from the first batch to the last,
    {consumer, workers, dispatcher: CPU seconds}, batches delivered, the share of the machine busy meanwhile)."""
    extra = ['--sharding', sharding] + (['--no-shm'] if args.no_shm else [])
    if args.window:
        m, p = args.window.split(',')
        extra += ['--max-outstanding', m, '--per-worker-outstanding', p]
    if sharding == 'dynamic' and args.no_provenance:
        extra.append('--no-provenance')
    pids = [d.proc.pid for d in c.daemons]
    if args.pin:
        pin_workers(c)
    # The dispatcher's threads outlive the runs, and its CPU a run (about 10 ms)
    # is one clock tick: its scheduler run time, to the nanosecond.
    parts = {'consumer': children_cpu_seconds, 'dispatcher': lambda: threads_cpu_seconds(c.dispatcher.proc.pid),
             'workers': lambda: sum(process_cpu_seconds(w.proc.pid) for w in c.workers)}
    before = {k: f() for k, f in parts.items()}
    user0, sys0 = cpu_user_system(pids)
    ticks0 = machine_ticks()
    elements = elements or args.elements
    if shape == 'epochs':
        elements = elements // args.epoch_elements * args.epoch_elements
    rc, _, err = c.cat(spec(shape, elements), extra, fmt='count', timeout=900)
    busy = busy_share(ticks0, machine_ticks())
    user1, sys1 = cpu_user_system(pids)
    by_part = {k: f() - before[k] for k, f in parts.items()}
    user, cpu = user1 - user0, (user1 - user0) + (sys1 - sys0)
    if rc != 0:
        sys.exit('bench: sluice-cat failed: ' + err[-2000:])
    s = summary(err)
    want = elements * (workers if sharding == 'off' else 1)
    if s['elements'] != want:
        sys.exit('bench: %s %s: %d elements, expected %d' % (shape, sharding, s['elements'], want))
    span = s['last_batch_seconds'] - s['first_batch_seconds']
    steady = (s['elements'] - BATCH) / span if span > 0 else 0.0  # the first batch came at its start
    return (s['elements'] / s['seconds'], cpu / s['elements'], user / cpu if cpu > 0 else 0.0, steady, by_part,
            (s['elements'] + BATCH - 1) // BATCH, busy)


def median_ci95(xs, draws=2000):
    """The 2.5th and 97.5th percentiles of the medians of draws resamples of xs."""
    rng = random.Random(16)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return [round(meds[int(0.025 * draws)], 3), round(meds[int(0.975 * draws) - 1], 3)]


results = []
for workers in [int(w) for w in args.workers.split(',')]:
    if args.pin:
        os.sched_setaffinity(0, set(CPUS))  # the daemons start with every CPU; the workers are pinned per run
    c = Cluster(workers=workers)
    if args.pin:
        os.sched_setaffinity(0, {CPUS[0]})
    try:
        c.wait_workers_registered(workers)
        for shape in args.shapes.split(','):
            run(c, workers, shape, 'off')  # warm up: page cache, allocator, dispatcher state
            off, dyn, equal, short = [], [], [], []
            second = 'off' if args.control else 'dynamic'
            for i in range(args.rounds):
                # OFF first in even rounds, the other side first in odd ones,
                # so that an advantage of either place (an A/A invocation with
                # OFF always first once read 1.054, 1.009-1.099) goes to both.
                if i % 2 == 0:
                    off.append(run(c, workers, shape, 'off'))
                    dyn.append(run(c, workers, shape, second))
                else:
                    dyn.append(run(c, workers, shape, second))
                    off.append(run(c, workers, shape, 'off'))
                if workers > 1 and not args.no_equal_work and not args.control:
                    equal.append(run(c, workers, shape, 'dynamic', args.elements * workers))
                if workers > 1 and not args.no_length_control and not args.control:
                    short.append(run(c, workers, shape, 'off', args.elements // workers))
            best_off, best_dyn = max(o[0] for o in off), max(d[0] for d in dyn)
            cpu_off, cpu_dyn = min(o[1] for o in off), min(d[1] for d in dyn)
            pairs = [d[0] / o[0] for o, d in zip(off, dyn)]
            # Where the CPU went, a batch: each part's CPU time over all rounds (its clock
            # ticks add up to tenths of seconds) over the batches of all rounds.
            per_batch = {side: {k: round(sum(x[4][k] for x in runs) / sum(x[5] for x in runs) * 1e6, 3)
                                for k in ('consumer', 'workers', 'dispatcher')}
                         for side, runs in (('off', off), ('dynamic', dyn))}
            r = {"bench": "dynamic_vs_off_control" if args.control else "dynamic_vs_off", "workers": workers, "shape": shape, "elements": args.elements,
                 "dynamic_elements_per_s": round(best_dyn), "provenance": not args.no_provenance,
                 "baseline": "the same job under OFF", "off_elements_per_s": round(best_off),
                 "ratio": round(best_dyn / best_off, 3),
                 "pair_ratio": round(statistics.median(pairs), 3),
                 "pair_ratios": [round(x, 3) for x in pairs],
                 "pair_ratio_ci95": median_ci95(pairs),
                 "pair_ratio_by_order": {"off_first": round(statistics.median(pairs[0::2]), 3),
                                         "off_second": round(statistics.median(pairs[1::2]), 3)
                                         if len(pairs) > 1 else None},
                 "steady_pair_ratio": round(statistics.median(d[3] / o[3] for o, d in zip(off, dyn)), 3),
                 "cpu_ns_per_element": {"off": round(cpu_off * 1e9, 1), "dynamic": round(cpu_dyn * 1e9, 1)},
                 "cpu_ratio": round(cpu_off / cpu_dyn, 3),
                 "cpu_us_per_batch": per_batch,
                 "cpu_ratio_all_rounds": round(sum(per_batch['off'].values()) / sum(per_batch['dynamic'].values()), 3),
                 "cpu_user_share": {"off": round(statistics.median(o[2] for o in off), 2),
                                    "dynamic": round(statistics.median(d[2] for d in dyn), 2)},
                 "machine_busy": {"off": round(statistics.median(o[6] for o in off), 2),
                                  "dynamic": round(statistics.median(d[6] for d in dyn), 2)},
                 "rounds": args.rounds, "window": args.window or "sized by bytes", "placement": PLACEMENT}
            results.append(r)
            print(json.dumps(r), flush=True)
            if equal:
                eq_pairs = [d[0] / o[0] for o, d in zip(off, equal)]
                eq_batch = {k: round(sum(x[4][k] for x in equal) / sum(x[5] for x in equal) * 1e6, 3)
                            for k in ('consumer', 'workers', 'dispatcher')}
                print(json.dumps({
                    "bench": "dynamic_vs_off_equal_work", "workers": workers, "shape": shape,
                    "elements": args.elements * workers,
                    "baseline": "the OFF runs above (%d elements, each worker all of them)" % args.elements,
                    "dynamic_elements_per_s": round(max(d[0] for d in equal)),
                    "pair_ratio": round(statistics.median(eq_pairs), 3),
                    "pair_ratios": [round(x, 3) for x in eq_pairs], "pair_ratio_ci95": median_ci95(eq_pairs),
                    "steady_pair_ratio": round(statistics.median(d[3] / o[3] for o, d in zip(off, equal)), 3),
                    "cpu_us_per_batch": {"off": per_batch['off'], "dynamic": eq_batch},
                    "cpu_ratio_all_rounds": round(sum(per_batch['off'].values()) / sum(eq_batch.values()), 3),
                    "rounds": args.rounds, "placement": PLACEMENT}), flush=True)
            if short:
                short_off = [s[0] / o[0] for o, s in zip(off, short)]
                dyn_short = [d[0] / s[0] for d, s in zip(dyn, short)]
                print(json.dumps({
                    "bench": "dynamic_vs_off_length", "workers": workers, "shape": shape,
                    "short_off_elements": args.elements // workers,
                    "baseline": "OFF over %d elements (each worker all of them): as many elements in as many "
                                "batches as the DYNAMIC runs above" % (args.elements // workers),
                    "short_off_vs_off": round(statistics.median(short_off), 3),
                    "short_off_vs_off_ci95": median_ci95(short_off),
                    "dynamic_vs_short_off": round(statistics.median(dyn_short), 3),
                    "dynamic_vs_short_off_ci95": median_ci95(dyn_short),
                    "rounds": args.rounds, "placement": PLACEMENT}), flush=True)
    finally:
        c.close()
print(json.dumps({"bench": "dynamic_vs_off_control_min" if args.control else "dynamic_vs_off_min",
                  "elements": args.elements,
                  "baseline": "the same job under OFF, per shape",
                  "ratio": min(r["ratio"] for r in results),
                  "pair_ratio": min(r["pair_ratio"] for r in results),
                  "steady_pair_ratio": min(r["steady_pair_ratio"] for r in results),
                  "cpu_ratio": min(r["cpu_ratio"] for r in results),
                  "cpu_ratio_all_rounds": min(r["cpu_ratio_all_rounds"] for r in results), "placement": PLACEMENT}))
