"""The fixture the Python client's tests share: one cluster for the class
(harness.ClusterCase: `workers`, `dispatcher_args`, `worker_args`), the
dispatcher's address as `addr`, and a check that no batch or iterator handle
of the library outlives a test."""
import gc

import sluice.client
from harness import ClusterCase


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
