"""DYNAMIC sharding behind shuffle buffers of the sizes users run (10^5 and
more): every element exactly once, with one and three workers, with and
without provenance, over a range and over text files, behind repeat, and
across a checkpoint and a resume in a new process. A shuffle(100000) once
repeated 14% of an epoch with no failure at all: a frame carried at most 64
split-done notices, and a task whose buffer finished more splits at its end
had the rest handed out again. Then a seeded property test draws sizes,
split sizes, batch sizes, worker counts, filters and checkpoints at random;
set SLUICE_SEED to replay one draw."""
import collections
import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

from consumers import Consumers
from harness import Cluster, ClusterCase, child_env, get_json, wait_for


def range_spec(n, buffer, batch, seed=1, pre=(), post=()):
    return {"source": {"type": "range", "stop": n},
            "ops": list(pre) + [{"op": "shuffle", "buffer_size": buffer, "seed": seed}] + list(post) +
                   [{"op": "batch", "batch_size": batch}]}


def read_values(cluster, spec, args=(), timeout=600):
    """Runs sluice-cat --format raw to the end: (returncode, int64 values, stderr)."""
    r = subprocess.run(cluster.cat_argv(spec, ['--sharding', 'dynamic'] + list(args), fmt='raw'),
                       capture_output=True, timeout=timeout, env=child_env())
    return r.returncode, np.frombuffer(r.stdout, dtype='<i8'), r.stderr.decode(errors='replace')


def exactly(values, n, times=1, low=0):
    """None when values hold every integer of [low, n) exactly `times` times and
    nothing else; else what is wrong."""
    if values.size and (values.min() < low or values.max() >= n):
        return 'values outside [%d, %d): min %d, max %d' % (low, n, values.min(), values.max())
    counts = np.bincount(values - low, minlength=n - low) if values.size else np.zeros(n - low, dtype=np.int64)
    wrong = np.nonzero(counts != times)[0]
    if wrong.size == 0:
        return None
    more = int(np.sum(np.maximum(counts - times, 0)))
    fewer = int(np.sum(np.maximum(times - counts, 0)))
    return '%d values of %d wrong (%d extra, %d missing; first %d seen %d times)' % (
        wrong.size, n - low, more, fewer, wrong[0] + low, counts[wrong[0]])


class Shuffle(ClusterCase):
    workers = 1

    def once(self, n, buffer, args=(), batch=1024):
        rc, got, err = read_values(self.c, range_spec(n, buffer, batch), args)
        self.assertEqual(rc, 0, err[-2000:])
        self.assertIsNone(exactly(got, n), 'shuffle(%d), %d workers %s: %s' % (buffer, self.workers, args,
                                                                            err[-1000:]))

    def test_buffers_of_50000_to_500000_give_every_element_once(self):
        for buffer in (50000, 100000, 200000, 500000):
            with self.subTest(buffer=buffer):
                self.once(1000000, buffer)

    def test_without_provenance_too(self):
        for buffer in (100000, 500000):
            with self.subTest(buffer=buffer):
                self.once(1000000, buffer, ['--no-provenance'])

    def test_behind_repeat_every_element_once_per_pass(self):
        for ops in ({"pre": [], "post": [{"op": "repeat", "count": 3}]},
                    {"pre": [{"op": "repeat", "count": 3}], "post": []}):
            with self.subTest(**ops):
                rc, got, err = read_values(self.c, range_spec(300000, 200000, 1000, **ops))
                self.assertEqual(rc, 0, err[-2000:])
                self.assertIsNone(exactly(got, 300000, times=3))

    def test_past_max_ledger_runs_it_says_so_and_takes_no_checkpoint(self):
        """The documented fallback of a ledger too small for the shuffle's
        holes: a line on stderr, and a checkpoint refused by name, never a
        checkpoint that would repeat or lose elements."""
        ckpt = os.path.join(self.c.dir, 'ckpt-small-%d' % self.workers)
        rc, got, err = read_values(self.c, range_spec(1000000, 100000, 1024),
                                   ['--limit', '50', '--max-ledger-runs', '1000', '--checkpoint-out', ckpt])
        self.assertNotEqual(rc, 0, err[-2000:])
        self.assertIn('no longer fits its ledger', err)
        self.assertIn('more than 1000 runs of positions (max_ledger_runs', err)
        self.assertFalse(os.path.exists(ckpt))

    def test_a_checkpoint_mid_epoch_resumes_exactly_once(self):
        spec = range_spec(1000000, 500000, 1024)
        ckpt = os.path.join(self.c.dir, 'ckpt-%d' % self.workers)
        # 300 batches in: far fewer than the epoch, with the buffers full.
        rc, first, err = read_values(self.c, spec, ['--limit', '300', '--checkpoint-out', ckpt])
        self.assertEqual(rc, 0, err[-2000:])
        # 300 batches, whole but for the last of each worker's share: a
        # worker whose splits ran out drains its buffer and its last batch is
        # short, and with splits handed out unevenly that can come within the
        # first 300 (306,752 elements were seen with three workers).
        self.assertLessEqual(first.size, 300 * 1024)
        self.assertGreater(first.size, 300 * 1024 - self.workers * 1024)
        rc, rest, err = read_values(self.c, spec, ['--resume-from', ckpt])
        self.assertEqual(rc, 0, err[-2000:])
        self.assertIsNone(exactly(np.concatenate([first, rest]), 1000000))


