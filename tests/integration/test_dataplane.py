"""The data plane end to end: a dispatcher and two workers with --data-root
at a temporary copy of tests/data/tfrecord run real pipelines (tfrecord,
parse_example, image ops, batch) under DYNAMIC and OFF sharding, through
sluice-cat; paths outside the data root are refused at registration."""
import collections
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

from harness import Cluster, summary, values

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, '..', 'data', 'tfrecord')


def images_spec(data):
    """Item 7 of issue 3: parse, decode, random crop, flip, resize to 32x32,
    normalize, batch. The smallest fixture image is 38 high and 40 wide
    (MANIFEST.json), so a 36x36 crop fits every one."""
    return {"source": {"type": "tfrecord", "files": [os.path.join(data, "images-*.tfrecord")]},
            "ops": [{"op": "parse_example", "features": {"id": {"dtype": "int64"},
                                                         "image/encoded": {"dtype": "bytes"},
                                                         "label": {"dtype": "int64"}}},
                    {"op": "decode_jpeg", "key": "image/encoded", "channels": 3},
                    {"op": "random_crop", "key": "image/encoded", "size": [36, 36]},
                    {"op": "random_flip", "key": "image/encoded"},
                    {"op": "resize", "key": "image/encoded", "size": [32, 32]},
                    {"op": "normalize", "key": "image/encoded", "mean": [0.485, 0.456, 0.406],
                     "std": [0.229, 0.224, 0.225], "scale": True},
                    {"op": "batch", "batch_size": 5}]}


def basic_spec(data, batch=100):
    return {"source": {"type": "tfrecord", "files": os.path.join(data, "basic-*-of-00004.tfrecord")},
            "ops": [{"op": "parse_example", "features": {"id": {"dtype": "int64"}, "name": {"dtype": "bytes"}}},
                    {"op": "batch", "batch_size": batch}]}


def shape(v):
    """The shape of nested JSON lists."""
    s = []
    while isinstance(v, list):
        s.append(len(v))
        v = v[0] if v else None
    return s


