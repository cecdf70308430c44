"""The admin endpoints of both daemons, sluicectl, the status page and the
log format, against running daemons."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from harness import (Cluster, ClusterCase, binary, child_env, dump_dom, get_json, http_request, parse_jsonl,
                     read_to_close, values, wait_for)

# A job that never ends by itself (repeat without a count): the tests that
# need a running job must not depend on how fast the machine gets through it.
LONG = {"source": {"type": "range", "stop": 2000000000},
        "ops": [{"op": "batch", "batch_size": 1000}, {"op": "repeat"}]}


# The admin token of the cluster under test: http() sends it unless told
# token=None (every endpoint but /healthz and /readyz needs it).
ADMIN_TOKEN = None


def http(port, path, method='GET', token=Ellipsis, body=None):
    """(status, parsed JSON or text, content type); the admin token unless token is given."""
    status, data, ctype = http_request(port, path, method, ADMIN_TOKEN if token is Ellipsis else token, body)
    return status, (json.loads(data) if ctype.startswith('application/json') else data), ctype


class Drain:
    """A thread that reads a binary stream to its end; .text() is what it
    has read so far."""

    def __init__(self, stream):
        self.chunks = []
        self.thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.thread.start()

    def _run(self, stream):
        for chunk in iter(lambda: os.read(stream.fileno(), 1 << 16), b''):
            self.chunks.append(chunk)

    def text(self):
        return b''.join(self.chunks).decode()


class HeldConsumer:
    """sluice-cat writing JSON lines into a pipe nobody reads until
    release(). Once the pipe, sluice-cat's requests in flight and the
    workers' buffers are full (a few dozen batches), it asks for nothing
    more: its job cannot end before release(), however fast the machine."""

    def __init__(self, test, cluster, spec, args):
        fd, self.err_path = tempfile.mkstemp(prefix='held-', suffix='.err', dir=cluster.dir)
        with os.fdopen(fd, 'w') as err:
            self.p = subprocess.Popen(cluster.cat_argv(spec, args), stdout=subprocess.PIPE, stderr=err,
                                      env=child_env())
        self.out = None
        test.addCleanup(self.kill)

    def release(self):
        self.out = Drain(self.p.stdout)

    def finish(self, timeout=300):
        """(returncode, stdout, stderr) once the consumer exited (released first)."""
        if self.out is None:
            self.release()
        self.p.wait(timeout)
        self.out.thread.join(timeout)
        with open(self.err_path) as f:
            return self.p.returncode, self.out.text(), f.read()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        if self.out:
            self.out.thread.join(60)
        self.p.stdout.close()


class Admin(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tokdir = tempfile.mkdtemp(prefix='sluice-token-')
        global ADMIN_TOKEN
        cls.token = ADMIN_TOKEN = 'secret-%d' % os.getpid()
        cls.token_file = os.path.join(cls.tokdir, 'token')
        with open(cls.token_file, 'w') as f:
            f.write(cls.token + '\n')
        cls.c = Cluster(workers=2, dispatcher_args=['--admin-token-file', cls.token_file, '--log-format', 'json'],
                        worker_args=['--admin-token-file', cls.token_file])
        cls.c.wait_workers_registered(2)
        cls.a = cls.c.dispatcher.admin_port

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        shutil.rmtree(cls.tokdir, ignore_errors=True)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def start_job(self, name, spec=LONG, sharding='dynamic'):
        p = subprocess.Popen(self.c.cat_argv(spec, ['--sharding', sharding, '--job-name', name], fmt='count'),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (p.kill(), p.wait()))

        def find():
            for j in http(self.a, '/v1/jobs')[1]['jobs']:
                if j['name'] == name and j['state'] == 'RUNNING' and j['elements_served'] > 0:
                    return j
        return p, wait_for(find, what='job %s to serve' % name)

    def test_health_and_readiness(self):
        st, body, ctype = http(self.a, '/healthz')
        self.assertEqual((st, body['status'], body['workers']), (200, 'ok', 2))
        self.assertTrue(ctype.startswith('application/json'))
        st, body, _ = http(self.a, '/readyz')
        self.assertEqual((st, body['ready']), (200, True))
        for w in self.c.workers:
            st, body, _ = http(w.admin_port, '/healthz')
            self.assertEqual((st, body['registered']), (200, True))
            st, body, _ = http(w.admin_port, '/readyz', token=None)
            self.assertEqual((st, body['ready']), (200, True))

    def test_worker_readyz_is_503_until_it_registers(self):
        """A worker whose dispatcher does not answer is alive but not ready."""
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            s.listen(1)  # accepts, never answers the handshake
            c = Cluster(workers=0)
            try:
                w = c.add_worker(['--dispatcher', '127.0.0.1:%d' % s.getsockname()[1]])
                self.assertEqual(http(w.admin_port, '/healthz')[0], 200)
                st, body, _ = http(w.admin_port, '/readyz')
                self.assertEqual((st, body['ready']), (503, False))
                self.assertIn('not registered', body['error'])
            finally:
                self.assertEqual(c.close(), {})

    def test_readyz_is_503_without_workers(self):
        c = Cluster(workers=0)
        try:
            st, body, _ = http(c.dispatcher.admin_port, '/readyz')
            self.assertEqual(st, 503)
            self.assertIn('no live worker', body['error'])
        finally:
            c.close()

    def test_workers_datasets_and_jobs(self):
        st, body, _ = http(self.a, '/v1/workers')
        self.assertEqual(st, 200)
        self.assertEqual(sorted(w['address'] for w in body['workers']), sorted(w.addr for w in self.c.workers))
        self.assertTrue(all(w['state'] == 'LIVE' for w in body['workers']))
        p, job = self.start_job('views-%d' % os.getpid())
        st, ds, _ = http(self.a, '/v1/datasets')
        self.assertIn(job['dataset_id'], [d['id'] for d in ds['datasets']])
        st, d, _ = http(self.a, '/v1/datasets/%d' % job['dataset_id'])
        self.assertEqual((st, d['spec']['source']['stop']), (200, 2000000000))
        st, j, _ = http(self.a, '/v1/jobs/%d' % job['id'])
        self.assertEqual(st, 200)
        self.assertEqual((j['sharding'], j['state'], j['num_consumers']), ('dynamic', 'RUNNING', 1))
        self.assertEqual(len(j['tasks']), 2)
        self.assertGreater(j['splits']['handed_out'], 0)
        self.assertGreater(j['splits']['records_handed_out'], 0)
        self.assertGreater(j['splits']['records'], j['splits']['records_handed_out'])
        self.assertLess(j['consumers'][0]['last_heartbeat_ms_ago'], 5000)
        wait_for(lambda: http(self.a, '/v1/jobs/%d' % job['id'])[1]['bytes_served'] > 0, what='bytes served')
        # The worker's view of the same job, once worker 0 made a batch of it:
        # the job's counts above may all be worker 1's so far (a loaded
        # machine starts worker 0's task later).
        def worker0_tasks():
            t = http(self.c.workers[0].admin_port, '/v1/tasks')[1]
            mine = [x for x in t['tasks'] if x['job_id'] == job['id']]
            return mine if mine and mine[0]['batches_produced'] > 0 else None
        mine = wait_for(worker0_tasks, what='worker 0 to make a batch of job %d' % job['id'])
        self.assertEqual(len(mine), 1)
        self.assertGreater(mine[0]['batches_produced'], 0)
        self.assertLessEqual(mine[0]['buffer']['batches'], mine[0]['buffer']['capacity_batches'])
        self.assertGreaterEqual(mine[0]['pipeline_seconds'], 0)
        # Time per pipeline op: the source, then each op of the spec.
        ops = mine[0]['ops']
        self.assertEqual([o['stage'] for o in ops], ['source (range)', 'ops[0] (batch)', 'ops[1] (repeat)'])
        self.assertGreater(ops[0]['elements'], 0)
        self.assertGreater(ops[1]['elements'], 0)
        for o in ops:
            self.assertGreater(o['calls'], 0)  # range gives batch rows in bulk: fewer calls than elements
            self.assertGreater(o['seconds'], 0)
            self.assertTrue(0 <= o['self_seconds'] <= o['seconds'])

    def test_every_endpoint_but_the_probes_needs_the_token(self):
        for path in ('/v1/workers', '/v1/datasets', '/v1/jobs', '/metrics', '/'):
            st, _, _ = http(self.a, path, token=None)
            self.assertEqual(st, 401, path)
            st, _, _ = http(self.a, path, token='wrong')
            self.assertEqual(st, 401, path)
            st, _, _ = http(self.a, path)
            self.assertEqual(st, 200, path)
        for path in ('/healthz', '/readyz'):
            st, _, _ = http(self.a, path, token=None)
            self.assertEqual(st, 200, path)
        st, _, _ = http(self.c.workers[0].admin_port, '/v1/tasks', token=None)
        self.assertEqual(st, 401, 'a worker\'s admin endpoint too')

    def test_cancel_gives_clients_a_clear_error(self):
        p, job = self.start_job('cancel-%d' % os.getpid())
        st, body, _ = http(self.a, '/v1/jobs/%d' % job['id'], method='DELETE', token=None)
        self.assertEqual(st, 401)
        st, body, _ = http(self.a, '/v1/jobs/%d' % job['id'], method='DELETE', token='wrong')
        self.assertEqual(st, 401)
        st, body, _ = http(self.a, '/v1/jobs/%d' % job['id'], method='DELETE', token=self.token)
        self.assertEqual((st, body['state']), (200, 'CANCELLED'))
        _, err = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('cancelled by the operator', err)
        st, body, _ = http(self.a, '/v1/jobs/%d' % job['id'], method='DELETE', token=self.token)
        self.assertEqual(st, 409)
        self.assertIn('already', body['error'])

    def test_drain_moves_the_work_elsewhere(self):
        # A cluster of its own: a drained worker stays drained.
        c = Cluster(workers=2, dispatcher_args=['--admin-token-file', self.token_file])
        self.addCleanup(c.close)
        c.wait_workers_registered(2)
        a = c.dispatcher.admin_port
        spec = {"source": {"type": "range", "stop": 3000000}, "ops": [{"op": "batch", "batch_size": 1000}]}
        name = 'drain-%d' % os.getpid()
        p = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--job-name', name,
                                                    '--max-outstanding', '2']),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(j['name'] == name and j['elements_served'] > 0
                             for j in http(a, '/v1/jobs')[1]['jobs']), what='drain job to start')
        drained = c.workers[0].addr
        st, body, _ = http(a, '/v1/workers/%s/drain' % drained, method='POST', token=self.token)
        self.assertEqual((st, body['state']), (200, 'DRAINING'))
        out, err = p.communicate(timeout=300)
        self.assertEqual(p.returncode, 0, err)
        vals = values(parse_jsonl(out), 'value')
        self.assertEqual(len(vals), 3000000)
        self.assertEqual(len(set(vals)), 3000000)
        st, body, _ = http(a, '/v1/workers')
        self.assertEqual({w['address']: w['state'] for w in body['workers']}[drained], 'DRAINING')
        # No new job gets a task on the drained worker.
        rc, batches, err = c.cat({"source": {"type": "range", "stop": 500},
                                       "ops": [{"op": "batch", "batch_size": 100}]}, ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'value')), list(range(500)))
        st, body, _ = http(a, '/v1/workers/127.0.0.1:1/drain', method='POST', token=self.token)
        self.assertEqual(st, 404)
        self.assertIn('127.0.0.1:1', body['error'])

    def test_draining_the_only_worker_leaves_the_job_waiting_for_another(self):
        # Splits of 1,024 at most, so that the drained worker cannot have been
        # handed the whole range already however fast it reads (a worker's
        # rate would make them longer: docs/sharding.md).
        c = Cluster(workers=1, dispatcher_args=['--max-split-size', '1024'])
        self.addCleanup(c.close)
        c.wait_workers_registered(1)
        a = c.dispatcher.admin_port
        name = 'alone-%d' % os.getpid()
        # The consumer is held until the worker is drained, so the job cannot
        # end before the drain (unheld, its 2000 batches took half a second).
        consumer = HeldConsumer(self, c, {"source": {"type": "range", "stop": 2000000},
                                          "ops": [{"op": "batch", "batch_size": 1000}]},
                                ['--sharding', 'dynamic', '--job-name', name, '--max-outstanding', '1'])
        job = wait_for(lambda: next((j for j in http(a, '/v1/jobs')[1]['jobs']
                                     if j['name'] == name and j['elements_served'] > 0), None),
                       what='job %s to serve' % name)
        self.assertEqual(http(a, '/v1/workers/%s/drain' % c.workers[0].addr, method='POST')[0], 200)
        # Read on: the drained task sends what it made of its splits, and ends.
        consumer.release()
        wait_for(lambda: http(a, '/v1/jobs/%d' % job['id'])[1]['tasks'][0]['state'] == 'DONE',
                 what='the drained task to end')
        time.sleep(1)  # time for a wrong end to show; the job waits whatever the speed
        self.assertEqual(http(a, '/v1/jobs/%d' % job['id'])[1]['state'], 'RUNNING')
        self.assertIsNone(consumer.p.poll())
        c.add_worker()
        rc, out, err = consumer.finish()
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(parse_jsonl(out), 'value')), list(range(2000000)))

    def test_draining_a_worker_of_an_endless_dynamic_job_ends_its_task_and_the_job_reads_on(self):
        # Under repeat(-1), the drained worker's pipeline used to go through
        # empty epochs without end (each ends at once: no split will come),
        # a core busy, its task never ending, and the consumer's requests
        # parked at it waiting for good: the job stalled.
        c = Cluster(workers=2)
        self.addCleanup(c.close)
        c.wait_workers_registered(2)
        a = c.dispatcher.admin_port
        name = 'endless-%d' % os.getpid()
        # Epochs of one batch: the drained worker's queue (512 splits at
        # most, one epoch each) holds less than a third of the 3,000 batches
        # read.
        spec = {"source": {"type": "range", "stop": 1000},
                "ops": [{"op": "repeat", "count": -1}, {"op": "batch", "batch_size": 1000}]}
        consumer = HeldConsumer(self, c, spec, ['--sharding', 'dynamic', '--job-name', name, '--max-outstanding',
                                                '2', '--limit', '3000', '--with-provenance'])
        wait_for(lambda: any(j['name'] == name and j['elements_served'] > 0 for j in http(a, '/v1/jobs')[1]['jobs']),
                 what='job %s to serve' % name)
        drained = c.workers[0]
        self.assertEqual(http(a, '/v1/workers/%s/drain' % drained.addr, method='POST')[0], 200)
        consumer.release()
        rc, out, err = consumer.finish(timeout=120)
        self.assertEqual([t['state'] for t in get_json(drained.admin_port, '/v1/tasks')['tasks']], ['DONE'],
                         'the drained worker\'s task ended, its end taken')
        self.assertEqual(rc, 0, err)
        batches = [b for b in parse_jsonl(out) if 'value' in b]
        self.assertEqual(len(batches), 3000, 'the job read on from the other worker')
        seen = set()
        for b in batches:
            for epoch, _file, begin, count in b['_provenance']:
                for r in range(begin, begin + count):
                    self.assertNotIn((epoch, r), seen, 'record %d of epoch %d twice' % (r, epoch))
                    seen.add((epoch, r))

    def test_a_dynamic_task_counts_its_wait_for_splits(self):
        # The dispatcher stopped (SIGSTOP) while a DYNAMIC job reads fast: the
        # worker's queued splits run out, and its pipeline waits for more.
        # Unbounded range, so the job cannot end meanwhile.
        c = Cluster(workers=1)
        self.addCleanup(c.close)
        c.wait_workers_registered(1)
        name = 'starved-%d' % os.getpid()
        p = subprocess.Popen(c.cat_argv(LONG, ['--sharding', 'dynamic', '--job-name', name, '--timeout-ms', '120000'],
                                        fmt='count'),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (p.kill(), p.wait(), p.stderr.close()))

        def task():
            tasks = [t for t in http(c.workers[0].admin_port, '/v1/tasks')[1]['tasks'] if t['state'] == 'RUNNING']
            return tasks[0] if tasks and tasks[0]['batches_produced'] > 0 else None
        before = wait_for(task, what='the task to make batches')['split_wait_seconds']
        self.assertGreaterEqual(before, 0)
        os.kill(c.dispatcher.proc.pid, signal.SIGSTOP)
        try:
            waited = wait_for(lambda: (task() or {}).get('split_wait_seconds', 0) >= before + 0.5,
                              what='the pipeline to wait half a second for splits')
        finally:
            os.kill(c.dispatcher.proc.pid, signal.SIGCONT)
        self.assertTrue(waited)
        # Splits again: the pipeline makes batches again.
        made = task()['batches_produced']
        wait_for(lambda: task()['batches_produced'] > made + 10, what='batches after the dispatcher came back')

    def test_error_answers(self):
        st, body, _ = http(self.a, '/no/such/path')
        self.assertEqual(st, 404)
        self.assertIn('/no/such/path', body['error'])
        st, body, _ = http(self.a, '/v1/jobs', method='POST', token=self.token)
        self.assertEqual(st, 405)
        self.assertIn('error', body)
        st, body, _ = http(self.a, '/v1/jobs/abc')
        self.assertEqual(st, 404)
        st, body, _ = http(self.a, '/v1/jobs/123456789')
        self.assertEqual((st, body['error']), (404, 'job 123456789 is unknown'))
        st, body, _ = http(self.a, '/v1/datasets/77777')
        self.assertEqual(st, 404)
        st, body, _ = http(self.a, '/v1/jobs/1', method='DELETE', token=self.token, body='{not json')
        self.assertEqual(st, 400)
        self.assertIn('bad JSON body', body['error'])
        st, body, _ = http(self.c.workers[0].admin_port, '/v1/nothing')
        self.assertEqual(st, 404)
        st, body, _ = http(self.c.workers[0].admin_port, '/v1/tasks', method='DELETE', token=self.token)
        self.assertEqual(st, 405)
        # Still serving after all of it.
        self.assertEqual(http(self.a, '/healthz')[0], 200)

    def test_metrics_in_prometheus_format(self):
        p, job = self.start_job('metrics-%d' % os.getpid())
        st, text, ctype = http(self.a, '/metrics')
        self.assertEqual(st, 200)
        self.assertTrue(ctype.startswith('text/plain'))
        self.assertIn('# TYPE sluice_dispatcher_requests_total counter', text)
        self.assertRegex(text, r'sluice_dispatcher_workers 2\b')
        self.assertRegex(text, r'sluice_dispatcher_splits_handed_out_total [1-9]')
        # Once worker 0 served a batch: the job's first batches may all be
        # worker 1's (a loaded machine starts worker 0's task later).
        def worker0_metrics():
            text = http(self.c.workers[0].admin_port, '/metrics')[1]
            return text if re.search(r'sluice_worker_bytes_served_total [1-9]', text) else None
        text = wait_for(worker0_metrics, what='worker 0 to serve a batch')
        self.assertIn('# TYPE sluice_worker_batch_latency_seconds histogram', text)
        self.assertRegex(text, r'sluice_worker_batch_latency_seconds_bucket\{le="\+Inf"\} [1-9]')
        self.assertIn('sluice_worker_client_wait_seconds_count', text)
        self.assertRegex(text, r'sluice_worker_bytes_served_total [1-9]')
        self.assertIn('sluice_worker_buffer_batches', text)
        self.assertIn('sluice_worker_read_bytes_total{engine="uring"}', text)
        self.assertIn('sluice_worker_read_bytes_total{engine="pread"}', text)
        # Every sample line is "name{labels} value".
        for line in text.splitlines():
            if line and not line.startswith('#'):
                self.assertRegex(line, r'^[a-z_]+(\{[^}]*\})? [-+0-9.eInf]+$')

    def test_sluicectl(self):
        p, job = self.start_job('ctl-%d' % os.getpid())
        ctl = [binary('sluicectl'), '--admin', '127.0.0.1:%d' % self.a]

        def run(*args, check=True, token=True):
            auth = ['--token-file', self.token_file] if token else []
            r = subprocess.run(ctl + auth + list(args), capture_output=True, text=True, timeout=60)
            if check:
                self.assertEqual(r.returncode, 0, r.stderr)
            return r
        out = run('workers').stdout
        self.assertRegex(out.splitlines()[0], r'^ID\s+ADDRESS\s+STATE')
        for w in self.c.workers:
            self.assertIn(w.addr, out)
        self.assertIn('ctl-%d' % os.getpid(), run('jobs').stdout)
        shown = run('job', str(job['id'])).stdout
        self.assertIn('dynamic sharding', shown)
        self.assertRegex(shown, r'\n  client \d+, present, last heartbeat \d+ ms ago\n')
        held = run('held-back').stdout.splitlines()
        self.assertRegex(held[0], r'^KIND\s+ID\s+NAME\s+REP\s+WHY$')
        self.assertEqual(held[1:], ['(none: every record of the state store loaded)'])
        self.assertIn('"workers"', run('--json', 'workers').stdout)
        json.loads(run('--json', 'datasets').stdout)
        r = run('cancel', str(job['id']), check=False, token=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn('401', r.stderr)
        r = run('jobs', check=False, token=False)
        self.assertEqual(r.returncode, 1, 'reading jobs needs the admin token too')
        self.assertIn('401', r.stderr)
        run('cancel', str(job['id']))
        r = run('watch', str(job['id']), check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn('CANCELLED', r.stdout)
        r = run('job', 'x', check=False)
        self.assertEqual(r.returncode, 2)

    def test_sluicectl_watch_ends_with_the_job(self):
        name = 'watch-%d' % os.getpid()
        # The consumer is held until watch has drawn the job running: unheld,
        # the job could end before watch starts, however fast the machine.
        consumer = HeldConsumer(self, self.c, {"source": {"type": "range", "stop": 2000000},
                                               "ops": [{"op": "batch", "batch_size": 1000}]},
                                ['--sharding', 'dynamic', '--job-name', name, '--max-outstanding', '1'])
        job = wait_for(lambda: next((j for j in http(self.a, '/v1/jobs')[1]['jobs'] if j['name'] == name), None),
                       what='job %s' % name)
        watch = subprocess.Popen([binary('sluicectl'), '--admin', '127.0.0.1:%d' % self.a, '--token-file',
                                  self.token_file, 'watch', str(job['id'])],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        shown = Drain(watch.stdout)

        def stop_watch():
            if watch.poll() is None:
                watch.kill()
            watch.wait()
            shown.thread.join(60)
            watch.stdout.close()
        self.addCleanup(stop_watch)
        wait_for(lambda: 'RUNNING' in shown.text(), what='watch to draw the running job')
        consumer.release()
        rc, _, err = consumer.finish()
        self.assertEqual(rc, 0, err)
        watch.wait(timeout=300)
        shown.thread.join(60)
        self.assertEqual(watch.returncode, 0, shown.text())
        self.assertIn('100%', shown.text())
        self.assertIn('FINISHED', shown.text())

    def test_json_logs(self):
        lines = [l for l in self.c.dispatcher.stderr().splitlines() if l.strip()]
        events = [json.loads(l) for l in lines]
        self.assertTrue(all({'ts', 'level', 'program', 'msg'} <= set(e) for e in events))
        self.assertTrue(any(re.search(r'worker \d+ joined from 127\.0\.0\.1:\d+', e['msg']) for e in events))

    def test_status_page_in_chromium(self):
        p, job = self.start_job('page-%d' % os.getpid())
        dom, err = dump_dom('http://operator:%s@127.0.0.1:%d/' % (self.token, self.a))
        self.assertIn('<span class="job-id">%d</span>' % job['id'], dom, err[-2000:])
        self.assertIn('page-%d' % os.getpid(), dom)
        for w in self.c.workers:
            self.assertIn(w.addr, dom)
        self.assertIn('<div id="held"></div>', dom, 'nothing was held back at start: the section stays empty')


def raw_http(port, data):
    """Sends data as it is and reads until the daemon closes:
    (status, Content-Type, body)."""
    s = socket.create_connection(('127.0.0.1', port), timeout=10)
    try:
        s.sendall(data)
        got = read_to_close(s)
    finally:
        s.close()
    head, _, body = got.partition(b'\r\n\r\n')
    lines = head.decode('latin-1').split('\r\n')
    headers = dict(l.split(': ', 1) for l in lines[1:] if ': ' in l)
    return int(lines[0].split()[1]), headers.get('Content-Type', ''), body.decode('latin-1')


class RequestsLibeventRefuses(ClusterCase):
    """Requests libevent's HTTP server answers on its own (an HTML page of
    its own making) get a JSON body like every other answer."""


    def assert_json_error(self, port, data, status, text):
        got_status, ctype, body = raw_http(port, data)
        self.assertEqual(got_status, status, body)
        self.assertTrue(ctype.startswith('application/json'), (ctype, body))
        self.assertIn(text, json.loads(body)['error'])

    def test_malformed_oversize_and_unsupported(self):
        for name, port in (('dispatcher', self.c.dispatcher.admin_port), ('worker', self.c.workers[0].admin_port)):
            with self.subTest(daemon=name):
                self.assert_json_error(port, b'NOT AN HTTP REQUEST\r\n\r\n', 400, 'bad request')
                self.assert_json_error(port, b'GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n',
                                       400, 'bad request')
                body = b'{"reason": "%s"}' % (b'x' * 70000)
                self.assert_json_error(port, b'DELETE /v1/jobs/1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n'
                                       % len(body) + body, 413, 'at most 65536 bytes')
                self.assert_json_error(port, b'PATCH /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n', 501,
                                       'method PATCH is not implemented')
                self.assert_json_error(port, b'BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n', 501, 'not implemented')
                # Served on after all of it.
                self.assertEqual(http(port, '/healthz')[0], 200)


if __name__ == '__main__':
    unittest.main()
