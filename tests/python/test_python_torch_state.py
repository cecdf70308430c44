"""Tests of sluice.torch's state across DataLoader worker processes
(StatefulDataLoader, SluiceIterableDataset shares) against real daemons:
a dispatcher and two workers on free loopback ports. Each test counts the
elements that went missing and those that came twice across a save and a
restore. Run with tests/python/run.py."""
import collections
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch

import sluice
import sluice.torch as st
from sluice._share import share_spec
from harness import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))

# How DataLoader worker processes start. fork, torch's default, in a normal
# build. Under ASan a fork while another thread of this process (a
# multiprocessing queue feeder left by the test before) holds ASan's
# allocator lock leaves the child stuck in its first malloc: there the
# workers come from a forkserver, a process with one thread.
if os.environ.get('SLUICE_SANITIZED'):
    import multiprocessing
    multiprocessing.set_forkserver_preload(['torch', 'sluice.torch'])
    WORKERS_CONTEXT = multiprocessing.get_context('forkserver')
else:
    WORKERS_CONTEXT = None


def doubled(batch):
    """A collate_fn (module level: the forkserver's workers unpickle it)."""
    return {'double': batch['value'] * 2}

# torch warns when a DataLoader starts more worker processes than there are
# cores; these tests start 3 to 5 on purpose.
warnings.filterwarnings('ignore', message='This DataLoader will create')


def flat(batch, key='value'):
    return batch[key].tolist()


def tally(got, want):
    """(missing, duplicated): elements of want never got, extra copies got."""
    c = collections.Counter(got)
    w = collections.Counter(want)
    missing = sum((w - c).values())
    dup = sum((c - w).values())
    return missing, dup


class ShareSpecTest(unittest.TestCase):
    """share_spec() alone: what each share of a source reads."""

    def test_range_shares_partition_the_range(self):
        for start, stop, step, n in ((0, 100, 1, 3), (5, 77, 4, 4), (100, -3, -7, 2), (0, 2, 1, 5)):
            got = []
            for i in range(n):
                src = share_spec(sluice.range(start, stop, step), i, n)['source']
                got += list(range(src['start'], src['stop'], src['step']))
            self.assertEqual(sorted(got), sorted(range(start, stop, step)), (start, stop, step, n))

    def test_file_shares_and_their_limits(self):
        ds = sluice.text_lines(['/d/a', '/d/b', '/d/c']).batch(2)
        self.assertEqual(share_spec(ds, 0, 2)['source']['files'], ['/d/a', '/d/c'])
        self.assertEqual(share_spec(ds, 1, 2)['source']['files'], ['/d/b'])
        self.assertEqual(share_spec(ds, 1, 2)['ops'], ds.spec['ops'])
        self.assertEqual(share_spec(ds, 0, 1), ds.spec)
        with self.assertRaisesRegex(ValueError, r'source.files: 3 entries cannot make 4 shares'):
            share_spec(ds, 0, 4)
        with self.assertRaisesRegex(ValueError, r'want 0 <= index < count'):
            share_spec(ds, 2, 2)


class StatefulLoaderTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.mkdtemp(prefix='sluice-py-state-')
        cls.c = Cluster(workers=2, dispatcher_args=['--data-root', cls.data], worker_args=['--data-root', cls.data])
        cls.c.wait_workers_registered(2)
        cls.addr = cls.c.dispatcher.addr

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        for name in os.listdir(cls.data):
            os.unlink(os.path.join(cls.data, name))
        os.rmdir(cls.data)
        if bad:
            raise AssertionError('daemons did not exit cleanly: %s' % bad)

    def loader(self, ds, num_workers, **kw):
        if num_workers > 0:
            kw.setdefault('multiprocessing_context', WORKERS_CONTEXT)
        return st.StatefulDataLoader(st.SluiceIterableDataset(ds, self.addr, sharding='dynamic'),
                                     num_workers=num_workers, **kw)

    def run_until(self, dl, stop_after, got, extra_after_state=0):
        """Takes stop_after batches from a new iter(dl) into got, saves the
        state, then takes extra_after_state more batches that a crash would
        lose (not added to got), and abandons the iteration."""
        it = iter(dl)
        for _ in range(stop_after):
            got += flat(next(it))
        state = dl.state_dict()
        for _ in range(extra_after_state):
            next(it)
        del it
        return state

    def test_two_workers_resume_exactly_once(self):
        # A shuffle and a filter in the pipeline, a restore in a new loader
        # (through pickle, as torch.save would), and batches taken after the
        # save that the restore must give again.
        ds = sluice.range(0, 30000).filter('value', 'ne', 7).shuffle(400, seed=11).batch(100)
        want = [v for v in range(30000) if v != 7]
        got = []
        state = self.run_until(self.loader(ds, 2), 37, got, extra_after_state=5)
        self.assertEqual(state['shares'], 2)
        self.assertTrue(all(isinstance(c, bytes) for c in state['checkpoints']), state)
        state = pickle.loads(pickle.dumps(state))
        second = self.loader(ds, 2)
        second.load_state_dict(state)
        # A state loaded and not yet used is the state.
        self.assertEqual(second.state_dict(), state)
        for b in second:
            got += flat(b)
        missing, dup = tally(got, want)
        self.assertEqual((missing, dup), (0, 0), 'missing %d, duplicated %d of %d' % (missing, dup, len(want)))
        # The epoch ended: the state starts the next one.
        self.assertEqual(second.state_dict(), {'version': 1, 'shares': 2, 'checkpoints': [None, None]})

    def test_restores_chain(self):
        ds = sluice.range(0, 20000).shuffle(300, seed=2).batch(50)
        got = []
        state = self.run_until(self.loader(ds, 3), 30, got, extra_after_state=4)
        second = self.loader(ds, 3)
        second.load_state_dict(state)
        state = self.run_until(second, 70, got, extra_after_state=2)
        third = self.loader(ds, 3)
        third.load_state_dict(state)
        for b in third:
            got += flat(b)
        missing, dup = tally(got, range(20000))
        self.assertEqual((missing, dup), (0, 0), 'missing %d, duplicated %d' % (missing, dup))

    def test_one_epoch_with_workers_reads_each_element_once(self):
        # Shared out, the worker processes split the epoch between them (each
        # one used to read the whole dataset), epoch after epoch.
        ds = sluice.range(0, 5000).batch(64)
        dl = self.loader(ds, 2)
        for epoch in range(2):
            got = []
            for b in dl:
                self.assertIsInstance(b['value'], torch.Tensor)
                got += flat(b)
            self.assertEqual(tally(got, range(5000)), (0, 0), 'epoch %d' % epoch)
        # More workers than elements: some shares are empty ranges.
        tiny = self.loader(sluice.range(0, 3).batch(2), 4)
        self.assertEqual(sorted(v for b in tiny for v in flat(b)), [0, 1, 2])

    def test_state_saved_before_any_batch_and_after_a_share_ended(self):
        ds = sluice.range(0, 3000).batch(100)
        dl = self.loader(ds, 2)
        self.assertEqual(dl.state_dict(), {'version': 1, 'shares': 2, 'checkpoints': [None, None]})
        # Take all but the last batch: by then a share may have ended.
        got = []
        state = self.run_until(dl, 29, got)
        second = self.loader(ds, 2)
        second.load_state_dict(state)
        for b in second:
            got += flat(b)
        self.assertEqual(tally(got, range(3000)), (0, 0))

    def test_file_source_shares(self):
        files = []
        for k in range(4):
            path = os.path.join(self.data, 'part-%d.txt' % k)
            with open(path, 'w') as f:
                f.write(''.join('%d-%d\n' % (k, i) for i in range(700)))
            files.append(path)
        want = [b'%d-%d' % (k, i) for k in range(4) for i in range(700)]
        ds = sluice.text_lines(files).shuffle(200, seed=4).batch(32)
        dl = self.loader(ds, 2)
        got = []
        it = iter(dl)
        for _ in range(25):
            got += next(it)['line']
        state = dl.state_dict()
        del it
        second = self.loader(ds, 2)
        second.load_state_dict(state)
        for b in second:
            got += b['line']
        self.assertEqual(tally(got, want), (0, 0))
        with self.assertRaisesRegex(ValueError, 'source.files: 4 entries cannot make 5 shares'):
            next(iter(self.loader(ds, 5)))

    def test_single_process_loader_and_dataset_state(self):
        ds = sluice.range(0, 4000).shuffle(100, seed=9).batch(40)
        got = []
        state = self.run_until(self.loader(ds, 0), 17, got, extra_after_state=3)
        self.assertEqual(state['shares'], 1)
        second = self.loader(ds, 0)
        second.load_state_dict(state)
        for b in second:
            got += flat(b)
        self.assertEqual(tally(got, range(4000)), (0, 0))
        # The dataset's own state in a plain DataLoader without workers: the
        # loop takes what the dataset yields, one by one.
        tds = st.SluiceIterableDataset(ds, self.addr, sharding='dynamic')
        got = []
        it = iter(torch.utils.data.DataLoader(tds, batch_size=None))
        for _ in range(11):
            got += flat(next(it))
        share_state = tds.state_dict()
        self.assertEqual(share_state['share'], [0, 1])
        del it
        tds2 = st.SluiceIterableDataset(ds, self.addr, sharding='dynamic')
        tds2.load_state_dict(share_state)
        for b in torch.utils.data.DataLoader(tds2, batch_size=None):
            got += flat(b)
        self.assertEqual(tally(got, range(4000)), (0, 0))

    def test_ranks_of_a_named_job_resume_from_their_merged_states(self):
        # Three ranks (loaders of one named job) read in turn and stop at a
        # common step; their merged states resume as four loaders under
        # another name: every element once across all seven.
        ds = sluice.range(0, 24000).shuffle(300, seed=2).batch(100)
        ranks = [st.loader(ds, self.addr, sharding='dynamic', job_name='tl-ranks', checkpointable=True)
                 for _ in range(3)]
        its = [iter(r) for r in ranks]
        got = []
        for _ in range(15):
            for it in its:
                got += flat(next(it))
        states = [r.state_dict() for r in ranks]
        self.assertEqual({s['rank_of'] for s in states}, {'tl-ranks'})
        for r in ranks:
            r.close()
        merged = st.merge_state_dicts(states)
        self.assertEqual(merged['merged_from'], 'tl-ranks')
        with self.assertRaisesRegex(ValueError, "one rank's state of named job 'tl-ranks'"):
            ranks[0].load_state_dict(states[0])
        with self.assertRaisesRegex(ValueError, "resume under another job_name than 'tl-ranks'"):
            ranks[0].load_state_dict(merged)
        with self.assertRaisesRegex(ValueError, 'resumes in loaders with a job_name and checkpointable=True'):
            st.loader(ds, self.addr, sharding='dynamic').load_state_dict(merged)
        resumed = [st.loader(ds, self.addr, sharding='dynamic', job_name='tl-ranks-resumed', checkpointable=True)
                   for _ in range(4)]
        for r in resumed:
            r.load_state_dict(merged)
        live = [iter(r) for r in resumed]
        while live:
            for it in list(live):
                try:
                    got += flat(next(it))
                except StopIteration:
                    live.remove(it)
        self.assertEqual(tally(got, range(24000)), (0, 0))
        # Merging refuses what is not a rank's state, and ranks of two jobs.
        with self.assertRaisesRegex(ValueError, "state 2 is not a named job's rank state"):
            st.merge_state_dicts([states[0], {'checkpoint': states[1]['checkpoint']}])
        with self.assertRaisesRegex(ValueError, 'different named jobs'):
            st.merge_state_dicts([states[0], dict(states[1], rank_of='other')])
        with self.assertRaisesRegex(ValueError, 'none of them started'):
            st.merge_state_dicts([{'checkpoint': None, 'rank_of': 'tl-ranks'}])
        # A named job's loader without checkpointable=True has no state.
        with self.assertRaisesRegex(NotImplementedError, 'with a job_name checkpointable=True'):
            st.loader(ds, self.addr, sharding='dynamic', job_name='tl-plain').state_dict()

    def test_refusals(self):
        ds = sluice.range(0, 1000).batch(10)
        two = self.loader(ds, 2)
        it = iter(two)
        next(it)
        state = two.state_dict()
        del it
        with self.assertRaisesRegex(ValueError, r'state of 2 shares .* cannot resume in a loader of 3'):
            self.loader(ds, 3).load_state_dict(state)
        with self.assertRaisesRegex(TypeError, r'checkpoints\"\]\[0\] must be bytes'):
            two.load_state_dict({'version': 1, 'shares': 2, 'checkpoints': ['x', None]})
        with self.assertRaisesRegex(NotImplementedError, 'no job_name'):
            st.StatefulDataLoader(st.SluiceIterableDataset(ds, self.addr, sharding='dynamic', job_name='j'))
        # A named job's dataset says which path gives its ranks a state.
        with self.assertRaisesRegex(NotImplementedError, r'loader\(ds, \.\.\., job_name=\.\.\., checkpointable=True\)'
                                    r'.*merge_state_dicts\(\)'):
            st.SluiceIterableDataset(ds, self.addr, sharding='dynamic', job_name='j').state_dict()
        with self.assertRaisesRegex(NotImplementedError, 'sharding="dynamic"'):
            st.SluiceIterableDataset(ds, self.addr, sharding='off').state_dict()
        with self.assertRaisesRegex(ValueError, 'batch_size must be None'):
            self.loader(ds, 1, batch_size=4)
        with self.assertRaisesRegex(ValueError, 'persistent_workers'):
            self.loader(ds, 1, persistent_workers=True)
        with self.assertRaisesRegex(TypeError, 'SluiceIterableDataset'):
            st.StatefulDataLoader([1, 2, 3])
        # The request window: 0 (the default) sizes it by window_bytes, below 0 is refused where it is given.
        for kw in ({'max_outstanding': -1}, {'per_worker_outstanding': -1}, {'per_worker_outstanding': 17},
                   {'window_bytes': -1}):
            with self.assertRaisesRegex(sluice.InvalidArgumentError, list(kw)[0]):
                st.SluiceIterableDataset(ds, self.addr, sharding='dynamic', **kw)
        st.SluiceIterableDataset(ds, self.addr, sharding='dynamic', max_outstanding=0, per_worker_outstanding=0,
                                 window_bytes=0)

    def test_spawned_workers(self):
        # Workers started with "spawn" (as with CUDA) get the dataset and the
        # state to resume from by pickle, not by fork. spawn imports the main
        # module again in each worker, so this runs in a script of its own.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sluice.__file__)))
        r = subprocess.run([sys.executable, os.path.join(HERE, 'spawn_resume.py'), self.addr], env=env,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        out = json.loads(r.stdout)
        self.assertEqual((out['missing'], out['duplicated']), (0, 0), out)
        self.assertEqual(out['first_pass_batches'], 60)
        self.assertEqual(out['plain_spawn_batches'], 60)  # two shares of 30

    def test_killed_with_minus_9_resumes_exactly_once(self):
        # A trainer (killed_resume.py) saves the loader's state every few
        # batches and is killed with -9 (its DataLoader workers with it)
        # while it reads on; this process resumes from the last state it
        # saved: the elements it had taken by then, and the rest, each
        # exactly once in each of the 3 epochs.
        sys.path.insert(0, HERE)
        try:
            import killed_resume
        finally:
            sys.path.remove(HERE)
        tmp = tempfile.mkdtemp(prefix='sluice-py-killed-')
        values, state_path = os.path.join(tmp, 'values'), os.path.join(tmp, 'state')
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sluice.__file__)))
        child = subprocess.Popen([sys.executable, os.path.join(HERE, 'killed_resume.py'), self.addr, values,
                                  state_path], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            # Gate on state: the child has saved 6 states (42 batches).
            saves = 0
            for line in child.stdout:
                saves += line.startswith('saved ')
                if saves == 6:
                    break
            self.assertEqual(saves, 6, 'the trainer ended before its 6th save (exit %s)' % child.poll())
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            child.stdout.close()
        with open(state_path, 'rb') as f:
            saved = pickle.load(f)
        with open(values) as f:
            taken = [json.loads(next(f)) for _ in range(saved['lines'])]
        got = [v for batch in taken for v in batch]
        second = self.loader(killed_resume.dataset(), 2)
        second.load_state_dict(saved['state'])
        for b in second:
            got += flat(b)
        want = [v for v in range(40000) if v not in (11, 20001)] * 3
        missing, dup = tally(got, want)
        self.assertEqual((missing, dup), (0, 0), 'missing %d, duplicated %d of %d' % (missing, dup, len(want)))
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)

    def test_what_workers_send_per_batch_stays_constant_over_many_epochs(self):
        # 12 epochs behind shuffle(5000): the checkpoint of a share holds
        # the shuffle's holes (thousands of runs), which the workers used to
        # send with every batch; what they send now is each batch's
        # provenance (a few bytes an element), the same in the last epoch
        # as in the first. The state stays bounded too: done epochs fold.
        sizes = []

        class Measured(st.StatefulDataLoader):
            def _unstamp(self, inner, live):
                def spy():
                    for item in inner:
                        sizes.append(len(item.delta))
                        yield item
                return super()._unstamp(spy(), live)

        batch, epochs = 64, 12
        ds = sluice.range(0, 20000).shuffle(5000, seed=1).repeat(epochs).batch(batch)
        dl = Measured(st.SluiceIterableDataset(ds, self.addr, sharding='dynamic'), num_workers=2,
                      multiprocessing_context=WORKERS_CONTEXT)
        n, most_state = 0, 0
        for b in dl:
            n += len(b['value'])
            if len(sizes) % 200 == 0:
                state = dl.state_dict()
                most_state = max(most_state, max(len(c) for c in state['checkpoints'] if c is not None))
        self.assertEqual(n, 20000 * epochs)
        # A delta: 16 bytes of header, 18 a batch record, at most 10 bytes
        # an element (varints), and the split-done notices it carries.
        bound = 16 + 18 + 10 * batch + 512
        first, last = sizes[:len(sizes) // epochs], sizes[-(len(sizes) // epochs):]
        self.assertLessEqual(max(sizes), bound, 'largest delta %d bytes' % max(sizes))
        self.assertLessEqual(sum(last) / len(last), 1.5 * sum(first) / len(first) + 64,
                             'the last epoch\'s deltas average %d bytes, the first\'s %d'
                             % (sum(last) / len(last), sum(first) / len(first)))
        # Each share's checkpoint holds its open epochs' holes: about a
        # shuffle buffer's worth of runs (3 bytes each), not 12 epochs'.
        self.assertLessEqual(most_state, 72 + 3 * 2 * 5000 + 4096, 'a state checkpoint of %d bytes' % most_state)
        sys.stderr.write('deltas: %d batches, mean %.0f bytes, largest %d; state checkpoint largest %d bytes\n'
                         % (len(sizes), sum(sizes) / len(sizes), max(sizes), most_state))

    def test_collate_fn_and_pin_memory(self):
        ds = sluice.range(0, 800).batch(100)
        dl = self.loader(ds, 2, collate_fn=doubled, pin_memory=True)
        got = []
        for b in dl:
            got += b['double'].tolist()
        self.assertEqual(sorted(got), [2 * v for v in range(800)])


if __name__ == '__main__':
    unittest.main()
