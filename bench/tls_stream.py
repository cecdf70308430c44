#!/usr/bin/env python3
"""The cost of TLS on the data stream: 1 MiB batches from one worker to one
client, with the cluster token alone and with the token under TLS 1.3, each
on its own cluster, alternating runs in the same command. Prints one JSON
line: bytes/s of each and the ratio TLS / token (docs/security.md; the goal
is at least 0.85). Both read over TCP (sluice-cat --no-shm): a client on the
worker's host otherwise takes the batches from shared memory, which TLS does
not cover (docs/protocol.md, "Shared memory")."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--batches', type=int, default=2000)
ap.add_argument('--runs', type=int, default=3)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
from harness import Cluster, summary  # noqa: E402
from test_security_auth import make_cert, token_file  # noqa: E402

MIB_OF_INT64 = (1 << 20) // 8

d = tempfile.mkdtemp(prefix='sluice-bench-tls-')
tok = ['--auth-token-file', token_file(d, 'token', os.urandom(32).hex())]
tls = {n: make_cert(d, 'ca', n) for n in ('dispatcher', 'worker', 'trainer')}
spec = {"source": {"type": "range", "start": 0, "stop": MIB_OF_INT64 * args.batches},
        "ops": [{"op": "batch", "batch_size": MIB_OF_INT64}]}
clusters = {
    'token': (Cluster(workers=1, dispatcher_args=tok, worker_args=tok + ['--buffer-mb', '64']), tok),
    'tls': (Cluster(workers=1, dispatcher_args=tok + tls['dispatcher'],
                    worker_args=tok + tls['worker'] + ['--buffer-mb', '64']), tok + tls['trainer']),
}
rates = {k: [] for k in clusters}
try:
    for c, _ in clusters.values():
        c.wait_workers_registered(1)
    for _ in range(args.runs):
        for name, (c, cargs) in clusters.items():
            rc, _, err = c.cat(spec, ['--sharding', 'off', '--max-outstanding', '8', '--no-shm'] + cargs, fmt='count',
                               timeout=600)
            if rc != 0:
                sys.exit('bench: sluice-cat (%s) failed: %s' % (name, err[-2000:]))
            s = summary(err)
            rates[name].append(s['bytes'] / s['seconds'] / 1e9)
finally:
    for c, _ in clusters.values():
        c.close()
    subprocess.run(['rm', '-rf', d])
token_gbps, tls_gbps = statistics.median(rates['token']), statistics.median(rates['tls'])
print(json.dumps({
    "bench": "tls_stream_1mib_batches",
    "tls_GBps": round(tls_gbps, 3),
    "baseline": "the same stream with the cluster token alone (no TLS), same run",
    "token_GBps": round(token_gbps, 3),
    "ratio": round(tls_gbps / token_gbps, 3),
    "runs": args.runs,
}))
