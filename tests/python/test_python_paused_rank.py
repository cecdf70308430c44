"""A rank of a named DYNAMIC job whose trainer stops reading, beside ranks
whose worker loses batches it sent them (docs/fault-tolerance.md, "The
worker's word")."""
import collections
import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import sluice
from harness import Cluster, cats_end, cats_values, child_env, get_json, stop_until_batches_are_lost, wait_for

FILES, EPOCHS, BATCH, CATS, BOUND = 100, 20, 5, 6, 16


class PausedRankBehindLostBatchesTest(unittest.TestCase):
    """One rank (a Python iterator) takes a batch and stops reading, as a
    trainer writing a checkpoint does; six sluice-cat ranks read on, and
    are stopped (SIGSTOP) while the worker holds batches sent to them until
    it lets those go after its --hold-timeout-ms of 1 s. The worker's word
    of what reached the clients then stops short of those batches' splits
    (lost_below) and counts past them only once every rank said it has
    them; the paused rank's progress stays where its first batches left it.
    Its loop asks the worker how far the task's splits are done when the
    dispatcher lists the task with probe_below, and the others read on at
    the bound of 16. Without the asking the job stopped at its next hold
    for as long as the pause lasted. Every record once an epoch across the
    ranks, the paused one's read once the others are done."""

    def setUp(self):
        self.data = tempfile.mkdtemp(prefix='sluice-paused-')
        self.files = []
        for f in range(FILES):
            self.files.append(os.path.join(self.data, 'part-%03d.txt' % f))
            with open(self.files[-1], 'w') as out:
                out.write('%d\n' % f)
        self.c = Cluster(workers=1, dispatcher_args=['--data-root', self.data, '--max-outstanding-splits', str(BOUND),
                                                     '--client-stall-ms', '0', '--worker-timeout-ms', '600000'],
                         worker_args=['--data-root', self.data, '--hold-timeout-ms', '1000'])
        self.c.wait_workers_registered(1)

    def tearDown(self):
        bad = self.c.close()
        shutil.rmtree(self.data, ignore_errors=True)
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def test_a_paused_rank_is_asked_past_the_batches_a_worker_lost(self):
        spec = {"source": {"type": "text_lines", "files": self.files},
                "ops": [{"op": "repeat", "count": EPOCHS}, {"op": "batch", "batch_size": BATCH}]}
        worker = self.c.workers[0]
        port = self.c.dispatcher.admin_port
        outs = [tempfile.TemporaryFile(mode='w+') for _ in range(2 * CATS)]
        procs, paused = [], None
        # Every rank joins before the worker runs the task: none comes
        # after the job ended.
        worker.kill(signal.SIGSTOP)
        try:
            # A window of two batches: what it received stops early.
            paused = sluice.from_spec(spec).distribute(self.c.dispatcher.addr, sharding='dynamic',
                                                       job_name='paused', timeout_ms=600000, max_outstanding=2)
            argv = self.c.cat_argv(spec, ['--sharding', 'dynamic', '--job-name', 'paused'])
            procs = [subprocess.Popen(argv, stdout=outs[2 * i], stderr=outs[2 * i + 1], env=child_env())
                     for i in range(CATS)]
            wait_for(lambda: [j['num_consumers'] for j in get_json(port, '/v1/jobs')['jobs']] == [CATS + 1],
                     'all %d ranks joined' % (CATS + 1))
        finally:
            worker.kill(signal.SIGCONT)
        got = []
        try:
            got += [int(v) for v in next(paused)['line']]  # then it reads no more until the others are done
            stop_until_batches_are_lost(procs, self.c.workers)
            got += cats_values(procs, outs, 'line')
            for b in paused:
                got += [int(v) for v in b['line']]
        finally:
            cats_end(procs, outs)
            if paused is not None:
                paused.close()
        counts = collections.Counter(got)
        wrong = {v: k for v, k in counts.items() if k != EPOCHS or not 0 <= v < FILES}
        self.assertEqual(len(got), FILES * EPOCHS, 'records read: %d, not once an epoch: %s' % (
            len(got), dict(list(wrong.items())[:10])))
        self.assertEqual(wrong, {})


if __name__ == '__main__':
    unittest.main()
