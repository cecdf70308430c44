"""The dispatcher's resource limits (issue 15) against real daemons: each
limit is a configuration option, a refusal at it is a clear error naming
the option and counts in a metric, and the dispatcher keeps serving
(docs/security.md, "Limits"). Requests are sent by hand over the wire, as
an attacker would: attacks 6, 7, 9 and 12 of issue 15 (attacks 5, 6 and 7
are also replayed in test_security_auth)."""
import gzip
import json
import os
import re
import shutil
import socket
import struct
import tempfile
import unittest

from harness import Cluster, get_json, http, metric, values, wait_for
from test_wire_errors import HELLO_LEN, hello
from test_wire_errors import varint as read_varint

ROLE_CLIENT, ROLE_WORKER, ROLE_DISPATCHER = 1, 2, 3
MSG_ERROR = 1
MSG_WORKER_REGISTER_REQ = 2
MSG_REGISTER_DATASET_REQ = 10
MSG_GET_OR_CREATE_JOB_REQ = 12
SL_ETOOBIG, SL_ELIMIT = -5003, -5016
ETIMEDOUT = -110
SHARDING_OFF, SHARDING_DYNAMIC = 0, 1


def handshake(sock, role):
    """The protocol handshake as a peer of role, without a token (the
    dispatcher serves loopback peers then): the one place here that knows
    its bytes."""
    sock.sendall(hello(role))
    got = b''
    while len(got) < HELLO_LEN:
        chunk = sock.recv(HELLO_LEN - len(got))
        if not chunk:
            raise AssertionError('the dispatcher closed during the handshake: %r' % got)
        got += chunk
    if got[:8] != hello(ROLE_DISPATCHER)[:8]:
        raise AssertionError('unexpected handshake answer %r' % got)


def varint(v):
    out = b''
    while True:
        b = v & 0x7f
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def pb_uint(field, v):
    return varint(field << 3) + varint(v) if v else b''


def pb_bytes(field, data):
    return varint(field << 3 | 2) + varint(len(data)) + data


def pb_decode(msg):
    """{field: value} of a protobuf message (varints and bytes only)."""
    out, i = {}, 0
    while i < len(msg):
        key, i = read_varint(msg, i)
        if key & 7 == 0:
            v, i = read_varint(msg, i)
            out[key >> 3] = v
        elif key & 7 == 2:
            n, i = read_varint(msg, i)
            out[key >> 3] = msg[i:i + n]
            i += n
        else:
            raise AssertionError('wire type %d' % (key & 7))
    return out


class Wire:
    """A raw protocol connection to the dispatcher."""

    def __init__(self, port, role=ROLE_CLIENT, timeout=120):
        self.sock = socket.create_connection(('127.0.0.1', port), timeout=timeout)
        handshake(self.sock, role)
        self.next_id = 1

    def send(self, msg_type, msg=b'', payload=b''):
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(struct.pack('>HHIII', msg_type, 0, rid, len(msg), len(payload)) + msg + payload)
        return rid

    def _read(self, n):
        got = b''
        while len(got) < n:
            chunk = self.sock.recv(n - len(got))
            if not chunk:
                raise AssertionError('the dispatcher closed the connection')
            got += chunk
        return got

    def answer(self, rid):
        """(type, fields) of the answer to request rid; an ERROR's fields
        are {'code', 'message'}."""
        while True:
            t, _, got_id, mlen, plen = struct.unpack('>HHIII', self._read(16))
            msg = self._read(mlen)
            self._read(plen)
            if got_id != rid:
                continue
            f = pb_decode(msg)
            if t == MSG_ERROR:
                code = f.get(1, 0)
                code = code - (1 << 64) if code >= 1 << 63 else code
                return t, {'code': code, 'message': f.get(2, b'').decode()}
            return t, f

    def request(self, msg_type, msg=b'', payload=b''):
        return self.answer(self.send(msg_type, msg, payload))

    def register_dataset(self, spec):
        return self.request(MSG_REGISTER_DATASET_REQ, b'', spec.encode() if isinstance(spec, str) else spec)

    def job(self, dataset_id, sharding=SHARDING_DYNAMIC, exclusions=b''):
        return self.request(MSG_GET_OR_CREATE_JOB_REQ, pb_uint(1, dataset_id) + pb_uint(3, sharding), exclusions)

    def register_worker(self, address):
        return self.request(MSG_WORKER_REGISTER_REQ, pb_bytes(1, address.encode()) + pb_uint(5, 1))

    def close(self):
        self.sock.close()


