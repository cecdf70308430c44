"""Batches from a worker on the trainer's host through shared memory
(docs/protocol.md, "Shared memory"), against real daemons: the arrays are
the ones the socket brings, a trainer that holds its batches gets the rest
over the socket, a batch changed in place does not change the next one,
components whose bytes the client interprets (bytes, ragged) stay on the
socket, coordinated reads take it too, and a worker started with --shm-mb 0
sends everything over it.
Which way each batch went is read from the worker's counters."""
import json
import os
import unittest
import urllib.request

import numpy as np

import sluice
from harness import Cluster, metric
from pycase import DataCase, SluiceCase

def counters(worker):
    """(batches served, of them through shared memory, fallbacks to TCP) of a worker."""
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % worker.admin_port, timeout=10) as r:
        lines = r.read().decode().splitlines()
    got = {}
    for line in lines:
        name, _, v = line.partition(' ')
        got[name] = float(v) if v and not line.startswith('#') else got.get(name)
    return (got['sluice_worker_batches_served_total'], got['sluice_worker_batches_shm_total'],
            got['sluice_worker_shm_fallbacks_total'])


def lent(worker):
    """Batches a worker lent from their own blocks in a client's region (no copy)."""
    return int(metric(worker.admin_port, 'sluice_worker_batches_shm_lent_total'))


def delta(after, before):
    return tuple(int(a - b) for a, b in zip(after, before))


class SharedMemory(SluiceCase):
    workers = 1
    # 2 MiB a connection: 64 slots of 8 KiB batches fit, which the slot bound stops first.
    worker_args = ('--shm-mb', '2')

    def read(self, ds, **options):
        """Every batch's 'value' copied out, and the worker's counts of the read."""
        before = counters(self.c.workers[0])
        with sluice.distribute(ds, self.addr, **options) as it:
            got = [np.array(b['value']) for b in it]
        return got, delta(counters(self.c.workers[0]), before)

    def test_the_batches_are_the_ones_the_socket_brings(self):
        ds = sluice.range(200000).batch(1000)
        shm, (served, via_shm, fallback) = self.read(ds)
        self.assertEqual(served, 200)
        # The first answer offers the region; requests already in flight then come over TCP.
        self.assertGreaterEqual(via_shm, 200 - 8)
        self.assertEqual(fallback, 0)
        tcp, (served, via_shm, fallback) = self.read(ds, shared_memory=False)
        self.assertEqual((served, via_shm, fallback), (200, 0, 0))
        self.assertEqual(len(shm), len(tcp))
        for a, b in zip(shm, tcp):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(np.concatenate(shm), np.arange(200000))

    def test_rows_and_batches_copied_past_the_cache_arrive_whole(self):
        # Rows of 65,592 bytes (batches of 8,199 int64 batched again by 3): the
        # batch op and the slot copy them with streaming stores (common/copy.h),
        # at offsets that are not multiples of a cache line. Read until 100
        # batches came through shared memory (the first ones come over TCP
        # until the region is mapped, however many that is), each checked.
        rows, per, epoch = 8199, 3, 50
        ds = sluice.range(rows * per * epoch).batch(rows).batch(per).repeat()
        want = np.arange(rows * per * epoch).reshape(epoch, per, rows)
        before = counters(self.c.workers[0])
        via_shm = 0
        with sluice.distribute(ds, self.addr) as it:
            for i, b in enumerate(it):
                np.testing.assert_array_equal(b['value'], want[i % epoch], 'batch %d' % i)
                del b
                if i % 10 == 9:
                    # (A 2 MiB region holds 10 such batches: the rest of the
                    # window's answers fall back to the socket, as documented.)
                    served, via_shm, fallback = delta(counters(self.c.workers[0]), before)
                    if via_shm >= 100:
                        break
                self.assertLess(i, 20000, 'only %d batches came through shared memory' % via_shm)
        self.assertGreaterEqual(via_shm, 100)

    def test_a_trainer_that_holds_its_batches_gets_the_rest_over_the_socket(self):
        ds = sluice.range(200 * 1000).batch(1000)
        before = counters(self.c.workers[0])
        held = []
        with sluice.distribute(ds, self.addr) as it:
            for b in it:
                held.append(b['value'])  # a view: its batch, and its slot, stay held
            served, via_shm, fallback = delta(counters(self.c.workers[0]), before)
            self.assertEqual(served, 200)
            # No more than 64 slots lent at once: the rest came over TCP, nothing waited or was lost.
            self.assertLessEqual(via_shm, 64)
            self.assertGreater(via_shm, 0)
            self.assertGreaterEqual(fallback, 200 - 64 - 8)
            np.testing.assert_array_equal(np.concatenate(held), np.arange(200000))
            del held, b

    def test_a_batch_changed_in_place_does_not_change_the_next(self):
        ds = sluice.range(300 * 1000).batch(1000)
        with sluice.distribute(ds, self.addr) as it:
            n = 0
            for b in it:
                v = b['value']
                np.testing.assert_array_equal(v, np.arange(n * 1000, (n + 1) * 1000))
                v[:] = -7  # the caller's until it lets the batch go
                self.assertEqual(int(v.sum()), -7000)
                n += 1
                del v, b
        self.assertEqual(n, 300)

    def test_coordinated_reads_too(self):
        ds = sluice.range(0, 1000).repeat().batch(4)
        before = counters(self.c.workers[0])
        with ds.distribute(self.addr, job_name='shm-coord', num_consumers=2, consumer_index=0) as a, \
                ds.distribute(self.addr, job_name='shm-coord', num_consumers=2, consumer_index=1) as b:
            for _ in range(100):
                x = next(a)['value'].tolist()
                y = next(b)['value'].tolist()
                self.assertEqual(x[-1] + 1, y[0])  # the round's two batches, consecutive
        served, via_shm, fallback = delta(counters(self.c.workers[0]), before)
        # Each consumer's first requests go before its region is mapped; the rest through it.
        self.assertGreaterEqual(via_shm, 200 - 2 * 16)
        self.assertEqual(fallback, 0)

    def test_a_worker_with_shm_off_sends_everything_over_the_socket(self):
        c = Cluster(workers=1, worker_args=['--shm-mb', '0'])
        try:
            c.wait_workers_registered(1)
            before = counters(c.workers[0])
            with sluice.distribute(sluice.range(50000).batch(1000), c.dispatcher.addr) as it:
                got = np.concatenate([np.array(b['value']) for b in it])
            self.assertEqual(delta(counters(c.workers[0]), before), (50, 0, 0))
            np.testing.assert_array_equal(got, np.arange(50000))
        finally:
            bad = c.close()
            self.assertEqual(bad, {})


