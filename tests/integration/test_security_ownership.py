"""Roles and ownership (issue 15, attacks 1, 2, 3, 8 and 15; docs/security.md,
"Ownership"): ids are not capabilities. Each test replays an attack against
real daemons, speaking the wire protocol by hand over a raw socket, while a
real trainer (sluice-cat) reads a job: the attack is refused with an error
answer that says what was wrong, the daemons keep serving, and the trainer
gets every element exactly once.

The trainer is held mid-job without timing: its stdout is a pipe the test
does not read until the attacks are done, so sluice-cat blocks writing once
the pipe is full while its iterator thread keeps its lease (heartbeats), and
the job stays RUNNING with most of its elements still to come."""
import contextlib
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import unittest
import urllib.request

from cutproxy import worker_behind
from harness import Cluster, ClusterCase, binary, child_env, get_json, metric, parse_jsonl, values, wait_for
from test_wire_errors import HELLO_LEN, hello
from test_wire_errors import varint as dec_varint

HERE = os.path.dirname(os.path.abspath(__file__))

ROLE_CLIENT, ROLE_WORKER, ROLE_DISPATCHER = 1, 2, 3
SL_EPROTO, SL_ENOTFOUND, SL_EINVAL, SL_EPERM = -5001, -5005, -5012, -5014
SL_ECANCELLED = -5008

# enum sl_msg_type (protocol/frame.h)
ERROR = 1
WORKER_REGISTER_REQ, WORKER_HEARTBEAT_REQ, GET_DATASET_REQ, GET_SPLIT_REQ = 2, 4, 6, 8
REGISTER_DATASET_REQ, GET_OR_CREATE_JOB_REQ, CLIENT_HEARTBEAT_REQ, RELEASE_CLIENT_REQ = 10, 12, 14, 16
GET_ELEMENT_REQ, REPORT_RECEIVED_REQ, GET_EXCLUSIONS_REQ = 18, 20, 22

TASK_DONE, TASK_FAILED = 2, 3  # sl_task_state_t
SHARDING_DYNAMIC = 1           # sl_sharding_t
N = 300000                     # elements: far more than the pipe, the iterator and the workers hold
SPEC = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": 100}]}


def recv_exact(sock, n):
    got = b''
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise ConnectionError('the peer closed after %d of %d bytes' % (len(got), n))
        got += chunk
    return got


def handshake(sock, role, peer_role):
    """The connection's handshake as `role`, checking the peer answers as
    `peer_role`: the one place in this file that knows its bytes."""
    sock.sendall(hello(role))
    got = recv_exact(sock, HELLO_LEN)
    if got[:8] != hello(peer_role)[:8]:
        raise AssertionError('unexpected handshake answer %r' % got)


# ---- protobuf, by hand ----

def enc_varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7f
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def fv(num, v):
    """A varint field (left out at its default, as proto3 does)."""
    return enc_varint(num << 3) + enc_varint(v) if v else b''


def fb(num, b):
    """A length-delimited field: bytes, a string, a message."""
    b = b.encode() if isinstance(b, str) else b
    return enc_varint(num << 3 | 2) + enc_varint(len(b)) + b


