#!/usr/bin/env python3
"""Streams 1 MiB batches from one worker to one client over TCP
(sluice-cat --no-shm) and compares the rate with iperf3 on loopback,
measured in the same run; then the same stream as a client on the worker's
host gets it, through shared memory (docs/protocol.md, "Shared memory"),
against the TCP stream. Then batches of 8 KiB from 2 workers over TCP
against the same through shared memory. Prints one JSON line for each."""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--batches', type=int, default=3000)
ap.add_argument('--seconds', type=int, default=5, help='iperf3 duration')
ap.add_argument('--small-elements', type=int, default=20000000,
                help='the range read in batches of 1,024 from 2 workers, over TCP and through shared memory')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, summary  # noqa: E402

MIB_OF_INT64 = (1 << 20) // 8


def iperf3_gbps(seconds):
    if not shutil.which('iperf3'):
        return None
    srv = subprocess.Popen(['iperf3', '-s', '-1', '-p', '5299', '-B', '127.0.0.1'], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = subprocess.run(['iperf3', '-c', '127.0.0.1', '-p', '5299', '-t', str(seconds), '-J'],
                           capture_output=True, text=True, timeout=seconds + 30)
        return json.loads(r.stdout)['end']['sum_received']['bits_per_second'] / 8e9
    finally:
        srv.kill()
        srv.wait()


c = Cluster(workers=1, worker_args=['--buffer-mb', '64'])
try:
    c.wait_workers_registered(1)
    spec = {"source": {"type": "range", "start": 0, "stop": MIB_OF_INT64 * args.batches},
            "ops": [{"op": "batch", "batch_size": MIB_OF_INT64}]}
    runs = {}
    for name, extra in (('tcp', ['--no-shm']), ('shm', [])):
        rc, _, err = c.cat(spec, ['--sharding', 'off', '--max-outstanding', '8'] + extra, fmt='count', timeout=600)
        if rc != 0:
            sys.exit('bench: sluice-cat failed: ' + err[-2000:])
        runs[name] = summary(err)
finally:
    c.close()
# Small batches (1,024 int64, 8 KiB) from 2 workers: over TCP, as a trainer
# on another host reads them, against shared memory, alternating, the median
# of three each; with the client's page faults a batch (from the children's
# rusage): before small freed blocks were kept (2026-12-01) a window of them
# went back to the kernel and was faulted in again, 3.7 faults a batch, and
# TCP ran at a fifth of shared memory.
small = {'tcp': [], 'shm': []}
c = Cluster(workers=2)
try:
    c.wait_workers_registered(2)
    spec = {"source": {"type": "range", "stop": args.small_elements}, "ops": [{"op": "batch", "batch_size": 1024}]}
    for _ in range(3):
        for name, extra in (('tcp', ['--no-shm']), ('shm', [])):
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
            rc, _, err = c.cat(spec, ['--sharding', 'off'] + extra, fmt='count', timeout=600)
            if rc != 0:
                sys.exit('bench: sluice-cat failed: ' + err[-2000:])
            faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - before
            r = summary(err)
            small[name].append((r['elements'] / r['seconds'], faults / r['batches']))
finally:
    c.close()
s = runs['tcp']
sluice = s['bytes'] / s['seconds'] / 1e9
shm = runs['shm']['bytes'] / runs['shm']['seconds'] / 1e9
base = iperf3_gbps(args.seconds)
print(json.dumps({
    "bench": "stream_1mib_batches",
    "sluice_GBps": round(sluice, 3),
    "batches_per_s": round(s['batches'] / s['seconds'], 1),
    "baseline": "iperf3 loopback, one stream",
    "iperf3_GBps": round(base, 3) if base else None,
    "ratio": round(sluice / base, 3) if base else None,
    "shm_GBps": round(shm, 3),
    "shm_vs_tcp": round(shm / sluice, 3),
}))
tcp_rate = statistics.median(x[0] for x in small['tcp'])
shm_rate = statistics.median(x[0] for x in small['shm'])
print(json.dumps({
    "bench": "stream_8kib_batches",
    "workers": 2,
    "tcp_elements_per_s": round(tcp_rate),
    "baseline": "the same job through shared memory, alternating runs",
    "shm_elements_per_s": round(shm_rate),
    "tcp_vs_shm": round(tcp_rate / shm_rate, 3),
    "client_faults_per_batch": {k: round(statistics.median(x[1] for x in v), 2) for k, v in small.items()},
}))
