#!/usr/bin/env python3
"""What DYNAMIC sharding costs against OFF, counted in instructions, which do
not depend on how fast the shared machine happens to be (dynamic_vs_off.py
times the same jobs, and its ratios move 10-25% between invocations).

One worker and the consumer (sluice-cat, provenance on as a DYNAMIC iterator
has it) run under valgrind --tool=callgrind; a range of --elements int64s in
batches of 1024, plain and behind a shuffle(10000), once under OFF (the
baseline) and once under DYNAMIC. Each job runs at two sizes on a fresh
cluster, and the difference between them is the cost of the extra elements,
so starting and stopping do not count. glibc's memset and memcpy are told
never to use `rep stosb`/`rep movsb` (GLIBC_TUNABLES), which callgrind
counts once per byte (an 11 KB calloc would count 11,000 instructions, a
few hundred cycles on the machine): they count as the vector loops they
become instead. Splits are 262,144 records
(--split-size and --max-split-size of the dispatcher): what a worker asks
for at full speed, 50 ms of its pipeline (--split-target-ms), where under
callgrind, 50 times slower, it would ask for splits smaller than the
shuffle's buffer. The consumer keeps one request in flight
(--max-outstanding 1), so that each pass of the worker's loop and of the
consumer's answers one batch: with more in flight, how many batches a pass
finds depends on how callgrind happened to interleave the threads, and the
loops' instructions a batch moved by a thousand or more between runs (the
plain ratio read 0.85 to 1.04 for the same build; lock-step, 0.922-0.926 in
three runs). Lock-step still moves by a few hundred (one build's worker
under DYNAMIC read 13,378 to 13,753 in five runs, the plain ratio 0.93 to
0.99, on 2026-11-29): compare builds over several runs each, or a
function's own count in the kept files. Prints one JSON line per shape with
the instructions per batch of the worker and of the consumer under each
policy and ratio = OFF / DYNAMIC of their sum (1.0: DYNAMIC costs nothing
more), then one line with the smallest ratio.

Run with the Release build: bench/dynamic_instructions.py --build build-release
(about a minute; needs valgrind)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build-release')
ap.add_argument('--elements', type=int, default=1000000, help='the smaller size; the larger is twice it')
ap.add_argument('--shapes', default='plain,shuffle',
                help='plain, shuffle, epochs, comma-separated (epochs: a repeat over a range of --epoch-elements)')
ap.add_argument('--epoch-elements', type=int, default=2048,
                help='the epochs shape: elements an epoch (--elements rounded down to whole epochs)')
ap.add_argument('--workers', type=int, default=1, help='workers in the cluster (their instructions are summed)')
ap.add_argument('--keep', metavar='DIR', help='keep the callgrind files in DIR (for callgrind_annotate)')
ap.add_argument('--no-shm', action='store_true',
                help='the consumer reads over TCP, not through shared memory (sluice-cat --no-shm)')
ap.add_argument('--max-outstanding', type=int, default=1,
                help='the consumer\'s requests in flight (1: lock-step, the same count run after run)')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, binary, child_env  # noqa: E402

BATCH = 1024
SPLIT = 262144
# String instructions as the vector loops they are on the machine (see
# above), for every daemon and the consumer (child_env() copies it).
os.environ['GLIBC_TUNABLES'] = ('glibc.cpu.x86_rep_stosb_threshold=0x7fffffffffffffff:'
                                'glibc.cpu.x86_rep_movsb_threshold=0x7fffffffffffffff')
if not shutil.which('valgrind'):
    sys.exit('bench: valgrind not found (scripts/install-deps.sh installs it)')


def spec(shape, n):
    if shape == 'epochs':
        return {"source": {"type": "range", "start": 0, "stop": args.epoch_elements},
                "ops": [{"op": "repeat", "count": n // args.epoch_elements},
                        {"op": "batch", "batch_size": BATCH, "drop_remainder": False}]}
    ops = [{"op": "shuffle", "buffer_size": 10000, "seed": 7}] if shape == 'shuffle' else []
    ops.append({"op": "batch", "batch_size": BATCH, "drop_remainder": False})
    return {"source": {"type": "range", "start": 0, "stop": n}, "ops": ops}


def instructions(path):
    """The total of a callgrind output file (its 'summary:' line)."""
    with open(path) as f:
        for line in f:
            if line.startswith('summary:'):
                return int(line.split()[1])
    sys.exit('bench: no summary in ' + path)


def job(shape, sharding, n, out):
    """(worker instructions, consumer instructions) of one job of n elements on a fresh cluster."""
    c = Cluster(workers=0, dispatcher_args=['--split-size', str(SPLIT), '--max-split-size', str(SPLIT)])
    try:
        for k in range(args.workers):
            vg = ['valgrind', '--tool=callgrind', '--callgrind-out-file=%s.worker%d' % (out, k)]
            c._start(vg + [binary('sluice-workerd'), '--dispatcher', c.dispatcher.addr, '--port', '0',
                           '--admin-port', '0'], 'worker%d' % k)
        c.wait_workers_registered(args.workers, timeout=120)
        argv = ['valgrind', '--tool=callgrind', '--callgrind-out-file=%s.cat' % out]
        argv += c.cat_argv(spec(shape, n), ['--sharding', sharding, '--max-outstanding', str(args.max_outstanding),
                                            '--per-worker-outstanding', str(min(args.max_outstanding, 16))] +
                           (['--no-shm'] if args.no_shm else []),
                           fmt='count')
        r = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=1800)
        if r.returncode != 0:
            sys.exit('bench: sluice-cat failed: ' + r.stderr[-2000:])
    finally:
        bad = c.close()  # the worker exits on SIGTERM, and callgrind writes its file
        if bad:
            sys.exit('bench: daemons did not stop cleanly: %s' % bad)
    return sum(instructions('%s.worker%d' % (out, k)) for k in range(args.workers)), instructions(out + '.cat')


tmp = args.keep or tempfile.mkdtemp(prefix='sluice-instr-')
os.makedirs(tmp, exist_ok=True)
results = []
try:
    for shape in args.shapes.split(','):
        per_batch = {}
        for sharding in ('off', 'dynamic'):
            small = job(shape, sharding, args.elements, os.path.join(tmp, '%s-%s-1' % (shape, sharding)))
            large = job(shape, sharding, 2 * args.elements, os.path.join(tmp, '%s-%s-2' % (shape, sharding)))
            # Under OFF every worker reads the whole range: the consumer gets
            # workers times the batches.
            batches = args.elements / BATCH * (args.workers if sharding == 'off' else 1)
            per_batch[sharding] = [(large[i] - small[i]) / batches for i in range(2)]
        off, dyn = per_batch['off'], per_batch['dynamic']
        r = {"bench": "dynamic_instructions", "shape": shape, "elements": args.elements, "workers": args.workers,
             "baseline": "the same job under OFF", "unit": "instructions per batch of 1024 (callgrind)",
             "off": {"worker": round(off[0]), "consumer": round(off[1])},
             "dynamic": {"worker": round(dyn[0]), "consumer": round(dyn[1])}, "split_records": SPLIT,
             "max_outstanding": args.max_outstanding,
             "ratio": round(sum(off) / sum(dyn), 3)}
        results.append(r)
        print(json.dumps(r), flush=True)
finally:
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({"bench": "dynamic_instructions_min", "baseline": "the same job under OFF, per shape",
                  "ratio": min(r["ratio"] for r in results)}))