def decode(msg):
    """{field number: [values]}: ints for varints, bytes for the rest."""
    out, i = {}, 0
    while i < len(msg):
        key, i = dec_varint(msg, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = dec_varint(msg, i)
        elif wt == 2:
            n, i = dec_varint(msg, i)
            v, i = msg[i:i + n], i + n
        elif wt == 1:
            v, i = msg[i:i + 8], i + 8
        elif wt == 5:
            v, i = msg[i:i + 4], i + 4
        else:
            raise AssertionError('wire type %d' % wt)
        out.setdefault(num, []).append(v)
    return out


def one(fields, num, default=0):
    return fields.get(num, [default])[0]


def error_of(msg):
    f = decode(msg)
    code = one(f, 1)
    return (code - (1 << 64) if code >= 1 << 63 else code), one(f, 2, b'').decode()


class Peer:
    """A raw protocol connection: requests numbered from 1, answers matched by id."""

    def __init__(self, port, role, peer_role):
        self.sock = socket.create_connection(('127.0.0.1', port), timeout=30)
        handshake(self.sock, role, peer_role)
        self.next_id = 0

    def send(self, msg_type, msg=b'', payload=b''):
        self.next_id += 1
        self.sock.sendall(struct.pack('>HHIII', msg_type, 0, self.next_id, len(msg), len(payload)) + msg + payload)
        return self.next_id

    def recv(self):
        """(type, request_id, message, payload) of the next frame."""
        t, _, rid, mlen, plen = struct.unpack('>HHIII', recv_exact(self.sock, 16))
        msg = recv_exact(self.sock, mlen)
        return t, rid, msg, recv_exact(self.sock, plen)

    def call(self, msg_type, msg=b'', payload=b''):
        rid = self.send(msg_type, msg, payload)
        while True:
            t, got, m, p = self.recv()
            if got == rid:
                return t, m, p
            if got == 0:
                raise AssertionError('connection-level error: %r' % (error_of(m),))

    def refused(self, msg_type, msg=b'', payload=b''):
        """The (code, message) of the error that answers the request."""
        t, m, _ = self.call(msg_type, msg, payload)
        if t != ERROR:
            raise AssertionError('answered with type %d, not refused: %r' % (t, decode(m)))
        return error_of(m)

    def close(self):
        self.sock.close()


def new_job(test, c):
    """A job on cluster c's one worker, made over the wire: (client id, its
    TaskInfo fields, the dispatcher peer). The worker hears of it from the
    dispatcher (its notice, or a request that names the task)."""
    me = Peer(c.dispatcher.port, ROLE_CLIENT, ROLE_DISPATCHER)
    t, m, _ = me.call(REGISTER_DATASET_REQ, b'', json.dumps(SPEC).encode())
    test.assertEqual(t, REGISTER_DATASET_REQ + 1, error_of(m) if t == ERROR else '')
    t, m, _ = me.call(GET_OR_CREATE_JOB_REQ, fv(1, one(decode(m), 1)))
    test.assertEqual(t, GET_OR_CREATE_JOB_REQ + 1, error_of(m) if t == ERROR else '')
    job = decode(m)
    client, secret = one(job, 2), one(job, 5, b'')
    t, m, _ = me.call(CLIENT_HEARTBEAT_REQ, fv(1, one(job, 1)) + fv(2, client) + fb(5, secret))
    test.assertEqual(t, CLIENT_HEARTBEAT_REQ + 1, error_of(m) if t == ERROR else '')
    tasks = [decode(ti) for ti in decode(m).get(1, [])]
    test.assertEqual(len(tasks), 1)
    return client, tasks[0], me


class Trainer:
    """sluice-cat reading SPEC to the end, held mid-job (see the top)."""

    def __init__(self, cluster, args=()):
        self.c = cluster
        before = {j['id'] for j in get_json(cluster.dispatcher.admin_port, '/v1/jobs')['jobs']}
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cluster.cat_argv(SPEC, ['--sharding', 'dynamic'] + list(args)),
                                     stdout=subprocess.PIPE, stderr=self.err, env=child_env())

        def started():
            for j in get_json(cluster.dispatcher.admin_port, '/v1/jobs')['jobs']:
                if j['id'] in before or j['state'] != 'RUNNING':
                    continue
                job = get_json(cluster.dispatcher.admin_port, '/v1/jobs/%d' % j['id'])
                # Its client joined, and a task has made batches (not
                # every one need have: the trainer may be held before the
                # last worker's first batch).
                if job['consumers'] and any(t['batches'] > 0 for t in job['tasks']):
                    return job
            return None
        self.job = wait_for(started, 'the trainer\'s job to run')

    @property
    def serving(self):
        """A task its worker runs (it has made batches)."""
        return next(t for t in self.job['tasks'] if t['batches'] > 0)

    @property
    def client_id(self):
        return self.job['consumers'][0]['client_id']

    def still_running(self):
        job = get_json(self.c.dispatcher.admin_port, '/v1/jobs/%d' % self.job['id'])
        return job['state'] == 'RUNNING' and [k['client_id'] for k in job['consumers']] == [self.client_id]

    def finish(self, test):
        """Reads the trainer to its end and checks it got 0..N-1 once each."""
        out, _ = self.proc.communicate(timeout=600)
        self.err.seek(0)
        err = self.err.read().decode(errors='replace')
        test.assertEqual(self.proc.returncode, 0, err[-3000:])
        got = values(parse_jsonl(out.decode()), 'value')
        test.assertEqual(len(got), N, 'elements lost or repeated')
        test.assertEqual(sorted(got), list(range(N)))