class ShuffleThreeWorkers(Shuffle):
    workers = 3


class TextFiles(ClusterCase):
    """50 files of 20,000 lines behind shuffle(100000), two workers."""

    FILES, LINES = 50, 20000
    workers = 2

    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.mkdtemp(prefix='sluice-lines-')
        for f in range(cls.FILES):
            with open(os.path.join(cls.data, 'part-%03d.txt' % f), 'w') as out:
                out.write(''.join('%d\n' % (f * cls.LINES + i) for i in range(cls.LINES)))
        cls.dispatcher_args = cls.worker_args = ['--data-root', cls.data]
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.data, ignore_errors=True)

    def test_every_line_once(self):
        n = self.FILES * self.LINES
        for args in ([], ['--no-provenance']):
            with self.subTest(args=args):
                spec = {"source": {"type": "text_lines", "files": [os.path.join(self.data, 'part-*.txt')]},
                        "ops": [{"op": "shuffle", "buffer_size": 100000, "seed": 3},
                                {"op": "batch", "batch_size": 1024}]}
                rc, lines, err = self.c.cat(spec, ['--sharding', 'dynamic'] + args)
                self.assertEqual(rc, 0, err[-2000:])
                got = np.array([int(v) for b in lines for v in b['line']], dtype=np.int64)
                self.assertIsNone(exactly(got, n), err[-1000:])