def range_spec(stop):
    return '{"source": {"type": "range", "stop": %d}, "ops": [{"op": "batch", "batch_size": 10}]}' % stop


def exclusions(runs, first=0):
    """A position set of version 1 (posset.h): runs of one position, each in
    a block of 4096 of its own, so that the dispatcher keeps each as a run
    (a unit; crowded runs would become a bitmap of 22 units)."""
    return b'SLPS' + struct.pack('<IQ', 1, runs) + b''.join(
        struct.pack('<IIQQ', 0, 0, first + 4096 * i, 1) for i in range(runs))


class LimitCase(unittest.TestCase):
    """A dispatcher with an admin token (every admin endpoint but the probes
    needs it), dispatcher_args, and `workers` workers."""
    dispatcher_args = ()
    workers = 0

    def setUp(self):
        self.token = 'limits-%d' % os.getpid()
        self.token_dir = tempfile.mkdtemp(prefix='sluice-limits-')
        self.token_file = os.path.join(self.token_dir, 'admin-token')
        with open(self.token_file, 'w') as f:
            f.write(self.token + '\n')
        self.c = Cluster(workers=self.workers,
                         dispatcher_args=['--admin-token-file', self.token_file] + list(self.dispatcher_args))
        self.wires = []

    def tearDown(self):
        for w in self.wires:
            w.close()
        bad = self.c.close()
        shutil.rmtree(self.token_dir, ignore_errors=True)
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def wire(self, role=ROLE_CLIENT):
        w = Wire(self.c.dispatcher.port, role)
        self.wires.append(w)
        return w

    def get(self, path):
        st, body = http(self.c.dispatcher.admin_port, path, token=self.token)
        self.assertEqual(st, 200, body)
        return json.loads(body)

    def metric(self, name, labels=''):
        return metric(self.c.dispatcher.admin_port, name, labels, token=self.token)

    def restart(self, extra=()):
        """The dispatcher again (SIGKILL, the same work dir and ports), with extra options."""
        old = self.c.dispatcher
        old.kill()
        argv = list(old.argv) + list(extra)
        argv[argv.index('--port') + 1] = str(old.port)
        argv[argv.index('--admin-port') + 1] = str(old.admin_port)
        self.c.dispatcher = self.c._start(argv, 'dispatcher%d' % len(self.c.daemons))
        return self.c.dispatcher

    def assert_refused(self, answer, code, *texts):
        t, f = answer
        self.assertEqual(t, MSG_ERROR, 'not refused: %r' % (f,))
        self.assertEqual(f['code'], code, f['message'])
        for text in texts:
            self.assertIn(text, f['message'])
        return f['message']


class Registries(LimitCase):
    """--max-datasets and --max-jobs: a full table is refused with an error
    naming the option, counted; what no running job needs makes room."""
    dispatcher_args = ('--max-datasets', '2', '--max-jobs', '2')

    def test_datasets_and_jobs(self):
        a = self.c.dispatcher.admin_port
        w = self.wire()
        ds = [w.register_dataset(range_spec(100 + i))[1][1] for i in range(2)]
        jobs = [w.job(d, SHARDING_OFF)[1][1] for d in ds]
        # Each dataset is read by a running job: nothing can make room.
        self.assert_refused(w.register_dataset(range_spec(999)), SL_ELIMIT, '2 datasets are registered',
                            '--max-datasets', 'each read by a running job')
        self.assertEqual(self.metric('sluice_dispatcher_limit_refusals_total', 'limit="max_datasets"'), 1)
        self.assert_refused(w.job(ds[0], SHARDING_OFF), SL_ETOOBIG, '2 jobs are running', '--max-jobs')
        self.assertEqual(self.metric('sluice_dispatcher_limit_refusals_total', 'limit="max_jobs"'), 1)
        self.assertIn('job refused: 2 jobs are running', self.c.dispatcher.stderr())
        # An ended job makes room for a job, and its dataset for a dataset.
        st, body = http(a, '/v1/jobs/%d' % jobs[1], 'DELETE', self.token)
        self.assertEqual(st, 200, body)
        t, f = w.job(ds[0], SHARDING_OFF)
        self.assertNotEqual(t, MSG_ERROR, f)
        t, f = w.register_dataset(range_spec(999))
        self.assertNotEqual(t, MSG_ERROR, f)
        got = sorted(d['id'] for d in self.get('/v1/datasets')['datasets'])
        self.assertEqual(got, sorted([ds[0], f[1]]))