class Ownership(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix='sluice-root-')
        # The attackers' connections send no heartbeats: a long worker
        # timeout keeps them registered however slow the machine is.
        cls.c = Cluster(workers=2, dispatcher_args=['--data-root', cls.root, '--worker-timeout-ms', '600000',
                                                    '--client-timeout-ms', '600000'])
        try:
            cls.c.wait_workers_registered(2)
        except BaseException:
            cls.c.close()
            raise
        cls.fake = 0

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        os.rmdir(cls.root)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    @property
    def disp(self):
        return self.c.dispatcher

    def fake_worker(self):
        """A worker-role connection registered as a worker of its own, drained
        (so the trainer's job gives it no task) before the trainer starts:
        (peer, its worker id)."""
        type(self).fake += 1
        address = '127.0.0.1:%d' % type(self).fake  # nobody listens there
        p = Peer(self.disp.port, ROLE_WORKER, ROLE_DISPATCHER)
        t, m, _ = p.call(WORKER_REGISTER_REQ, fb(1, address) + fv(5, 1))
        self.assertEqual(t, WORKER_REGISTER_REQ + 1, error_of(m) if t == ERROR else '')
        wid = one(decode(m), 1)
        req = urllib.request.Request('http://127.0.0.1:%d/v1/workers/%s/drain' % (self.disp.admin_port, address),
                                     method='POST')
        urllib.request.urlopen(req, timeout=10).read()
        return p, wid

    def assert_refused(self, got, code, *texts):
        self.assertEqual(got[0], code, got[1])
        for text in texts:
            self.assertIn(text, got[1])

    def test_attack_1_get_split_of_another_workers_task(self):
        fake, fake_id = self.fake_worker()
        trainer = Trainer(self.c)
        forbidden = metric(self.disp.admin_port, 'sluice_dispatcher_requests_forbidden_total', default=0.0)
        # Task ids counted up, as the attacker would (the admin view gives
        # the real ones: the attack's best case).
        for task in trainer.job['tasks']:
            for seq in (0, 1, 1000):
                req = fv(1, task['task_id']) + fv(3, 64) + fv(4, seq)
                self.assert_refused(fake.refused(GET_SPLIT_REQ, req), SL_EPERM,
                                    'task %d is not worker %d\'s' % (task['task_id'], fake_id))
        # Without registering at all.
        bare = Peer(self.disp.port, ROLE_WORKER, ROLE_DISPATCHER)
        self.assert_refused(bare.refused(GET_SPLIT_REQ, fv(1, trainer.job['tasks'][0]['task_id']) + fv(3, 64)),
                            SL_EPERM, 'WORKER_REGISTER first')
        bare.close()
        self.assertGreaterEqual(metric(self.disp.admin_port, 'sluice_dispatcher_requests_forbidden_total', default=0.0),
                                forbidden + 7)
        self.assertTrue(trainer.still_running())
        fake.close()
        trainer.finish(self)

    def test_attack_2_get_element_without_the_task_key(self):
        trainer = Trainer(self.c)
        task = trainer.serving
        worker = next(w for w in self.c.workers if w.addr == task['worker_address'])
        # The attacker's own job over the same dataset gives it real keys, of
        # its own tasks: they open nothing else.
        me = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
        t, m, _ = me.call(GET_OR_CREATE_JOB_REQ, fv(1, trainer.job['dataset_id']))
        self.assertEqual(t, GET_OR_CREATE_JOB_REQ + 1, error_of(m) if t == ERROR else '')
        mine = decode(m)
        my_job, my_client, my_secret = one(mine, 1), one(mine, 2), one(mine, 5, b'')
        self.assertEqual(len(my_secret), 16)
        t, m, _ = me.call(CLIENT_HEARTBEAT_REQ, fv(1, my_job) + fv(2, my_client) + fb(5, my_secret))
        self.assertEqual(t, CLIENT_HEARTBEAT_REQ + 1, error_of(m) if t == ERROR else '')
        my_keys = [one(decode(ti), 7, b'') for ti in decode(m).get(1, [])]
        self.assertTrue(my_keys and all(len(k) == 16 for k in my_keys), my_keys)

        thief = Peer(worker.port, ROLE_CLIENT, ROLE_WORKER)
        base = fv(1, task['task_id']) + fv(2, trainer.client_id)
        for key in (None, bytes(16), my_keys[0], b'\x01' * 16):
            with self.subTest(key=key):
                req = base + (fb(7, key) if key is not None else b'')
                self.assert_refused(thief.refused(GET_ELEMENT_REQ, req), SL_EPERM,
                                    'task %d on worker %s: task_key is not client %d\'s key to the task'
                                    % (task['task_id'], worker.addr, trainer.client_id))
        # Coordinated-looking and provenance requests alike.
        self.assert_refused(thief.refused(GET_ELEMENT_REQ, base + fv(3, 1) + fv(4, 5) + fv(6, 1)), SL_EPERM,
                            'task_key')
        # The connection stays: its next request is answered too.
        self.assert_refused(thief.refused(GET_ELEMENT_REQ, base), SL_EPERM, 'nothing served')
        thief.close()
        self.assertTrue(trainer.still_running())
        t, m, _ = me.call(RELEASE_CLIENT_REQ, fv(1, my_job) + fv(2, my_client) + fb(3, my_secret))
        self.assertEqual(t, RELEASE_CLIENT_REQ + 1, error_of(m) if t == ERROR else '')
        me.close()
        trainer.finish(self)

    def test_attack_2_a_client_of_the_job_cannot_speak_for_another(self):
        # A second client of the trainer's named job holds keys to the same
        # tasks, its own: with the trainer's client_id (whose held batches a
        # request may be served again, and acknowledges) they open nothing.
        trainer = Trainer(self.c, ['--job-name', 'shared-keys'])
        task = trainer.serving
        worker = next(w for w in self.c.workers if w.addr == task['worker_address'])
        me = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
        t, m, _ = me.call(GET_OR_CREATE_JOB_REQ,
                          fv(1, trainer.job['dataset_id']) + fb(2, b'shared-keys') + fv(3, SHARDING_DYNAMIC))
        self.assertEqual(t, GET_OR_CREATE_JOB_REQ + 1, error_of(m) if t == ERROR else '')
        mine = decode(m)
        my_job, my_client, my_secret = one(mine, 1), one(mine, 2), one(mine, 5, b'')
        self.assertEqual(my_job, trainer.job['id'], 'the second client joined the trainer\'s job')
        self.assertNotEqual(my_client, trainer.client_id)
        t, m, _ = me.call(CLIENT_HEARTBEAT_REQ, fv(1, my_job) + fv(2, my_client) + fb(5, my_secret))
        self.assertEqual(t, CLIENT_HEARTBEAT_REQ + 1, error_of(m) if t == ERROR else '')
        mine = {one(decode(ti), 1): one(decode(ti), 7, b'') for ti in decode(m).get(1, [])}
        self.assertIn(task['task_id'], mine)
        thief = Peer(worker.port, ROLE_CLIENT, ROLE_WORKER)
        for extra in (b'', fv(8, 1) + fv(9, 1), fv(8, 5) + fv(9, 5)):  # plain, asked again, acknowledging
            with self.subTest(extra=extra):
                req = fv(1, task['task_id']) + fv(2, trainer.client_id) + fb(7, mine[task['task_id']]) + extra
                self.assert_refused(thief.refused(GET_ELEMENT_REQ, req), SL_EPERM,
                                    'task %d on worker %s: task_key is not client %d\'s key to the task'
                                    % (task['task_id'], worker.addr, trainer.client_id))
        thief.close()
        t, m, _ = me.call(RELEASE_CLIENT_REQ, fv(1, my_job) + fv(2, my_client) + fb(3, my_secret))
        self.assertEqual(t, RELEASE_CLIENT_REQ + 1, error_of(m) if t == ERROR else '')
        me.close()
        trainer.finish(self)

    def test_a_worker_older_than_client_keys_is_refused_by_name(self):
        # A worker that does not say it checks clients' own task keys
        # (WorkerRegisterRequest.client_keys, 5) takes only the task's key,
        # which no client gets: it would refuse every client. It is refused
        # at registration instead, and nothing is registered.
        before = len(get_json(self.disp.admin_port, '/v1/workers')['workers'])
        p = Peer(self.disp.port, ROLE_WORKER, ROLE_DISPATCHER)
        got = p.refused(WORKER_REGISTER_REQ, fb(1, b'127.0.0.1:9'))
        self.assert_refused(got, SL_EINVAL, 'worker 127.0.0.1:9 is older than this dispatcher',
                            'WorkerRegisterRequest.client_keys', 'upgrade it')
        p.close()
        self.assertEqual(len(get_json(self.disp.admin_port, '/v1/workers')['workers']), before)

    def test_attack_3_forged_worker_heartbeats(self):
        fake, fake_id = self.fake_worker()
        trainer = Trainer(self.c)
        victim = trainer.serving
        status_done = fb(2, fv(1, victim['task_id']) + fv(2, TASK_DONE))
        status_failed = fb(2, fv(1, victim['task_id']) + fv(2, TASK_FAILED) + fb(6, 'the attacker\'s text'))
        # In the name of the real worker, over its own connection.
        for status in (status_done, status_failed):
            self.assert_refused(fake.refused(WORKER_HEARTBEAT_REQ, fv(1, victim['worker_id']) + status), SL_EPERM,
                                'worker_id %d is not the worker registered over this connection (%d)'
                                % (victim['worker_id'], fake_id))
        # In its own name, reporting the real worker's task.
        for status in (status_done, status_failed):
            self.assert_refused(fake.refused(WORKER_HEARTBEAT_REQ, fv(1, fake_id) + status), SL_EPERM,
                                'worker %d reported task %d, which is not one of its tasks'
                                % (fake_id, victim['task_id']))
        # Its own heartbeat is still answered (it has no task: drained).
        t, m, _ = fake.call(WORKER_HEARTBEAT_REQ, fv(1, fake_id))
        self.assertEqual(t, WORKER_HEARTBEAT_REQ + 1, error_of(m) if t == ERROR else '')
        # Over a connection that registered nothing.
        bare = Peer(self.disp.port, ROLE_WORKER, ROLE_DISPATCHER)
        self.assert_refused(bare.refused(WORKER_HEARTBEAT_REQ, fv(1, victim['worker_id']) + status_done), SL_EPERM,
                            'no worker registered over this connection')
        bare.close()
        # Over a client-role connection: the role table closes it.
        client = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
        client.send(WORKER_HEARTBEAT_REQ, fv(1, victim['worker_id']) + status_failed)
        t, rid, m, _ = client.recv()
        self.assertEqual((t, rid), (ERROR, 0))
        self.assertEqual(error_of(m)[0], SL_EPROTO, error_of(m)[1])
        client.close()
        job = get_json(self.disp.admin_port, '/v1/jobs/%d' % trainer.job['id'])
        self.assertEqual(job['state'], 'RUNNING', job)
        self.assertEqual([k['state'] for k in job['tasks'] if k['task_id'] == victim['task_id']], ['RUNNING'])
        fake.close()
        trainer.finish(self)

    def test_attack_8_client_requests_with_guessed_ids(self):
        trainer = Trainer(self.c)
        job_id, client_id = trainer.job['id'], trainer.client_id
        attacker = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
        # A secret of its own, from a job of its own: no key to another's.
        t, m, _ = attacker.call(GET_OR_CREATE_JOB_REQ, fv(1, trainer.job['dataset_id']))
        mine = decode(m)
        my_secret = one(mine, 5, b'')
        for secret in (None, bytes(16), my_secret):
            with self.subTest(secret=secret):
                s = fb(3, secret) if secret is not None else b''
                self.assert_refused(attacker.refused(RELEASE_CLIENT_REQ, fv(1, job_id) + fv(2, client_id) + s),
                                    SL_EPERM, 'RELEASE_CLIENT refused: client_secret is not the one job %d gave '
                                    'client %d' % (job_id, client_id))
                s = fb(5, secret) if secret is not None else b''
                self.assert_refused(attacker.refused(CLIENT_HEARTBEAT_REQ, fv(1, job_id) + fv(2, client_id) + s),
                                    SL_EPERM, 'CLIENT_HEARTBEAT refused')
                self.assert_refused(attacker.refused(REPORT_RECEIVED_REQ, fv(1, job_id) + fv(2, client_id) +
                                                     fv(3, 1) + fv(4, 1) + s), SL_EPERM, 'REPORT_RECEIVED refused')
        # Guessed ids near the real ones are told the same, whether they exist or not.
        for j, c in ((job_id, client_id + 1), (job_id + 1, client_id), (10 ** 9, 10 ** 9)):
            self.assert_refused(attacker.refused(RELEASE_CLIENT_REQ, fv(1, j) + fv(2, c)), SL_EPERM,
                                'client_secret is not the one job %d gave client %d' % (j, c))
        self.assertTrue(trainer.still_running(), 'the trainer was released')
        t, m, _ = attacker.call(RELEASE_CLIENT_REQ, fv(1, one(mine, 1)) + fv(2, one(mine, 2)) + fb(3, my_secret))
        self.assertEqual(t, RELEASE_CLIENT_REQ + 1, error_of(m) if t == ERROR else '')
        attacker.close()
        trainer.finish(self)

    def test_attack_15_dataset_specs_and_exclusions_of_others(self):
        fake, fake_id = self.fake_worker()
        trainer = Trainer(self.c)
        ds = trainer.job['dataset_id']
        for d in range(1, ds + 3):  # counted up
            self.assert_refused(fake.refused(GET_DATASET_REQ, fv(1, d)), SL_EPERM,
                                'dataset %d is not worker %d\'s: none of its tasks reads that dataset' % (d, fake_id))
        self.assert_refused(fake.refused(GET_EXCLUSIONS_REQ, fv(1, trainer.job['id'])), SL_EPERM,
                            'job %d is not worker %d\'s: it has no task of that job' % (trainer.job['id'], fake_id))
        bare = Peer(self.disp.port, ROLE_WORKER, ROLE_DISPATCHER)
        self.assert_refused(bare.refused(GET_DATASET_REQ, fv(1, ds)), SL_EPERM, 'WORKER_REGISTER first')
        bare.close()
        # A client may not ask at all (the role table).
        client = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
        client.send(GET_DATASET_REQ, fv(1, ds))
        t, rid, m, _ = client.recv()
        self.assertEqual((t, rid, error_of(m)[0]), (ERROR, 0, SL_EPROTO))
        client.close()
        self.assertTrue(trainer.still_running())
        fake.close()
        trainer.finish(self)

    def test_attack_15_glob_errors_do_not_tell_what_exists_outside_the_root(self):
        outside = tempfile.mkdtemp(prefix='sluice-outside-')
        try:
            with open(os.path.join(outside, 'secret.txt'), 'w') as f:
                f.write('x\n')
            p = Peer(self.disp.port, ROLE_CLIENT, ROLE_DISPATCHER)
            answers = {}
            for name, pattern in (('exists', outside + '/secret.txt'), ('missing', outside + '/nothing.txt'),
                                  ('exists-via-dotdot', self.root + '/..' + outside + '/secret.txt'),
                                  ('missing-via-dotdot', self.root + '/..' + outside + '/nothing.txt'),
                                  ('exists-glob', outside + '/s*.txt'), ('missing-glob', outside + '/n*.txt'),
                                  ('missing-inside', self.root + '/nothing.txt')):
                spec = '{"source": {"type": "text_lines", "files": ["%s"]}}' % pattern
                code, text = p.refused(REGISTER_DATASET_REQ, b'', spec.encode())
                self.assertIn(pattern, text)
                answers[name] = (code, text.replace(pattern, 'P'))
            p.close()
            self.assertEqual(len(set(answers.values())), 1, answers)
            code, text = answers['exists']
            self.assertIn('P matches no file, or a file outside every --data-root (%s)' % os.path.realpath(self.root),
                          text)
            self.assertTrue(self.disp.alive())
        finally:
            os.unlink(os.path.join(outside, 'secret.txt'))
            os.rmdir(outside)

    def test_checkpoint_and_restore_get_a_new_secret_and_every_element_once(self):
        ckpt = os.path.join(self.c.dir, 'ckpt')
        rc, first, err = self.c.cat(SPEC, ['--sharding', 'dynamic', '--limit', '40', '--checkpoint-out', ckpt])
        self.assertEqual(rc, 0, err)
        rc, rest, err = self.c.cat(SPEC, ['--sharding', 'dynamic', '--resume-from', ckpt])
        self.assertEqual(rc, 0, err)
        got = values(first, 'value') + values(rest, 'value')
        self.assertEqual(sorted(got), list(range(N)))


