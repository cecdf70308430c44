"""A new job's tasks reach the workers when its client first asks for them,
not at the workers' next heartbeat: with heartbeats every 10 minutes, small
jobs still run at once (a worker that does not know a task a client names
asks the dispatcher then, and the request waits for the answer), and
before that: the dispatcher tells each worker of its new task once the job
is committed (WORKER_NOTICE). A new iterator learns its tasks with its job,
not from its first heartbeat's answer. bench/first_batch.py measures how
long such a job takes."""
import json
import subprocess
import time
import unittest

from cutproxy import CutProxy, worker_behind
from harness import Cluster, child_env, get_json, metric, values, wait_for


SPEC = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batch_size": 10}]}


class NewTasks(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        # A worker would hear of a task only every 10 minutes by its heartbeat.
        cls.c = Cluster(workers=2, dispatcher_args=['--worker-heartbeat-ms', '600000',
                                                    '--worker-timeout-ms', '1200000'])
        cls.c.wait_workers_registered(2)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def cat(self, policy):
        r = subprocess.run(self.c.cat_argv(SPEC, ['--sharding', policy, '--timeout-ms', '15000']),
                           capture_output=True, text=True, timeout=60, env=child_env())
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return sorted(values([json.loads(line) for line in r.stdout.splitlines() if line.strip()], 'value'))

    def test_jobs_start_without_waiting_for_a_heartbeat(self):
        for _ in range(3):
            self.assertEqual(self.cat('dynamic'), list(range(10)))
            self.assertEqual(self.cat('off'), sorted(list(range(10)) * 2), 'OFF: each of the 2 workers reads all')

    def test_a_new_jobs_requests_are_never_answered_task_unknown(self):
        # A request that comes before its task (the dispatcher's notice and
        # the heartbeat it sets off still under way) waits for the heartbeat
        # it sets off, not answered SL_ENOTFOUND, which would have the
        # client ask again after a backoff (AwaitedTask forces the wait).
        unknown = sum(metric(w.admin_port, 'sluice_worker_requests_task_unknown_total') for w in self.c.workers)
        for policy in ('dynamic', 'off'):
            self.cat(policy)
        self.assertEqual(sum(metric(w.admin_port, 'sluice_worker_requests_task_unknown_total')
                             for w in self.c.workers), unknown,
                         'requests for a new job\'s tasks answered SL_ENOTFOUND')

    def test_an_iterator_reads_before_its_first_heartbeat_is_answered(self):
        # Through a proxy that answers the trainer's first connection (its
        # client: the dataset and the job) and gives the iterator's own
        # connection the dispatcher's hello only: no heartbeat answer
        # reaches it until release(). The workers are reached directly.
        served = lambda: sum(metric(w.admin_port, 'sluice_worker_batches_served_total') for w in self.c.workers)
        before = served()
        proxy = CutProxy(self.c.dispatcher.port)
        proxy.hold_connections_from(2)
        proc = subprocess.Popen(self.c.cat_argv(SPEC, ['--sharding', 'off', '--timeout-ms', '15000'],
                                                dispatcher='127.0.0.1:%d' % proxy.port),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            wait_for(lambda: served() >= before + 2 or proc.poll() is not None,
                     'batches served, or the client\'s end', timeout=20)
            # The iterator's own connection is the held one. It may come
            # through the proxy after the batches (its worker connections
            # open beside it): whenever it does, nothing past its hello
            # reaches the iterator. A heartbeat over the first connection
            # would leave nothing held, and fail here.
            wait_for(proxy.held.is_set, 'the iterator\'s dispatcher connection held after its hello', timeout=20)
            self.assertGreaterEqual(served(), before + 2, 'no batch served while the first heartbeat waits: the '
                                    'iterator did not take its tasks from the job\'s answer')
            self.assertIsNone(proc.poll(), 'the job ended without its client hearing of it')
        finally:
            proxy.release()
            try:
                out, err = proc.communicate(timeout=60)
            finally:
                proxy.close()
        self.assertEqual(proc.returncode, 0, err[-2000:])
        got = sorted(values([json.loads(line) for line in out.splitlines() if line.strip()], 'value'))
        self.assertEqual(got, sorted(list(range(10)) * 2))


class AwaitedTask(unittest.TestCase):
    """A worker whose dispatcher's frames are held (a slow route: its notice
    and heartbeat answers wait in a proxy) gets a new job's first request
    before it knows the task: the request waits at the worker and is served
    once the held frames come through, none answered SL_ENOTFOUND. The
    worker's requests wait up to --await-task-ms, 10 minutes here: the
    frames are held past the default 2 s, which would answer SL_ENOTFOUND,
    and nothing depends on how soon the test releases them."""

    def test_a_request_that_comes_before_its_task_waits_for_it(self):
        c = Cluster(dispatcher_args=['--worker-heartbeat-ms', '600000', '--worker-timeout-ms', '1200000'])
        proxy = None
        try:
            # The registration's answer goes through, then nothing.
            w, proxy = worker_behind(c, hold=True, extra=['--await-task-ms', '600000'])
            c.wait_workers_registered(1)
            counts = lambda: (metric(w.admin_port, 'sluice_worker_requests_awaited_task_total'),
                              metric(w.admin_port, 'sluice_worker_requests_task_unknown_total'))
            awaited, unknown = counts()
            proc = subprocess.Popen(c.cat_argv(SPEC, ['--sharding', 'off', '--timeout-ms', '15000']),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            try:
                wait_for(lambda: counts()[0] > awaited or proc.poll() is not None,
                         'a request waiting for its task, or the client\'s end', timeout=20)
                self.assertGreater(counts()[0], awaited, 'the first requests did not wait for their task')
                self.assertEqual(get_json(w.admin_port, '/v1/tasks')['tasks'], [], 'the task started unheard')
                # Past the default bound (the worker's sweep runs once a
                # second): a request still waits.
                time.sleep(3.5)
                self.assertEqual(counts()[1], unknown, 'a request answered SL_ENOTFOUND before --await-task-ms')
            finally:
                proxy.release()
                out, err = proc.communicate(timeout=60)
            self.assertEqual(proc.returncode, 0, err[-2000:])
            got = sorted(values([json.loads(line) for line in out.splitlines() if line.strip()], 'value'))
            self.assertEqual(got, list(range(10)))
            self.assertEqual(counts()[1], unknown, 'a request answered SL_ENOTFOUND')
        finally:
            if proxy:
                proxy.close()
            c.close()


class Notices(unittest.TestCase):
    """A worker that no client can reach (it gives the dispatcher an address
    where nothing listens) and that heartbeats every 10 minutes still starts
    its task of a new job at once: only the dispatcher's notice can tell it."""

    def test_a_worker_starts_its_new_task_before_any_client_names_it(self):
        c = Cluster(dispatcher_args=['--worker-heartbeat-ms', '600000', '--worker-timeout-ms', '1200000'])
        try:
            w = c.add_worker(['--worker-address', '127.0.0.1:1'])
            c.wait_workers_registered(1)
            sent = metric(c.dispatcher.admin_port, 'sluice_dispatcher_worker_notices_total')
            heard = metric(w.admin_port, 'sluice_worker_notices_total')
            proc = subprocess.Popen(c.cat_argv(SPEC, ['--sharding', 'off', '--timeout-ms', '30000']),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
            try:
                tasks = wait_for(lambda: get_json(w.admin_port, '/v1/tasks')['tasks'],
                                 'the worker to start the new job\'s task', timeout=20)
                self.assertEqual(len(tasks), 1, 'the worker did not start the new job\'s task in 20 s')
                self.assertIsNone(proc.poll(), 'the client ended: it could not have named the task')
            finally:
                proc.kill()
                proc.wait()
            self.assertEqual(metric(c.dispatcher.admin_port, 'sluice_dispatcher_worker_notices_total'), sent + 1)
            self.assertEqual(metric(w.admin_port, 'sluice_worker_notices_total'), heard + 1)
        finally:
            c.close()


if __name__ == '__main__':
    unittest.main()
