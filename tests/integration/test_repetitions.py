"""Named jobs keyed by (name, repetition), end to end with sluice-cat: 64
ranks of one named DYNAMIC job started over a few seconds, some after the
job ended, read each element exactly once between them; two repetitions of
one name run side by side; a repetition collected after
--job-gc-timeout-ms is created again. Late ranks are started once the
admin API shows the job ended, never after a guessed pause."""
import collections
import fcntl
import os
import subprocess
import threading
import time
import unittest

from harness import Cluster, child_env, get_json, parse_jsonl, summary, values, wait_for

N = 400000
SPEC = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": 20}]}
SMALL = {"source": {"type": "range", "stop": 6000}, "ops": [{"op": "batch", "batch_size": 20}]}
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), not named by Python before 3.10


def repetitions(c, name):
    return get_json(c.dispatcher.admin_port, '/v1/jobs')['names'].get(name, [])


def repetition(c, name, rep):
    for r in repetitions(c, name):
        if r['repetition'] == rep:
            return r
    return None


def start(c, name, rep=0, extra=()):
    return subprocess.Popen(c.cat_argv(SMALL, ['--sharding', 'dynamic', '--job-name', name, '--repetition', str(rep)]
                                       + list(extra)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())


class Rank:
    """A sluice-cat rank of a named DYNAMIC job. hold: its stdout is a pipe
    of 4 KiB that nobody reads until release(): it blocks once that pipe,
    its stdio buffer (at most 8 KiB) and its prefetched batches (8 of 20)
    are full: at most 12288 / 3 + 160 elements (a jsonl value takes at least
    3 bytes, "7, "), far below N / 32."""

    def __init__(self, c, name, hold=False):
        self.reader = None
        out = subprocess.PIPE
        if hold:
            self.reader, out = os.pipe()
            fcntl.fcntl(out, F_SETPIPE_SZ, 4096)
        self.p = subprocess.Popen(c.cat_argv(SPEC, ['--sharding', 'dynamic', '--job-name', name]), stdout=out,
                                  stderr=subprocess.PIPE, text=True, env=child_env())
        if hold:
            os.close(out)
        self.out = []
        self.thread = None

    def release(self):
        """Starts reading the held stdout (and stderr, which is small)."""
        def read():
            with os.fdopen(self.reader, 'r') as f:
                self.out.append(f.read())
        self.thread = threading.Thread(target=read)
        self.thread.start()

    def finish(self, timeout=600):
        if self.reader is None:
            out, err = self.p.communicate(timeout=timeout)
        else:
            err = self.p.stderr.read()
            self.p.wait(timeout=timeout)
            self.thread.join()
            out = self.out[0]
        return self.p.returncode, values(parse_jsonl(out), 'value'), err

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        if self.thread:
            self.thread.join()
        elif self.reader is not None:
            os.close(self.reader)
            self.reader = None
        self.p.stderr.close()
        if self.p.stdout:
            self.p.stdout.close()


def finish(p, timeout=600):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, values(parse_jsonl(out), 'value'), err


class Repetitions(unittest.TestCase):

    def test_64_ranks_some_after_the_end_read_each_element_once(self):
        # 64 ranks of one named job come over a few seconds: 32 that surely
        # join it while it runs, 16 that may or may not, 16 after its end.
        # Those after the end must see its end, not read the epoch again.
        c = Cluster(workers=2, dispatcher_args=['--job-gc-timeout-ms', '3600000'])
        ranks = []
        try:
            c.wait_workers_registered(2)
            # The first 32 write to pipes of 4 KiB not read yet: each blocks
            # once a pipe, its stdio buffer and its prefetched batches are
            # full, at most HELD elements, far less than N / 32; so the job
            # cannot end before all 32 joined.
            for i in range(32):
                ranks.append(Rank(c, 'ranks', hold=True))
                time.sleep(0.05)  # spread the starts; nothing is asserted on timing
            wait_for(lambda: (repetition(c, 'ranks', 0) or {}).get('num_consumers') == 32,
                     'the first 32 ranks to join repetition 0 of "ranks"', timeout=600)
            self.assertEqual(repetition(c, 'ranks', 0)['state'], 'RUNNING')
            for r in ranks:
                r.release()
            for i in range(16):
                ranks.append(Rank(c, 'ranks'))
                time.sleep(0.05)
            wait_for(lambda: (repetition(c, 'ranks', 0) or {}).get('state') == 'FINISHED',
                     'repetition 0 of "ranks" to finish', timeout=600)
            late = [Rank(c, 'ranks') for _ in range(16)]
            got = []
            for i, r in enumerate(ranks + late):
                rc, vals, err = r.finish()
                self.assertEqual(rc, 0, 'rank %d: %s' % (i, err[-2000:]))
                self.assertIsNotNone(summary(err), err)
                got.extend(vals)
                if i < 32:
                    self.assertNotIn('already ended', err)
                if i >= 48:
                    self.assertEqual(vals, [], 'late rank %d read data' % i)
                    self.assertRegex(err, r'sluice-cat: job "ranks" repetition 0 \(id \d+\) had already ended '
                                          r'\(FINISHED\) \d+ ms ago: this client gets its end at once')
            self.assertEqual(len(got), N)
            self.assertEqual(collections.Counter(got), collections.Counter(range(N)),
                             'each element once across the 64 ranks')
            reps = repetitions(c, 'ranks')
            self.assertEqual(len(reps), 1, reps)
            self.assertEqual((reps[0]['repetition'], reps[0]['state'], reps[0]['collected']), (0, 'FINISHED', False))
            self.assertEqual(len(get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']), 1, 'no job made again')
        finally:
            for r in ranks:
                r.kill()
            self.assertEqual(c.close(), {})

    def test_two_repetitions_of_one_name_run_side_by_side(self):
        # Epoch 1 starts while a slow rank is still in epoch 0: the slow
        # rank's stdout is not read until epoch 1 is done, so it blocks once
        # the pipe is full, long before its epoch's end (its output is many
        # times a pipe's 64 KiB), and repetition 0 cannot finish meanwhile.
        big = {"source": {"type": "range", "stop": 100000}, "ops": [{"op": "batch", "batch_size": 20}]}
        c = Cluster(workers=2)
        slow = None
        try:
            c.wait_workers_registered(2)
            argv = ['--sharding', 'dynamic', '--job-name', 'two', '--repetition']
            slow = subprocess.Popen(c.cat_argv(big, argv + ['0']), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=child_env())
            wait_for(lambda: repetition(c, 'two', 0), 'repetition 0 of "two" to be created')
            r = subprocess.run(c.cat_argv(big, argv + ['1']), capture_output=True, text=True, env=child_env(),
                               timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(sorted(values(parse_jsonl(r.stdout), 'value')), list(range(100000)),
                             'repetition 1 reads the whole dataset')
            self.assertNotIn('already ended', r.stderr)
            r0, r1 = repetition(c, 'two', 0), repetition(c, 'two', 1)
            self.assertEqual(r0['state'], 'RUNNING', 'repetition 0 still runs beside repetition 1')
            self.assertNotEqual(r0['job_id'], r1['job_id'])
            rc, vals, err = finish(slow)
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(vals), list(range(100000)), 'repetition 0 reads the whole dataset too')
            wait_for(lambda: all(r['state'] == 'FINISHED' for r in repetitions(c, 'two')), 'both to finish')
            self.assertEqual([r['repetition'] for r in repetitions(c, 'two')], [0, 1])
        finally:
            if slow and slow.poll() is None:
                slow.kill()
                slow.communicate()
            self.assertEqual(c.close(), {})

    def test_a_join_after_collection_creates_the_repetition_again_and_says_so(self):
        c = Cluster(workers=1, dispatcher_args=['--job-gc-timeout-ms', '300'])
        try:
            c.wait_workers_registered(1)
            rc, vals, err = finish(start(c, 'gc'))
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(vals), list(range(6000)))
            first = repetition(c, 'gc', 0)
            wait_for(lambda: (repetition(c, 'gc', 0) or {}).get('collected'), 'repetition 0 to be collected')
            rc, vals, err = finish(start(c, 'gc'))
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(vals), list(range(6000)), 'created again: the whole dataset')
            self.assertRegex(err, r'job "gc" repetition 0 \(id %d\) ended \(FINISHED\) \d+ ms ago and was collected '
                                  r'\(no client for --job-gc-timeout-ms 300 ms\); a new job \d+ was created'
                             % first['job_id'])
            reps = repetitions(c, 'gc')
            self.assertEqual(len(reps), 1, 'the collected record is replaced')
            self.assertNotEqual(reps[0]['job_id'], first['job_id'])
        finally:
            self.assertEqual(c.close(), {})

    def test_repetition_needs_a_job_name(self):
        c = Cluster(workers=0)
        try:
            r = subprocess.run(c.cat_argv(SMALL, ['--repetition', '1']), capture_output=True, text=True,
                               env=child_env(), timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn('--repetition counts the passes over a named job: give --job-name too', r.stderr)
            r = subprocess.run(c.cat_argv(SMALL, ['--job-name', 'x', '--repetition', '-1']), capture_output=True,
                               text=True, env=child_env(), timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn('--repetition: "-1" is not an integer', r.stderr)
        finally:
            self.assertEqual(c.close(), {})


if __name__ == '__main__':
    unittest.main()