class WorkerBeforeRegistration(unittest.TestCase):
    """A worker serves no client before the dispatcher accepted it: it has no
    task (tasks, and their keys, come only in the dispatcher's heartbeat
    answers), so every GET_ELEMENT is answered SL_ENOTFOUND."""

    def test_a_worker_that_never_registered_serves_nothing(self):
        c = Cluster()
        try:
            # A dispatcher address where nobody listens: it never registers.
            s = socket.socket()
            s.bind(('127.0.0.1', 0))
            nowhere = '127.0.0.1:%d' % s.getsockname()[1]
            s.close()
            w = c._start([binary('sluice-workerd'), '--dispatcher', nowhere, '--port', '0', '--admin-port', '0'],
                         'lonely')
            p = Peer(w.port, ROLE_CLIENT, ROLE_WORKER)
            for task in (1, 2, 3, 1000):
                code, text = p.refused(GET_ELEMENT_REQ, fv(1, task) + fb(7, bytes(16)))
                self.assertEqual(code, SL_ENOTFOUND, text)
                self.assertIn('task %d is not on worker' % task, text)
            p.close()
            self.assertTrue(w.alive())
        finally:
            bad = c.close()
        self.assertEqual(bad, {})



class WorkerIdsAreNotCapabilities(unittest.TestCase):
    """WORKER_REGISTER with a live worker's id resumes it only when no other
    open connection holds that id: a stranger naming it gets an id of its
    own, never the worker's tasks and keys."""

    def test_a_registered_workers_id_is_not_resumed_over_another_connection(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            real = get_json(c.dispatcher.admin_port, '/v1/workers')['workers'][0]
            p = Peer(c.dispatcher.port, ROLE_WORKER, ROLE_DISPATCHER)
            t, m, _ = p.call(WORKER_REGISTER_REQ, fb(1, real['address']) + fv(3, real['id']) + fv(5, 1))
            self.assertEqual(t, WORKER_REGISTER_REQ + 1, error_of(m) if t == ERROR else '')
            got = one(decode(m), 1)
            self.assertNotEqual(got, real['id'])
            # Its heartbeat in the real worker's name is refused.
            self.assert_perm(p.refused(WORKER_HEARTBEAT_REQ, fv(1, real['id'])))
            p.close()
            # The real worker registers again and serves on.
            wait_for(lambda: any(w['state'] == 'LIVE' and w['address'] == real['address'] and w['id'] not in
                                 (real['id'], got) for w in get_json(c.dispatcher.admin_port, '/v1/workers')['workers']),
                     'the real worker to register again')
            rc, batches, err = c.cat({"source": {"type": "range", "stop": 1000}, "ops": [{"op": "batch",
                                                                                        "batch_size": 100}]},
                                     ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(values(batches, 'value')), list(range(1000)))
        finally:
            bad = c.close()
        self.assertEqual(bad, {})

    def assert_perm(self, got):
        self.assertEqual(got[0], SL_EPERM, got[1])
        self.assertIn('is not the worker registered over this connection', got[1])


class RequestsBeforeTheirTask(ClusterCase):
    """A GET_ELEMENT for a task the worker has not heard of waits for the
    dispatcher's answer to a heartbeat sent after it came (a new job's first
    request can come before the task does); the task's key is checked once
    the task is there. Heartbeats every 10 minutes: the worker hears of a
    task when a request names it, or from the dispatcher's notice."""

    dispatcher_args = ['--worker-heartbeat-ms', '600000', '--worker-timeout-ms', '1200000', '--client-timeout-ms',
                       '600000']

    def counts(self, w=None):
        w = (w or self.c.workers[0]).admin_port
        return (metric(w, 'sluice_worker_requests_awaited_task_total', default=0.0),
                metric(w, 'sluice_worker_requests_task_unknown_total', default=0.0))

    @contextlib.contextmanager
    def held_worker(self, await_task_ms):
        """A cluster of its own whose one worker gets its dispatcher's frames
        through a proxy that lets the registration's answer through, then
        holds the rest (the notices and heartbeat answers) until release():
        (cluster, worker, proxy), all closed afterwards."""
        c = Cluster(dispatcher_args=self.dispatcher_args)
        proxy = None
        try:
            w, proxy = worker_behind(c, hold=True, extra=['--await-task-ms', str(await_task_ms)])
            c.wait_workers_registered(1)
            yield c, w, proxy
        finally:
            if proxy:
                proxy.close()
            c.close()

    def test_a_request_before_its_task_is_checked_against_its_key_once_the_task_came(self):
        # The dispatcher's notice would tell the worker of the task at once:
        # this test's worker gets its dispatcher's frames through a proxy
        # that holds them (the notice and heartbeat answers among them)
        # until the request waits at the worker, then lets them through. A
        # request waits for its task up to --await-task-ms, past any delay
        # of the release.
        with self.held_worker(600000) as (c, w, proxy):
            client, task, me = new_job(self, c)
            task_id, key = one(task, 1), one(task, 7, b'')
            awaited, unknown = self.counts(w)

            def release_once_it_waits():
                try:
                    wait_for(lambda: self.counts(w)[0] > awaited, 'the request to wait for its task', timeout=20)
                finally:
                    proxy.release()

            releaser = threading.Thread(target=release_once_it_waits)
            releaser.start()
            thief = Peer(w.port, ROLE_CLIENT, ROLE_WORKER)
            try:
                code, text = thief.refused(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, bytes(16)))
            finally:
                releaser.join()
            self.assertEqual(code, SL_EPERM, text)
            self.assertIn('task_key is not client %d\'s key to the task' % client, text)
            self.assertEqual(self.counts(w), (awaited + 1, unknown), 'the request waited for its task, then was '
                             'refused')
            # The task's client, with its key, is served.
            t, m, _ = thief.call(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, key))
            self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
            self.assertEqual(one(decode(m), 1), task_id)
            thief.close()
            me.close()

    def test_past_the_bound_answers_keep_the_order_of_the_requests(self):
        # 65 requests for a made-up task in one write: 64 wait (a
        # connection's bound), the 65th cannot, and those before it are
        # answered first; the client's redelivery counts on the order.
        p = Peer(self.c.workers[0].port, ROLE_CLIENT, ROLE_WORKER)
        msg = fv(1, 10 ** 9 + 7) + fb(7, bytes(16))
        p.sock.sendall(b''.join(struct.pack('>HHIII', GET_ELEMENT_REQ, 0, i, len(msg), 0) + msg
                                for i in range(1, 66)))
        p.next_id = 65
        got = []
        for _ in range(65):
            t, rid, m, _ = p.recv()
            self.assertEqual(t, ERROR)
            self.assertEqual(error_of(m)[0], SL_ENOTFOUND, error_of(m)[1])
            got.append(rid)
        self.assertEqual(got, list(range(1, 66)))
        p.close()
        self.assertTrue(self.c.workers[0].alive())

    def test_a_request_for_a_task_that_never_comes_is_answered_not_found(self):
        awaited, unknown = self.counts()
        p = Peer(self.c.workers[0].port, ROLE_CLIENT, ROLE_WORKER)
        for task in (10 ** 9, 10 ** 9 + 1):
            code, text = p.refused(GET_ELEMENT_REQ, fv(1, task) + fb(7, bytes(16)))
            self.assertEqual(code, SL_ENOTFOUND, text)
            self.assertIn('task %d is not on worker' % task, text)
        self.assertEqual(self.counts(), (awaited + 2, unknown + 2))
        p.close()
        self.assertTrue(self.c.workers[0].alive())

    def test_a_request_waits_for_its_task_no_longer_than_the_bound(self):
        # The worker's heartbeat answers are held: only --await-task-ms can
        # end the wait, and does, while the proxy still holds them.
        with self.held_worker(300) as (_, w, proxy):
            awaited, unknown = self.counts(w)
            p = Peer(w.port, ROLE_CLIENT, ROLE_WORKER)
            code, text = p.refused(GET_ELEMENT_REQ, fv(1, 10 ** 9 + 3) + fb(7, bytes(16)))
            self.assertEqual(code, SL_ENOTFOUND, text)
            self.assertIn('task %d is not on worker' % (10 ** 9 + 3), text)
            self.assertEqual(self.counts(w), (awaited + 1, unknown + 1))
            # What would have ended it otherwise, the answer to the heartbeat
            # the request set off, is held in the proxy.
            wait_for(proxy.held.is_set, 'the heartbeat answer to be held', timeout=20)
            p.close()


    def cancel_on_the_worker(self, p, task_id, made_up):
        """Cancels the job of task_id (on the first worker) through the
        admin API; then a request on p for made_up, a task that never
        comes, makes the worker heartbeat, whose answer removes the
        cancelled task."""
        admin = self.c.dispatcher.admin_port
        job_id = next(j['id'] for j in get_json(admin, '/v1/jobs')['jobs']
                      if any(k['task_id'] == task_id for k in get_json(admin, '/v1/jobs/%d' % j['id'])['tasks']))
        req = urllib.request.Request('http://127.0.0.1:%d/v1/jobs/%d' % (admin, job_id), method='DELETE')
        urllib.request.urlopen(req, timeout=10).read()
        code, text = p.refused(GET_ELEMENT_REQ, fv(1, made_up) + fb(7, bytes(16)))
        self.assertEqual(code, SL_ENOTFOUND, text)
        self.assertNotIn(task_id, [k['task_id'] for k in get_json(self.c.workers[0].admin_port, '/v1/tasks')['tasks']])

    def test_a_tombstone_answers_only_its_own_tasks_clients(self):
        # A task that went leaves a tombstone: its clients' late requests
        # are told it was cancelled. A request with another key may be for a
        # new task of that id the worker has not heard of yet (a dispatcher
        # restored from a backup gives the lost state's ids out again, with
        # other keys): it is taken as one for a task not here, waits for
        # the dispatcher's answer, and is answered not found, not refused.
        client, task, me = new_job(self, self.c)
        task_id, key = one(task, 1), one(task, 7, b'')
        p = Peer(self.c.workers[0].port, ROLE_CLIENT, ROLE_WORKER)
        t, m, _ = p.call(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, key))
        self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
        self.cancel_on_the_worker(p, task_id, 10 ** 9 + 11)
        awaited, unknown = self.counts()
        code, text = p.refused(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, bytes(16)))
        self.assertEqual(code, SL_ENOTFOUND, text)
        self.assertIn('task %d is not on worker' % task_id, text)
        self.assertEqual(self.counts(), (awaited + 1, unknown + 1), 'it waited for a task of that id')
        code, text = p.refused(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, key))
        self.assertEqual(code, SL_ECANCELLED, text)
        self.assertIn('task %d was cancelled' % task_id, text)
        p.close()
        me.close()

    def test_a_progress_request_is_answered_whatever_the_worker_holds(self):
        # GetElementRequest.progress (ack_only 16, progress 19): a client
        # behind a held task asks how far its splits are done, and may ask
        # before the worker heard of the task (its client heard first), or
        # after it went. Each gets an answer that says nothing (no
        # done_below, no batch, no notice): the client asks again later.
        # Before, none came, and the client asked that task no more.
        progress = fv(16, 1) + fv(19, 1)
        p = Peer(self.c.workers[0].port, ROLE_CLIENT, ROLE_WORKER)
        made_up = 10 ** 9 + 21
        t, m, pl = p.call(GET_ELEMENT_REQ, fv(1, made_up) + fb(7, bytes(16)) + progress)
        self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
        self.assertEqual((decode(m), pl), ({1: [made_up]}, b''))
        client, task, me = new_job(self, self.c)
        task_id, key = one(task, 1), one(task, 7, b'')
        mine = fv(1, task_id) + fv(2, client) + fb(7, key)
        t, m, _ = p.call(GET_ELEMENT_REQ, mine)
        self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
        t, m, _ = p.call(GET_ELEMENT_REQ, mine + progress)
        self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
        self.assertEqual(one(decode(m), 1), task_id)
        self.assertNotIn(4, decode(m), 'a progress answer carries no batch')
        self.cancel_on_the_worker(p, task_id, made_up + 1)
        t, m, pl = p.call(GET_ELEMENT_REQ, mine + progress)
        self.assertEqual(t, GET_ELEMENT_REQ + 1, error_of(m) if t == ERROR else '')
        self.assertEqual((decode(m), pl), ({1: [task_id]}, b''))
        p.close()
        me.close()
        self.assertTrue(self.c.workers[0].alive())


