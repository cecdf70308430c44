"""Batches of batches (and a batch after a filter) under DYNAMIC: a batch's
provenance counts the source records of every level (GetElementResponse.
num_records), so the client checks and records them, and exactly once holds,
also across a worker killed mid-epoch (docs/fault-tolerance.md).

The inner batch sizes multiply to a divisor of the split size (1000): each
worker's task reads whole splits, so no inner batch is partial (a partial
inner batch has another shape, which the next batch refuses, as tf.data
does)."""
import os
import random
import signal
import subprocess
import unittest

from harness import Cluster, child_env

import numpy as np


def chaos_seed():
    env = os.environ.get('SLUICE_CHAOS_SEED')
    return int(env) if env else random.randrange(1 << 32)


class NestedBatches(unittest.TestCase):

    def setUp(self):
        self.c = Cluster(workers=3, dispatcher_args=['--split-size', '1000'])
        self.c.wait_workers_registered(3)

    def tearDown(self):
        self.assertEqual(self.c.close(), {}, 'daemons exited uncleanly')

    def read(self, spec, args=(), kill_worker_after=None):
        """sluice-cat --format raw under DYNAMIC: every int64 delivered, in
        order; with kill_worker_after, worker 0 is killed with -9 once that
        many bytes were read."""
        argv = self.c.cat_argv(spec, ['--sharding', 'dynamic', '--max-outstanding', '4'] + list(args), fmt='raw')
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        chunks = []
        try:
            if kill_worker_after is not None:
                got = 0
                while got < kill_worker_after:
                    b = p.stdout.read(min(65536, kill_worker_after - got))
                    if not b:
                        break
                    chunks.append(b)
                    got += len(b)
                self.c.workers[0].kill(signal.SIGKILL)
            chunks.append(p.stdout.read())
            err = p.stderr.read().decode()
            p.wait(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 0, err[-3000:])
        return np.frombuffer(b''.join(chunks), dtype='<i8'), err

    def assert_exactly(self, got, want, where):
        got = np.sort(got)
        self.assertEqual(len(got), len(want), '%s: %d elements, %d expected' % (where, len(got), len(want)))
        bad = np.nonzero(got != want)[0]
        self.assertEqual(len(bad), 0, '%s: first difference at %s' % (where, bad[:5]))

    def test_batches_of_batches_of_batches_exactly_once(self):
        n = 1000000
        spec = {"source": {"type": "range", "stop": n},
                "ops": [{"op": "batch", "batch_size": 8}, {"op": "batch", "batch_size": 5},
                        {"op": "batch", "batch_size": 3}]}
        got, _ = self.read(spec)
        self.assert_exactly(got, np.arange(n), 'batch(8).batch(5).batch(3)')

    def test_a_batch_of_batches_after_a_filter_exactly_once(self):
        n = 300000
        spec = {"source": {"type": "range", "stop": n},
                "ops": [{"op": "filter", "key": "value", "cmp": "lt", "value": n // 2},
                        {"op": "batch", "batch_size": 10}, {"op": "batch", "batch_size": 3}]}
        got, _ = self.read(spec)
        self.assert_exactly(got, np.arange(n // 2), 'filter.batch(10).batch(3)')

    def test_a_worker_killed_mid_epoch_under_nested_batches(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        n = 600000
        inner, outer = rng.choice([(4, 10), (8, 25), (10, 20), (1, 7)])
        spec = {"source": {"type": "range", "stop": n},
                "ops": [{"op": "batch", "batch_size": inner}, {"op": "batch", "batch_size": outer}]}
        at = 8 * rng.randrange(n // 10, n // 2)
        got, _ = self.read(spec, kill_worker_after=at)
        self.assert_exactly(got, np.arange(n), 'seed %d (SLUICE_CHAOS_SEED=%d reruns it): batch(%d).batch(%d), '
                            'worker 0 killed after %d bytes' % (seed, seed, inner, outer, at))


if __name__ == '__main__':
    unittest.main()