class Dataplane(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-data-')
        cls.data = os.path.join(cls.tmp, 'tfrecord')
        shutil.copytree(FIXTURES, cls.data)
        with open(os.path.join(cls.data, 'MANIFEST.json')) as f:
            cls.manifest = json.load(f)['files']
        roots = ['--data-root', cls.data]
        cls.c = Cluster(workers=2, dispatcher_args=roots, worker_args=roots)
        cls.c.wait_workers_registered(2)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def assert_each(self, ids, times, n):
        counts = collections.Counter(ids)
        missing = [v for v in range(n) if counts[v] != times]
        extra = [v for v in counts if not 0 <= v < n]
        self.assertEqual((missing[:5], extra[:5]), ([], []))
        self.assertEqual(len(ids), times * n)

    def test_images_dynamic_every_id_once(self):
        rc, batches, err = self.c.cat(images_spec(self.data), ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assert_each(values(batches, 'id'), 1, 32)
        for b in batches:
            n = len(b['id'])
            self.assertEqual(shape(b['image/encoded']), [n, 32, 32, 3])
            self.assertEqual(len(b['label']), n)
            pixels = [x for row in b['image/encoded'] for line in row for px in line for x in px]
            self.assertTrue(all(isinstance(x, (int, float)) and -2.2 < x < 2.7 for x in pixels))
            self.assertTrue(any(isinstance(x, float) and x != int(x) for x in pixels), 'normalized floats')
        s = summary(err)
        self.assertEqual(s['elements'], 32)
        # float32: 32 images of 32 * 32 * 3 values of 4 bytes, and the int64 id and label.
        self.assertEqual(s['bytes'], 32 * (32 * 32 * 3 * 4 + 8 + 8))
        labels = {}
        for name in ('images-00000-of-00002.tfrecord', 'images-00001-of-00002.tfrecord'):
            for i, im in enumerate(self.manifest[name]['images']):
                labels[len(labels)] = im['label']
        got = dict(zip(values(batches, 'id'), values(batches, 'label')))
        self.assertEqual(got, labels)

    def test_basic_off_every_id_once_per_worker(self):
        rc, batches, err = self.c.cat(basic_spec(self.data), ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        ids = values(batches, 'id')
        self.assert_each(ids, 2, 1000)
        names = dict(zip(ids, values(batches, 'name')))
        self.assertEqual(names[0], 'rec-00000')
        self.assertEqual(names[999], 'rec-00999')
        self.assertEqual(len(batches), 20)

    def test_basic_dynamic_every_id_once(self):
        rc, batches, err = self.c.cat(basic_spec(self.data, batch=64), ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assert_each(values(batches, 'id'), 1, 1000)

    def test_varlen_tokens_are_ragged(self):
        spec = {"source": {"type": "tfrecord", "files": [os.path.join(self.data, "varlen-00000-of-00001.tfrecord")]},
                "ops": [{"op": "parse_example", "features": {"id": {"dtype": "int64"},
                                                             "tokens": {"dtype": "int64", "varlen": True}}},
                        {"op": "batch", "batch_size": 8}]}
        rc, batches, err = self.c.cat(spec, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        lengths = self.manifest['varlen-00000-of-00001.tfrecord']['token_lengths']
        seen = 0
        for b in batches:
            for i, toks in zip(b['id'], b['tokens']):
                self.assertEqual(toks, [i * 100 + k for k in range(lengths[i])])
                seen += 1
        self.assertEqual(seen, 100)

    def test_path_outside_the_data_root_is_refused_at_registration(self):
        spec = {"source": {"type": "text_lines", "files": ["/etc/passwd"]}}
        rc, batches, err = self.c.cat(spec, ['--sharding', 'off'])
        self.assertNotEqual(rc, 0)
        self.assertEqual(batches, [])
        self.assertIn('/etc/passwd', err)
        self.assertIn('outside every --data-root', err)

    def test_corrupt_record_fails_the_job_with_where(self):
        spec = {"source": {"type": "tfrecord", "files": [os.path.join(self.data, "corrupt-datacrc.tfrecord")]}}
        rc, batches, err = self.c.cat(spec, ['--sharding', 'dynamic'])
        self.assertNotEqual(rc, 0)
        self.assertIn('data crc mismatch in ', err)
        self.assertIn('corrupt-datacrc.tfrecord at offset 679 (record 7)', err)

    def test_truncated_file_is_refused_at_registration_unless_skipped(self):
        files = [os.path.join(self.data, "corrupt-truncated.tfrecord")]
        rc, batches, err = self.c.cat({"source": {"type": "tfrecord", "files": files}}, ['--sharding', 'off'])
        self.assertNotEqual(rc, 0)
        self.assertIn('truncated record in ', err)
        self.assertIn('corrupt-truncated.tfrecord at offset ', err)
        self.assertIn('(record 19)', err)
        complete = self.manifest['corrupt-truncated.tfrecord']['complete_records']
        spec = {"source": {"type": "tfrecord", "files": files, "on_corrupt": "skip"},
                "ops": [{"op": "batch", "batch_size": 4}]}
        for sharding, times in (('dynamic', 1), ('off', 2)):
            rc, batches, err = self.c.cat(spec, ['--sharding', sharding])
            self.assertEqual(rc, 0, err)
            self.assertEqual(summary(err)['elements'], complete * times)

    def test_skipped_records_are_counted_in_the_tasks(self):
        spec = {"source": {"type": "tfrecord", "on_corrupt": "skip",
                           "files": [os.path.join(self.data, "corrupt-datacrc.tfrecord")]},
                "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": 19}]}
        p = subprocess.Popen(self.c.cat_argv(spec, ['--sharding', 'off'], fmt='count'), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            skipped = 0
            while time.time() < deadline and not skipped:
                with urllib.request.urlopen('http://127.0.0.1:%d/v1/tasks' % self.c.workers[0].admin_port,
                                            timeout=5) as r:
                    tasks = json.load(r)['tasks']
                skipped = max([t.get('records_skipped', 0) for t in tasks] or [0])
                time.sleep(0.1)
            self.assertGreater(skipped, 0)
        finally:
            p.kill()
            p.wait()

    def test_a_pipeline_the_worker_cannot_build_fails_the_job(self):
        spec = images_spec(self.data)
        spec['ops'][1]['key'] = 'img'
        rc, batches, err = self.c.cat(spec, ['--sharding', 'off'])
        self.assertNotEqual(rc, 0)
        self.assertIn('ops[1] (decode_jpeg): component', err)
        self.assertIn('img', err)
        self.assertIn('is not in its input', err)


if __name__ == '__main__':
    unittest.main()
