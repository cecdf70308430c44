"""interleave, prefetch and cache end to end: a dispatcher and two workers,
each with --data-root at a temporary copy of tests/data/tfrecord and a
--cache-dir of its own. interleave under DYNAMIC delivers every record
exactly once across the two workers, and once per worker under OFF; a
repeat(2) over a disk cache yields every record twice per worker while the
workers open each file once (their sluice_worker_files_opened_total
counters), and a second job of the same spec is served from the cache
without opening a file; under DYNAMIC a disk cache (an entry per split)
keeps every record exactly once per epoch."""
import collections
import os
import shutil
import tempfile
import unittest

from harness import Cluster, metric, summary, values

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, '..', 'data', 'tfrecord')


class CacheInterleave(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-cache-')
        cls.data = os.path.join(cls.tmp, 'tfrecord')
        shutil.copytree(FIXTURES, cls.data)
        roots = ['--data-root', cls.data]
        cls.c = Cluster(workers=0, dispatcher_args=roots)
        for i in range(2):
            cls.c.add_worker(roots + ['--cache-dir', os.path.join(cls.tmp, 'cache%d' % i),
                                      '--cache-disk-mb', '64', '--threads', '2'])
        cls.c.wait_workers_registered(2)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def spec(self, ops, parallel=2):
        return {"source": {"type": "tfrecord", "files": [os.path.join(self.data, "basic-*-of-00004.tfrecord")]},
                "ops": [{"op": "interleave", "cycle_length": 3, "block_length": 2,
                         "num_parallel_calls": parallel},
                        {"op": "parse_example", "features": {"id": {"dtype": "int64"}}}] + ops}

    def assert_each(self, ids, times, n):
        counts = collections.Counter(ids)
        missing = [v for v in range(n) if counts[v] != times]
        extra = [v for v in counts if not 0 <= v < n]
        self.assertEqual((missing[:5], extra[:5]), ([], []))
        self.assertEqual(len(ids), times * n)

    def opened(self):
        return sum(metric(w.admin_port, 'sluice_worker_files_opened_total', default=0.0) for w in self.c.workers)

    def test_interleave_dynamic_every_record_once(self):
        for parallel in (1, 'autotune'):
            rc, batches, err = self.c.cat(self.spec([{"op": "prefetch", "buffer_size": 4},
                                                     {"op": "batch", "batch_size": 32}], parallel),
                                          ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            self.assert_each(values(batches, 'id'), 1, 1000)
            self.assertEqual(summary(err)['elements'], 1000)

    def test_interleave_off_once_per_worker_in_tf_data_order(self):
        rc, batches, err = self.c.cat(self.spec([{"op": "batch", "batch_size": 1000}]), ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(batches), 2)
        # cycle 3, block 2 over files of 250 ids starting at 0, 250, 500, 750.
        self.assertEqual(batches[0]['id'][:8], [0, 1, 250, 251, 500, 501, 2, 3])
        self.assertEqual(batches[0]['id'], batches[1]['id'])
        self.assert_each(values(batches, 'id'), 2, 1000)

    def test_repeat_over_a_disk_cache_opens_each_file_once(self):
        spec = self.spec([{"op": "cache", "storage": "disk"}, {"op": "repeat", "count": 2},
                          {"op": "batch", "batch_size": 100}])
        before = self.opened()
        rc, batches, err = self.c.cat(spec, ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        ids = values(batches, 'id')
        self.assert_each(ids, 4, 1000)
        # Each worker opened its 4 files in the first epoch only.
        self.assertEqual(self.opened() - before, 8)
        # A new job of the same spec: both epochs come from the cache.
        before = self.opened()
        rc, batches2, err = self.c.cat(spec, ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches2, 'id')), sorted(ids))
        self.assertEqual(self.opened() - before, 0)

    def test_repeat_over_a_disk_cache_under_dynamic_every_record_once_per_epoch(self):
        spec = {"source": {"type": "tfrecord", "files": [os.path.join(self.data, "basic-*-of-00004.tfrecord")]},
                "ops": [{"op": "parse_example", "features": {"id": {"dtype": "int64"}}},
                        {"op": "cache", "storage": "disk"}, {"op": "repeat", "count": 2},
                        {"op": "batch", "batch_size": 50}]}
        for run in range(2):
            rc, batches, err = self.c.cat(spec, ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            self.assert_each(values(batches, 'id'), 2, 1000)

    def test_worker_without_cache_dir_refuses_disk_cache(self):
        w = self.c.add_worker(['--data-root', self.data])
        try:
            self.c.wait_workers_registered(3)
            spec = self.spec([{"op": "cache", "storage": "disk"}])
            spec['ops'][0]['cycle_length'] = 5  # another dataset than the other tests'
            rc, batches, err = self.c.cat(spec, ['--sharding', 'off'])
            self.assertNotEqual(rc, 0)
            self.assertIn('ops[2] (cache): storage "disk" needs a worker started with --cache-dir', err)
        finally:
            w.stop()
            self.c.workers.remove(w)


if __name__ == '__main__':
    unittest.main()
