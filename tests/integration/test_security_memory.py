"""Issue 15, attack 13: a worker's memory across tasks. A worker with a small
--max-memory-mb runs a shuffle of 2^24 elements (about 2.5 GB of buffer
unbounded): the task fails with an error naming the op, what it needed, the
budget and the option, while another job on the same worker completes
exactly, and the worker keeps serving. A 9000 x 9000 JPEG (243 MB decoded)
is refused on its header, before its pixels are allocated (the worker's
peak RSS stays far below it), and a header claiming 60000 x 60000 by the
per-image limit. /metrics shows the budget, what is charged and the
refusals. Batch blocks the worker keeps for its next batch are charged to
the budget and freed before a task's charge would be refused."""
import importlib.util
import os
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

from cutproxy import CutProxy
from harness import Cluster, ClusterCase, binary, child_env, free_ports, get_json, metric, summary, wait_for

BUDGET_MB = 64


def range_spec(n, ops):
    return {"source": {"type": "range", "stop": n}, "ops": ops}


def metrics(admin_port):
    return {name: metric(admin_port, name) for name in (
        'sluice_worker_memory_budget_bytes', 'sluice_worker_memory_charged_bytes', 'sluice_worker_memory_refusals_total')}


def peak_rss_bytes(pid):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) * 1024
    return None


def jpeg_of(w, h):
    """A real baseline JPEG of w x h gray-ish RGB pixels, made with PIL."""
    from PIL import Image
    import io
    img = Image.new('RGB', (w, h), (90, 120, 150))
    buf = io.BytesIO()
    img.save(buf, format='JPEG', quality=50)
    return buf.getvalue()


def claim_size(jpeg, w, h):
    """The same JPEG with its SOF0 header claiming w x h (the pixels are not there)."""
    b = bytearray(jpeg)
    i = b.index(b'\xff\xc0')
    b[i + 5:i + 7] = h.to_bytes(2, 'big')
    b[i + 7:i + 9] = w.to_bytes(2, 'big')
    return bytes(b)


