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

    def test_color_jitter_matches_torchvision_arithmetic(self):
        # Each adjustment alone at a fixed factor ([f, f]) against
        # torchvision's functional code for uint8 tensors, written here in
        # torch: the same float32 steps, truncated to uint8 after each.
        import torch

        def blend(img1, img2, ratio):
            return (ratio * img1 + (1.0 - ratio) * img2).clamp(0, 255).to(torch.uint8)

        def gray(img):
            r, g, b = img.unbind(0)
            return (0.2989 * r + 0.587 * g + 0.114 * b).to(torch.uint8).unsqueeze(0)

        def rgb2hsv(x):
            r, g, b = x.unbind(0)
            maxc, minc = torch.max(x, dim=0).values, torch.min(x, dim=0).values
            eqc = maxc == minc
            cr = maxc - minc
            ones = torch.ones_like(maxc)
            s = cr / torch.where(eqc, ones, maxc)
            div = torch.where(eqc, ones, cr)
            rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
            h = ((maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc) +
                 ((maxc != g) & (maxc != r)) * (4.0 + gc - rc))
            return torch.stack((torch.fmod(h / 6.0 + 1.0, 1.0), s, maxc))

        def hsv2rgb(x):
            h, s, v = x.unbind(0)
            i = torch.floor(h * 6.0)
            f = h * 6.0 - i
            i = i.to(torch.int32) % 6
            p = torch.clamp(v * (1.0 - s), 0.0, 1.0)
            q = torch.clamp(v * (1.0 - s * f), 0.0, 1.0)
            t = torch.clamp(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
            mask = (i.unsqueeze(0) == torch.arange(6).view(-1, 1, 1)).to(x.dtype)
            a = torch.stack((torch.stack((v, q, p, p, t, v)), torch.stack((t, v, v, q, p, p)),
                             torch.stack((p, p, t, v, v, q))))
            return torch.einsum('ijk, xijk -> xjk', mask, a)

        def hue(img, f):
            hsv = rgb2hsv(img.to(torch.float32) / 255.0)
            h, s, v = hsv.unbind(0)
            return (hsv2rgb(torch.stack(((h + f) % 1.0, s, v))) * 255.0).to(torch.uint8)

        ref = {'brightness': lambda img, f: blend(img, torch.zeros_like(img), f),
               'contrast': lambda img, f: blend(img, torch.mean(gray(img).to(torch.float32), dim=(-3, -2, -1),
                                                                keepdim=True), f),
               'saturation': lambda img, f: blend(img, gray(img), f),
               'hue': hue}
        base = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
                .parse_example({'id': int, 'image/encoded': bytes})
                .decode_jpeg('image/encoded'))
        plain = {int(b['id'][0]): b['image/encoded'][0] for b in self.batches(base.batch(1))}
        for name, f in (('brightness', 1.3), ('brightness', 0.55), ('contrast', 1.6), ('contrast', 0.4),
                        ('saturation', 1.7), ('saturation', 0.2), ('hue', 0.21), ('hue', -0.37)):
            # f as float32, as torch draws it
            f = float(np.float32(f))
            got = {int(b['id'][0]): b['image/encoded'][0]
                   for b in self.batches(base.color_jitter('image/encoded', **{name: (f, f)}).batch(1))}
            self.assertEqual(sorted(got), list(range(32)))
            same = total = 0
            for i, img in got.items():
                want = ref[name](torch.from_numpy(plain[i]).permute(2, 0, 1), f).permute(1, 2, 0).numpy()
                diff = np.abs(img.astype(np.int16) - want.astype(np.int16))
                self.assertLessEqual(int(diff.max()), 1, '%s %g image %d' % (name, f, i))
                same += int((diff == 0).sum())
                total += diff.size
            self.assertGreaterEqual(same / total, 0.999, '%s %g: %d of %d values equal' % (name, f, same, total))
        # random_grayscale with p 1: torchvision's rgb_to_grayscale, 3 channels kept.
        got = {int(b['id'][0]): b['image/encoded'][0]
               for b in self.batches(base.random_grayscale('image/encoded', p=1).batch(1))}
        for i, img in got.items():
            want = gray(torch.from_numpy(plain[i]).permute(2, 0, 1)).expand(3, -1, -1).permute(1, 2, 0).numpy()
            self.assertTrue(np.array_equal(img, want), 'grayscale of image %d' % i)
        # random_solarize with p 1 against torchvision's solarize of a uint8 tensor:
        # torch.where(img >= threshold, 255 - img, img); a fractional threshold too.
        for threshold in (128, 100.5, 0, 255):
            got = {int(b['id'][0]): b['image/encoded'][0]
                   for b in self.batches(base.random_solarize('image/encoded', threshold, p=1).batch(1))}
            for i, img in got.items():
                t = torch.from_numpy(plain[i])
                want = torch.where(t >= threshold, 255 - t, t).numpy()
                self.assertTrue(np.array_equal(img, want), 'solarize %g of image %d' % (threshold, i))
        # gaussian_blur at a fixed sigma against torchvision's: its kernel, reflection
        # padding, a 2-D convolution in float32, rounded. The 2-D sum runs in another
        # order than Sluice's two 1-D passes: within one unit.
        def blur(img, kh, kw, sigma):
            def k1(k):
                x = torch.linspace(-(k - 1) * 0.5, (k - 1) * 0.5, steps=k)
                pdf = torch.exp(-0.5 * (x / sigma).pow(2))
                return pdf / pdf.sum()
            kernel = torch.mm(k1(kh)[:, None], k1(kw)[None, :]).expand(img.shape[0], 1, kh, kw)
            x = torch.nn.functional.pad(img.to(torch.float32)[None], [kw // 2, kw // 2, kh // 2, kh // 2],
                                        mode='reflect')
            return torch.round(torch.nn.functional.conv2d(x, kernel, groups=img.shape[0])[0]).to(torch.uint8)

        for kh, kw, sigma in ((5, 5, 1.5), (9, 3, 0.7), (1, 7, 2.0)):
            sigma = float(np.float32(sigma))
            op = base.gaussian_blur('image/encoded', (kh, kw), sigma=sigma)
            got = {int(b['id'][0]): b['image/encoded'][0] for b in self.batches(op.batch(1))}
            same = total = 0
            for i, img in got.items():
                want = blur(torch.from_numpy(plain[i]).permute(2, 0, 1), kh, kw, sigma).permute(1, 2, 0).numpy()
                diff = np.abs(img.astype(np.int16) - want.astype(np.int16))
                self.assertLessEqual(int(diff.max()), 1, 'blur %dx%d %g image %d' % (kh, kw, sigma, i))
                same += int((diff == 0).sum())
                total += diff.size
            self.assertGreaterEqual(same / total, 0.999, 'blur %dx%d: %d of %d equal' % (kh, kw, same, total))
        # All four, drawn per element in a random order: seeded, so two runs agree.
        jit = base.color_jitter('image/encoded', brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, seed=3)
        self.assertEqual(jit.spec['ops'][-1]['brightness'], [0.6, 1.4])
        self.assertEqual(jit.spec['ops'][-1]['hue'], [-0.1, 0.1])
        one = {int(b['id'][0]): b['image/encoded'][0] for b in self.batches(jit.batch(1), sharding='off')}
        two = {int(b['id'][0]): b['image/encoded'][0] for b in self.batches(jit.batch(1), sharding='off')}
        self.assertTrue(all(np.array_equal(one[i], two[i]) for i in one))
        self.assertTrue(any(not np.array_equal(one[i], plain[i]) for i in one))

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
