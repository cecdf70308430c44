#!/usr/bin/env python3
"""Reads ~1 GiB of page-cached TFRecord files with bench_tfrecord (io_uring,
both CRCs checked on every record) and compares the rate with fio's
sequential io_uring read of the same files (1 MiB blocks, depth 4), measured
in the same run. Prints one JSON line:

  {"bench": "tfrecord_read", "sluice_GBps": x, "fio_GBps": y, "ratio": x/y, "target": 0.9, ...}

sluice_GBps is bench_tfrecord at the reader's defaults (4 reads of 256 KiB in
flight); sluice_4x1MiB_GBps is the same with fio's 4 x 1 MiB, for the record.

Then a second line for many small files, where opening a file costs more
than reading it: --small-files files of one 100-byte record each, read with
io_uring and, as the baseline in the same run, with pread (best of --runs
each; ratio = pread's seconds over io_uring's, 1.0 when a ring costs nothing):

  {"bench": "small_files_read", "files": 2000, "uring_files_per_s": x, "pread_files_per_s": y, "ratio": x/y}

With a ring set up and torn down for every file this read 0.39-0.44 of
pread here; with a closed reader's ring kept for the next one
(storage/reader.c), 0.71-0.98 (2026-11-29, two runs each).

The files (8 x 128 MiB of 100 KiB records of random bytes) are written here
with CRCs computed in Python, independently of storage/crc32c.c, into a temp
dir under /tmp that is removed at the end. Each side runs --runs times and
keeps its best, so that a stray hiccup of the machine does not decide.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--files', type=int, default=8)
ap.add_argument('--file-mib', type=int, default=128)
ap.add_argument('--record-kib', type=int, default=100)
ap.add_argument('--runs', type=int, default=3)
ap.add_argument('--engine', default='uring')
ap.add_argument('--small-files', type=int, default=2000)
args = ap.parse_args()

bench = os.path.join(args.build, 'bench', 'bench_tfrecord')
if not os.access(bench, os.X_OK):
    sys.exit(f'bench: {bench} not built (cmake --build {args.build} --target bench_tfrecord)')
if not shutil.which('fio'):
    sys.exit('bench: fio is not installed (scripts/install-deps.sh installs it)')


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def framed(data):
    """One TFRecord: length, its masked CRC, the data, its masked CRC."""
    length = struct.pack('<Q', len(data))
    return length + struct.pack('<I', masked(length)) + data + struct.pack('<I', masked(data))


assert crc32c(b'123456789') == 0xE3069283

# Pure-Python CRC32C runs at a few MB/s, so a pool of distinct records is
# framed once and the files are filled with them in random order.
rng = random.Random(7)
record_len = args.record_kib * 1024
pool = []
for _ in range(24):
    pool.append(framed(rng.randbytes(record_len)))

tmp = tempfile.mkdtemp(prefix='sl-bench-tfrecord-', dir='/tmp')
try:
    files = []
    per_file = args.file_mib * (1 << 20) // len(pool[0])
    for i in range(args.files):
        path = os.path.join(tmp, f'bench-{i:05d}-of-{args.files:05d}.tfrecord')
        with open(path, 'wb') as f:
            for _ in range(per_file):
                f.write(pool[rng.randrange(len(pool))])
        files.append(path)
    total = sum(os.path.getsize(p) for p in files)

    # Once through the page cache, so both sides read from memory.
    subprocess.run(['cat'] + files, stdout=subprocess.DEVNULL, check=True)

    def sluice_once(*io):
        r = subprocess.run([bench, '--engine', args.engine, *io] + files, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit('bench: bench_tfrecord failed: ' + r.stderr[-2000:])
        out = json.loads(r.stdout)
        if out['file_bytes'] != total or out['records'] != per_file * args.files:
            sys.exit(f'bench: bench_tfrecord read {out} of {total} bytes')
        return out['GBps']

    def fio_once():
        r = subprocess.run(['fio', '--name=read', '--ioengine=io_uring', '--rw=read', '--bs=1M', '--iodepth=4',
                            '--numjobs=1', '--filename=' + ':'.join(files), '--output-format=json'],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit('bench: fio failed: ' + r.stderr[-2000:])
        out = json.loads(r.stdout[r.stdout.index('{'):])
        read = out['jobs'][0]['read']
        # fio reads whole blocks only: each file's last partial MiB is left.
        if read['io_bytes'] < total - len(files) * (1 << 20):
            sys.exit(f'bench: fio read {read["io_bytes"]} of {total} bytes')
        return read['bw_bytes'] / 1e9

    # Sluice at its defaults (4 x 256 KiB in flight), and with fio's
    # 4 x 1 MiB for the record.
    sluice = sluice_1m = fio = 0.0
    for _ in range(args.runs):
        sluice = max(sluice, sluice_once())
        fio = max(fio, fio_once())
        sluice_1m = max(sluice_1m, sluice_once('--block-size', str(1 << 20), '--depth', '4'))

    small = []
    one = framed(rng.randbytes(100))
    for i in range(args.small_files):
        path = os.path.join(tmp, f'small-{i:05d}.tfrecord')
        with open(path, 'wb') as f:
            f.write(one)
        small.append(path)

    def small_once(engine):
        r = subprocess.run([bench, '--engine', engine] + small, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit('bench: bench_tfrecord failed: ' + r.stderr[-2000:])
        out = json.loads(r.stdout)
        if out['records'] != len(small):
            sys.exit(f'bench: bench_tfrecord read {out} of {len(small)} small files')
        return out['seconds']

    small_once('pread')  # into the page cache
    uring_s = pread_s = float('inf')
    for _ in range(args.runs):
        uring_s = min(uring_s, small_once('uring'))
        pread_s = min(pread_s, small_once('pread'))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print(json.dumps({"bench": "tfrecord_read", "sluice_GBps": round(sluice, 3), "fio_GBps": round(fio, 3),
                  "ratio": round(sluice / fio, 3), "target": 0.9, "sluice_4x1MiB_GBps": round(sluice_1m, 3),
                  "files": len(files), "bytes": total}))
print(json.dumps({"bench": "small_files_read", "files": len(small), "record_bytes": 100,
                  "uring_files_per_s": round(len(small) / uring_s), "pread_files_per_s": round(len(small) / pread_s),
                  "ratio": round(pread_s / uring_s, 3), "baseline": "the same files read with pread"}))