class LentBlocks(SluiceCase):
    """Blocks of 64 KiB and more that the pipeline's last batch op makes in
    the client's region to begin with, and lends instead of copying
    (workerd/shm.h): a region of 64 MiB holds what the task buffers, what
    the client has in flight and what the worker holds until acknowledged."""
    workers = 1
    worker_args = ('--shm-mb', '64')

    def read_lent(self, ds, check, **options):
        """Reads ds, check(i, batch) on each batch; (batches, served, via shm, fallbacks, lent)."""
        before, lent_before = counters(self.c.workers[0]), lent(self.c.workers[0])
        n = 0
        with sluice.distribute(ds, self.addr, **options) as it:
            for b in it:
                check(n, b)
                del b
                n += 1
        served, via_shm, fallback = delta(counters(self.c.workers[0]), before)
        return n, served, via_shm, fallback, lent(self.c.workers[0]) - lent_before

    def test_a_batch_made_in_the_client_region_is_lent_not_copied(self):
        # Batches of 8,199 int64 (65,592 bytes, at least the 64 KiB a block
        # must have) from the pipeline's last op: the batch op makes its
        # block in the client's region, and the answer lends it. The caller
        # writes into each (its own until it lets go): the next batch made
        # in those pages is whole all the same.
        rows, epoch = 8199, 400

        def check(i, b):
            v = b['value']
            np.testing.assert_array_equal(v, np.arange(i * rows, (i + 1) * rows), 'batch %d' % i)
            v[:] = -7
        n, served, via_shm, fallback, lent_n = self.read_lent(sluice.range(rows * epoch).batch(rows), check)
        self.assertEqual((n, served), (epoch, epoch))
        # The first answers come before the region is mapped; the window's
        # first batches were made before it too.
        self.assertGreaterEqual(lent_n, epoch - 64)
        self.assertLessEqual(lent_n, via_shm)
        self.assertEqual(fallback, 0)

    def test_a_shuffled_dynamic_batch_is_lent_with_its_provenance_after_it(self):
        # Under DYNAMIC a shuffled batch's provenance (a fixed width per
        # record) is too long for the answer: it goes after the tensor bytes
        # in the room the block keeps for it, and the batch is still lent.
        rows, epoch = 8192, 300
        seen = []

        def check(i, b):
            v = b['value']
            self.assertEqual(len(v), rows)
            seen.append(np.array(v))
        n, served, via_shm, fallback, lent_n = self.read_lent(
            sluice.range(rows * epoch).shuffle(100000, seed=7).batch(rows), check, sharding='dynamic')
        self.assertEqual(n, epoch)
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(rows * epoch))
        self.assertGreaterEqual(lent_n, epoch - 64)
        self.assertEqual(fallback, 0)

    def test_blocks_only_of_the_last_batch_and_only_for_one_client(self):
        rows = 8199
        # A batch with an op after it that holds or may read its block (a
        # shuffle, a cache, a map) makes its block elsewhere: every batch
        # copied.
        starts = []

        def each_once(i, b):
            v = b['value']
            np.testing.assert_array_equal(v, np.arange(v[0], v[0] + rows), 'batch %d' % i)
            starts.append(int(v[0]))
        n, served, via_shm, fallback, lent_n = self.read_lent(sluice.range(rows * 100).batch(rows).shuffle(4),
                                                              each_once)
        self.assertEqual((n, lent_n), (100, 0))
        self.assertEqual(sorted(starts), list(range(0, rows * 100, rows)))
        self.assertGreaterEqual(via_shm, 100 - 16)

        def check(i, b):
            np.testing.assert_array_equal(b['value'], np.arange(i * rows, (i + 1) * rows), 'batch %d' % i)
        # Behind ops that pass it on unread, lent.
        for ds, first in ((sluice.range(rows * 100).batch(rows).prefetch(2), 0),
                          (sluice.range(rows * 101).batch(rows).skip(1).repeat(2).take(100).prefetch(1), 1)):
            n, served, via_shm, fallback, lent_n = self.read_lent(ds, lambda i, b: check(i + first, b))
            self.assertEqual(n, 100)
            self.assertGreater(lent_n, 0, json.dumps(ds.spec))
        # Two clients of one named job, each taking whichever batch comes
        # next: alone, the first one's batches are lent; once the second
        # asks, no block is made in either's region (a region's client can
        # read and write all of it). Blocks made before, at most the task's
        # buffer of 16 and what each has in flight, are all served in the
        # first 50 batches each. None is lent after those.
        ds = sluice.range(0, rows * 50).repeat().batch(rows)
        with ds.distribute(self.addr, job_name='shm-lend') as a:
            alone = lent(self.c.workers[0])
            for _ in range(60):
                next(a)
            self.assertGreater(lent(self.c.workers[0]) - alone, 0, 'one client of a named job is lent its blocks')
            b = ds.distribute(self.addr, job_name='shm-lend')
            for r in range(150):
                if r == 50:
                    before = lent(self.c.workers[0])
                for it in (a, b):
                    v = next(it)['value']
                    np.testing.assert_array_equal(v - v[0], np.arange(rows), 'batch %d' % r)
                    self.assertEqual(int(v[0]) % rows, 0)
            del v
            b.close()
            self.assertEqual(lent(self.c.workers[0]) - before, 0)

    def test_coordinated_consumers_get_blocks_made_each_in_its_own_region(self):
        # Coordinated reads: round r's batches are the task's batches 2r and
        # 2r + 1, for consumers 0 and 1 (workerd/rounds.h), so the task makes
        # each in the region of the consumer it goes to, and every batch is
        # lent once both regions are mapped and the batches made before
        # (at most the task's buffer, the open rounds' and the one being
        # made) are out: counted from round 200, each consumer long past
        # both. Each caller writes into the batches it holds; the other's
        # are whole all the same. A window of 8 keeps each region's blocks
        # out (in flight, in open rounds, in the task's buffer) well below
        # the 64 a region makes at most (SL_SHM_MAX_BLOCKS): a block refused
        # there is copied instead.
        rows = 8199
        ds = sluice.range(0, rows * 50).repeat().batch(rows)
        job = dict(job_name='shm-coord-lend', num_consumers=2, max_outstanding=8)
        with ds.distribute(self.addr, consumer_index=0, **job) as a, \
                ds.distribute(self.addr, consumer_index=1, **job) as b:
            for r in range(400):
                if r == 200:
                    lent_before = lent(self.c.workers[0])
                x = next(a)['value']
                y = next(b)['value']
                self.assertEqual((int(x[-1]) + 1) % (rows * 50), int(y[0]), 'round %d' % r)
                np.testing.assert_array_equal(x - x[0], np.arange(rows), 'round %d' % r)
                np.testing.assert_array_equal(y - y[0], np.arange(rows), 'round %d' % r)
                x[:] = -7
                y[:] = -9
            del x, y
            # Every batch the consumers took in rounds 200 to 399 was lent.
            # The worker counts a batch as it sends it, and up to the window
            # of each consumer (8 requests) is answered ahead of the rounds
            # read, at either end of the stretch: the count is the 400
            # batches of the stretch within 16. Blocks made in one region
            # for both consumers would lend about half.
            self.assertGreaterEqual(lent(self.c.workers[0]) - lent_before, 400 - 2 * 8)

    def test_sixteen_coordinated_consumers_each_get_blocks_of_their_own_region(self):
        # As above with 16 consumers, one trainer process a GPU of two hosts'
        # worth: consumer c of round r takes the task's batch 16r + c
        # (every value checked), made in its own region of the 16, and
        # every batch of rounds 100 to 199 is lent but for the windows at
        # either end of the stretch (4 requests a consumer).
        rows, n = 8199, 16
        ds = sluice.range(0, rows * 50).repeat().batch(rows)
        job = dict(job_name='shm-coord-lend-16', num_consumers=n, max_outstanding=4)
        its = [ds.distribute(self.addr, consumer_index=c, **job) for c in range(n)]
        try:
            for r in range(200):
                if r == 100:
                    lent_before = lent(self.c.workers[0])
                for c, it in enumerate(its):
                    x = next(it)['value']
                    self.assertEqual(int(x[0]), ((n * r + c) % 50) * rows, 'round %d, consumer %d' % (r, c))
                    np.testing.assert_array_equal(x - x[0], np.arange(rows), 'round %d, consumer %d' % (r, c))
                    x[:] = -c
                    del x
            self.assertGreaterEqual(lent(self.c.workers[0]) - lent_before, 100 * n - 2 * 4 * n)
        finally:
            for it in its:
                it.close()


class InterpretedBytesStayOnTheSocket(DataCase):
    """A bytes component's offsets and a ragged one's row splits are read by
    the client after its checks: the worker could change them in a slot, so
    such batches come over the socket."""
    workers = 1

    def test_bytes_and_ragged_components(self):
        files = os.path.join(self.data, 'basic-*-of-00004.tfrecord')
        varlen = os.path.join(self.data, 'varlen-00000-of-00001.tfrecord')
        for ds in (sluice.tfrecord(files).parse_example({'id': int, 'name': bytes}).batch(50),
                   sluice.tfrecord(varlen).parse_example({'id': int, 'tokens': {'dtype': 'int64', 'varlen': True}})
                   .batch(8)):
            before = counters(self.c.workers[0])
            with sluice.distribute(ds, self.c.dispatcher.addr) as it:
                ids = sorted(int(i) for b in it for i in b['id'])
            served, via_shm, fallback = delta(counters(self.c.workers[0]), before)
            self.assertGreater(served, 0)
            self.assertEqual((via_shm, fallback), (0, 0), json.dumps(ds.spec))
            self.assertEqual(len(ids), len(set(ids)))


if __name__ == '__main__':
    unittest.main()
