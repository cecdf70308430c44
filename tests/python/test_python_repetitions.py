"""Repetitions of named jobs from Python, against real daemons: each new
iterator over one distribute()d dataset joins the next repetition by itself,
as tf.data service counts them; a rank that joins a repetition that already
ended gets its end at once; sluice.torch's loaders pass the epoch. Run with
tests/python/run.py."""
import collections
import unittest

import torch

import sluice
import sluice.client
import sluice.torch
from harness import get_json, wait_for
from pycase import SluiceCase

N = 3000
DS = sluice.range(0, N).batch(50)


def drain_together(its):
    """Every value of the iterators, taken from them in turn (ranks that
    split one job), and each iterator's batch count."""
    got, counts = [], [0] * len(its)
    live = list(enumerate(its))
    while live:
        for k, it in list(live):
            try:
                got.extend(next(it)['value'].tolist())
                counts[k] += 1
            except StopIteration:
                live.remove((k, it))
    return got, counts


class RepetitionTest(SluiceCase):
    dispatcher_args = ('--job-gc-timeout-ms', '600000')

    def repetitions(self, name):
        """The admin API's repetitions of the named job, once all ended."""
        def ended():
            reps = get_json(self.c.dispatcher.admin_port, '/v1/jobs')['names'].get(name, [])
            return reps if reps and all(r['state'] != 'RUNNING' for r in reps) else None
        return wait_for(ended, 'every repetition of %s to end' % name)

    def test_each_new_iterator_joins_the_next_repetition(self):
        # Two ranks, each with its own distribute() of one named job, loop
        # over it for three epochs: every epoch is one repetition, read
        # once between them.
        a = DS.distribute(self.addr, sharding='dynamic', job_name='py-reps')
        b = DS.distribute(self.addr, sharding='dynamic', job_name='py-reps')
        self.assertEqual((a.repetition, b.repetition), (0, 0))
        job_ids = []
        for epoch in range(3):
            ia, ib = iter(a), iter(b)
            self.assertEqual((ia.repetition, ib.repetition), (epoch, epoch))
            self.assertEqual(ia.job_id, ib.job_id, 'the ranks share the repetition')
            self.assertEqual((ia.notice, ib.notice), ('', ''))
            got, _ = drain_together([ia, ib])
            self.assertEqual(collections.Counter(got), collections.Counter(range(N)), 'epoch %d' % epoch)
            job_ids.append(ia.job_id)
        self.assertEqual(len(set(job_ids)), 3, 'one job per repetition')
        reps = self.repetitions('py-reps')
        self.assertEqual([r['repetition'] for r in reps], [0, 1, 2])
        self.assertEqual([r['job_id'] for r in reps], job_ids)
        self.assertEqual([r['state'] for r in reps], ['FINISHED'] * 3)

    def test_a_late_rank_gets_the_end_of_an_ended_repetition_then_the_next_one(self):
        early = DS.distribute(self.addr, sharding='dynamic', job_name='py-late')
        got, _ = drain_together([early])
        self.assertEqual(sorted(got), list(range(N)))
        late = DS.distribute(self.addr, sharding='dynamic', job_name='py-late')
        self.assertEqual(late.job_id, early.job_id)
        self.assertEqual(list(late), [], 'a late rank reads no epoch twice')
        self.assertIn('job "py-late" repetition 0 (id %d) had already ended (FINISHED)' % early.job_id, late.notice)
        # Its next epoch is repetition 1, which no one started: all of it.
        nxt = iter(late)
        self.assertEqual(nxt.repetition, 1)
        got, _ = drain_together([nxt])
        self.assertEqual(sorted(got), list(range(N)))
        # An explicit repetition.
        again = DS.distribute(self.addr, sharding='dynamic', job_name='py-late', repetition=1)
        self.assertEqual(list(again), [])
        self.assertIn('repetition 1', again.notice)
        again.close()

    def test_a_repetition_needs_a_job_name(self):
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'repetition 2 needs a job_name'):
            DS.distribute(self.addr, repetition=2)
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'repetition must be an integer'):
            DS.distribute(self.addr, job_name='x', repetition=-1)

    def test_an_anonymous_iterator_iterated_again_reads_a_new_epoch(self):
        it = DS.distribute(self.addr, sharding='dynamic')
        first, _ = drain_together([it])
        second, _ = drain_together([iter(it)])
        self.assertEqual(sorted(first), list(range(N)))
        self.assertEqual(sorted(second), list(range(N)))

    def test_the_torch_loader_passes_its_epoch(self):
        ld = sluice.torch.loader(DS, self.addr, sharding='dynamic', job_name='torch-loader')
        for epoch in range(2):
            got = []
            for batch in ld:
                got.extend(batch['value'].tolist())
            self.assertEqual(sorted(got), list(range(N)), 'epoch %d' % epoch)
        # A loader that resumes at epoch 1 in a new process: repetition 1 has ended.
        ld2 = sluice.torch.loader(DS, self.addr, sharding='dynamic', job_name='torch-loader')
        ld2.set_epoch(1)
        self.assertEqual(list(ld2), [])
        self.assertEqual([r['repetition'] for r in self.repetitions('torch-loader')], [0, 1])

    def test_an_iterable_dataset_in_a_dataloader_follows_set_epoch(self):
        # Two DataLoader worker processes join the named job's repetition of
        # the epoch set, and split it.
        ds = sluice.torch.SluiceIterableDataset(DS, self.addr, sharding='dynamic', job_name='torch-ds')
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        for epoch in range(2):
            ds.set_epoch(epoch)
            got = []
            for batch in dl:
                got.extend(batch['value'].tolist())
            self.assertEqual(collections.Counter(got), collections.Counter(range(N)), 'epoch %d' % epoch)
        self.assertEqual([r['repetition'] for r in self.repetitions('torch-ds')], [0, 1])


if __name__ == '__main__':
    unittest.main()
