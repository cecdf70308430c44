#!/usr/bin/env python3
"""Images per second of an ImageNet-style JPEG input pipeline, Sluice against
PyTorch's DataLoader, on the same files in the same run. Prints one JSON line:

  {"bench": "jpeg_pipeline", "sluice_images_per_s": x, "torch_images_per_s": y,
   "ratio": x / y, "target": 3.0, ...}

The pipeline, on both sides: read TFRecord files of tf.train.Example records,
parse the Example (image/encoded, image/class/label), decode the JPEG to RGB,
take a random 256 x 256 crop, flip it left-right with probability 1/2, resize
it to 224 x 224 (bilinear, uint8), normalize to float32 with ImageNet's mean
and std on x / 255, and batch 64 images (HWC, float32) with their labels.

- Sluice: a real dispatcher and ONE sluice-workerd running the spec with
  --threads --workers, consumed by the Python client (NumPy views). With
  more than one thread the element-wise ops say num_parallel_calls
  "autotune" (--num-parallel-calls to give a number instead): the worker
  chooses their parallelism from their measured times and its CPUs, within
  --threads (docs/dataset-spec.md). The worker hands the batches over in
  shared memory, as it does to every client on its host (docs/protocol.md);
  with --tcp also (the default) the same runs read them over its TCP
  socket too, and "shm_vs_tcp" is the first rate over the second.
  "sluice_lent_share" is the share of the batches through shared memory
  that the worker lent from blocks made there, not copied (its counters,
  over every shared-memory run).
- PyTorch: a DataLoader over an IterableDataset with num_workers equal to
  Sluice's pipeline threads (1): TFRecord framing and the Example protobuf
  parsed in Python (a minimal wire-format parser; the CRCs are not checked
  there, which only favours it), PIL to decode, crop, flip and resize
  (Image.BILINEAR), NumPy to normalize, default_collate to batch.
  PIL's bilinear filter widens when it downscales (256 -> 224: a support of
  1.14 pixels each side instead of 1), a little more work than Sluice's
  resize (tf.image.resize's bilinear, two taps), and its pixels differ
  slightly; everything else is the same work.

--transform resized replaces the crop and the resize with torchvision's
ImageNet training crop, RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3):
Sluice's random_resized_crop (uint8, decoding only the window) then
random_flip; on the PyTorch side the same window drawn in Python as
torchvision's get_params draws it, then PIL's crop, flip and bilinear resize
(what torchvision's RandomResizedCrop does to a PIL image).

Each side skips --warmup batches and then times --batches batches; the two
run --runs times, alternately, and each keeps its best (the machine is
shared): "ratio" is the best against the best. "median_pair_ratio" is the
median of each run's Sluice rate over the DataLoader's run after it, which a
machine that slows or speeds up during the runs moves less. The data
(--images JPEGs at quality 90 in ImageNet's typical sizes, 500 x 375 the
commonest, in 8 shards; --image-scale 2 makes each side twice that) is
written once under BUILD/bench-data and reused by later runs.
"""
import argparse
import io
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', 'tests', 'integration'))
sys.path.insert(0, os.path.join(HERE, '..', 'client', 'python'))

ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--images', type=int, default=2000, help='JPEGs in the data set')
ap.add_argument('--shards', type=int, default=8)
ap.add_argument('--image-scale', type=float, default=1.0,
                help='each side of the images times this (2: 1000 x 750 the commonest, as in datasets of larger '
                'photos; random_resized_crop windows then often hold twice the output, decoded at a DCT scale)')
ap.add_argument('--crop', type=int, default=256)
ap.add_argument('--size', type=int, default=224)
ap.add_argument('--transform', choices=['crop', 'resized'], default='crop',
                help='crop: a --crop square crop, then a flip and a resize to --size; resized: RandomResizedCrop '
                     'to --size, then a flip')
ap.add_argument('--batch', type=int, default=64)
ap.add_argument('--warmup', type=int, default=2, help='batches skipped before timing')
ap.add_argument('--batches', type=int, default=24, help='batches timed')
ap.add_argument('--runs', type=int, default=2)
ap.add_argument('--workers', type=int, default=1, help='Sluice pipeline threads = DataLoader num_workers')
ap.add_argument('--only', choices=['sluice', 'torch'], help='run one side (for profiling)')
ap.add_argument('--tcp', choices=['also', 'only', 'no'], default='also',
                help='Sluice\'s batches also (or only, or not) over TCP instead of shared memory, as a baseline '
                     'of the transport')
ap.add_argument('--num-parallel-calls', default='autotune',
                help='the element-wise ops\' num_parallel_calls when --workers > 1: "autotune" or a number')
