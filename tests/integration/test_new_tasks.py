"""A new job's tasks reach the workers when its client first asks for them,
not at the workers' next heartbeat: with heartbeats every 10 minutes, small
jobs still run at once (a worker that does not know a task a client names
asks the dispatcher then, and the request waits for the answer). A new
iterator learns its tasks with its job, not from its first heartbeat's
answer. bench/first_batch.py measures how long such a job takes."""
import json
import subprocess
import time
import unittest

from cutproxy import CutProxy
from harness import Cluster, child_env, metric, values


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

    def test_a_jobs_first_requests_wait_at_the_worker_for_its_task(self):
        # A request that comes before its task waits for the heartbeat it
        # set off (not answered SL_ENOTFOUND, which would have the client
        # ask again after a backoff): with heartbeats every 10 minutes each
        # new task is first named by a client.
        def counts():
            ports = [w.admin_port for w in self.c.workers]
            return (sum(metric(p, 'sluice_worker_requests_awaited_task_total') for p in ports),
                    sum(metric(p, 'sluice_worker_requests_task_unknown_total') for p in ports))
        awaited, unknown = counts()
        for policy in ('dynamic', 'off'):
            self.cat(policy)
        got_awaited, got_unknown = counts()
        self.assertEqual(got_unknown, unknown, 'requests for a new job\'s tasks answered SL_ENOTFOUND')
        self.assertGreaterEqual(got_awaited, awaited + 4, 'two jobs of a task on each worker: each task named '
                                'first by a request')

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
            deadline = time.monotonic() + 20
            while served() < before + 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
            self.assertTrue(proxy.held.is_set(), 'the iterator\'s heartbeat answers were not held')
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


if __name__ == '__main__':
    unittest.main()
