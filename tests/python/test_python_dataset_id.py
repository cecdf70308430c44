"""tf.data service's dataset-by-id workflow against real daemons: a dataset
registered (under a name or not) in one process is read by id or name in
another; the element spec the dispatcher derives matches what the batches
hold; len() and cardinality() say what the workers yield, and a TypeError
where that is not fixed (docs/python.md, docs/coming-from-tf-data.md)."""
import json
import os
import signal
import subprocess
import sys
import unittest

import sluice
import sluice.torch
from harness import Cluster
from pycase import DataCase

PYTHONPATH = os.path.dirname(os.path.dirname(sluice.__file__))

READ_BY_NAME = r'''
import json, sys
import sluice
it = sluice.from_dataset_id(sys.argv[1], sys.argv[2], sharding="dynamic")
ids = [int(v) for b in it for v in b["value"]]
print(json.dumps({"dataset_id": it.dataset_id, "ids": sorted(ids),
                  "spec": {k: [list(s.shape), s.dtype] for k, s in it.element_spec.items()}}))
'''


def structure(batch):
    """{name: (shape with the ragged dimension as None, dtype name, ragged)} of a batch dict."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, tuple):  # ragged: (values, row_splits)
            values, splits = v
            out[k] = ((len(splits) - 1, None) + tuple(values.shape[1:]), dtype_name(values), True)
        else:
            out[k] = (tuple(v.shape), dtype_name(v), False)
    return out


def dtype_name(a):
    return 'bytes' if a.dtype == object else a.dtype.name


class DatasetIdTest(DataCase):

    @property
    def addr(self):
        return self.c.dispatcher.addr

    # ---- register_dataset / from_dataset_id ----

    def test_register_then_read_by_id(self):
        ds = sluice.range(0, 200).batch(16)
        did = sluice.register_dataset(self.addr, ds)
        self.assertIsInstance(did, int)
        self.assertEqual(sluice.register_dataset(self.addr, ds), did)  # the same spec, the same id
        with sluice.from_dataset_id(self.addr, did, sharding='dynamic') as it:
            self.assertEqual(it.dataset_id, did)
            ids = sorted(int(v) for b in it for v in b['value'])
        self.assertEqual(ids, list(range(200)))
        # distribute() of the same spec reads the same dataset.
        with ds.distribute(self.addr, sharding='dynamic') as it:
            self.assertEqual(it.dataset_id, did)
        # Iterated again after its end, it opens the next repetition of a
        # named job over the same dataset, as distribute()'s iterators do.
        it = sluice.from_dataset_id(self.addr, did, sharding='dynamic', job_name='by-id')
        self.assertEqual(sum(len(b['value']) for b in it), 200)
        it2 = iter(it)
        self.assertEqual((it2.repetition, it2.dataset_id), (1, did))
        self.assertEqual(sorted(int(v) for b in it2 for v in b['value']), list(range(200)))

    def test_named_dataset_is_read_in_another_process(self):
        ds = sluice.range(0, 120).shuffle(32, seed=3).batch(10)
        did = sluice.register_dataset(self.addr, ds, dataset_id='shared/train-v1')
        # Idempotent for the same spec under the same name.
        self.assertEqual(sluice.register_dataset(self.addr, ds, dataset_id='shared/train-v1'), did)
        # The same spec without the name, or under another, is another dataset.
        self.assertNotEqual(sluice.register_dataset(self.addr, ds), did)
        self.assertNotEqual(sluice.register_dataset(self.addr, ds, dataset_id='shared/train-v2'), did)
        p = subprocess.run([sys.executable, '-c', READ_BY_NAME, self.addr, 'shared/train-v1'], capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        self.assertEqual(got['dataset_id'], did)
        self.assertEqual(got['ids'], list(range(120)))
        self.assertEqual(got['spec'], {'value': [[None], 'int64']})
        # The id as text names the dataset too (what a command line passes).
        with sluice.from_dataset_id(self.addr, str(did)) as it:
            self.assertEqual(it.dataset_id, did)

    def test_name_of_another_spec_is_refused(self):
        sluice.register_dataset(self.addr, sluice.range(10), dataset_id='taken')
        with self.assertRaises(sluice.ConflictError) as cm:
            sluice.register_dataset(self.addr, sluice.range(11), dataset_id='taken')
        self.assertIn('dataset name "taken" is registered with another spec', str(cm.exception))

    def test_bad_names_and_unknown_datasets(self):
        for name, why in (('123', 'all digits'), ('a b', 'character 1'), ('x' * 128, 'at most 127')):
            with self.assertRaises(sluice.InvalidArgumentError) as cm:
                sluice.register_dataset(self.addr, sluice.range(3), dataset_id=name)
            self.assertIn(why, str(cm.exception))
        with self.assertRaises(sluice.NotFoundError) as cm:
            sluice.from_dataset_id(self.addr, 'never-registered')
        self.assertIn('no dataset is registered under the name "never-registered"', str(cm.exception))
        with self.assertRaises(sluice.NotFoundError):
            sluice.from_dataset_id(self.addr, 987654321)
        with self.assertRaises(sluice.InvalidArgumentError):
            sluice.from_dataset_id(self.addr, 0)
        # The dispatcher keeps serving.
        self.assertIsInstance(sluice.register_dataset(self.addr, sluice.range(3)), int)

    # ---- element_spec ----

    def check_element_spec(self, ds, sharding='dynamic'):
        """The element spec the dispatcher serves, before the first batch,
        agrees with every batch's real structure; returns it."""
        with ds.distribute(self.addr, sharding=sharding) as it:
            spec = it.element_spec
            self.assertIsNotNone(spec, ds)
            n = 0
            for b in it:
                got = structure(b)
                self.assertEqual(list(got), list(spec), ds)  # the same components in the same order
                for k, (shape, dtype, ragged) in got.items():
                    real = sluice.TensorSpec(shape, dtype, ragged)
                    self.assertTrue(spec[k].is_compatible_with(real), '%s: %r vs %r' % (k, spec[k], real))
                    if spec[k].shape is not None:
                        self.assertEqual(len(spec[k].shape), len(shape))
                n += 1
            self.assertGreater(n, 0)
        return spec

    def test_element_spec_matches_the_batches(self):
        S = sluice.TensorSpec
        self.assertEqual(self.check_element_spec(sluice.range(0, 100).batch(8, drop_remainder=True)),
                         {'value': S((8,), 'int64')})
        self.assertEqual(self.check_element_spec(sluice.range(0, 100, name='id').cast('id', 'float16')
                                                 .batch(4, drop_remainder=True).batch(3)),
                         {'id': S((None, 4), 'float16')})
        self.assertEqual(self.check_element_spec(sluice.range(0, 5)), {'value': S((), 'int64')})
        images = (sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord'))
                  .parse_example({'id': int, 'image/encoded': bytes, 'label': ('int64', [])})
                  .decode_jpeg('image/encoded')
                  .center_crop('image/encoded', 36, 36)
                  .resize('image/encoded', 24, 20, dtype='uint8')
                  .normalize('image/encoded', [0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
                  .batch(6))
        self.assertEqual(self.check_element_spec(images),
                         {'id': S((None,), 'int64'), 'image/encoded': S((None, 24, 20, 3), 'float32'),
                          'label': S((None,), 'int64')})
        raw = sluice.tfrecord(os.path.join(self.data, 'images-*.tfrecord')).parse_example({'image/encoded': bytes})
        self.assertEqual(self.check_element_spec(raw.decode_jpeg('image/encoded')),
                         {'image/encoded': S((None, None, 3), 'uint8')})
        varlen = (sluice.tfrecord(os.path.join(self.data, 'varlen-*.tfrecord'))
                  .parse_example({'id': int, 'tokens': {'dtype': int, 'varlen': True}}))
        self.assertEqual(self.check_element_spec(varlen.batch(8)),
                         {'id': S((None,), 'int64'), 'tokens': S((None, None), 'int64', ragged=True)})
        self.assertEqual(self.check_element_spec(varlen.padded_batch(8, padded_shapes={'tokens': [40]})),
                         {'id': S((None,), 'int64'), 'tokens': S((None, 40), 'int64')})

    def test_element_spec_not_known_is_none(self):
        # A key that names no component: the spec is registered, the
        # pipeline would fail when a worker builds it.
        bad = sluice.range(10).cast('nope', 'int8')
        did = sluice.register_dataset(self.addr, bad)
        self.assertIsNone(sluice.dataset_element_spec(self.addr, did))

    def test_given_element_spec_is_checked(self):
        did = sluice.register_dataset(self.addr, sluice.range(0, 30).batch(5), dataset_id='checked')
        with sluice.from_dataset_id(self.addr, 'checked', element_spec={'value': ((None,), 'int64')}) as it:
            self.assertEqual(it.element_spec, {'value': sluice.TensorSpec((None,), 'int64')})
        with self.assertRaises(sluice.InvalidArgumentError) as cm:
            sluice.from_dataset_id(self.addr, did, element_spec={'value': ((None,), 'float32')})
        self.assertIn('does not match what dataset %d yields' % did, str(cm.exception))
        # Where the dispatcher cannot say, the given one stands.
        unknown = sluice.register_dataset(self.addr, sluice.range(10).cast('nope', 'int8'))
        given = {'nope': sluice.TensorSpec((), 'int8')}
        with sluice.from_dataset_id(self.addr, unknown, element_spec=given) as it:
            self.assertEqual(it.element_spec, given)

    # ---- cardinality and len() ----

    def test_cardinality_is_what_one_worker_yields(self):
        # Under sharding "off" each of the 2 workers runs the whole pipeline.
        for ds in (sluice.range(0, 100).batch(7), sluice.range(0, 100).batch(7, drop_remainder=True),
                   sluice.range(0, 50).skip(8).take(30).batch(4), sluice.range(0, 20).repeat(3).batch(6),
                   sluice.range(0, 23).shard(4, 3), sluice.range(10, 0, -3), sluice.range(0, 9).skip(-1),
                   sluice.range(0, 64).shuffle(16, seed=1).padded_batch(5)):
            with ds.distribute(self.addr, sharding='off') as it:
                n = sum(1 for _ in it)
            self.assertEqual(n, 2 * len(ds), ds)
        self.assertEqual(sluice.range(5).repeat().cardinality(), sluice.INFINITE_CARDINALITY)
        self.assertEqual(sluice.range(5).filter('value', 'gt', 2).cardinality(), sluice.UNKNOWN_CARDINALITY)
        with self.assertRaisesRegex(TypeError, 'infinite'):
            len(sluice.range(5).repeat())
        with self.assertRaisesRegex(TypeError, 'unknown'):
            len(sluice.tfrecord('/d/a'))
        self.assertTrue(sluice.range(0))  # never false, also when empty

    def test_torch_len_where_the_workers_do_not_matter(self):
        ds = sluice.range(0, 90).shuffle(16, seed=2)
        for kw in ({'sharding': 'dynamic'}, {'sharding': 'dynamic', 'max_outstanding': 2}):
            loader = sluice.torch.loader(ds, self.addr, **kw)
            self.assertEqual(len(loader), 90)
            self.assertEqual(sum(1 for _ in loader), 90)
        dl = sluice.torch.SluiceIterableDataset(ds, self.addr, sharding='dynamic')
        self.assertEqual(len(dl), 90)
        self.assertEqual(sum(1 for _ in dl), 90)
        for kw, why in (({'sharding': 'off'}, 'sharding "off"'), ({'sharding': 'dynamic', 'job_name': 'j'},
                                                                 'named job')):
            with self.assertRaisesRegex(TypeError, why):
                len(sluice.torch.loader(ds, self.addr, **kw))
        with self.assertRaisesRegex(TypeError, 'runs batch on its own share'):
            len(sluice.torch.loader(ds.batch(8), self.addr, sharding='dynamic'))
        # The batch count under dynamic sharding is not fixed: it is what
        # the 2 workers' shares make, between these bounds.
        n = sum(1 for _ in sluice.torch.loader(ds.batch(8), self.addr, sharding='dynamic'))
        self.assertTrue(12 <= n <= 13, n)


class NamesAcrossRestart(unittest.TestCase):
    """A dispatcher of its own (no worker: names need none), killed and
    restarted on its work dir."""

    def setUp(self):
        self.c = Cluster(workers=0)

    def tearDown(self):
        self.assertEqual(self.c.close(), {}, 'daemons exited uncleanly')

    def test_name_survives_a_dispatcher_restart(self):
        ds = sluice.range(0, 40).batch(8)
        did = sluice.register_dataset(self.c.dispatcher.addr, ds, dataset_id='durable')
        self.c.restart_dispatcher(signal.SIGKILL)
        self.assertEqual(sluice.register_dataset(self.c.dispatcher.addr, ds, dataset_id='durable'), did)
        self.assertEqual(sluice.dataset_element_spec(self.c.dispatcher.addr, 'durable'),
                         {'value': sluice.TensorSpec((None,), 'int64')})
        with self.assertRaises(sluice.ConflictError):
            sluice.register_dataset(self.c.dispatcher.addr, sluice.range(1), dataset_id='durable')


if __name__ == '__main__':
    unittest.main()