class DatasetCollection(LimitCase):
    """Attack 7: a dataset no running job read for --dataset-gc-timeout-ms is
    deleted, and that time is stored: a restart does not start it afresh."""
    dispatcher_args = ('--dataset-gc-timeout-ms', '600000')

    def test_collected_and_the_unused_time_survives_a_restart(self):
        w = self.wire()
        t, kept = w.register_dataset(range_spec(10))
        t, gone = w.register_dataset(range_spec(11))
        t, job = w.job(kept[1], SHARDING_OFF)  # a running job keeps its dataset
        self.assertNotEqual(t, MSG_ERROR, job)
        wait_for(lambda: self.get('/v1/datasets/%d' % gone[1])['unused_ms'] >= 2500, 'the dataset unused 2.5 s')
        # A crash, and a shorter timeout: the time the dataset was last used
        # comes back from the store, as the wall-clock time of the commit
        # that stored it, which is up to a commit's latency (an fsync; 11 ms
        # once) after the request's time that unused_ms counted from before.
        # A restart that started it afresh would read a few hundred ms.
        self.restart(['--dataset-gc-timeout-ms', '5000'])
        self.assertGreaterEqual(self.get('/v1/datasets/%d' % gone[1])['unused_ms'], 1500)
        wait_for(lambda: self.metric('sluice_dispatcher_datasets_collected_total') == 1, 'a dataset collected')
        self.assertEqual([d['id'] for d in self.get('/v1/datasets')['datasets']], [kept[1]])
        self.assertIn('dataset %d deleted: no running job read it' % gone[1], self.c.dispatcher.stderr())


class Exclusions(LimitCase):
    """Attack 6: a restored checkpoint's positions are bounded per restore
    and for all running jobs together; refusals are counted."""
    dispatcher_args = ('--max-exclude-runs', '100', '--max-exclude-total-runs', '150')

    def test_per_restore_and_total(self):
        w = self.wire()
        t, ds = w.register_dataset(range_spec(10000))
        self.assert_refused(w.job(ds[1], exclusions=exclusions(101)), SL_ELIMIT, '101 runs',
                            '--max-exclude-runs')
        t, f = w.job(ds[1], exclusions=exclusions(100))
        self.assertNotEqual(t, MSG_ERROR, f)
        self.assertEqual(self.metric('sluice_dispatcher_exclude_runs'), 100)
        self.assert_refused(w.job(ds[1], exclusions=exclusions(51, 1000)), SL_ELIMIT, '--max-exclude-total-runs')
        self.assertEqual(self.metric('sluice_dispatcher_limit_refusals_total', 'limit="max_exclude_runs"'), 2)
        self.assertEqual(get_json(self.c.dispatcher.admin_port, '/healthz')['status'], 'ok')


