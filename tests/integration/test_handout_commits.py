"""Hand-outs that share a commit (docs/sharding.md, DYNAMIC, "Hand-outs share
commits"): a DYNAMIC hand-out whose worker says its queued splits last a
while (GetSplitRequest.slack_ms) is committed later, with whatever comes
meanwhile, and its answer goes out only after that commit. Raw-wire workers,
so that nothing else talks to the dispatcher: no heartbeat or other request
commits it by chance (and the tick does not while a commit is put off)."""
import json
import signal
import socket
import unittest

from harness import Cluster, get_json, metric
from test_security_ownership import (ERROR, GET_OR_CREATE_JOB_REQ, GET_SPLIT_REQ, REGISTER_DATASET_REQ, ROLE_CLIENT,
                                     ROLE_DISPATCHER, ROLE_WORKER, SHARDING_DYNAMIC, SPEC, WORKER_HEARTBEAT_REQ,
                                     WORKER_REGISTER_REQ, Peer, decode, error_of, fb, fv, one)

GET_SPLIT_RESP = GET_SPLIT_REQ + 1


class SharedCommits(unittest.TestCase):
    # Long leases and heartbeats: nothing times out or beats while the test
    # holds a hand-out back.
    DISPATCHER_ARGS = ['--worker-heartbeat-ms', '600000', '--worker-timeout-ms', '1200000',
                       '--client-timeout-ms', '600000', '--handout-commit-delay-ms', '600000']

    def setUp(self):
        self.c = Cluster(dispatcher_args=self.DISPATCHER_ARGS)
        self.peers = []

    def tearDown(self):
        for p in self.peers:
            p.close()
        self.assertEqual(self.c.close(), {}, 'daemons did not shut down cleanly (exit codes, stderr)')

    def peer(self, role):
        p = Peer(self.c.dispatcher.port, role, ROLE_DISPATCHER)
        self.peers.append(p)
        return p

    def ok(self, got, want_type):
        t, m, _ = got
        self.assertEqual(t, want_type, error_of(m) if t == ERROR else '')
        return decode(m)

    def fake_worker(self, n):
        """A registered worker-role connection (nobody serves its address):
        (peer, worker id)."""
        p = self.peer(ROLE_WORKER)
        reg = self.ok(p.call(WORKER_REGISTER_REQ, fb(1, '127.0.0.1:%d' % n) + fv(5, 1)), WORKER_REGISTER_REQ + 1)
        return p, one(reg, 1)

    def dynamic_job(self, workers):
        """A DYNAMIC job over SPEC on the fake workers: each one's task id."""
        me = self.peer(ROLE_CLIENT)
        ds = self.ok(me.call(REGISTER_DATASET_REQ, b'', json.dumps(SPEC).encode()), REGISTER_DATASET_REQ + 1)
        self.ok(me.call(GET_OR_CREATE_JOB_REQ, fv(1, one(ds, 1)) + fv(3, SHARDING_DYNAMIC)), GET_OR_CREATE_JOB_REQ + 1)
        tasks = []
        for p, wid in workers:
            beat = self.ok(p.call(WORKER_HEARTBEAT_REQ, fv(1, wid)), WORKER_HEARTBEAT_REQ + 1)
            new = [decode(t) for t in beat.get(1, [])]
            self.assertEqual(len(new), 1, 'worker %d was not given one task' % wid)
            tasks.append(one(new[0], 1))
        return tasks

    def counts(self):
        port = self.c.dispatcher.admin_port
        return (metric(port, 'sluice_dispatcher_state_commits_total', default=0.0),
                metric(port, 'sluice_dispatcher_handouts_delayed_total', default=0.0))

    def put_off(self, worker, task):
        """Worker asks for task's splits saying its queue lasts 10 minutes:
        the hand-out is made, and its answer waits for a commit (at most 5
        minutes here). Checks that none comes for 2 s, the ticks passing,
        and that nothing was committed: (commits, hand-outs put off) before."""
        commits, delayed = self.counts()
        worker.send(GET_SPLIT_REQ, fv(1, task) + fv(3, 4) + fv(4, 1) + fv(6, 600000))
        worker.sock.settimeout(2.0)
        with self.assertRaises(socket.timeout, msg='the answer went out before its commit'):
            worker.recv()
        worker.sock.settimeout(30)
        self.assertEqual(self.counts(), (commits, delayed + 1), 'the hand-out was committed, or not put off')
        return commits, delayed

    def test_a_handout_whose_worker_can_wait_goes_out_with_the_next_commit(self):
        a, b = self.fake_worker(1), self.fake_worker(2)
        task_a, task_b = self.dynamic_job([a, b])
        commits, delayed = self.put_off(a[0], task_a)
        # Worker b's queue is empty: its hand-out is committed at once, and
        # a's with it, in one commit; both answers go out.
        got_b = self.ok(b[0].call(GET_SPLIT_REQ, fv(1, task_b) + fv(3, 4) + fv(4, 1)), GET_SPLIT_RESP)
        t, _, m, _ = a[0].recv()
        self.assertEqual(t, GET_SPLIT_RESP, error_of(m) if t == ERROR else '')
        got_a = decode(m)
        self.assertEqual(self.counts(), (commits + 1, delayed + 1))
        # Different splits: the two hand-outs are both in the state.
        ids_a = {one(decode(s), 1) for s in got_a.get(1, [])}
        ids_b = {one(decode(s), 1) for s in got_b.get(1, [])}
        self.assertTrue(ids_a and ids_b and not ids_a & ids_b, (ids_a, ids_b))

    def test_a_handout_put_off_goes_out_within_half_its_workers_slack(self):
        # Nothing else comes: the commit put off is due after half of what
        # the worker says its queue lasts (1 s of a 600,000 ms bound), and
        # the answer goes out then by itself.
        a, b = self.fake_worker(1), self.fake_worker(2)
        task_a, _ = self.dynamic_job([a, b])
        commits, delayed = self.counts()
        got = self.ok(a[0].call(GET_SPLIT_REQ, fv(1, task_a) + fv(3, 4) + fv(4, 1) + fv(6, 2000)), GET_SPLIT_RESP)
        self.assertTrue(got.get(1), "no splits")
        self.assertEqual(self.counts(), (commits + 1, delayed + 1))

    def test_a_clean_stop_commits_a_handout_put_off(self):
        # SIGTERM while a hand-out waits for its commit: the answer does not
        # go out, but the hand-out is in the store the dispatcher starts
        # from again (its task counts the request), so the worker asking
        # again with the same request_seq gets those splits.
        a, b = self.fake_worker(1), self.fake_worker(2)
        task_a, _ = self.dynamic_job([a, b])
        self.put_off(a[0], task_a)
        self.c.restart_dispatcher(sig=signal.SIGTERM)
        port = self.c.dispatcher.admin_port
        requests = {t['task_id']: t['split_requests'] for j in get_json(port, '/v1/jobs')['jobs']
                    for t in get_json(port, '/v1/jobs/%d' % j['id'])['tasks']}
        self.assertEqual(requests.get(task_a), 1, 'the hand-out put off was not committed at the stop: %r' % requests)


if __name__ == '__main__':
    unittest.main()
