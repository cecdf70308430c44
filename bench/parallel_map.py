#!/usr/bin/env python3
"""The JPEG pipeline of tests/data/tfrecord (parse_example, decode_jpeg,
random_crop, random_flip, resize to 160x160, normalize, batch), repeated to a few
thousand images, run in-process by bench_parallel_map: once sequential (the
baseline, no num_parallel_calls) and once with num_parallel_calls on every
element-wise op (one fused parallel stage), in the same run. Prints one JSON
line:

  {"bench": "parallel_map", "sequential_ips": x, "parallel_ips": y, "ratio": y/x, "threads": T, ...}

Each side runs --runs times and keeps its best. The ratio is bounded by the
cores the machine gives the run: about min(threads, idle cores).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.abspath(os.path.join(HERE, '..', 'tests', 'data', 'tfrecord'))

ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--threads', type=int, default=2)
ap.add_argument('--repeat', type=int, default=100)
ap.add_argument('--runs', type=int, default=3)
args = ap.parse_args()

bench = os.path.join(args.build, 'bench', 'bench_parallel_map')
if not os.access(bench, os.X_OK):
    sys.exit(f'bench: {bench} not built (cmake --build {args.build} --target bench_parallel_map)')


def spec(calls):
    par = {'num_parallel_calls': calls} if calls else {}
    return {"source": {"type": "tfrecord", "files": [os.path.join(DATA, "images-*.tfrecord")]},
            "ops": [{"op": "repeat", "count": args.repeat},
                    dict({"op": "parse_example", "features": {"id": {"dtype": "int64"},
                                                              "image/encoded": {"dtype": "bytes"}}}, **par),
                    dict({"op": "decode_jpeg", "key": "image/encoded"}, **par),
                    dict({"op": "random_crop", "key": "image/encoded", "size": [36, 36], "seed": 1}, **par),
                    dict({"op": "random_flip", "key": "image/encoded", "seed": 2}, **par),
                    dict({"op": "resize", "key": "image/encoded", "size": [160, 160]}, **par),
                    dict({"op": "normalize", "key": "image/encoded", "mean": [0.5, 0.5, 0.5],
                          "std": [0.25, 0.25, 0.25], "scale": True}, **par),
                    {"op": "batch", "batch_size": 32}]}


def run(calls):
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
        json.dump(spec(calls), f)
        path = f.name
    try:
        best = None
        for _ in range(args.runs):
            r = subprocess.run([bench, path, DATA, str(args.threads)], capture_output=True, text=True, check=True)
            m = json.loads(r.stdout)
            ips = m['elements'] / m['seconds']
            best = ips if best is None or ips > best else best
        return best, m['elements']
    finally:
        os.unlink(path)


seq, n = run(None)
par, n2 = run(args.threads)
assert n == n2
print(json.dumps({"bench": "parallel_map", "images": n, "threads": args.threads,
                  "sequential_ips": round(seq, 1), "parallel_ips": round(par, 1), "ratio": round(par / seq, 3),
                  "cpus": os.cpu_count()}))