args = ap.parse_args()
BUILD = os.path.abspath(args.build)
os.environ['SLUICE_BUILD'] = BUILD
os.environ.setdefault('SLUICE_LIB', os.path.join(BUILD, 'client', 'libsluice.so'))

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
# ImageNet's common sizes (width, height), the first the commonest.
SIZES = [(500, 375)] * 6 + [(375, 500)] * 2 + [(500, 333), (333, 500), (640, 480), (500, 400), (400, 300),
                                               (500, 500), (800, 600), (450, 338)]

# ---- the data ----


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    if wire == 2:
        return varint(num << 3 | 2) + varint(len(payload)) + payload
    return varint(num << 3 | wire) + payload


def example(features):
    """A serialized tf.train.Example from {name: bytes | int}."""
    entries = b''
    for name, v in features.items():
        if isinstance(v, bytes):
            feature = field(1, 2, field(1, 2, v))                # bytes_list { value: v }
        else:
            feature = field(3, 2, field(1, 2, varint(v)))        # int64_list { value: [v] } (packed)
        entries += field(1, 2, field(1, 2, name.encode()) + field(2, 2, feature))
    return field(1, 2, entries)                                  # Example { features { feature {...} } }


def make_image(rng, np, Image, ImageDraw, w, h):
    """A photo-like picture: smooth colour fields, a few shapes with edges,
    mid-frequency texture and sensor noise."""
    def field_of(gh, gw, amp):
        small = (rng.random((gh, gw, 3)) * amp).astype(np.float32)
        return np.stack([np.asarray(Image.fromarray(small[:, :, k], mode='F').resize((w, h), Image.BICUBIC))
                         for k in range(3)], axis=2)
    img = 40 + field_of(4, 5, 170) + field_of(24, 30, 40) + field_of(90, 120, 60) - 50
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(pil)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=colour)
    arr = np.asarray(pil).astype(np.float32) + rng.normal(0, 10, (h, w, 3)).astype(np.float32)
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def make_data():
    """Writes the shards once; returns (directory, their paths, mean JPEG bytes)."""
    tag = 'jpeg-v2-%d-%d' % (args.images, args.shards) + ('-x%g' % args.image_scale if args.image_scale != 1 else '')
    d = os.path.join(BUILD, 'bench-data', tag)
    paths = [os.path.join(d, 'images-%05d-of-%05d.tfrecord' % (i, args.shards)) for i in range(args.shards)]
    done = os.path.join(d, 'DONE.json')
    if os.path.exists(done):
        return d, paths, json.load(open(done))['mean_jpeg_bytes']
    import numpy as np
    from PIL import Image, ImageDraw
    writer = os.path.join(BUILD, 'bench', 'bench_tfrecord_write')
    if not os.access(writer, os.X_OK):
        sys.exit('bench: %s not built' % writer)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(20261123)
    total = 0
    for s, path in enumerate(paths):
        proc = subprocess.Popen([writer, path + '.tmp'], stdin=subprocess.PIPE)
        for i in range(s, args.images, args.shards):
            w, h = SIZES[int(rng.integers(0, len(SIZES)))]
            w, h = max(1, round(w * args.image_scale)), max(1, round(h * args.image_scale))
            buf = io.BytesIO()
            make_image(rng, np, Image, ImageDraw, w, h).save(buf, format='JPEG', quality=90)
            jpeg = buf.getvalue()
            total += len(jpeg)
            rec = example({'image/encoded': jpeg, 'image/class/label': i % 1000, 'image/height': h,
                           'image/width': w})
            proc.stdin.write(struct.pack('<Q', len(rec)) + rec)
        proc.stdin.close()
        if proc.wait() != 0:
            sys.exit('bench: bench_tfrecord_write failed for ' + path)
        os.replace(path + '.tmp', path)
    json.dump({'mean_jpeg_bytes': total // args.images}, open(done, 'w'))
    return d, paths, total // args.images


# ---- Sluice ----


def transform(par):
    """Sluice's ops between decode_jpeg and normalize."""
    if args.transform == 'resized':
        return [dict({"op": "random_resized_crop", "key": "image/encoded", "size": [args.size, args.size],
                      "dtype": "uint8"}, **par),
                dict({"op": "random_flip", "key": "image/encoded"}, **par)]
    return [dict({"op": "random_crop", "key": "image/encoded", "size": [args.crop, args.crop]}, **par),
            dict({"op": "random_flip", "key": "image/encoded"}, **par),
            dict({"op": "resize", "key": "image/encoded", "size": [args.size, args.size], "dtype": "uint8"}, **par)]


def resized_window(rng, w, h):
    """torchvision's RandomResizedCrop.get_params with its defaults: (x, y, cw, ch)."""
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    own = w / h
    if own < 3 / 4:
        cw, ch = w, int(round(w / (3 / 4)))
    elif own > 4 / 3:
        cw, ch = int(round(h * (4 / 3))), h
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


# The workers' counts of batches through shared memory, and of those lent
# (summed over the Sluice runs).
shm_counts = {}


def sluice_rate(data_dir, shared_memory=True):
    import sluice
    from harness import Cluster, metric
    c = Cluster(workers=1, dispatcher_args=['--data-root', data_dir],
                worker_args=['--data-root', data_dir, '--threads', str(args.workers), '--buffer-mb', '128'])
    try:
        c.wait_workers_registered(1)
        # With more than one thread, the element-wise ops run as one parallel
        # stage within --workers threads (the worker's --threads).
        calls = args.num_parallel_calls if args.num_parallel_calls == 'autotune' else int(args.num_parallel_calls)
        par = {"num_parallel_calls": calls} if args.workers > 1 else {}
        decode = dict({"op": "decode_jpeg", "key": "image/encoded", "channels": 3}, **par)
        spec = {"source": {"type": "tfrecord", "files": [os.path.join(data_dir, 'images-*.tfrecord')]},
                "ops": [{"op": "repeat"},
                        dict({"op": "parse_example", "features": {"image/encoded": {"dtype": "bytes"},
                                                                  "image/class/label": {"dtype": "int64"}}}, **par),
                        decode] + transform(par) + [
                        dict({"op": "normalize", "key": "image/encoded", "mean": MEAN, "std": STD, "scale": True},
                             **par),
                        {"op": "batch", "batch_size": args.batch, "drop_remainder": True},
                        {"op": "take", "count": args.warmup + args.batches}]}
        it = sluice.distribute(spec, c.dispatcher.addr, max_outstanding=4, shared_memory=shared_memory)
        n = 0
        t0 = None
        for b in it:
            img = b['image/encoded']
            assert img.shape == (args.batch, args.size, args.size, 3) and str(img.dtype) == 'float32', img.shape
            n += 1
            if n == args.warmup:
                t0 = time.perf_counter()
        dt = time.perf_counter() - t0
        it.close()
        if n != args.warmup + args.batches:
            sys.exit('bench: sluice yielded %d batches, expected %d' % (n, args.warmup + args.batches))
        for name in ('sluice_worker_batches_shm_total', 'sluice_worker_batches_shm_lent_total'):
            shm_counts[name] = shm_counts.get(name, 0) + metric(c.workers[0].admin_port, name, default=0)
        return args.batches * args.batch / dt
    finally:
        bad = c.close()
        if bad:
            sys.exit('bench: daemons did not stop cleanly: %r' % bad)


# ---- PyTorch ----


def read_varint(b, i):
    v = shift = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            return v, i
        shift += 7


def parse_fields(b):
    """(field number, wire type, value) of a message's fields; value is a
    memoryview for length-delimited ones, an int for varints."""
    i, n = 0, len(b)
    while i < n:
        key, i = read_varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 2:
            ln, i = read_varint(b, i)
            yield num, wire, b[i:i + ln]
            i += ln
        elif wire == 0:
            v, i = read_varint(b, i)
            yield num, wire, v
        elif wire == 5:
            yield num, wire, b[i:i + 4]
            i += 4
        elif wire == 1:
            yield num, wire, b[i:i + 8]
            i += 8
        else:
            raise ValueError('bad wire type %d' % wire)


def parse_example(rec, want):
    """{name: value} for the features named in want ({name: 'bytes' | 'int64'})."""
    out = {}
    b = memoryview(rec)
    for num, _, features in parse_fields(b):
        if num != 1:
            continue
        for fnum, _, entry in parse_fields(features):
            if fnum != 1:
                continue
            name = feature = None
            for enum, _, v in parse_fields(entry):
                if enum == 1:
                    name = bytes(v).decode()
                elif enum == 2:
                    feature = v
            if name not in want:
                continue
            for kind, _, lst in parse_fields(feature):
                if want[name] == 'bytes' and kind == 1:
                    for vnum, _, v in parse_fields(lst):
                        if vnum == 1:
                            out[name] = bytes(v)
                elif want[name] == 'int64' and kind == 3:
                    for vnum, wire, v in parse_fields(lst):
                        if vnum == 1 and wire == 2:           # packed
                            out[name], _ = read_varint(v, 0)
                        elif vnum == 1:
                            out[name] = v
    return out


def torch_rate(paths):
    import numpy as np
    import torch
    from PIL import Image
    torch.set_num_threads(1)
    mean = np.array(MEAN, dtype=np.float32)
    std = np.array(STD, dtype=np.float32)
    want = {'image/encoded': 'bytes', 'image/class/label': 'int64'}
    crop, size = args.crop, args.size

    class Records(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            wid, nw = (info.id, info.num_workers) if info else (0, 1)
            rng = random.Random(wid)
            mine = paths[wid::nw]
            while True:                                      # repeat
                for p in mine:
                    with open(p, 'rb') as f:
                        while True:
                            hdr = f.read(12)
                            if len(hdr) < 12:
                                break
                            (ln,) = struct.unpack('<Q', hdr[:8])
                            rec = f.read(ln)
                            f.read(4)
                            ex = parse_example(rec, want)
                            img = Image.open(io.BytesIO(ex['image/encoded'])).convert('RGB')
                            w, h = img.size
                            if args.transform == 'resized':
                                x, y, cw, ch = resized_window(rng, w, h)
                                img = img.crop((x, y, x + cw, y + ch)).resize((size, size), Image.BILINEAR)
                                if rng.random() < 0.5:
                                    img = img.transpose(Image.FLIP_LEFT_RIGHT)
                            else:
                                y, x = rng.randint(0, h - crop), rng.randint(0, w - crop)
                                img = img.crop((x, y, x + crop, y + crop))
                                if rng.random() < 0.5:
                                    img = img.transpose(Image.FLIP_LEFT_RIGHT)
                                img = img.resize((size, size), Image.BILINEAR)
                            a = (np.asarray(img, dtype=np.float32) / np.float32(255.0) - mean) / std
                            yield a, ex['image/class/label']

    dl = torch.utils.data.DataLoader(Records(), batch_size=args.batch, num_workers=args.workers)
    it = iter(dl)
    for _ in range(args.warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(args.batches):
        img, label = next(it)
        assert tuple(img.shape) == (args.batch, size, size, 3) and img.dtype == torch.float32
    dt = time.perf_counter() - t0
    del it
    return args.batches * args.batch / dt


def main():
    data_dir, paths, mean_bytes = make_data()
    s_runs, t_runs, tcp_runs = [], [], []
    for _ in range(args.runs):
        if args.only != 'torch' and args.tcp != 'only':
            s_runs.append(sluice_rate(data_dir))
        if args.only != 'torch' and args.tcp != 'no':
            tcp_runs.append(sluice_rate(data_dir, shared_memory=False))
        if args.only != 'sluice':
            t_runs.append(torch_rate(paths))
    if args.tcp == 'only':
        s_runs = tcp_runs
    s_best, t_best = max(s_runs, default=0.0), max(t_runs, default=0.0)
    tcp_best = max(tcp_runs, default=0.0)
    print(json.dumps({
        "bench": "jpeg_pipeline",
        "sluice_images_per_s": round(s_best, 1),
        "torch_images_per_s": round(t_best, 1),
        "sluice_runs": [round(x, 1) for x in s_runs],
        "torch_runs": [round(x, 1) for x in t_runs],
        "ratio": round(s_best / t_best, 3) if s_best and t_best else None,
        "median_pair_ratio": (round(statistics.median(s / t for s, t in zip(s_runs, t_runs)), 3)
                              if s_runs and t_runs and all(t_runs) else None),
        "target": 3.0,
        "sluice_transport": "tcp" if args.tcp == 'only' else "shared memory",
        "sluice_tcp_runs": [round(x, 1) for x in tcp_runs],
        "shm_vs_tcp": round(s_best / tcp_best, 3) if s_best and tcp_best and args.tcp == 'also' else None,
        "sluice_lent_share": (round(shm_counts['sluice_worker_batches_shm_lent_total'] /
                                    shm_counts['sluice_worker_batches_shm_total'], 3)
                              if shm_counts.get('sluice_worker_batches_shm_total') else None),
        "sluice_workers": 1,
        "sluice_pipeline_threads": args.workers,
        "sluice_num_parallel_calls": args.num_parallel_calls if args.workers > 1 else None,
        "torch_num_workers": args.workers,
        "pipeline": ("tfrecord, parse_example, decode_jpeg, random_crop %dx%d, random_flip, resize %dx%d bilinear "
                     "uint8, normalize float32, batch %d" % (args.crop, args.crop, args.size, args.size, args.batch)
                     if args.transform == 'crop' else
                     "tfrecord, parse_example, decode_jpeg, random_resized_crop %dx%d uint8, random_flip, normalize "
                     "float32, batch %d" % (args.size, args.size, args.batch)),
        "images_timed": args.batches * args.batch,
        "warmup_images": args.warmup * args.batch,
        "dataset_images": args.images,
        "image_scale": args.image_scale,
        "mean_jpeg_bytes": mean_bytes,
        "jpeg_quality": 90,
    }))


if __name__ == '__main__':
    main()