class TombstonesOfARestoredState(unittest.TestCase):
    """A dispatcher restored from a backup gives the lost state's ids out
    again (docs/operations.md, Backups): the worker that ran the lost job's
    task keeps its tombstone, and a new job's task of the same id comes
    with another key. When the new task starts, the old tombstone goes
    (bury_no_more() in workerd/worker.c): once the new task is cancelled,
    its client's late request is told so by the new task's own tombstone,
    not taken for a task that never came because the old one was found
    first and its key did not fit."""

    def test_a_new_tasks_late_request_gets_its_own_tasks_end(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            worker = c.workers[0]
            # The backup, taken with the dispatcher stopped, knows the worker.
            backup = c.backup_state()
            wait_for(lambda: worker.stderr().count('reconnected to dispatcher') == 1, 'the worker back')
            tasks_here = lambda: [t['task_id'] for t in get_json(worker.admin_port, '/v1/tasks')['tasks']]

            # The job the restore loses: its task runs on the worker.
            _, lost, lost_me = new_job(self, c)
            task_id, lost_key = one(lost, 1), one(lost, 7, b'')
            wait_for(lambda: task_id in tasks_here(), 'the lost job\'s task to start')
            lost_me.close()
            c.restore_state(backup)
            # The restored state does not know the task: the worker drops it
            # and keeps its tombstone.
            wait_for(lambda: 'task %d removed' % task_id in worker.stderr(), 'the worker to drop the lost task')

            # The new job's task takes the id again, with another key.
            client, task, me = new_job(self, c)
            self.assertEqual(one(task, 1), task_id, 'the premise: the restored state gives the lost task\'s id again')
            key = one(task, 7, b'')
            self.assertNotEqual(key, lost_key)
            wait_for(lambda: worker.stderr().count('task %d of job' % task_id) == 2, 'the new task to start')
            job_id = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'][0]['id']
            req = urllib.request.Request('http://127.0.0.1:%d/v1/jobs/%d' % (c.dispatcher.admin_port, job_id),
                                         method='DELETE')
            urllib.request.urlopen(req, timeout=10).read()
            wait_for(lambda: worker.stderr().count('task %d removed' % task_id) == 2, 'the worker to drop the new task')

            p = Peer(worker.port, ROLE_CLIENT, ROLE_WORKER)
            code, text = p.refused(GET_ELEMENT_REQ, fv(1, task_id) + fv(2, client) + fb(7, key))
            self.assertEqual(code, SL_ECANCELLED, 'the late request was not told its task\'s end: %s' % text)
            self.assertIn('task %d was cancelled' % task_id, text)
            p.close()
            me.close()
        finally:
            c.close()

if __name__ == '__main__':
    unittest.main()