class WorkerMemory(ClusterCase):
    workers = 1

    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.mkdtemp(prefix='sluice-mem-')
        cls.worker_args = ('--max-memory-mb', str(BUDGET_MB), '--data-root', cls.data)
        cls.dispatcher_args = ('--data-root', cls.data)
        super().setUpClass()

    def read_values(self, spec, args=()):
        r = subprocess.run(self.c.cat_argv(spec, ['--sharding', 'dynamic'] + list(args), fmt='raw'),
                           capture_output=True, timeout=300, env=child_env())
        return r.returncode, np.frombuffer(r.stdout, dtype='<i8'), r.stderr.decode(errors='replace')

    def test_metrics_show_the_budget(self):
        m = metrics(self.c.workers[0].admin_port)
        self.assertEqual(m['sluice_worker_memory_budget_bytes'], BUDGET_MB << 20)
        self.assertIsNotNone(m['sluice_worker_memory_charged_bytes'])
        self.assertIsNotNone(m['sluice_worker_memory_refusals_total'])

    def test_a_shuffle_over_the_budget_fails_clearly_while_another_job_completes_exactly(self):
        n_small = 2000000
        small = subprocess.Popen(self.c.cat_argv(range_spec(n_small, [{"op": "batch", "batch_size": 1000}]),
                                                 ['--sharding', 'dynamic'], fmt='raw'),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        before = metrics(self.c.workers[0].admin_port)['sluice_worker_memory_refusals_total']
        rc, got, err = self.read_values(range_spec(1 << 24, [{"op": "shuffle", "buffer_size": 1 << 24, "seed": 1},
                                                             {"op": "batch", "batch_size": 1024}]))
        out, serr = small.communicate(timeout=300)
        self.assertNotEqual(rc, 0, 'the shuffle of 2^24 should have been refused')
        self.assertRegex(err, r'ops\[0\] \(shuffle\): needs \d+ bytes \([0-9.]+ MiB\) for a shuffle buffer of \d+ '
                              r'elements \(buffer_size 16777216\), but the worker\'s memory budget of %d bytes '
                              r'\(%d\.0 MiB\) has \d+ bytes left \(sluice-workerd --max-memory-mb\)'
                         % (BUDGET_MB << 20, BUDGET_MB), err[-3000:])
        # The other job, on the same worker at the same time, got every element once.
        self.assertEqual(small.returncode, 0, serr.decode(errors='replace')[-2000:])
        vals = np.frombuffer(out, dtype='<i8')
        self.assertEqual(vals.size, n_small)
        self.assertTrue(np.array_equal(np.sort(vals), np.arange(n_small)))
        m = metrics(self.c.workers[0].admin_port)
        self.assertGreater(m['sluice_worker_memory_refusals_total'], before)
        # The refused shuffle gave its buffer back: a job after it runs, and
        # nothing stays charged once the jobs are over.
        rc, got, err = self.read_values(range_spec(100000, [{"op": "shuffle", "buffer_size": 50000, "seed": 2},
                                                            {"op": "batch", "batch_size": 100}]))
        self.assertEqual(rc, 0, err[-2000:])
        self.assertTrue(np.array_equal(np.sort(got), np.arange(100000)))
        self.assertTrue(self.c.workers[0].alive())
        wait_for(lambda: metrics(self.c.workers[0].admin_port)['sluice_worker_memory_charged_bytes'] == 0,
                 'the charges to go back to 0 once the jobs are done')

    def jpeg_job(self, name, jpeg, scaled=False):
        """decode_jpeg then a resize to 8 x 8; the cast between them keeps the
        decode whole, unless scaled (then the resize decodes at 1/8)."""
        path = os.path.join(self.data, name)
        with open(path, 'wb') as f:
            f.write(jpeg)
        between = [] if scaled else [{"op": "cast", "key": "record", "dtype": "uint8"}]
        spec = {"source": {"type": "fixed_length_records", "files": path, "record_bytes": len(jpeg)},
                "ops": [{"op": "decode_jpeg", "key": "record"}] + between +
                       [{"op": "resize", "key": "record", "size": [8, 8]}, {"op": "batch", "batch_size": 1}]}
        r = subprocess.run(self.c.cat_argv(spec, ['--sharding', 'dynamic']), capture_output=True, text=True,
                           timeout=300, env=child_env())
        return r.returncode, r.stderr

    def test_a_huge_jpeg_is_refused_before_its_pixels_are_allocated(self):
        if importlib.util.find_spec('PIL') is None:
            self.skipTest('PIL is not installed')
        small = jpeg_of(64, 48)
        # A small image decodes (the budget has room for it).
        rc, err = self.jpeg_job('small.jpg', small)
        self.assertEqual(rc, 0, err[-2000:])
        pid = self.c.workers[0].proc.pid
        # A real 9000 x 9000 JPEG: 243 MB decoded, under the per-image limit
        # (--max-batch-mb 256), over the budget.
        huge = jpeg_of(9000, 9000)
        rc, err = self.jpeg_job('huge.jpg', huge)
        self.assertNotEqual(rc, 0)
        self.assertRegex(err, r'ops\[0\] \(decode_jpeg\): component "record" \(\d+ bytes\): needs 243000000 bytes '
                              r'\(231\.7 MiB\) for a decoded 9000 x 9000 x 3 image, but the worker\'s memory budget '
                              r'of %d bytes' % (BUDGET_MB << 20), err[-3000:])
        self.assertIn('(sluice-workerd --max-memory-mb)', err)
        peak = peak_rss_bytes(pid)
        self.assertLess(peak, 200 << 20, 'the worker\'s peak RSS is %d bytes: the pixels were allocated' % peak)
        # A header claiming 60000 x 60000 (10.8 GB) is over the per-image limit.
        rc, err = self.jpeg_job('claims.jpg', claim_size(small, 60000, 60000))
        self.assertNotEqual(rc, 0)
        self.assertIn('ops[0] (decode_jpeg): component "record"', err)
        self.assertIn('60000 x 60000 x 3 image exceeds the limit', err)
        self.assertIn('--max-batch-mb', err)
        # Still serving.
        rc, err = self.jpeg_job('small2.jpg', small)
        self.assertEqual(rc, 0, err[-2000:])
        self.assertLess(peak_rss_bytes(pid), 200 << 20)
        # Straight into a resize to 8 x 8 the same JPEG decodes at 1/8 (DCT
        # scaling): 1125 x 1125 x 3, 3.8 MB, which the budget has room for.
        rc, err = self.jpeg_job('huge2.jpg', huge, scaled=True)
        self.assertEqual(rc, 0, err[-2000:])
        self.assertLess(peak_rss_bytes(pid), 200 << 20)


class KeptBatchBlocks(ClusterCase):
    """Sent batches' blocks that the worker keeps for its next batch are
    charged to --max-memory-mb, and freed before a task's charge would be
    refused: a job of large batches leaves some kept, and a shuffle that
    needs most of the budget after it still runs."""
    workers = 1
    worker_args = ('--max-memory-mb', str(BUDGET_MB))

    def test_kept_blocks_are_charged_and_give_way_to_a_task(self):
        port = self.c.workers[0].admin_port
        # Batches of 8 MiB (2^20 int64s, the largest batch_size): their
        # blocks are kept once sent.
        rows = 1 << 20
        rc, _, err = self.c.cat(range_spec(4 * rows, [{"op": "batch", "batch_size": rows}]), ['--sharding', 'off'],
                                fmt='count', timeout=300)
        self.assertEqual(rc, 0, err[-2000:])
        wait_for(lambda: metrics(port)['sluice_worker_memory_charged_bytes'] >= 8 << 20,
                 'a kept 8 MiB block to be charged to the budget')
        kept = metrics(port)['sluice_worker_memory_charged_bytes']
        self.assertLessEqual(kept, BUDGET_MB << 20)
        refusals = metrics(port)['sluice_worker_memory_refusals_total']
        # A shuffle whose buffer takes 58 MiB of the 64 (152 bytes a slot):
        # with the kept blocks still charged it would not fit.
        n = (58 << 20) // 152
        self.assertGreater(n * 152 + kept, BUDGET_MB << 20, 'the test needs the kept blocks in the way')
        rc, got, err = self.read_values(range_spec(n, [{"op": "shuffle", "buffer_size": n, "seed": 3},
                                                       {"op": "batch", "batch_size": 1024}]))
        self.assertEqual(rc, 0, err[-2000:])
        self.assertTrue(np.array_equal(np.sort(got), np.arange(n)))
        self.assertEqual(metrics(port)['sluice_worker_memory_refusals_total'], refusals,
                         'a task\'s charge was refused while kept blocks held the room')

    def read_values(self, spec):
        r = subprocess.run(self.c.cat_argv(spec, ['--sharding', 'off'], fmt='raw'), capture_output=True, timeout=300,
                           env=child_env())
        return r.returncode, np.frombuffer(r.stdout, dtype='<i8'), r.stderr.decode(errors='replace')


class TightBudget(ClusterCase):
    """A job that fits a tight budget runs whatever the moment: shuffled
    DYNAMIC batches of 1 MiB (131,072 int64s; their provenance, 24 bytes an
    element, three times that until encoded) behind a shuffle of 50,000 on a
    worker of 16 MiB, twelve jobs back to back. Each needs about 13.5 MiB at
    its peak, and a job starts while the one before it still holds memory
    (its task until the worker drops it, batches until their client
    acknowledges them): half of such runs once failed their task ("task
    buffer: needs 4587743 bytes ... for a finished batch"), by timing alone.
    Every job must deliver every element once."""
    workers = 1
    worker_args = ('--max-memory-mb', '16')

    def test_back_to_back_jobs_at_the_edge_of_the_budget_all_complete_exactly(self):
        n = 2000000
        port = self.c.workers[0].admin_port
        for i in range(12):
            spec = range_spec(n, [{"op": "shuffle", "buffer_size": 50000, "seed": i},
                                  {"op": "batch", "batch_size": 131072}])
            r = subprocess.run(self.c.cat_argv(spec, ['--sharding', 'dynamic'], fmt='raw'), capture_output=True,
                               timeout=300, env=child_env())
            self.assertEqual(r.returncode, 0, 'job %d: %s' % (i, r.stderr.decode(errors='replace')[-2000:]))
            got = np.frombuffer(r.stdout, dtype='<i8')
            self.assertEqual(got.size, n, 'job %d' % i)
            self.assertTrue(np.array_equal(np.sort(got), np.arange(n)), 'job %d: not every element once' % i)
        self.assertLessEqual(metrics(port)['sluice_worker_memory_charged_bytes'], 16 << 20)
        self.assertIsNotNone(metric(port, 'sluice_worker_memory_waits_total'))



class WhoHoldsTheBudget(ClusterCase):
    """On a shared worker a job can fail because another holds the budget:
    a named job whose trainer read one batch and went away keeps its task,
    and the shuffle buffer in it, until the job is collected. The refusal
    of the next job names who holds the budget, the most first, and GET
    /v1/tasks shows each task's share (memory_bytes)."""
    workers = 1
    worker_args = ('--max-memory-mb', str(BUDGET_MB))

    def test_a_refusal_names_the_task_and_job_that_hold_the_budget(self):
        idle = range_spec(10000000, [{"op": "shuffle", "buffer_size": 300000, "seed": 1},
                                     {"op": "batch", "batch_size": 1024}])
        r = subprocess.run(self.c.cat_argv(idle, ['--job-name', 'idle', '--limit', '1'], fmt='count'),
                           capture_output=True, text=True, timeout=120, env=child_env())
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        job = [j for j in get_json(self.c.dispatcher.admin_port, '/v1/jobs')['jobs'] if j['name'] == 'idle'][0]
        # Its shuffle buffer filled before the first batch came out: it
        # holds that much until the job is collected (a minute).
        # Its pipeline stops once its buffer is full: from then on what it
        # holds stays put.
        def idle_task():
            t = [t for t in get_json(self.c.workers[0].admin_port, '/v1/tasks')['tasks'] if t['job_id'] == job['id']]
            return t[0] if t and t[0]['buffer']['full'] else None
        held = wait_for(idle_task, 'the idle job\'s task to fill its buffer')
        self.assertGreater(held['memory_bytes'], 10 << 20, held)
        # sluicectl tasks, against the worker's admin port, shows it too.
        ctl = subprocess.run([binary('sluicectl'), '--admin',
                              '127.0.0.1:%d' % self.c.workers[0].admin_port, 'tasks'],
                             capture_output=True, text=True, timeout=60, env=child_env())
        self.assertEqual(ctl.returncode, 0, ctl.stderr)
        self.assertRegex(ctl.stdout.splitlines()[0], r'^TASK\s+JOB\s+SHARDING\s+STATE\s+BATCHES SERVED\s+BUFFER\s+'
                                                    r'MEMORY\s+WAITING$')
        self.assertRegex(ctl.stdout, r'(?m)^%d\s+%d\s+off\s+RUNNING\s+\d+\s+\d+/\d+.*\s%.1f MiB\s+\d+$'
                         % (held['task_id'], job['id'], held['memory_bytes'] / (1 << 20)))
        big = range_spec(10000000, [{"op": "shuffle", "buffer_size": 1 << 20, "seed": 2},
                                    {"op": "batch", "batch_size": 1024}])
        r = subprocess.run(self.c.cat_argv(big, [], fmt='count'), capture_output=True, text=True, timeout=120,
                           env=child_env())
        self.assertNotEqual(r.returncode, 0, 'the second shuffle should not fit beside the first')
        self.assertRegex(r.stderr, r'ops\[0\] \(shuffle\): needs \d+ bytes .* has \d+ bytes left '
                                   r'\(sluice-workerd --max-memory-mb\); held now by task %d of job %d '
                                   r'[0-9.]+ MiB, this task [0-9.]+ MiB' % (held['task_id'], job['id']))
        self.assertTrue(self.c.workers[0].alive())


class PausedTrainer(ClusterCase):
    """A trainer that stops reading (a checkpoint being written, an
    evaluation) on a worker whose task buffer is larger than its memory
    budget: the task's own batches fill the budget, and its pipeline's next
    charge waits for them to come back, however long the pause, instead of
    failing the job after the budget's 2 s wait (before 2026-12-02:
    "ops[0] (batch): needs 1048576 bytes (1.0 MiB) for a batch of 131072
    elements, but the worker's memory budget of 16777216 bytes (16.0 MiB)
    has 1048456 bytes left"). Batch blocks kept for reuse, which fill the
    budget as the paused trainer's batches come back, are given back to it
    while the charge waits. The same holds for a prefetch's queue and a
    decode_jpeg's pixels, which failed at once before 2026-12-03."""
    workers = 1
    worker_args = ('--max-memory-mb', '16', '--buffer-mb', '64')

    @classmethod
    def setUpClass(cls):
        cls.data = tempfile.mkdtemp(prefix='sluice-pause-')
        cls.worker_args = cls.worker_args + ('--data-root', cls.data)
        cls.dispatcher_args = ('--data-root', cls.data)
        super().setUpClass()

    def pause_and_read(self, spec, limit, batch_size, extra):
        """Reads limit batches of batch_size elements with sluice-cat (extra:
        its options), stopped with SIGSTOP for 3 s once the pipeline waits
        for the budget."""
        port = self.c.workers[0].admin_port
        # The anonymous job of a trainer that left early (sluice-cat
        # --limit) ends as it leaves: its worker drops its task, and the
        # batches it buffered, at its next heartbeat, not the job's gc
        # timeout (60 s) later. Each test starts with the budget to itself.
        wait_for(lambda: not get_json(port, '/v1/tasks')['tasks'], 'the jobs of the tests before to end')
        waits = metric(port, 'sluice_worker_memory_waits_total', default=0)
        refusals = metric(port, 'sluice_worker_memory_refusals_total', default=0)
        not_held = metric(port, 'sluice_worker_batches_not_held_total', default=0)
        proc = subprocess.Popen(self.c.cat_argv(spec, ['--limit', str(limit)] + extra, fmt='count'),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        try:
            wait_for(lambda: any(t['batches_produced'] > 0 for t in get_json(port, '/v1/tasks')['tasks']),
                     'the job to start')
            proc.send_signal(signal.SIGSTOP)
            wait_for(lambda: metric(port, 'sluice_worker_memory_waits_total', default=0) > waits or
                     proc.poll() is not None or
                     metric(port, 'sluice_worker_memory_refusals_total', default=0) > refusals,
                     'the pipeline to wait for the budget its own batches fill')
            time.sleep(3)  # past the budget's wait of 2 s, which failed the job
            proc.send_signal(signal.SIGCONT)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = err.decode(errors='replace')
        self.assertEqual(proc.returncode, 0, err[-2000:])
        self.assertEqual(summary(err)['elements'], limit * batch_size)
        self.assertEqual(metric(port, 'sluice_worker_memory_refusals_total', default=0), refusals)
        # Every batch served on the full budget was held for a reconnect
        # (its holder took over its task's charge).
        self.assertEqual(metric(port, 'sluice_worker_batches_not_held_total', default=0), not_held)

    def test_a_pause_does_not_fail_the_job(self):
        # Over TCP: batches lent in a client's shared memory are made in its
        # region, which this budget does not fill.
        spec = range_spec(1 << 50, [{"op": "repeat"}, {"op": "batch", "batch_size": 131072}])
        # 1 MiB batches of an infinite range: 25 budgets' worth.
        self.pause_and_read(spec, 400, 131072, ['--no-shm'])

    def test_a_pause_through_shared_memory_does_not_fail_the_job(self):
        # The client's region's pages count against the budget as slots
        # cover them, the batches beyond its window go over TCP: either
        # way the 64 MiB buffer fills the 16 MiB budget.
        spec = range_spec(1 << 50, [{"op": "repeat"}, {"op": "batch", "batch_size": 131072}])
        self.pause_and_read(spec, 400, 131072, [])

    def test_a_pause_does_not_fail_a_prefetch(self):
        # The prefetch's thread charges each batch it queues.
        spec = range_spec(1 << 50, [{"op": "repeat"}, {"op": "batch", "batch_size": 131072},
                                    {"op": "prefetch", "buffer_size": 2}])
        self.pause_and_read(spec, 400, 131072, ['--no-shm'])

    def test_a_pause_does_not_fail_a_decode_jpeg(self):
        # Each image decodes whole (the cast keeps the resize from scaling
        # the decode): 3 MiB of pixels, the largest charge of the pipeline.
        if importlib.util.find_spec('PIL') is None:
            self.skipTest('PIL is not installed')
        jpeg = jpeg_of(1024, 1024)
        path = os.path.join(self.data, 'paused.jpg')
        with open(path, 'wb') as f:
            f.write(jpeg)
        spec = {"source": {"type": "fixed_length_records", "files": path, "record_bytes": len(jpeg)},
                "ops": [{"op": "repeat"}, {"op": "decode_jpeg", "key": "record"},
                        {"op": "cast", "key": "record", "dtype": "uint8"},
                        {"op": "resize", "key": "record", "size": [256, 256], "dtype": "uint8"},
                        {"op": "batch", "batch_size": 8}]}
        # Batches of 1.5 MiB: 60 of them are 5.6 budgets' worth.
        self.pause_and_read(spec, 60, 8, ['--no-shm'])

if __name__ == '__main__':
    unittest.main()


def tcp_buffer_max(name):
    """The most a TCP socket's buffer grows to (net.ipv4.tcp_rmem or
    tcp_wmem, their third figure), in bytes; 6 MiB when unknown."""
    try:
        with open('/proc/sys/net/ipv4/' + name) as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 6 << 20


class CutOnAFullBudget(unittest.TestCase):
    """A trainer paused long enough for its task's buffer to fill a tight
    budget, whose connection then breaks with answers in flight: the worker
    served those answers on a full budget, and holds them all the same (the
    holder takes over the task's charge of each batch, held.h), so the
    trainer, asking again on a new connection, gets them and reads every
    element once. Before 2026-12-03 the holder charged each batch anew: the
    full budget refused, the batches were not held, and the trainer failed
    with "the batch answered to request N ... is no longer held"."""

    def test_answers_served_on_a_full_budget_are_sent_again(self):
        batch = 131072  # 1 MiB of int64
        # Three budgets' worth, and what the sockets of the two hops
        # (worker to proxy, proxy to trainer) can hold while the trainer is
        # stopped: a kernel whose TCP buffers grow to 32 MiB took all of
        # 48 batches in before the cut, and the worker served none after.
        n = (48 + 2 * (tcp_buffer_max('tcp_rmem') + tcp_buffer_max('tcp_wmem')) // (1 << 20)) * batch
        real = free_ports(1)[0]
        cluster = Cluster()
        proxy = CutProxy(real)
        try:
            w = cluster.add_worker(['--port', str(real), '--worker-address', '127.0.0.1:%d' % proxy.port,
                                    '--max-memory-mb', '16', '--buffer-mb', '64'])
            cluster.wait_workers_registered(1)
            port = w.admin_port
            spec = range_spec(n, [{"op": "batch", "batch_size": batch}])
            cat = subprocess.Popen(cluster.cat_argv(spec, ['--no-shm', '--max-outstanding', '8', '--timeout-ms',
                                                           '60000'], fmt='raw'),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
            chunks = []
            reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: cat.stdout.read(1 << 20), b'')),
                                      daemon=True)
            reader.start()
            try:
                wait_for(lambda: sum(map(len, chunks)) >= 2 * batch * 8, 'the trainer to read 2 batches')
                cat.send_signal(signal.SIGSTOP)
                wait_for(lambda: metric(port, 'sluice_worker_memory_waits_total', default=0) > 0,
                         'the task\'s buffer to fill the budget')
                # A new connection, on which the proxy delivers the first
                # answer and holds back the rest.
                proxy.hold_after_first()
                proxy.cut(wait=0.2)
                served = metric(port, 'sluice_worker_batches_served_total')
                cat.send_signal(signal.SIGCONT)
                wait_for(lambda: proxy.held.is_set() and
                         metric(port, 'sluice_worker_batches_served_total') >= served + 4,
                         'batches served on the full budget to be held back by the proxy')
                proxy.release()  # connections from now on pass everything
                self.assertGreater(proxy.cut(wait=0.2), 0, 'the cut threw no answer away')
                cat.wait(timeout=120)
                reader.join(60)
            finally:
                cat.send_signal(signal.SIGCONT)
                if cat.poll() is None:
                    cat.kill()
                    cat.wait()
            err = cat.stderr.read().decode(errors='replace')
            self.assertEqual(cat.returncode, 0, err[-3000:])
            got = np.frombuffer(b''.join(chunks), dtype='<i8')
            counts = np.bincount(got, minlength=n) if got.size else np.zeros(n, dtype=np.int64)
            self.assertEqual((got.size, int(np.sum(counts != 1))), (n, 0), 'every element once')
            self.assertGreater(metric(port, 'sluice_worker_batches_sent_again_total'), 0)
            self.assertEqual(metric(port, 'sluice_worker_batches_not_held_total', default=0), 0)
            self.assertEqual(metric(port, 'sluice_worker_memory_refusals_total', default=0), 0)
        finally:
            proxy.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
