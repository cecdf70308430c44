"""The builder's data-plane methods against running daemons: every method
writes a spec the dispatcher accepts and the workers run, over the TFRecord
fixtures and files the test writes, and the arrays hold what the files do."""
import collections
import gzip
import json
import os

import numpy as np

import sluice
from pycase import DataCase


class DataplaneBuilderTest(DataCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(os.path.join(cls.data, 'MANIFEST.json')) as f:
            cls.manifest = json.load(f)['files']
        cls.addr = cls.c.dispatcher.addr

    def batches(self, ds, sharding='dynamic'):
        """Every batch as a dict of copied arrays (the views die with the batch)."""
        out = []
        with ds.distribute(self.addr, sharding=sharding) as it:
            for b in it:
                out.append({k: (tuple(np.array(x) for x in v) if isinstance(v, tuple) else np.array(v))
                            for k, v in b.items()})
        return out

    def test_image_pipeline_with_every_image_method(self):
        ds = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
              .parse_example({'id': int, 'image/encoded': bytes, 'label': ('int64', [])})
              .decode_jpeg('image/encoded')
              .center_crop('image/encoded', 36, 36)
              .random_flip('image/encoded', direction='up_down', seed=5)
              .resize('image/encoded', 24, 20, dtype='uint8')
              .normalize('image/encoded', [0.5, 0.5, 0.5], [0.25, 0.25, 0.25], scale=True)
              .cast('label', np.int32)
              .batch(6))
        bs = self.batches(ds)
        ids = [int(i) for b in bs for i in b['id']]
        self.assertEqual(sorted(ids), list(range(32)))
        for b in bs:
            n = len(b['id'])
            self.assertEqual(b['image/encoded'].shape, (n, 24, 20, 3))
            self.assertEqual(b['image/encoded'].dtype, np.float32)
            self.assertEqual(b['label'].dtype, np.int32)
            # scale: pixels / 255, then (x - 0.5) / 0.25: within [-2, 2].
            self.assertGreaterEqual(float(b['image/encoded'].min()), -2.0)
            self.assertLessEqual(float(b['image/encoded'].max()), 2.0)
        labels = {int(i): int(l) for b in bs for i, l in zip(b['id'], b['label'])}
        want = {}  # ids count the images in file order
        for name in ('images-00000-of-00002.tfrecord', 'images-00001-of-00002.tfrecord'):
            for im in self.manifest[name]['images']:
                want[len(want)] = im['label']
        self.assertEqual(labels, want)

    def test_random_resized_crop_as_torchvision_trains(self):
        # RandomResizedCrop, RandomHorizontalFlip, ToTensor + Normalize, on
        # the workers, every image once under DYNAMIC.
        ds = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
              .parse_example({'id': int, 'image/encoded': bytes})
              .decode_jpeg('image/encoded')
              .random_resized_crop('image/encoded', 28, 24, seed=4)
              .random_flip('image/encoded', seed=4)
              .normalize('image/encoded', [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], scale=True)
              .batch(8))
        bs = self.batches(ds)
        self.assertEqual(sorted(int(i) for b in bs for i in b['id']), list(range(32)))
        for b in bs:
            img = b['image/encoded']
            self.assertEqual(img.shape, (len(b['id']), 28, 24, 3))
            self.assertEqual(img.dtype, np.float32)
            # (x / 255 - mean) / std for x in [0, 255]
            self.assertGreaterEqual(float(img.min()), (0 - 0.485) / 0.229 - 1e-4)
            self.assertLessEqual(float(img.max()), (1 - 0.406) / 0.225 + 1e-4)
        # uint8 out, and a bad scale refused by the dispatcher, naming the field.
        u8 = self.batches(sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
                          .parse_example({'image/encoded': bytes})
                          .decode_jpeg('image/encoded')
                          .random_resized_crop('image/encoded', 16, 16, dtype=np.uint8)
                          .batch(32))
        self.assertEqual(sum(len(b['image/encoded']) for b in u8), 32)
        for b in u8:
            self.assertEqual(b['image/encoded'].dtype, np.uint8)
            self.assertEqual(b['image/encoded'].shape[1:], (16, 16, 3))
        bad = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
               .parse_example({'image/encoded': bytes})
               .decode_jpeg('image/encoded')
               .random_resized_crop('image/encoded', 8, 8, scale=(0.5, 2)))
        with self.assertRaises(sluice.SpecError) as cm:
            self.batches(bad)
        self.assertIn('$.ops[2].scale: must be [lo, hi] with 0 < lo <= hi <= 1, got [0.5, 2]', str(cm.exception))

    def test_evaluation_resize_keeps_the_aspect_ratio_then_center_crop(self):
        # torchvision's evaluation transform, Resize(40) then CenterCrop(36).
        ds = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
              .parse_example({'id': int, 'image/encoded': bytes})
              .decode_jpeg('image/encoded')
              .resize('image/encoded', shorter_side=40, dtype='uint8')
              .center_crop('image/encoded', 36, 36)
              .batch(8))
        bs = self.batches(ds)
        self.assertEqual(sorted(int(i) for b in bs for i in b['id']), list(range(32)))
        for b in bs:
            self.assertEqual(b['image/encoded'].shape[1:], (36, 36, 3))
            self.assertEqual(b['image/encoded'].dtype, np.uint8)
        bad = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
               .parse_example({'image/encoded': bytes})
               .decode_jpeg('image/encoded')
               .op('resize', key='image/encoded', size=[8, 8], shorter_side=8))
        with self.assertRaises(sluice.SpecError) as cm:
            self.batches(bad)
        self.assertIn('$.ops[2]: give size or shorter_side, not both', str(cm.exception))

    def test_parse_example_python_dtypes_and_varlen(self):
        ds = (sluice.tfrecord(os.path.join(self.data, 'varlen-*.tfrecord'))
              .parse_example({'id': int, 'tokens': {'dtype': int, 'varlen': True}})
              .padded_batch(10))
        got = {}
        for b in self.batches(ds, sharding='off'):
            for i, row in zip(b['id'], b['tokens']):
                got.setdefault(int(i), []).append(row)
        lengths = self.manifest['varlen-00000-of-00001.tfrecord']['token_lengths']
        self.assertEqual(sorted(got), list(range(100)))
        for i, rows in got.items():
            self.assertEqual(len(rows), 2)  # OFF: once per worker
            n = lengths[i]
            self.assertEqual(rows[0][:n].tolist(), [i * 100 + k for k in range(n)])

    def test_gzip_text_lines_and_fixed_length_records(self):
        lines = ['line %d' % i for i in range(300)]
        with gzip.open(os.path.join(self.data, 'lines.txt.gz'), 'wt') as f:
            f.write('\n'.join(lines) + '\n')
        ds = sluice.text_lines(os.path.join(self.data, 'lines.txt.gz'), compression='gzip').batch(50)
        got = [x for b in self.batches(ds) for x in b['line'].tolist()]
        self.assertEqual(sorted(got), sorted(s.encode() for s in lines))

        recs = [bytes([i]) * 8 for i in range(40)]
        with open(os.path.join(self.data, 'records.bin'), 'wb') as f:
            f.write(b'HEAD' + b''.join(recs) + b'FT')
        ds = sluice.fixed_length_records(os.path.join(self.data, 'records.bin'), 8, header_bytes=4,
                                         footer_bytes=2, name='r').batch(7)
        got = collections.Counter(x for b in self.batches(ds) for x in b['r'].tolist())
        self.assertEqual(got, collections.Counter(recs))