class OutstandingBound(unittest.TestCase):
    def test_a_buffer_wider_than_the_bound_fails_the_job_by_name(self):
        """A pipeline whose shuffle buffer needs more splits than
        --max-outstanding-splits before it can finish one would wait for ever:
        the job fails, and the message says which bound and what to raise."""
        # Splits of 1,024 at most: a worker's rate would otherwise make them
        # longer (docs/sharding.md), and a fast one fill its buffer.
        c = Cluster(workers=1, dispatcher_args=['--max-outstanding-splits', '16', '--split-size', '1024',
                                                '--max-split-size', '1024'])
        try:
            c.wait_workers_registered(1)
            # A buffer of 20,000 elements over splits of 1,024 at most: a
            # split's last record stays in it for a hundred splits or so,
            # far more than the 32 a task held at the bound of 16 may get
            # while none of its splits can finish.
            spec = range_spec(1000000, 20000, 64)
            rc, got, err = read_values(c, spec, timeout=120)
            self.assertEqual(rc, 1, err[-2000:])
            self.assertIn('--max-outstanding-splits 16', err)
            self.assertIn('raise --max-outstanding-splits or --split-size', err)
        finally:
            self.assertEqual(c.close(), {})

    def test_coordinated_reads_whose_buffer_is_wider_than_the_bound_fail_by_name(self):
        """The same under coordinated reads, where a round's batches go out
        once all are made: splits of 100 through a shuffle of 1,000 leave
        each split's last records in the buffer for dozens of splits, so at
        12 the pipeline stops with a round of three consumers part made, and
        no split can finish. The worker counted that round's batches as
        waiting for a client, so the dispatcher never took the task for
        starved and the job stayed RUNNING, its consumers waiting (before
        2026-12-04); they wait for the pipeline."""
        ops = [{"op": "shuffle", "buffer_size": 1000, "seed": 3}, {"op": "repeat"}, {"op": "batch", "batch_size": 100}]
        with self.coordinated(1, 12, 100, ops, [4, 4, 4]) as cons:
            wait_for(lambda: all(p.poll() is not None for p in cons.procs), 'every consumer to end', timeout=120)
            codes = [p.returncode for p in cons.procs]
            said = cons.stop()
            self.assertEqual(codes, [1, 1, 1], said)
            for err in said:
                self.assertIn('--max-outstanding-splits 12', err)
                self.assertIn('raise --max-outstanding-splits or --split-size', err)

    def test_coordinated_consumers_read_on_at_a_tight_bound(self):
        """The consumer that asks ahead gets its batch of a round before the
        round's other batches are made, so before their splits are done: a
        client's done_below moved only with a later batch of the task, and a
        task at the bound makes none. With a bound of 8, two workers and two
        consumers (one asking 16 rounds ahead, one a round at a time) the
        job stopped within a few rounds, RUNNING, its consumers waiting
        (before 2026-12-04). A client whose requests of a task wait now asks
        how far its splits are done (GetElementRequest.progress). Both read
        300 rounds, and no value twice."""
        with self.coordinated(2, 8, 1000, [{"op": "repeat"}, {"op": "batch", "batch_size": 1000}], [16, 1]) as cons:
            wait_for(lambda: cons.reading(300), 'both consumers to read 300 rounds', timeout=120)
            seen = collections.Counter(v for g in cons.got for x in g[:300] for v in x['value'])
            self.assertEqual([v for v, n in seen.items() if n > 1][:10], [])
            self.assertEqual(len(seen), 2 * 300 * 1000)

    @contextlib.contextmanager
    def coordinated(self, workers, bound, split, ops, windows):
        """Coordinated consumers (a window each of windows) of a DYNAMIC job
        over ops on a range of 2^40, from workers workers, with
        --max-outstanding-splits bound and splits of split records; the
        daemons must exit cleanly after."""
        c = Cluster(workers=workers, dispatcher_args=['--max-outstanding-splits', str(bound), '--split-size',
                                                      str(split), '--max-split-size', str(split)])
        cons = None
        try:
            c.wait_workers_registered(workers)
            spec = {"source": {"type": "range", "stop": 1 << 40}, "ops": ops}
            cons = Consumers(c, spec, 'coord-bound', windows, ['--sharding', 'dynamic', '--timeout-ms', '60000'])
            yield cons
        finally:
            if cons:
                cons.stop()
            self.assertEqual(c.close(), {})

    def test_a_pipeline_that_drops_every_element_fails_the_job_by_name(self):
        """A skip past the data under a repeat reads epoch after epoch and
        makes no batch: the splits it read never finish (their notices go
        with batches), so the job fails at the bound, and the message says
        this cause too, where it named only a shuffle buffer."""
        c = Cluster(workers=1, dispatcher_args=['--max-outstanding-splits', '16'])
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 10},
                    "ops": [{"op": "skip", "count": 100}, {"op": "repeat"}, {"op": "batch", "batch_size": 4}]}
            rc, got, err = read_values(c, spec, timeout=120)
            self.assertEqual(rc, 1, err[-2000:])
            self.assertEqual(len(got), 0)
            self.assertIn('--max-outstanding-splits 16', err)
            self.assertRegex(err, r'or it drops every element it reads \(a skip or filter that leaves nothing, under '
                             r'a repeat, runs through epochs without end: the job is at epoch \d+ and the task has '
                             r'served no batch\)')
        finally:
            self.assertEqual(c.close(), {})


def read_with_kill(cluster, spec, args, at_bytes, victim, down):
    """Streams spec (--format raw, DYNAMIC) and, once at_bytes were read,
    kills worker `victim` with -9 and starts it again on its ports after
    `down` seconds. Reading stops meanwhile, so the job cannot end before the
    kill unless the workers hold all the rest in their buffers; either way
    every element must come once. Returns (returncode, values, stderr)."""
    rc, raw, err = cluster.cat_across_restart(spec, ['--sharding', 'dynamic'] + list(args), at_bytes, victim, down)
    return rc, np.frombuffer(raw, dtype='<i8'), err


