"""A new job's tasks reach the workers when its client first asks for them,
not at the workers' next heartbeat: with heartbeats every 10 minutes, small
jobs still run at once (a worker that does not know a task a client names
asks the dispatcher then, and the request waits for the answer).
bench/first_batch.py measures how long such a job takes."""
import subprocess
import unittest

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
        import json
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


if __name__ == '__main__':
    unittest.main()
