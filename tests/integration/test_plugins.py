"""map and filter end to end: two workers with --plugin-dir at a temporary
directory holding the test plugin (built under BUILD/tests/plugins) run map
and filter specs, with num_parallel_calls, under DYNAMIC sharding through
sluice-cat: every expected element arrives exactly once. A plugin reached
through a symlink out of the directory, a path in the spec, and any plugin
on a worker without --plugin-dir are refused with the reason."""
import collections
import os
import shutil
import tempfile
import unittest

import harness
from harness import Cluster, summary, values

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, '..', 'data', 'tfrecord')


def plugin_built(name):
    return os.path.abspath(os.path.join(harness.BUILD, 'tests', 'plugins', name))


def map_filter_spec(n, calls):
    return {"source": {"type": "range", "stop": n},
            "ops": [{"op": "filter", "plugin": "libsltest.so", "function": "is_even", "num_parallel_calls": calls},
                    {"op": "map", "plugin": "libsltest.so", "function": "add_double",
                     "output": {"double": "int64"}, "num_parallel_calls": calls},
                    {"op": "filter", "key": "double", "cmp": "ne", "value": 8},
                    {"op": "batch", "batch_size": 16}]}


class Plugins(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-plugins-')
        cls.plugdir = os.path.join(cls.tmp, 'plugins')
        outside = os.path.join(cls.tmp, 'outside')
        os.makedirs(cls.plugdir)
        os.makedirs(outside)
        shutil.copy(plugin_built('libsltest.so'), cls.plugdir)
        shutil.copy(plugin_built('libsltest.so'), os.path.join(outside, 'libevil.so'))
        os.symlink(os.path.join(outside, 'libevil.so'), os.path.join(cls.plugdir, 'libescape.so'))
        cls.data = os.path.join(cls.tmp, 'tfrecord')
        shutil.copytree(FIXTURES, cls.data)
        roots = ['--data-root', cls.data]
        cls.c = Cluster(workers=2, dispatcher_args=roots,
                        worker_args=roots + ['--plugin-dir', cls.plugdir, '--threads', '2'])
        cls.c.wait_workers_registered(2)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def test_map_filter_dynamic_every_element_once(self):
        for calls in (1, 2, 'autotune'):
            rc, batches, err = self.c.cat(map_filter_spec(1000, calls), ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            got = values(batches, 'value')
            counts = collections.Counter(got)
            want = [v for v in range(0, 1000, 2) if v != 4]
            self.assertEqual(sorted(counts), want)
            self.assertEqual(max(counts.values()), 1, 'each element exactly once')
            self.assertEqual(values(batches, 'double'), [2 * v for v in got])
            self.assertEqual(summary(err)['elements'], len(want))

    def test_parallel_images_with_builtin_filter_dynamic(self):
        par = {"num_parallel_calls": 2}
        spec = {"source": {"type": "tfrecord", "files": [os.path.join(self.data, "images-*.tfrecord")]},
                "ops": [dict({"op": "parse_example", "features": {"id": {"dtype": "int64"},
                                                                  "image/encoded": {"dtype": "bytes"}}}, **par),
                        {"op": "filter", "key": "id", "cmp": "in", "value": [1, 3, 5, 30, 31, 99]},
                        dict({"op": "decode_jpeg", "key": "image/encoded"}, **par),
                        dict({"op": "random_crop", "key": "image/encoded", "size": [36, 36], "seed": 4}, **par),
                        dict({"op": "resize", "key": "image/encoded", "size": [8, 8]}, **par),
                        {"op": "batch", "batch_size": 2}]}
        rc, batches, err = self.c.cat(spec, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'id')), [1, 3, 5, 30, 31])

    def test_plugin_through_a_symlink_out_of_the_dir_is_refused(self):
        spec = {"source": {"type": "range", "stop": 10},
                "ops": [{"op": "filter", "plugin": "libescape.so", "function": "is_even"}]}
        rc, _, err = self.c.cat(spec, ['--sharding', 'dynamic'])
        self.assertNotEqual(rc, 0)
        self.assertIn('ops[0] (filter): plugin "libescape.so"', err)
        self.assertIn('outside the --plugin-dir', err)

    def test_plugin_path_refused_at_registration(self):
        spec = {"source": {"type": "range", "stop": 10},
                "ops": [{"op": "map", "plugin": plugin_built('libsltest.so'), "function": "add_double",
                         "output": {"double": "int64"}}]}
        rc, _, err = self.c.cat(spec)
        self.assertNotEqual(rc, 0)
        self.assertIn("$.ops[0].plugin: must be a file name in the worker's --plugin-dir", err)

    def test_missing_plugin_names_the_op_and_path(self):
        spec = {"source": {"type": "range", "stop": 10},
                "ops": [{"op": "batch", "batch_size": 2},
                        {"op": "map", "plugin": "libnothere.so", "function": "f", "output": {"x": "int64"}}]}
        rc, _, err = self.c.cat(spec, ['--sharding', 'dynamic'])
        self.assertNotEqual(rc, 0)
        self.assertIn('ops[1] (map): plugin "libnothere.so": not found (looked for %s)'
                      % os.path.join(os.path.realpath(self.plugdir), 'libnothere.so'), err)


class NoPluginDir(unittest.TestCase):
    def test_every_plugin_op_refused_without_plugin_dir(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 10},
                    "ops": [{"op": "filter", "plugin": "libsltest.so", "function": "is_even"}]}
            rc, _, err = c.cat(spec)
            self.assertNotEqual(rc, 0)
            self.assertIn('this worker loads no plugins (start sluice-workerd with --plugin-dir DIR)', err)
        finally:
            bad = c.close()
        self.assertEqual(bad, {})


if __name__ == '__main__':
    unittest.main()