class PausedConsumer(unittest.TestCase):
    def test_a_consumer_that_pauses_at_the_bound_does_not_fail_its_job(self):
        """A trainer that stops reading for longer than the bound's 5 s (it
        saves its model, say) while its task holds --max-outstanding-splits:
        the splits wait in the worker's buffer for the consumer, not for the
        pipeline; the job must go on, exactly once, when it reads again."""
        # Splits of 1,000 at most: 200,000 elements are then far more than 8
        # splits, however fast the worker (its rate would make them longer).
        c = Cluster(workers=1, dispatcher_args=['--max-outstanding-splits', '8', '--split-size', '1000',
                                                '--max-split-size', '1000'])
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 200000}, "ops": [{"op": "batch", "batch_size": 1000}]}
            err_path = os.path.join(c.dir, 'cat-paused.err')
            with open(err_path, 'wb') as err_file:
                proc = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--max-outstanding', '1'],
                                                   fmt='raw'),
                                        stdout=subprocess.PIPE, stderr=err_file, env=child_env())
            try:
                head = proc.stdout.read(8 * 2000)
                # Nobody reads now: the task reaches the bound and is held.
                wait_for(lambda: get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'][0]['lost_splits']
                         ['outstanding'] >= 8, 'the task to hold --max-outstanding-splits')
                time.sleep(7)  # longer than the bound's 5 s: a pause, not a wait for speed
                job = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'][0]
                self.assertEqual(job['state'], 'RUNNING', job)
                tail = proc.stdout.read()
                proc.wait(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            with open(err_path) as f:
                err = f.read()
            self.assertEqual(proc.returncode, 0, err[-2000:])
            self.assertIsNone(exactly(np.frombuffer(head + tail, dtype="<i8"), 200000), err[-1000:])
        finally:
            self.assertEqual(c.close(), {})


class PropertyTest(unittest.TestCase):
    """Seeded draws: dataset size, shuffle buffer, split size, batch size,
    workers, provenance, an optional filter, epochs (one in two draws reads
    2 to 100 epochs, with the repeat before the shuffle, whose buffer then
    mixes epochs, or after it, up to 5,000,000 elements in all), and a
    fault: none, a checkpoint and a resume in a new process at a random
    batch, or a worker killed with -9 at a random point and started again.
    Every element the filter keeps comes exactly once per epoch. Prints the
    seed; SLUICE_SEED replays it."""

    DRAWS = 6

    def test_random_shapes_are_exactly_once(self):
        seed = int(os.environ.get('SLUICE_SEED', random.SystemRandom().randrange(1 << 32)))
        print('PropertyTest seed %d (SLUICE_SEED=%d replays it)' % (seed, seed), file=sys.stderr)
        rng = random.Random(seed)
        for draw in range(self.DRAWS):
            n = rng.randrange(50000, 400000)
            buffer = int(10 ** rng.uniform(3, 5.5))
            split = int(10 ** rng.uniform(1.8, 3.7))
            batch = int(2 ** rng.uniform(6, 11))
            workers = rng.randint(1, 3)
            provenance = rng.random() < 0.75
            low = rng.choice([0, 0, n // 3])
            epochs = 1 if rng.random() < 0.5 else rng.randint(2, max(2, min(100, 5000000 // n)))
            repeat_at = rng.choice(['before', 'after'])
            # Without provenance a worker loss is at least once by design
            # (docs/fault-tolerance.md), and there are no checkpoints.
            fault = rng.choice(['none', 'checkpoint', 'kill']) if provenance else 'none'
            batches = max(2, (n - low) * epochs // batch)
            ckpt_at = rng.randrange(1, batches) if fault == 'checkpoint' else 0
            kill_at = 8 * rng.randrange(1, (n - low) * epochs) if fault == 'kill' else 0
            victim, down = rng.randrange(workers), rng.uniform(0.0, 0.5)
            what = ('seed %d draw %d: n=%d buffer=%d split=%d batch=%d workers=%d provenance=%s low=%d epochs=%d '
                    'repeat %s the shuffle, fault=%s checkpoint_at=%d kill_at_byte=%d victim=%d' % (
                        seed, draw, n, buffer, split, batch, workers, provenance, low, epochs, repeat_at, fault,
                        ckpt_at, kill_at, victim))
            print(what, file=sys.stderr)
            pre = [{"op": "filter", "key": "value", "cmp": "ge", "value": low}] if low else []
            repeat = [{"op": "repeat", "count": epochs}] if epochs > 1 else []
            spec = range_spec(n, buffer, batch, seed=draw, pre=pre + (repeat if repeat_at == 'before' else []),
                              post=repeat if repeat_at == 'after' else [])
            c = Cluster(workers=workers, dispatcher_args=['--split-size', str(split)])
            try:
                c.wait_workers_registered(workers)
                args = [] if provenance else ['--no-provenance']
                parts = []
                if ckpt_at:
                    ckpt = os.path.join(c.dir, 'ckpt')
                    rc, got, err = read_values(c, spec, args + ['--limit', str(ckpt_at), '--checkpoint-out', ckpt])
                    self.assertEqual(rc, 0, what + ': ' + err[-2000:])
                    parts.append(got)
                    args = args + ['--resume-from', ckpt]
                if kill_at:
                    rc, got, err = read_with_kill(c, spec, args, kill_at, victim, down)
                else:
                    rc, got, err = read_values(c, spec, args)
                self.assertEqual(rc, 0, what + ': ' + err[-2000:])
                parts.append(got)
                self.assertIsNone(exactly(np.concatenate(parts), n, times=epochs, low=low), what)
            finally:
                self.assertEqual(c.close(), {}, what)


if __name__ == '__main__':
    unittest.main()