class ExclusionsSentAsRuns(LimitCase):
    """A restore's positions sent as more runs than --max-exclude-runs
    (a client sends runs where its own bound holds them), which crowd into
    bitmaps within it: taken, though its bytes pass what the bound's units
    take on the wire (the payload limit followed the bound before, and
    such a restore had its connection closed)."""
    dispatcher_args = ('--max-exclude-runs', '50000')

    def test_a_restore_of_crowded_runs_is_held_as_bitmaps_within_the_bound(self):
        w = self.wire()
        t, ds = w.register_dataset(range_spec(1 << 30))
        crowded = b'SLPS' + struct.pack('<IQ', 1, 60000) + b''.join(
            struct.pack('<IIQQ', 0, 0, 2 * i, 1) for i in range(60000))
        self.assertGreater(len(crowded), 24 + 24 * 50000 + 1024)
        t, f = w.job(ds[1], exclusions=crowded)
        self.assertNotEqual(t, MSG_ERROR, f)
        # 30 blocks: bitmaps where the runs would not fit, runs where they still do.
        self.assertTrue(30 * 22 <= self.metric('sluice_dispatcher_exclude_runs') <= 50000)
        # Runs that do not crowd are held as runs: past the bound, refused by name.
        self.assert_refused(w.job(ds[1], exclusions=exclusions(50001, 1 << 28)), SL_ELIMIT, '50001',
                            '--max-exclude-runs')


class StateStore(LimitCase):
    """Attack 6: the state store is never filled to the brim (then every
    commit failed, also after a restart): past three quarters of
    --state-store-mb, restores are refused; an ended job's positions leave
    memory and the store at once, and make room again."""
    dispatcher_args = ('--state-store-mb', '1', '--max-exclude-runs', '40000')

    def test_restores_stop_before_the_store_is_full(self):
        a = self.c.dispatcher.admin_port
        w = self.wire()
        t, ds = w.register_dataset(range_spec(1 << 30))
        jobs, refused = [], None
        for k in range(40):
            t, f = w.job(ds[1], exclusions=exclusions(20000, k * 100000))
            if t == MSG_ERROR:
                refused = f
                break
            jobs.append(f[1])
        self.assertIsNotNone(refused, 'never refused: %d restored jobs' % len(jobs))
        self.assertGreater(len(jobs), 0)
        self.assertEqual(refused['code'], SL_ELIMIT, refused['message'])
        self.assertIn('the state store holds', refused['message'])
        self.assertEqual(self.metric('sluice_dispatcher_limit_refusals_total', 'limit="state_store"'), 1)
        self.assertEqual(self.metric('sluice_dispatcher_state_commit_failures_total'), 0)
        # Ended jobs give their positions back, in memory and in the store.
        for j in jobs:
            st, body = http(a, '/v1/jobs/%d' % j, 'DELETE', self.token)
            self.assertEqual(st, 200, body)
        self.assertEqual(self.metric('sluice_dispatcher_exclude_runs'), 0)
        t, f = w.job(ds[1], exclusions=exclusions(20000))
        self.assertNotEqual(t, MSG_ERROR, f)
        # Every commit went through, and one after a restart still does.
        self.assertEqual(self.metric('sluice_dispatcher_state_commit_failures_total'), 0)
        self.restart()
        w = self.wire()
        t, f = w.register_dataset(range_spec(7))
        self.assertNotEqual(t, MSG_ERROR, f)
        self.assertEqual(self.metric('sluice_dispatcher_state_commit_failures_total'), 0)


class Workers(LimitCase):
    """Attack 9: registrations that never heartbeat hold a place only until
    --worker-timeout-ms; a refusal at --max-workers is logged and counted."""
    dispatcher_args = ('--max-workers', '2', '--worker-timeout-ms', '1000')

    def test_dead_registrations_free_their_place(self):
        a = self.c.dispatcher.admin_port
        fakes = [self.wire(ROLE_WORKER) for _ in range(3)]
        for i in range(2):
            t, f = fakes[i].register_worker('127.0.0.1:%d' % (40001 + i))
            self.assertNotEqual(t, MSG_ERROR, f)
        self.assert_refused(fakes[2].register_worker('127.0.0.1:40003'), SL_ETOOBIG, '2 workers are live',
                            '--max-workers', '--worker-timeout-ms 1000')
        self.assertEqual(self.metric('sluice_dispatcher_limit_refusals_total', 'limit="max_workers"'), 1)
        self.assertIn('worker 127.0.0.1:40003 refused', self.c.dispatcher.stderr())
        # The fakes keep their connections open and never heartbeat: they
        # are lost after --worker-timeout-ms, and their places are free.
        wait_for(lambda: get_json(a, '/healthz')['workers'] == 0, 'the silent workers lost')
        t, f = fakes[2].register_worker('127.0.0.1:40003')
        self.assertNotEqual(t, MSG_ERROR, f)
        self.assertEqual(len(re.findall(r'at 127\.0\.0\.1:4000[12] lost: no heartbeat', self.c.dispatcher.stderr())), 2)
        self.assertEqual([w['address'] for w in self.get('/v1/workers')['workers'] if w['state'] == 'LIVE'],
                         ['127.0.0.1:40003'])


