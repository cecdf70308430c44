"""The fixtures the Python client's tests share: one cluster for the class
(harness.ClusterCase: `workers`, `dispatcher_args`, `worker_args`), the
dispatcher's address as `addr`, and a check that no batch or iterator handle
of the library outlives a test (SluiceCase); a cluster whose daemons read a
copy of tests/data/tfrecord (DataCase)."""
import gc
import os
import shutil
import tempfile

import sluice.client
from harness import ClusterCase

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'tfrecord')


class SluiceCase(ClusterCase):
    workers = 2

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.addr = cls.c.dispatcher.addr

    def assert_no_live_handles(self):
        gc.collect()
        self.assertEqual(sluice.client.live_handles(), {'batches': 0, 'iterators': 0})

    def setUp(self):
        self.assert_no_live_handles()

    def tearDown(self):
        self.assert_no_live_handles()


class DataCase(ClusterCase):
    """One cluster for the class whose dispatcher and workers have a copy of
    tests/data/tfrecord, `data`, as their --data-root (removed after)."""
    workers = 2

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-pydata-')
        cls.data = os.path.join(cls.tmp, 'data')
        shutil.copytree(FIXTURES, cls.data)
        cls.dispatcher_args = cls.worker_args = ('--data-root', cls.data)
        try:
            super().setUpClass()
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)
