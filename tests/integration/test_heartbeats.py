"""Heartbeat intervals. The dispatcher's --client-heartbeat-ms reaches its
clients (in GetOrCreateJobResponse.heartbeat_ms): a client heartbeats at
that interval, and a job still ends at once, since a client asks for the end
as its last task ends rather than at its next heartbeat. A worker's or a
client's interval of more than half its timeout is refused at start (the
client's only when given: short client timeouts with the default were taken
before the flag existed).
(test_new_tasks.py: a new job's tasks do not wait for the workers'.)"""
import json
import subprocess
import threading
import time
import unittest

from harness import Cluster, ClusterCase, binary, child_env, metric, values


def heartbeats(c):
    return metric(c.dispatcher.admin_port, 'sluice_dispatcher_requests_total', 'type="CLIENT_HEARTBEAT"', 0)


class ClientHeartbeat(ClusterCase):
    # A client heartbeats every 10 minutes (and is away after 20).
    dispatcher_args = ['--client-heartbeat-ms', '600000', '--client-timeout-ms', '1200000']

    def test_a_running_client_heartbeats_at_the_dispatchers_interval(self):
        # A job with no end, its client held by a full pipe: its loop
        # thread runs on, and would heartbeat 6 times in 1.5 s at the
        # default 250 ms.
        spec = {"source": {"type": "range", "stop": 2 ** 62}, "ops": [{"op": "batch", "batch_size": 1024}]}
        proc = subprocess.Popen(self.c.cat_argv(spec, ['--sharding', 'dynamic'], fmt='raw'), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=child_env())
        watchdog = threading.Timer(120, proc.kill)  # a client that never writes fails the test, not the run
        watchdog.start()
        try:
            self.assertEqual(len(proc.stdout.read(1 << 20)), 1 << 20, 'the job did not run')
            before = heartbeats(self.c)
            self.assertGreaterEqual(before, 1, 'the client never heartbeat')
            time.sleep(1.5)
            self.assertEqual(heartbeats(self.c), before, 'heartbeats while the interval is 10 minutes')
            self.assertIsNone(proc.poll(), 'the client ended')
        finally:
            watchdog.cancel()
            proc.kill()
            proc.wait()

    def test_a_job_ends_without_waiting_for_a_heartbeat(self):
        spec = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batch_size": 4}]}
        for policy in ('dynamic', 'off'):
            r = subprocess.run(self.c.cat_argv(spec, ['--sharding', policy]), capture_output=True, text=True,
                               timeout=60, env=child_env())
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            got = values([json.loads(line) for line in r.stdout.splitlines() if line.strip()], 'value')
            self.assertEqual(sorted(got), list(range(10)), policy)

    def test_an_interval_longer_than_half_the_timeout_is_refused(self):
        for who, beat, timeout in (('worker', 6000, 10000), ('client', 20000, 30000)):
            r = subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                                self.c.dir + '/refused', '--%s-heartbeat-ms' % who, str(beat)],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn('--%s-heartbeat-ms %d is more than half of --%s-timeout-ms %d: a %s would be lost between '
                          'two heartbeats' % (who, beat, who, timeout, who), r.stderr)

    def test_a_short_client_timeout_with_the_default_interval_is_taken(self):
        c = Cluster(dispatcher_args=['--client-timeout-ms', '300'])
        self.assertEqual(c.close(), {})


if __name__ == '__main__':
    unittest.main()