def gzip_bomb(path, gigabytes):
    """A gzip file of text lines inflating to `gigabytes` GiB: one member of
    64 MiB of newlines, written 16 times a GiB (gzread reads members on)."""
    member = gzip.compress(b'\n' * (64 << 20), compresslevel=9)
    with open(path, 'wb') as f:
        for _ in range(16 * gigabytes):
            f.write(member)


class RecordCountingOffTheLoop(LimitCase):
    """Attack 12: a gzip bomb's records are counted on a thread of their
    own, bounded by --count-timeout-ms, and the outcome is cached."""
    workers = 1

    def test_a_bomb_does_not_stop_the_dispatcher(self):
        root = os.path.join(self.c.dir, 'data')
        os.makedirs(root)
        bomb = os.path.join(root, 'bomb.txt.gz')
        gzip_bomb(bomb, 32)
        d = self.restart(['--data-root', root, '--count-timeout-ms', '8000'])
        self.c.wait_workers_registered(1)
        spec = {"source": {"type": "text_lines", "files": [bomb], "compression": "gzip"},
                "ops": [{"op": "batch", "batch_size": 10}]}
        w = self.wire()
        rid = w.send(MSG_REGISTER_DATASET_REQ, b'', json.dumps(spec).encode())
        wait_for(lambda: self.metric('sluice_dispatcher_record_counts_in_progress') == 1, 'the count under way')
        # While it counts: health, and another client's whole job.
        self.assertEqual(get_json(d.admin_port, '/healthz')['status'], 'ok')
        rc, batches, err = self.c.cat({"source": {"type": "range", "stop": 100},
                                       "ops": [{"op": "batch", "batch_size": 10}]}, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'value')), list(range(100)))
        self.assertEqual(self.metric('sluice_dispatcher_record_counts_in_progress'), 1,
                         'the count ended before the other job was served (a machine this fast needs a '
                         'bigger bomb)')
        # The count ends at its time limit with a clear error.
        self.assert_refused(w.answer(rid), ETIMEDOUT, 'did not finish within --count-timeout-ms 8000', bomb)
        self.assertEqual(self.metric('sluice_dispatcher_record_count_timeouts_total'), 1)
        # A variant of the spec is answered from the cache, not counted again.
        spec['ops'][0]['batch_size'] = 20
        self.assert_refused(w.register_dataset(json.dumps(spec)), ETIMEDOUT, '--count-timeout-ms')
        self.assertEqual(self.metric('sluice_dispatcher_record_count_timeouts_total'), 1)
        self.assertEqual(self.metric('sluice_dispatcher_record_count_cache_hits_total'), 1)
        self.assertEqual(self.metric('sluice_dispatcher_record_counts_in_progress'), 0)

    def test_a_shutdown_while_counting_is_clean(self):
        root = os.path.join(self.c.dir, 'data')
        os.makedirs(root)
        bomb = os.path.join(root, 'bomb.txt.gz')
        gzip_bomb(bomb, 32)
        self.restart(['--data-root', root])
        spec = {"source": {"type": "text_lines", "files": [bomb], "compression": "gzip"}}
        w = self.wire()
        w.send(MSG_REGISTER_DATASET_REQ, b'', json.dumps(spec).encode())
        wait_for(lambda: self.metric('sluice_dispatcher_record_counts_in_progress') == 1, 'the count under way')
        # SIGTERM: the count is cancelled, nothing leaks (ASan), exit 0.
        self.assertEqual(self.c.dispatcher.stop(), 0, self.c.dispatcher.stderr()[-3000:])


if __name__ == '__main__':
    unittest.main()
