"""Durable dispatcher state and crash recovery (issue 5), with real daemons:
a dispatcher killed with -9 mid-epoch and restarted on the same work dir,
three workers and a consumer that carry on by themselves, and every element
delivered exactly once. The kill points come from a seed, printed in every
failure message; set SLUICE_CHAOS_SEED to run one again."""
import collections
import fcntl
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import threading
import time
import unittest

from consumers import Consumers
from cutproxy import CutProxy, worker_behind
from harness import (Cluster, binary, cats_with_faults, child_env, drain_worker, dump_dom, free_ports, get_json,
                     http, metric, parse_jsonl, summary, values, wait_for)


N = 240000   # elements of the chaos runs: at least 200,000 (issue 5)
BATCH = 100


def chaos_seed():
    env = os.environ.get('SLUICE_CHAOS_SEED')
    return int(env) if env else random.randrange(1 << 32)


def missing_and_duplicated(got, expected):
    counts = collections.Counter(got)
    missing = [v for v in expected if counts[v] == 0]
    duplicated = sorted(v for v, n in counts.items() if n > 1)
    unexpected = sorted(v for v in counts if not (0 <= v < len(expected)))
    return missing, duplicated, unexpected


def assert_exactly_once(test, got, n, where):
    """Every value of range(n) in got once, and nothing else."""
    missing, duplicated, unexpected = missing_and_duplicated(got, range(n))
    test.assertEqual((len(missing), len(duplicated), unexpected), (0, 0, []),
                     '%s: %d missing (first %s), %d duplicated (first %s)' %
                     (where, len(missing), missing[:10], len(duplicated), duplicated[:10]))


def stream_with_faults(cluster, spec, args, faults):
    """Streams spec through sluice-cat (jsonl), calling act() once batch `at`
    was read, for each (at, act) of faults in order; returns (returncode,
    every value read, stderr)."""
    argv = cluster.cat_argv(spec, ['--max-outstanding', '4'] + list(args))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    got, batches = [], 0
    try:
        for at, act in faults:
            while batches < at:
                line = proc.stdout.readline()
                if not line:
                    break
                got.extend(json.loads(line)['value'])
                batches += 1
            act()
        for line in proc.stdout:
            if line.strip():
                got.extend(json.loads(line)['value'])
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, got, proc.stderr.read()


def store_records(work, table):
    """The records of a table of a stopped dispatcher's state store, {key: value} as bytes (mdb_dump)."""
    r = subprocess.run(['mdb_dump', '-n', '-s', table, os.path.join(work, 'state.mdb')], capture_output=True,
                       text=True, check=True)
    lines = r.stdout.split('\n')
    i, out = lines.index('HEADER=END') + 1, {}
    while lines[i] != 'DATA=END':
        out[bytes.fromhex(lines[i].strip())] = bytes.fromhex(lines[i + 1].strip())
        i += 2
    return out


def store_put(work, table, key, value):
    """Puts a record into a table of a stopped dispatcher's state store as it is (mdb_load)."""
    text = ''.join('\\%02x' % b for b in key) + '\n' + ''.join('\\%02x' % b for b in value) + '\n'
    subprocess.run(['mdb_load', '-n', '-s', table, '-T', os.path.join(work, 'state.mdb')], input=text, text=True,
                   capture_output=True, check=True)


def addressed_cluster(n=3):
    """A dispatcher with --worker-addresses and n workers on those addresses
    (what the static policies need)."""
    ports = free_ports(n)
    addrs = ['127.0.0.1:%d' % p for p in ports]
    cluster = Cluster(dispatcher_args=['--worker-addresses', ','.join(addrs)])
    for p, a in zip(ports, addrs):
        cluster.add_worker(['--port', str(p), '--worker-address', a])
    cluster.wait_workers_registered(n)
    return cluster


class ThreeWorkers(unittest.TestCase):
    """A dispatcher cutting splits of 1000 records at least and three workers,
    new for each test and checked to exit cleanly after it."""
    worker_args = ()

    def setUp(self):
        self.cluster = Cluster(workers=3, dispatcher_args=['--split-size', '1000'], worker_args=self.worker_args)
        self.cluster.wait_workers_registered(3)

    def tearDown(self):
        bad = self.cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)


def run_ranks(cluster, spec, rank_args):
    """Starts one sluice-cat per entry of rank_args at once and waits for
    all: [(returncode, values, stderr)] in that order."""
    procs = [subprocess.Popen(cluster.cat_argv(spec, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=child_env()) for args in rank_args]
    # Every rank's pipes are read at once: a rank blocked on a full pipe
    # would hold its splits back from the job's end.
    outs = [None] * len(procs)

    def read(i):
        outs[i] = procs[i].communicate(timeout=600)
    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(procs))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [(p.returncode, values(parse_jsonl(o[0]), 'value'), o[1]) if o else (None, [], 'no output')
                for p, o in zip(procs, outs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class NamedJobCheckpoints(ThreeWorkers):
    """Checkpoints of a named DYNAMIC job's ranks: four sluice-cat ranks
    share job "train" behind a shuffle, each stops after a seeded number of
    batches and writes its checkpoint; the four are merged
    (--merge-checkpoints) and the job resumes under another name as three
    ranks, and again, from the same merged checkpoint, as six: each time
    every element arrives exactly once across the first four and the
    resumed ranks."""
    N = 300000

    def setUp(self):
        super().setUp()
        self.spec = {"source": {"type": "range", "stop": self.N},
                     "ops": [{"op": "shuffle", "buffer_size": 2000, "seed": 5},
                             {"op": "batch", "batch_size": BATCH}]}
        self.dir = self.cluster.dir

    def path(self, name):
        return os.path.join(self.dir, name)

    def first_four(self, seed):
        """The four ranks of "train", stopped at seeded batch counts (in all
        at most half the epoch, so the job is still running when the last
        stops); returns (values, merged checkpoint path, where)."""
        rng = random.Random(seed)
        total = self.N // BATCH
        stops = [rng.randrange(total // 30, total // 8) for _ in range(4)]
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), ranks stop after batches %s' % (seed, seed, stops)
        print('NamedJobCheckpoints: %s' % where)
        ckpts = [self.path('rank%d.ckpt' % i) for i in range(4)]
        runs = run_ranks(self.cluster, self.spec, [['--sharding', 'dynamic', '--job-name', 'train', '--limit',
                                                    str(n), '--checkpoint-out', ck] for n, ck in zip(stops, ckpts)])
        got = []
        for i, (rc, vals, err) in enumerate(runs):
            self.assertEqual(rc, 0, '%s: rank %d: %s' % (where, i, err[-2000:]))
            self.assertEqual(len(vals), stops[i] * BATCH, '%s: rank %d' % (where, i))
            got.extend(vals)
        # One job: every rank joined "train" repetition 0 while it ran.
        reps = get_json(self.cluster.dispatcher.admin_port, '/v1/jobs')['names']['train']
        self.assertEqual(len(reps), 1, reps)
        merged = self.path('merged.ckpt')
        r = subprocess.run([binary('sluice-cat'), '--merge-checkpoints', '--checkpoint-out', merged] + ckpts,
                           capture_output=True, text=True, timeout=120, env=child_env())
        self.assertEqual(r.returncode, 0, '%s: merge: %s' % (where, r.stderr))
        return got, merged, where, ckpts

    def resume(self, merged, name, ranks, where):
        runs = run_ranks(self.cluster, self.spec, [['--sharding', 'dynamic', '--job-name', name, '--resume-from',
                                                    merged]] * ranks)
        got = []
        for i, (rc, vals, err) in enumerate(runs):
            self.assertEqual(rc, 0, '%s: resumed rank %d of %d: %s' % (where, i, ranks, err[-2000:]))
            got.extend(vals)
        return got

    def test_four_ranks_resume_as_three_and_as_six_exactly_once(self):
        first, merged, where, _ = self.first_four(chaos_seed())
        for ranks in (3, 6):
            rest = self.resume(merged, 'train-as-%d' % ranks, ranks, where)
            assert_exactly_once(self, first + rest, self.N, '%s, resumed as %d ranks' % (where, ranks))

    def test_ranks_that_stop_in_later_epochs_resume_exactly_once(self):
        """Four epochs (a repeat): the ranks stop in the second to fourth,
        each at its own count, after their job may have folded done epochs
        (epochs_folded); resumed as three ranks, every element comes once
        per epoch."""
        import struct
        n, epochs = 40000, 4
        self.spec = {"source": {"type": "range", "stop": n},
                     "ops": [{"op": "shuffle", "buffer_size": 2000, "seed": 5}, {"op": "repeat", "count": epochs},
                             {"op": "batch", "batch_size": BATCH}]}
        seed = chaos_seed()
        rng = random.Random(seed)
        total = n * epochs // BATCH
        stops = [rng.randrange(total // 6, total * 6 // 25) for _ in range(4)]
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), ranks stop after batches %s' % (seed, seed, stops)
        print('NamedJobCheckpoints epochs: %s' % where)
        ckpts = [self.path('rank%d.ckpt' % i) for i in range(4)]
        runs = run_ranks(self.cluster, self.spec, [['--sharding', 'dynamic', '--job-name', 'epochs', '--limit',
                                                    str(k), '--checkpoint-out', ck] for k, ck in zip(stops, ckpts)])
        got = []
        for i, (rc, vals, err) in enumerate(runs):
            self.assertEqual(rc, 0, '%s: rank %d: %s' % (where, i, err[-2000:]))
            got.extend(vals)
        merged = self.path('merged.ckpt')
        r = subprocess.run([binary('sluice-cat'), '--merge-checkpoints', '--checkpoint-out', merged] + ckpts,
                           capture_output=True, text=True, timeout=120, env=child_env())
        self.assertEqual(r.returncode, 0, '%s: merge: %s' % (where, r.stderr))
        with open(merged, 'rb') as f:
            done = struct.unpack('<Q', f.read()[24:32])[0]
        print('NamedJobCheckpoints epochs: the merged checkpoint has every epoch below %d done' % done)
        got.extend(self.resume(merged, 'epochs-as-3', 3, where))
        counts = collections.Counter(got)
        wrong = sorted(v for v in range(n) if counts[v] != epochs)
        self.assertEqual((wrong[:10], len(got)), ([], n * epochs),
                         '%s (done epochs %d): %d values not %d times' % (where, done, len(wrong), epochs))

    def test_a_rank_with_another_checkpoint_is_refused(self):
        _, merged, where, ckpts = self.first_four(chaos_seed())
        # One rank restores the merged checkpoint and stops after a batch:
        # job "again" runs on (most of the epoch is left), made from it.
        rc, _, err = self.cluster.cat(self.spec, ['--sharding', 'dynamic', '--job-name', 'again', '--resume-from',
                                                  merged, '--limit', '1'])
        self.assertEqual(rc, 0, err)
        rc, _, err = self.cluster.cat(self.spec, ['--sharding', 'dynamic', '--job-name', 'again', '--resume-from',
                                                  ckpts[0], '--limit', '1'])
        self.assertNotEqual(rc, 0)
        self.assertIn('was restored from another checkpoint: every rank restores the same merged checkpoint', err)
        rc, _, err = self.cluster.cat(self.spec, ['--sharding', 'dynamic', '--job-name', 'again', '--limit', '1'])
        self.assertNotEqual(rc, 0)
        self.assertIn('was restored from a checkpoint: a rank joins it by restoring the same checkpoint', err)
        # The running "train" was not made from a checkpoint.
        rc, _, err = self.cluster.cat(self.spec, ['--sharding', 'dynamic', '--job-name', 'train', '--resume-from',
                                                  merged, '--limit', '1'])
        self.assertNotEqual(rc, 0)
        self.assertIn('is running and was not restored from a checkpoint', err)
        # Checkpoints of other datasets do not merge.
        other = self.path('other.ckpt')
        rc, _, err = self.cluster.cat({"source": {"type": "range", "stop": 1000},
                                       "ops": [{"op": "batch", "batch_size": 10}]},
                                      ['--sharding', 'dynamic', '--limit', '2', '--checkpoint-out', other])
        self.assertEqual(rc, 0, err)
        r = subprocess.run([binary('sluice-cat'), '--merge-checkpoints', '--checkpoint-out', self.path('x'), merged,
                            other], capture_output=True, text=True, timeout=120, env=child_env())
        self.assertEqual(r.returncode, 1)
        self.assertIn('merge: checkpoint 2 of 2 is of dataset', r.stderr)


class DispatcherCrash(ThreeWorkers):
    def run_with_kills(self, spec, kills, seed, args=(), sharding='dynamic'):
        """Streams spec through sluice-cat, killing (-9) and restarting the
        dispatcher after the batch counts in kills; returns every value read."""
        rng = random.Random(seed)

        def restart():
            self.cluster.restart_dispatcher()
            time.sleep(rng.uniform(0.0, 0.5))
        return stream_with_faults(self.cluster, spec, ['--sharding', sharding] + list(args),
                                  [(at, restart) for at in kills])

    def test_kill9_mid_epoch_every_element_exactly_once(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        total = N // BATCH
        kills = sorted(rng.sample(range(total // 10, total * 7 // 10), 2))
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        rc, got, err = self.run_with_kills(spec, kills, seed)
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), kills after batches %s' % (seed, seed, kills)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        assert_exactly_once(self, got, N, where)
        # The restarted dispatcher carried the job on: one job, finished.
        jobs = get_json(self.cluster.dispatcher.admin_port, '/v1/jobs')['jobs']
        self.assertEqual([j['state'] for j in jobs], ['FINISHED'], where)
        # Its splits (of 1000 records at least, longer as the workers' rates
        # asked) tiled the range once.
        self.assertEqual(jobs[0]['splits']['records_handed_out'], N, where)
        self.assertLessEqual(jobs[0]['splits']['handed_out_all_epochs'], N // 1000, where)

    def test_trainers_ride_through_an_outage_longer_than_their_timeout(self):
        """The dispatcher killed -9 and started again 5 s later, as a
        rescheduled pod would be: the trainer (--timeout-ms 3000 for workers,
        the default hour for the dispatcher) reads on from the workers,
        reconnects, and ends with every element exactly once."""
        spec = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": BATCH}]}
        running = []

        def outage():
            jobs = get_json(self.cluster.dispatcher.admin_port, '/v1/jobs')['jobs']
            running.append([j['state'] for j in jobs])
            self.cluster.dispatcher.kill()
            time.sleep(5)  # longer than --timeout-ms: the outage the trainer must ride through
            self.cluster.restart_dispatcher()
        rc, got, err = stream_with_faults(self.cluster, spec, ['--sharding', 'dynamic', '--timeout-ms', '3000'],
                                          [(N // BATCH // 5, outage)])
        self.assertEqual(running, [['RUNNING']], 'the job was still running when the dispatcher died')
        self.assertEqual(rc, 0, 'sluice-cat failed: %s' % err[-3000:])
        assert_exactly_once(self, got, N, 'a 5 s dispatcher outage')
        self.assertIn('does not answer', err)
        self.assertRegex(err, r'dispatcher 127\.0\.0\.1:\d+ answers again after \d+ ms')

    def test_a_frozen_dispatcher_is_left_and_found_again(self):
        """The dispatcher stopped (SIGSTOP) for 4 s mid-epoch: its sockets
        stay open but nothing answers, as behind a partition. The trainer and
        the workers give up on the silent connections after 2 s of unanswered
        heartbeats, reconnect, and the epoch ends exactly once."""
        spec = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": BATCH}]}
        disp = self.cluster.dispatcher

        def freeze():
            disp.kill(signal.SIGSTOP)
            try:
                time.sleep(4)  # past the 2 s a heartbeat may go unanswered
            finally:
                disp.kill(signal.SIGCONT)
        rc, got, err = stream_with_faults(self.cluster, spec, ['--sharding', 'dynamic', '--timeout-ms', '3000'],
                                          [(N // BATCH // 5, freeze)])
        self.assertEqual(rc, 0, 'sluice-cat failed: %s' % err[-3000:])
        assert_exactly_once(self, got, N, 'a 4 s frozen dispatcher')
        self.assertRegex(err, r'dispatcher 127\.0\.0\.1:\d+ does not answer')
        self.assertRegex(err, r'dispatcher 127\.0\.0\.1:\d+ answers again after \d+ ms')
        gave_up = [w.name for w in self.cluster.workers if 'no heartbeat answer for' in w.stderr()]
        self.assertEqual(len(gave_up), 3, 'workers that left the silent connection: %s' % gave_up)

    def test_kill9_under_data_sharding_every_element_exactly_once(self):
        """A static policy: each worker's shard is fixed by --worker-addresses;
        the restarted dispatcher must keep the tasks and indexes it gave out."""
        self.assertEqual(self.cluster.close(), {})
        self.cluster = addressed_cluster(3)
        seed = chaos_seed()
        rng = random.Random(seed)
        total = N // BATCH
        kills = sorted(rng.sample(range(total // 10, total * 7 // 10), 2))
        spec = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": BATCH}]}
        rc, got, err = self.run_with_kills(spec, kills, seed, sharding='data')
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), kills after batches %s' % (seed, seed, kills)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        assert_exactly_once(self, got, N, where)

    def test_state_survives_a_restart_and_ids_are_not_reused(self):
        spec = {"source": {"type": "range", "stop": 5000}, "ops": [{"op": "batch", "batch_size": 100}]}
        rc, batches, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--job-name', 'kept'])
        self.assertEqual(rc, 0, err)
        admin = self.cluster.dispatcher.admin_port
        before = {p: get_json(admin, p) for p in ('/v1/datasets', '/v1/jobs')}
        workers_before = sorted(w['id'] for w in get_json(admin, '/v1/workers')['workers'])
        self.cluster.restart_dispatcher(signal.SIGKILL)
        admin = self.cluster.dispatcher.admin_port
        after = {p: get_json(admin, p) for p in ('/v1/datasets', '/v1/jobs')}
        # unused_ms is a time, as age_ms is: compared without it.
        timeless = lambda ds: [{k: v for k, v in d.items() if k != 'unused_ms'} for d in ds['datasets']]
        self.assertEqual(timeless(after['/v1/datasets']), timeless(before['/v1/datasets']))
        drop = ('age_ms', 'ended_ms_ago', 'elements_served', 'bytes_served', 'batches_served', 'num_consumers')
        strip = lambda jobs: [{k: v for k, v in j.items() if k not in drop} for j in jobs['jobs']]
        self.assertEqual(strip(after['/v1/jobs']), strip(before['/v1/jobs']))
        # Workers carry on under their ids, without registering again.
        self.cluster.wait_workers_registered(3)
        self.assertEqual(sorted(w['id'] for w in get_json(admin, '/v1/workers')['workers']), workers_before)
        # A new dataset and a new job get ids the first run never gave out.
        old_ids = {d['id'] for d in before['/v1/datasets']['datasets']} | {j['id'] for j in before['/v1/jobs']['jobs']}
        spec2 = {"source": {"type": "range", "stop": 300}, "ops": [{"op": "batch", "batch_size": 100}]}
        rc, batches, err = self.cluster.cat(spec2, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(v for b in batches for v in b['value']), list(range(300)))
        new_ids = {d['id'] for d in get_json(admin, '/v1/datasets')['datasets']} | \
                  {j['id'] for j in get_json(admin, '/v1/jobs')['jobs']}
        fresh = new_ids - old_ids
        self.assertEqual(len(fresh), 2)
        self.assertGreater(min(fresh), max(old_ids | set(workers_before)))


class DamagedRecord(ThreeWorkers):
    def test_a_damaged_job_record_holds_back_that_job_and_the_rest_is_served(self):
        """The dispatcher killed -9 mid-epoch, one running job's record
        damaged meanwhile (its state out of range, its name still readable),
        and started again: the other job's trainer reads on and ends with
        every element exactly once; the damaged job is held back, its
        trainer told why, its name not made again, its record left as it
        is."""
        if not shutil.which('mdb_load'):
            self.fail('mdb_load (lmdb-utils, which scripts/install-deps.sh installs) is needed to damage a record')
        admin = self.cluster.dispatcher.admin_port
        work = self.cluster.dispatcher.argv[self.cluster.dispatcher.argv.index('--work-dir') + 1]
        # The victim reads an endless job and is gated by its one-page pipe,
        # which nothing reads until after the restart: it runs throughout.
        endless = {"source": {"type": "range", "stop": 1000}, "ops": [{"op": "repeat"}, {"op": "batch",
                                                                                          "batch_size": 10}]}
        victim = subprocess.Popen(self.cluster.cat_argv(endless, ['--sharding', 'dynamic', '--job-name', 'victim']),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        try:
            fcntl.fcntl(victim.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
            job = wait_for(lambda: next((j for j in get_json(admin, '/v1/jobs')['jobs'] if j['name'] == 'victim'
                                         and j['num_consumers'] == 1), None), 'the victim job and its client')
            key = struct.pack('>Q', job['id'])
            damaged = []

            def check_store():
                r = subprocess.run([binary('sluice-dispatcher'), '--work-dir', work, '--check-store'],
                                   capture_output=True, text=True, timeout=60)
                return r.returncode, json.loads(r.stdout), r.stderr

            def damage():
                checked.append(check_store())
                rec = json.loads(store_records(work, 'jobs')[key])
                rec['state'] = 99
                damaged.append(json.dumps(rec).encode())
                store_put(work, 'jobs', key, damaged[0])
                with open(os.path.join(work, 'state.mdb'), 'rb') as f:
                    before = f.read()
                checked.append(check_store())
                with open(os.path.join(work, 'state.mdb'), 'rb') as f:
                    checked.append(f.read() == before)
            checked = []

            spec = {"source": {"type": "range", "stop": N}, "ops": [{"op": "batch", "batch_size": BATCH}]}
            rc, got, err = stream_with_faults(
                self.cluster, spec, ['--sharding', 'dynamic'],
                [(N // BATCH // 3, lambda: self.cluster.restart_dispatcher(stopped=damage))])
            self.assertEqual(rc, 0, 'sluice-cat failed: %s' % err[-3000:])
            assert_exactly_once(self, got, N, 'a restart with another job held back')
            out, verr = victim.communicate(timeout=120)
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
        self.assertNotEqual(victim.returncode, 0)
        why = 'state store: jobs record %d: a field out of range' % job['id']
        # An operator's check of the stopped store, before and after the
        # damage: what it holds, what a start would hold back; it writes nothing.
        (rc0, out0, err0), (rc1, out1, err1), unchanged = checked
        self.assertEqual((rc0, out0['loads'], out0['held_back']), (0, True, []), err0)
        self.assertGreaterEqual(out0['jobs'], 2)
        self.assertEqual((rc1, out1['loads'], out1['jobs']), (1, True, out0['jobs'] - 1), err1)
        self.assertEqual(out1['held_back'], [{'table': 'jobs', 'kind': 'job', 'id': job['id'], 'name': 'victim',
                                              'repetition': 0, 'why': why}])
        self.assertIn('--check-store: 1 damaged records: a start would hold back what they are of', err1)
        self.assertTrue(unchanged, 'the check wrote the store')
        self.assertIn('job %d is held back since the dispatcher started, its state store record damaged' % job['id'],
                      verr)
        admin = self.cluster.dispatcher.admin_port
        held = get_json(admin, '/v1/quarantine')
        self.assertEqual(held, {'held_back': [{'table': 'jobs', 'kind': 'job', 'id': job['id'], 'name': 'victim',
                                               'repetition': 0, 'why': why}], 'limit': 1024})
        self.assertEqual(metric(admin, 'sluice_dispatcher_held_back_records'), 1)
        self.assertEqual(get_json(admin, '/healthz')['held_back'], 1)
        ctl = subprocess.run([binary('sluicectl'), '--admin', '127.0.0.1:%d' % admin, 'held-back'], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(ctl.returncode, 0, ctl.stderr)
        self.assertRegex(ctl.stdout.splitlines()[1], r'^job\s+%d\s+victim\s+0\s+%s$' % (job['id'], why))
        dom, derr = dump_dom('http://127.0.0.1:%d/' % admin)
        self.assertIn('<h2 id="held-title">Held back</h2><p>1 damaged record(s)', dom, derr[-2000:])
        self.assertIn('<td>job</td><td>%d</td><td>victim repetition 0</td><td>%s</td>' % (job['id'], why), dom)
        status, text = http(admin, '/v1/jobs/%d' % job['id'])
        self.assertEqual(status, 404)
        self.assertIn('is held back: ' + why, text)
        self.assertNotIn(job['id'], [j['id'] for j in get_json(admin, '/v1/jobs')['jobs']])
        # Its workers let its tasks go.
        wait_for(lambda: not [t for w in self.cluster.workers for t in get_json(w.admin_port, '/v1/tasks')['tasks']
                              if t['job_id'] == job['id']], 'the workers dropping the held-back job\'s tasks')
        # Its name is not made again: its trainer would read the epoch over.
        rc, _, err = self.cluster.cat(endless, ['--sharding', 'dynamic', '--job-name', 'victim'], fmt='count',
                                     timeout=120)
        self.assertNotEqual(rc, 0)
        self.assertIn('job "victim" repetition 0 (id %d) is held back, its state store record damaged' % job['id'],
                      err)
        # The record is as the damage left it, through the commits since.
        self.cluster.restart_dispatcher(signal.SIGTERM, stopped=lambda: damaged.append(
            store_records(work, 'jobs')[key]))
        self.assertEqual(damaged[1], damaged[0])
        # The operator forgets it: its records go, and its name makes a new job.
        admin = self.cluster.dispatcher.admin_port
        ctl = [binary('sluicectl'), '--admin', '127.0.0.1:%d' % admin]
        r = subprocess.run(ctl + ['forget', 'job/%d' % job['id']], capture_output=True, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (0, 'job/%d forgotten: its records are deleted from the state '
                                                       'store\n' % job['id']), r.stderr)
        self.assertEqual(get_json(admin, '/v1/quarantine')['held_back'], [])
        r = subprocess.run(ctl + ['forget', 'job/%d' % job['id']], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn('no job %d is held back' % job['id'], r.stderr)
        small = {"source": {"type": "range", "stop": 1000}, "ops": [{"op": "batch", "batch_size": 10}]}
        rc, got, err = self.cluster.cat(small, ['--sharding', 'dynamic', '--job-name', 'victim'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(got, 'value')), list(range(1000)))
        self.cluster.restart_dispatcher(signal.SIGTERM, stopped=lambda: damaged.append(
            store_records(work, 'jobs').get(key)))
        self.assertIsNone(damaged[2])


class WorkerCrash(ThreeWorkers):
    """Workers killed with -9 mid-epoch under DYNAMIC sharding: the dispatcher
    sees the connection close, the consumer says what it received of the
    lost worker's splits, and the rest of them goes to the other workers;
    the killed worker comes back on its address and rejoins. Every element
    arrives exactly once."""

    def run_with_worker_kills(self, spec, kills, seed, args=()):
        """Streams spec through sluice-cat; after each batch count in kills
        (at, worker index) kills that worker and starts it again on its ports
        after a seeded pause. Returns (returncode, values, stderr)."""
        rng = random.Random(seed)
        self.victims = []  # the workers killed, in order (see kill())

        def taking_part(i):
            # A batch still in its buffer holds splits the consumer cannot
            # have confirmed: its loss is one the clients must report.
            return any(t['state'] == 'RUNNING' and t['batches_produced'] > 0 and t['buffer']['batches'] > 0
                       for t in get_json(self.cluster.workers[i].admin_port, '/v1/tasks')['tasks'])

        def kill(victim):
            # The victim takes part before it goes: it has a task of the job
            # that made batches and holds one, so it holds splits the
            # consumer has not confirmed. A worker restarted by the kill before may not even
            # have registered yet, however many batches were read since, or
            # may never make a batch: the others may hold every split left
            # (the splits of a short epoch are long). Then the next worker
            # that takes part goes instead. Their pipelines fill their
            # buffers while nothing is read, so this wait ends without the
            # consumer.
            order = [victim] + [i for i in range(len(self.cluster.workers)) if i != victim]
            chosen = wait_for(lambda: [i for i in order if taking_part(i)][:1],
                              'a worker to make batches before it is killed (worker %d drawn)' % victim)[0]
            self.victims.append(chosen)
            self.cluster.restart_worker(chosen, down=rng.uniform(0.0, 1.0))
        faults = [(at, lambda v=victim: kill(v)) for at, victim in kills]
        return stream_with_faults(self.cluster, spec, ['--sharding', 'dynamic'] + list(args), faults)

    def test_kill9_workers_mid_epoch_every_element_exactly_once(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        total = N // BATCH
        ats = sorted(rng.sample(range(total // 10, total * 7 // 10), 2))
        kills = [(at, rng.randrange(3)) for at in ats]
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        rc, got, err = self.run_with_worker_kills(spec, kills, seed)
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), (batch, worker) kills %s, workers killed %s' % (
            seed, seed, kills, self.victims)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        assert_exactly_once(self, got, N, where)
        admin = self.cluster.dispatcher.admin_port
        # The last worker restarted may register after the job ended.
        self.cluster.wait_workers_registered(3, timeout=60)
        workers = get_json(admin, '/v1/workers')['workers']
        lost = [w for w in workers if w['state'] == 'LOST']
        self.assertEqual(len(lost), 2, '%s: %s' % (where, workers))
        for w in lost:
            self.assertIn('its connection closed', w['lost_reason'], where)
        # The killed workers came back on their addresses and registered again.
        self.assertEqual(len([w for w in workers if w['state'] == 'LIVE']), 3, '%s: %s' % (where, workers))
        job = get_json(admin, '/v1/jobs')['jobs'][0]
        self.assertEqual(job['state'], 'FINISHED', where)
        # A report for each lost worker that held splits: each kill's victim
        # held a batch, but the consumer may still have confirmed its splits
        # between the look and the kill, and then nothing waits for a report.
        reports = self.cluster.dispatcher.stderr().count('wait for the clients to say what they received')
        self.assertGreaterEqual(reports, 1, where)
        self.assertEqual(job['lost_splits'], {'outstanding': 0, 'awaiting_reports': 0, 'queued': 0,
                                              'report_gen': reports}, where)

    def test_kill9_workers_of_a_job_handed_its_first_splits_exactly_once(self):
        """The dataset's second job: the dispatcher hands each task its first
        splits with the job (docs/sharding.md, DYNAMIC), before the workers
        hear of it, and workers die early in it, some of those splits still
        queued unread: every element exactly once all the same."""
        seed = chaos_seed()
        rng = random.Random(seed)
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        admin = self.cluster.dispatcher.admin_port
        rc, batches, err = self.cluster.cat(spec, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err[-2000:])
        assert_exactly_once(self, values(batches, 'value'), N, 'the first job')
        before = metric(admin, 'sluice_dispatcher_first_splits_with_job_total')
        total = N // BATCH
        kills = [(at, rng.randrange(3)) for at in sorted(rng.sample(range(1, total // 4), 2))]
        rc, got, err = self.run_with_worker_kills(spec, kills, seed)
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), (batch, worker) kills %s, workers killed %s' % (
            seed, seed, kills, self.victims)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        assert_exactly_once(self, got, N, where)
        # The premise: the job handed tasks their first splits itself.
        self.assertGreater(metric(admin, 'sluice_dispatcher_first_splits_with_job_total'), before, where)

    def test_long_splits_of_a_killed_worker_exactly_once(self):
        """Workers that ask for splits far longer than the least (a target
        of 100 s a split): the dispatcher hands out each as long as its
        guided share allows, and a killed worker's long splits go out again
        without what the consumer has: exactly once."""
        self.cluster.close()
        self.cluster = Cluster(workers=3, dispatcher_args=['--split-size', '1000'],
                               worker_args=['--split-target-ms', '100000'])
        self.cluster.wait_workers_registered(3)
        seed = chaos_seed()
        rng = random.Random(seed)
        kills = [(rng.randrange(N // BATCH // 10, N // BATCH // 2), rng.randrange(3))]
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        rc, got, err = self.run_with_worker_kills(spec, kills, seed)
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), (batch, worker) kills %s, workers killed %s' % (
            seed, seed, kills, self.victims)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        assert_exactly_once(self, got, N, where)
        job = get_json(self.cluster.dispatcher.admin_port, '/v1/jobs')['jobs'][0]
        self.assertEqual(job['state'], 'FINISHED', where)
        self.assertEqual(job['lost_splits']['report_gen'], 1, where)
        # Longer splits than the least: fewer of them than 1000-record ones.
        splits = job['splits']
        self.assertEqual(splits['records_handed_out'], N, where)
        self.assertLess(splits['handed_out_all_epochs'], N // 1000, '%s: %s' % (where, splits))

    def test_without_provenance_a_worker_loss_is_at_least_once(self):
        """--no-provenance: the client cannot say what it received; the lost
        splits go out again whole, so nothing is missing (some may repeat),
        and the dispatcher says why."""
        seed = chaos_seed()
        rng = random.Random(seed)
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        kills = [(rng.randrange(N // BATCH // 10, N // BATCH // 2), rng.randrange(3))]
        rc, got, err = self.run_with_worker_kills(spec, kills, seed, ['--no-provenance'])
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), (batch, worker) kills %s, workers killed %s' % (
            seed, seed, kills, self.victims)
        self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        missing, _, unexpected = missing_and_duplicated(got, range(N))
        self.assertEqual((len(missing), unexpected), (0, []), '%s: missing %s' % (where, missing[:10]))
        self.assertIn('cannot say what it received of the lost workers', self.cluster.dispatcher.stderr(), where)
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--no-provenance', '--checkpoint-out', 'x'])
        self.assertEqual(rc, 2)
        self.assertIn('--no-provenance cannot go with', err)


class WorkerLostAfterItsTaskWasDone(unittest.TestCase):
    """A task reports itself done once its last batch and split notice went
    out, before its client asks for the end of sequence. A worker killed in
    between (and started again without the task) cannot send that end; the
    job is FINISHED at the dispatcher, whose task list still has the task (it
    was done, not lost). The client ends the task when its worker no longer
    knows it: every split reached it, so nothing is missing."""

    def test_the_read_ends_with_every_element_once(self):
        n, batch = 500000, 100000  # batches of 800 KB: far more than a pipe holds
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": n}, "ops": [{"op": "batch", "batch_size": batch}]}
            admin = c.dispatcher.admin_port
            # The first three batches read: sluice-cat then blocks writing
            # the fourth into the full pipe, and the fifth, the last, waits
            # in its queue, so it asks for nothing more (one in flight or
            # queued). The worker has sent everything but the end.
            rc, raw, err = c.cat_across_restart(
                spec, ['--sharding', 'dynamic', '--max-outstanding', '1', '--timeout-ms', '20000'], 3 * batch * 8, 0,
                before=lambda: wait_for(lambda: get_json(admin, '/v1/jobs')['jobs'][0]['state'] == 'FINISHED',
                                        'the job to finish at the dispatcher before the client has the end'),
                timeout=120)
            self.assertEqual(rc, 0, err[-2000:])
            got = struct.unpack('<%dq' % (len(raw) // 8), raw)
            assert_exactly_once(self, got, n, 'a worker lost after its task was done')
        finally:
            self.assertEqual(c.close(), {})


class FirstSplitsWithTheJob(unittest.TestCase):
    """A new DYNAMIC job hands each task the splits its first request will
    ask for when its worker's tasks asked for the dataset's splits before
    (docs/sharding.md, DYNAMIC): committed with the job, before the worker
    has even heard of its task. A worker lost before it asked for them
    never read them: they go to the others, and the job reads every element
    once."""

    def test_a_worker_lost_before_it_asks_for_its_first_splits_loses_none(self):
        n = 500000
        c = Cluster(workers=1, dispatcher_args=['--split-size', '1000', '--worker-timeout-ms', '5000'])
        stopped = False
        try:
            c.wait_workers_registered(1)
            admin = c.dispatcher.admin_port
            spec = {"source": {"type": "range", "stop": n}, "ops": [{"op": "batch", "batch_size": 1000}]}

            # Worker 0 alone reads a first job: its task takes every split,
            # so it asks again (for splits of a length) after the fourth of
            # the eight its first request got. Nothing was handed out ahead.
            rc, batches, err = c.cat(spec, ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err[-2000:])
            assert_exactly_once(self, values(batches, 'value'), n, 'the first job')
            self.assertEqual(metric(admin, 'sluice_dispatcher_first_splits_with_job_total'), 0)
            dataset = get_json(admin, '/v1/datasets')['datasets'][0]['id']
            taught = get_json(admin, '/v1/workers')['workers'][0]
            self.assertEqual(taught['first_request_splits'], 8, taught)
            self.assertEqual([x['dataset_id'] for x in taught['split_lengths']], [dataset], taught)

            # Worker 1 has never read it; worker 0 stops before the next job.
            c.add_worker()
            c.wait_workers_registered(2)
            c.workers[0].kill(signal.SIGSTOP)
            stopped = True
            proc = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--timeout-ms', '120000']),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            out, err = proc.communicate(timeout=300)
            self.assertEqual(proc.returncode, 0, err[-2000:])
            assert_exactly_once(self, values(parse_jsonl(out), 'value'), n, 'a worker stopped before its first request')
            jobs = get_json(admin, '/v1/jobs')['jobs']
            job = get_json(admin, '/v1/jobs/%d' % max(j['id'] for j in jobs))
            lost = [t for t in job['tasks'] if t['worker_address'] == c.workers[0].addr]
            self.assertEqual(len(lost), 1, 'worker 0 was lost before the job was made: %s' % job)
            # Worker 0's task alone was handed its first splits with the job.
            self.assertEqual(metric(admin, 'sluice_dispatcher_first_splits_with_job_total'), 1)
            # Its first answer, made with the job, counts as its one request.
            self.assertEqual((lost[0]['state'], lost[0]['split_requests'], lost[0]['batches']), ('LOST', 1, 0), job)
            self.assertEqual(job['lost_splits']['report_gen'], 1, job)
            self.assertEqual(job['splits']['records_handed_out'], n, job)
        finally:
            if stopped:
                c.workers[0].kill(signal.SIGCONT)
            c.close()


class DispatcherStateLost(unittest.TestCase):
    """A dispatcher started on an empty work dir (its volume lost) gives its
    ids again from the start, to other tasks. A worker that outlived the old
    one registers anew and forgets what it ran under it: it kept a running
    task of the old dispatcher's under the id the new one gives a new job's
    task, took the new task for it (never starting it) and refused the new
    job's client with SL_EPERM (not its key), as it did with a tombstone of
    that id. The old job's trainer fails, with the dispatcher's refusal."""

    def held_trainer(self, c, spec, err_file):
        """sluice-cat reading spec (100,000 elements), held after its first
        batch: nobody reads its output."""
        p = subprocess.Popen(c.cat_argv(spec, ['--max-outstanding', '1'], fmt='raw'), stdout=subprocess.PIPE,
                             stderr=err_file, env=child_env())
        p.stdout.read(8 * 1000)
        return p

    def assert_fails(self, trainer, err_file, *texts):
        """The held trainer, read again, ends with an error that says texts,
        not with data nor a hang."""
        out, _ = trainer.communicate(timeout=60)
        err_file.seek(0)
        err = err_file.read()
        self.assertNotEqual(trainer.returncode, 0, err[-2000:])
        for text in texts:
            self.assertIn(text, err)
        self.assertLess(len(out), 100000 * 8, 'the old job read on')

    def close_all(self, c, trainer, err_file):
        if trainer and trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        err_file.close()
        self.assertEqual(c.close(), {})

    def test_a_worker_that_outlived_its_dispatchers_state_serves_the_new_ones_jobs(self):
        c = Cluster(workers=1)
        old = None
        old_err = open(os.path.join(c.dir, 'old-trainer.err'), 'w+')
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 100000}, "ops": [{"op": "batch", "batch_size": 1000}]}
            # A job of the old dispatcher's that stays running: its client
            # reads a batch, then nobody reads its output.
            old = self.held_trainer(c, spec, old_err)
            old_tasks = [t['task_id'] for t in get_json(c.workers[0].admin_port, '/v1/tasks')['tasks']]
            c.restart_dispatcher(work_dir=os.path.join(c.dir, 'work-new'))
            c.wait_workers_registered(1)
            jobs = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']
            for sharding in ('off', 'dynamic'):
                rc, batches, err = c.cat(spec, ['--sharding', sharding, '--timeout-ms', '20000'], timeout=60)
                self.assertEqual(rc, 0, err[-2000:])
                assert_exactly_once(self, values(batches, 'value'), 100000, 'a new dispatcher\'s job, ' + sharding)
            self.assertEqual(jobs, [], 'the new dispatcher knew a job before its first')
            # The premise: the first new job's task has the old task's id.
            self.assertIn('task %d of job' % old_tasks[0], c.workers[0].stderr().split('registered with')[-1])
            # The old trainer fails, with an error that names the dispatcher.
            self.assert_fails(old, old_err, 'dispatcher %s' % c.dispatcher.addr, 'before it lost its state')
        finally:
            self.close_all(c, old, old_err)

    NEW = {"source": {"type": "range", "start": 500000, "stop": 510000}, "ops": [{"op": "batch", "batch_size": 1000}]}

    def backup_then_lost_job(self, c, old_err):
        """Takes a backup of c's state (the dispatcher stopped), then starts
        a held job after it, the job the restore loses, whose trainer goes
        to self.old; returns its task ids on the worker and the backup's
        path (Cluster.restore_state())."""
        # The backup, taken with the dispatcher stopped, knows the worker.
        backup = c.backup_state()
        # Each job is made once the worker is back (its task made with the
        # job), so that the lost one and the new one take their ids in the
        # same order.
        wait_for(lambda: c.workers[0].stderr().count('reconnected to dispatcher') == 1, 'the worker back')
        lost = {"source": {"type": "range", "stop": 100000}, "ops": [{"op": "batch", "batch_size": 1000}]}
        self.old = self.held_trainer(c, lost, old_err)
        return [t['task_id'] for t in get_json(c.workers[0].admin_port, '/v1/tasks')['tasks']], backup

    def assert_new_job_read_its_own(self, c, read, lost_tasks, old_err):
        """The new job read its own range exactly once, under the lost
        job's task's id, and the lost job's trainer fails, refused: it
        reads nothing of the new job."""
        self.assertEqual(sorted(v - 500000 for v in read), list(range(10000)),
                         'the new job read other data than its own')
        logged = c.workers[0].stderr()
        self.assertGreaterEqual(logged.count('task %d of job' % lost_tasks[0]), 2, logged[-3000:])
        self.assert_fails(self.old, old_err, 'client_secret is not the one job')

    def test_a_dispatcher_restored_from_a_backup_serves_no_task_or_trainer_of_the_lost_state(self):
        """Restored from a backup taken before a job, the dispatcher gives
        that job's ids out again (operations.md, Backups): to a new job
        over another dataset, on the same worker, which ran the lost job's
        task of that id and keeps its tombstone. The new job's trainer reads
        its own dataset, exactly once, and the lost job's trainer, which
        comes back with secrets for the same ids, is refused: neither reads
        the other's data (the jobs' nonces, dispatcher/caps.h)."""
        c = Cluster(workers=1)
        self.old = None
        old_err = open(os.path.join(c.dir, 'lost-trainer.err'), 'w+')
        try:
            c.wait_workers_registered(1)
            lost_tasks, backup = self.backup_then_lost_job(c, old_err)
            c.restore_state(backup)
            wait_for(lambda: c.workers[0].stderr().count('reconnected to dispatcher') == 2, 'the worker back')
            # The worker reconnects and reports the lost task, which this
            # state does not know: it goes, and leaves a tombstone of its id,
            # which must not answer the new job's task of that id.
            wait_for(lambda: 'task %d removed' % lost_tasks[0] in c.workers[0].stderr(),
                     'the worker to drop the lost job\'s task')
            rc, batches, err = c.cat(self.NEW, ['--timeout-ms', '20000', '--with-worker'], timeout=60)
            self.assertEqual(rc, 0, err[-2000:])
            self.assert_new_job_read_its_own(c, values(batches, 'value'), lost_tasks, old_err)
        finally:
            self.close_all(c, self.old, old_err)

    def test_a_new_trainer_ahead_of_the_restored_dispatchers_answer_waits_for_it(self):
        """The same restore, with the restored dispatcher's answers to the
        reconnected worker held on the way after the first (its
        registration's): the worker still runs the lost job's task when the
        new job's trainer comes with a key to the new task of that id. A
        task kept from before the session is not vouched for until the
        dispatcher answers a heartbeat sent since: the request waits for
        that answer, which puts the new task in the lost one's place, and is
        served then, not refused (SL_EPERM, not its key)."""
        c = Cluster()
        _, proxy = worker_behind(c)
        self.old = None
        old_err = open(os.path.join(c.dir, 'lost-trainer.err'), 'w+')
        try:
            c.wait_workers_registered(1)
            lost_tasks, backup = self.backup_then_lost_job(c, old_err)
            proxy.hold_after_first()
            c.restore_state(backup)
            wait_for(lambda: c.workers[0].stderr().count('reconnected to dispatcher') == 2 and proxy.held.is_set(),
                     'the worker back, the answers after its registration held')
            self.assertEqual([t['task_id'] for t in get_json(c.workers[0].admin_port, '/v1/tasks')['tasks']],
                             lost_tasks, 'the worker dropped the lost task before the answer was let through')
            awaited = metric(c.workers[0].admin_port, 'sluice_worker_requests_awaited_task_total')
            trainer = subprocess.Popen(c.cat_argv(self.NEW, ['--timeout-ms', '20000']), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=child_env())
            try:
                wait_for(lambda: trainer.poll() is not None or
                         metric(c.workers[0].admin_port, 'sluice_worker_requests_awaited_task_total') > awaited,
                         'the new trainer\'s request to reach the worker')
                proxy.release()
                out, err = trainer.communicate(timeout=60)
            finally:
                if trainer.poll() is None:
                    trainer.kill()
                    trainer.wait()
            self.assertEqual(trainer.returncode, 0, err[-2000:])
            self.assert_new_job_read_its_own(c, values(parse_jsonl(out), 'value'), lost_tasks, old_err)
        finally:
            proxy.release()
            self.close_all(c, self.old, old_err)
            proxy.close()


class AwayClient(unittest.TestCase):
    """A trainer whose lease runs out while it is away (stopped with SIGSTOP
    longer than --client-timeout-ms) is away, not gone: its peer reads on,
    a worker killed meanwhile has its splits wait for what the away trainer
    received, and when it comes back it goes on: exactly once across both."""

    def setUp(self):
        self.cluster = Cluster(workers=3, dispatcher_args=['--split-size', '1000', '--client-timeout-ms', '1000'])
        self.cluster.wait_workers_registered(3)

    def tearDown(self):
        bad = self.cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def test_an_away_trainer_comes_back_exactly_once_across_a_worker_loss(self):
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "shuffle", "buffer_size": 500, "seed": 7}, {"op": "batch", "batch_size": BATCH}]}
        args = ['--sharding', 'dynamic', '--job-name', 'away', '--max-outstanding', '4', '--timeout-ms', '60000']
        admin = self.cluster.dispatcher.admin_port
        # The peer stops reading while the trainer is away (its stdout is not
        # read, so it blocks; its heartbeats go on): the epoch cannot end
        # before the away trainer is back, however fast the machine.
        g = GatedTrainers(self.cluster, spec, args, gated=1, stop_after=20)
        trainers, got, counts, peer_reads = g.procs, g.got, g.counts, g.reads
        try:
            wait_for(lambda: min(counts) >= 20, 'both trainers to read 20 batches')
            trainers[0].send_signal(signal.SIGSTOP)
            job_id = get_json(admin, '/v1/jobs')['jobs'][0]['id']

            def job():
                return get_json(admin, '/v1/jobs/%d' % job_id)
            wait_for(lambda: [c['state'] for c in job()['consumers']] in (['away', 'present'], ['present', 'away']),
                     'the stopped trainer to be away and its peer present')
            # A worker that served the job dies while the trainer is away; it
            # holds splits not confirmed (its buffer is full, nobody reads;
            # the away trainer did not acknowledge what came last). One that
            # served the job but holds none (its splits reached both trainers,
            # its worker saw them acknowledged) leaves nothing to report.
            def victim():
                held = [t['worker_address'] for t in job()['tasks'] if t.get('outstanding_splits', 0) > 0]
                return next((i for i, w in enumerate(self.cluster.workers) if '127.0.0.1:%d' % w.port in held), None)
            wait_for(lambda: victim() is not None, 'a worker holding splits not confirmed')
            self.cluster.restart_worker(victim(), down=0.2)
            wait_for(lambda: job()['lost_splits']['report_gen'] >= 1, 'the dispatcher to see the worker lost')
            self.assertEqual(job()['state'], 'RUNNING')
            trainers[0].send_signal(signal.SIGCONT)
            peer_reads.set()
            ends = [g.finish(i) for i in range(2)]
        finally:
            g.kill()
        for rc, err in ends:
            self.assertEqual(rc, 0, 'sluice-cat failed: %s' % err[-3000:])
        assert_exactly_once(self, got[0] + got[1], N, 'an away trainer and a worker killed meanwhile')
        log = self.cluster.dispatcher.stderr()
        self.assertRegex(log, r'client \d+ is away: no heartbeat for \d+ ms')
        self.assertRegex(log, r'client \d+ is back after \d+ ms away')
        self.assertEqual(job()['state'], 'FINISHED')


class GatedTrainers:
    """Two sluice-cat trainers of one spec, their stdout drained by threads
    into got[i] (values) and counts[i] (batches); the drain of trainer
    `gated` waits while `reads` is clear, so that its caller stops reading
    (its stdout blocks) while its process and its heartbeats go on. That
    drain clears `reads` itself once it has read `stop_after` batches: the
    gate closes there however fast the job runs (a test that closed it when
    it saw the count found a 100,000-element job over before it looked).
    The gated trainer's pipe is one page, so that it blocks after a few
    batches more, not after 64 KiB of them. The other trainer's drain waits
    at `stop_after` batches until the gated one has read as many: it started
    first or runs faster, and an ungated peer once read a whole
    100,000-element job before the gated trainer had its 5 batches. With
    peer_waits the other trainer stops reading there too (its pipe one
    page as well) until `peer_reads` is set."""

    def __init__(self, cluster, spec, args, gated, stop_after, peer_waits=False):
        self.got, self.counts = [[], []], [0, 0]
        self.reads = threading.Event()
        self.reads.set()
        self.gated_there = threading.Event()  # the gated drain has read stop_after batches
        self.peer_reads = threading.Event()
        if not peer_waits:
            self.peer_reads.set()
        self.stop_after = stop_after
        self.procs, self.threads = [], []
        try:
            for i in range(2):
                p = subprocess.Popen(cluster.cat_argv(spec, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=child_env())
                if i == gated or peer_waits:
                    fcntl.fcntl(p.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
                self.procs.append(p)
                t = threading.Thread(target=self._drain, args=(i, p, i == gated), daemon=True)
                t.start()
                self.threads.append(t)
        except BaseException:
            self.kill()
            raise

    def _drain(self, i, proc, gated):
        for line in proc.stdout:
            if gated:
                self.reads.wait()
            if line.endswith('\n'):
                self.got[i].extend(json.loads(line)['value'])
                self.counts[i] += 1
                if gated and self.counts[i] == self.stop_after:
                    self.reads.clear()
                    self.gated_there.set()
                elif not gated and self.counts[i] == self.stop_after:
                    self.gated_there.wait()
                    self.peer_reads.wait()

    def finish(self, i, timeout=300):
        """Waits for trainer i to exit and its drain to end: (exit code, stderr)."""
        self.procs[i].wait(timeout=timeout)
        self.threads[i].join(timeout=60)
        return self.procs[i].returncode, self.procs[i].stderr.read()

    def kill(self):
        """Lets every drain read and kills what still runs (a stopped one too)."""
        self.reads.set()
        self.gated_there.set()
        self.peer_reads.set()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()


class StalledClient(unittest.TestCase):
    """A trainer whose caller stops reading without closing (its stdout is
    not read, so it blocks while its heartbeats go on) is stalled after
    --client-stall-ms: its peer reads to the end of the job without it, and
    when it reads again it gets the rest of what it had: exactly once
    across both. Both stop reading until they are stalled, while the job's
    tasks run: at their end, the dispatcher lists a done task to a client
    behind it with probe_below (2026-12-05), and a trainer asked so is as
    far as they are and holds nothing back, stalled or not (the job then
    ended before its stall). A stalled client is not asked."""

    def setUp(self):
        self.cluster = Cluster(workers=2, dispatcher_args=['--split-size', '1000', '--client-stall-ms', '1000'])
        self.cluster.wait_workers_registered(2)

    def tearDown(self):
        bad = self.cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def test_a_trainer_that_stops_reading_does_not_hold_its_peer_at_the_end(self):
        n = 100000
        spec = {"source": {"type": "range", "stop": n}, "ops": [{"op": "batch", "batch_size": BATCH}]}
        args = ['--sharding', 'dynamic', '--job-name', 'stall', '--timeout-ms', '60000']
        admin = self.cluster.dispatcher.admin_port
        # Trainer 0's caller stops reading after 5 batches; its process runs
        # on. The peer's stops there too until both are stalled.
        g = GatedTrainers(self.cluster, spec, args, gated=0, stop_after=5, peer_waits=True)
        got, counts, stalled_reads = g.got, g.counts, g.reads
        try:
            wait_for(lambda: min(counts) >= 5, 'both trainers to read 5 batches')
            job_id = get_json(admin, '/v1/jobs')['jobs'][0]['id']

            def job():
                return get_json(admin, '/v1/jobs/%d' % job_id)
            wait_for(lambda: [c['state'] for c in job()['consumers']] == ['stalled', 'stalled'],
                     'both trainers to be stalled')
            self.assertEqual(job()['state'], 'RUNNING')
            g.peer_reads.set()
            # The peer reads on and reaches the job's end without trainer 0:
            # the job finishes while trainer 0 is stalled.
            wait_for(lambda: job()['state'] == 'FINISHED', 'the job to finish while trainer 0 does not read',
                     timeout=300)
            self.assertIn('stalled', [c['state'] for c in job()['consumers']],
                          [line for line in self.cluster.dispatcher.stderr().splitlines() if 'client' in line])
            rc, err = g.finish(1)
            self.assertEqual(rc, 0, 'the peer failed: %s' % err[-3000:])
            stalled_reads.set()
            rc, err = g.finish(0)
            self.assertEqual(rc, 0, 'the stalled trainer failed: %s' % err[-3000:])
        finally:
            g.kill()
        assert_exactly_once(self, got[0] + got[1], n, 'a trainer that stopped reading and its peer')
        log = self.cluster.dispatcher.stderr()
        self.assertRegex(log, r'client \d+ is stalled: it heartbeats but received nothing new for \d+ ms')


class BrokenConnections(unittest.TestCase):
    """Connections between a trainer and a worker broken with answers in
    flight (a proxy throws away the bytes the worker sent next and resets
    both ends): the trainer connects again and asks again for what it did
    not get, the worker sends the batches it holds, and every element comes
    exactly once. Sizes, cut points and the policy come from a seed, printed
    in every failure (SLUICE_CHAOS_SEED reruns one)."""

    def test_answers_lost_with_a_connection_are_sent_again(self):
        self.cut_and_check([64, 100, 256])

    def test_batches_lent_in_shared_memory_are_sent_again_on_the_new_connection(self):
        # Batches of 64 KiB and more are made in the trainer's region of
        # shared memory and lent (docs/protocol.md, "Blocks made in the
        # region"), their provenance after them in the block: one asked
        # again on a new connection, whose region is another, is copied out
        # of the old one, which lives until then. 100 batches or more: more
        # than the two workers' buffers hold before the trainer maps its
        # region (16 each), so that later ones are made there.
        lent, where = self.cut_and_check([8192, 10000, 16384], batches_from=100)
        self.assertGreater(lent, 0, '%s: no batch was lent: the test did not reach what it is about' % where)

    def test_a_trainer_that_leaves_early_leaves_nothing_held(self):
        # A trainer reads 20 batches of an endless named job and leaves:
        # the batches it received were held for it until a later request
        # acknowledged them, and with none coming, until the hold timeout
        # (5 min) or the job's collection (60 s without clients). Leaving,
        # it acknowledges them (an ack-only request), plain and coordinated.
        cluster = Cluster()
        try:
            w = cluster.add_worker()
            cluster.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 1000000},
                    "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": 100}]}
            for name, extra in (('leaver', []), ('leaver-coord', ['--num-consumers', '1', '--consumer-index', '0'])):
                rc, batches, err = cluster.cat(spec, ['--job-name', name, '--limit', '20',
                                                      '--max-outstanding', '16'] + extra)
                self.assertEqual((rc, len(batches)), (0, 20), err[-2000:])
                job = get_json(cluster.dispatcher.admin_port, '/v1/jobs')['names'][name][0]['job_id']
                self.assertTrue(any(t['job_id'] == job for t in get_json(w.admin_port, '/v1/tasks')['tasks']),
                                '%s: the task stays while the job waits for clients' % name)
                wait_for(lambda: metric(w.admin_port, 'sluice_worker_held_batches') == 0,
                         '%s: the worker to let go of what the trainer received, before the job is collected' % name,
                         timeout=20)
        finally:
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def test_the_last_answers_lost_after_the_job_ended_are_sent_again(self):
        # Under OFF a job ends when its tasks are done, and the dispatcher
        # takes the task away from the worker: answers lost with a broken
        # connection just then were answered with the end of the task when
        # asked again (the task was gone), and the trainer ended without
        # them, silently. The proxy delivers the first answer and holds
        # the rest; once the job finished and the worker dropped the task,
        # the connection is cut (what the proxy held is lost) and new ones
        # are refused until then, so that the trainer asks again only
        # after the task went. The worker kept the batches its client had
        # not acknowledged, and sends them again.
        n, batch = 1000, 100  # 10 batches and the end: all asked for at once (16 requests of a task in flight)
        real = free_ports(1)[0]
        cluster = Cluster()
        proxy = CutProxy(real)
        try:
            w = cluster.add_worker(['--port', str(real), '--worker-address', '127.0.0.1:%d' % proxy.port])
            cluster.wait_workers_registered(1)
            proxy.hold_after_first()
            spec = {"source": {"type": "range", "stop": n}, "ops": [{"op": "batch", "batch_size": batch}]}
            cat = subprocess.Popen(cluster.cat_argv(spec, ['--max-outstanding', '32', '--timeout-ms', '60000']),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            try:
                admin = cluster.dispatcher.admin_port
                wait_for(lambda: proxy.held.is_set() and get_json(admin, '/v1/jobs')['jobs'] and
                         get_json(admin, '/v1/jobs')['jobs'][0]['state'] == 'FINISHED',
                         'the job to finish while the proxy holds its answers')
                wait_for(lambda: not get_json(w.admin_port, '/v1/tasks')['tasks'],
                         'the worker to drop the finished task')
                self.assertGreater(metric(w.admin_port, 'sluice_worker_held_batches'), 0,
                                   'the finished task\'s unacknowledged batches are held')
                proxy.refuse()
                proxy.cut(wait=0.2)
                proxy.release()
                proxy.accept_again()
                out, err = cat.communicate(timeout=120)
            finally:
                if cat.poll() is None:
                    cat.kill()
                    cat.wait()
            self.assertEqual(cat.returncode, 0, err[-3000:])
            assert_exactly_once(self, values(parse_jsonl(out), 'value'), n, 'an OFF job read across the cut')
            self.assertGreater(metric(w.admin_port, 'sluice_worker_batches_sent_again_total'), 0)
            # The trainer acknowledged them at the end: nothing stays held.
            wait_for(lambda: metric(w.admin_port, 'sluice_worker_held_batches') == 0,
                     'the worker to hold nothing once the trainer acknowledged the end')
        finally:
            proxy.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def test_a_request_asked_again_while_the_old_one_waits_gets_the_same_batch(self):
        # Only the trainer's end of the connection breaks (a half-open
        # cut): the worker still has the old connection's requests waiting
        # for batches (the dispatcher is stopped, so the DYNAMIC task runs
        # out of splits) when the trainer asks again with the same numbers
        # on a new one. Once splits come again, the old request of a number
        # is served first; the new one must get that batch again, not the
        # next one (whose records the old connection's batch then took
        # away for good).
        n, batch = 1000000, 1000
        real = free_ports(1)[0]
        cluster = Cluster(dispatcher_args=['--split-size', '1000', '--max-split-size', '1000'])
        proxy = CutProxy(real)
        disp = cluster.dispatcher.proc
        try:
            # Splits of 1,000 records, a few queued at a time: the task runs
            # out of them soon after the dispatcher stops.
            w = cluster.add_worker(['--port', str(real), '--worker-address', '127.0.0.1:%d' % proxy.port,
                                    '--split-target-ms', '0'])
            cluster.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": n}, "ops": [{"op": "batch", "batch_size": batch}]}
            cat = subprocess.Popen(cluster.cat_argv(spec, ['--sharding', 'dynamic', '--timeout-ms', '60000']),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            got = []

            def read():
                for line in cat.stdout:
                    got.extend(json.loads(line)['value'])
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                def task():
                    tasks = get_json(w.admin_port, '/v1/tasks')['tasks']
                    return tasks[0] if tasks else {}
                wait_for(lambda: len(got) >= 10 * batch, 'the trainer to read 10 batches')
                disp.send_signal(signal.SIGSTOP)
                wait_for(lambda: task().get('requests_waiting', 0) > 0,
                         'the trainer\'s requests to wait for splits while the dispatcher is stopped')
                proxy.cut(half_open=True, wait=0.2)
                wait_for(lambda: task().get('requests_waiting_again', 0) > 0,
                         'requests asked again on a new connection to wait beside the old ones')
                disp.send_signal(signal.SIGCONT)
                cat.wait(timeout=120)
                reader.join(60)
            finally:
                disp.send_signal(signal.SIGCONT)
                if cat.poll() is None:
                    cat.kill()
                    cat.wait()
            err = cat.stderr.read()
            self.assertEqual(cat.returncode, 0, err[-3000:])
            # The iterator counts what its workers delivered and it never
            # got, split by split: it would have seen the loss too.
            self.assertEqual(summary(err)['records_missing'], 0, err[-3000:])
            assert_exactly_once(self, got, n, 'a DYNAMIC job read across a half-open cut')
            self.assertGreater(metric(w.admin_port, 'sluice_worker_batches_sent_again_total'), 0)
        finally:
            proxy.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def cut_and_check(self, batches, batches_from=None):
        """One seeded run of cuts with a batch size of batches (and at least
        batches_from batches); returns the batches the workers lent from
        shared memory, and the run's description."""
        seed = chaos_seed()
        rng = random.Random(seed)
        n = rng.randrange(200000, 1000001)
        batch = rng.choice(batches)
        if batches_from:
            n = batch * rng.randrange(batches_from, 2 * batches_from) + rng.randrange(batch)
        shuffle = rng.choice([0, 1000, 100000])
        cuts = rng.randrange(2, 6)
        # Some cuts reset the trainer's end only (half-open): the worker
        # keeps the old connection, and its waiting requests, open.
        half = [rng.random() < 0.5 for _ in range(cuts)]
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d elements, batch %d, shuffle %d, %d cuts (half-open: %s)' % (
            seed, seed, n, batch, shuffle, cuts, half)
        real = free_ports(2)
        cluster = Cluster(dispatcher_args=['--split-size', str(rng.choice([256, 1000, 4096]))])
        proxies = [CutProxy(p) for p in real]
        try:
            for p, proxy in zip(real, proxies):
                cluster.add_worker(['--port', str(p), '--worker-address', '127.0.0.1:%d' % proxy.port])
            cluster.wait_workers_registered(2)
            ops = ([{"op": "shuffle", "buffer_size": shuffle, "seed": seed % 1000}] if shuffle else [])
            spec = {"source": {"type": "range", "stop": n}, "ops": ops + [{"op": "batch", "batch_size": batch}]}
            total = n // batch
            ats = sorted(rng.sample(range(total // 10, total * 8 // 10), cuts))
            lost, cutters = [], []

            def cut(half_open):
                # In the background, while the test reads on: the trainer
                # keeps asking, so answers are on the wire when the proxy
                # throws away what comes next (read nothing, and the trainer
                # would stop asking once its budget is full: nothing to cut).
                for p in proxies:
                    t = threading.Thread(target=lambda p=p: lost.append(p.cut(half_open=half_open)))
                    t.start()
                    cutters.append(t)
            rc, got, err = stream_with_faults(cluster, spec, ['--sharding', 'dynamic', '--timeout-ms', '30000'],
                                              [(at, lambda h=h: cut(h)) for at, h in zip(ats, half)])
            for t in cutters:
                t.join(30)
            self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
            assert_exactly_once(self, got, n, '%s, bytes thrown away by each cut %s' % (where, lost))
            self.assertEqual(summary(err)['records_missing'], 0, '%s: %s' % (where, err[-3000:]))
            # The cuts threw answers away: what the test is about happened.
            self.assertGreater(sum(lost), 0, where)
            # Nothing stays held: a batch is let go when a later request
            # acknowledges it, and the last ones (answered just before the
            # end) when the trainer's request after the end acknowledges
            # them.
            def held():
                return sum(metric(w.admin_port, 'sluice_worker_held_batches', default=0) for w in cluster.workers)
            wait_for(lambda: held() == 0, '%s: the workers to hold no batch once the job ended' % where)
            lent = sum(metric(w.admin_port, 'sluice_worker_batches_shm_lent_total', default=0)
                       for w in cluster.workers)
        finally:
            for p in proxies:
                p.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        return lent, where


class MixedFaults(unittest.TestCase):
    """Every fault of a trainer's reach at once: three workers behind
    proxies, and while one DYNAMIC trainer reads, cuts of its connections
    (both ends, or its end only), workers killed with -9 and started again,
    and the dispatcher killed with -9 and started again, in an order, at
    moments and over sizes drawn from a seed, printed in every failure
    (SLUICE_CHAOS_SEED reruns one). Every element exactly once, and the
    iterator saw no batch lost on the way."""

    def test_cuts_worker_kills_and_dispatcher_restarts_together_exactly_once(self):
        self.run_mixed(chaos_seed(), trainers=1)

    def test_the_ranks_of_a_named_job_through_the_same_faults_exactly_once(self):
        # Two to four ranks share one DYNAMIC job (the DataLoader-per-GPU
        # path): each worker holds batches for several clients at once.
        # One seed draws them and the rest, so that it reruns the same.
        seed = chaos_seed()
        self.run_mixed(seed, trainers=random.Random(seed).randrange(2, 5))

    def run_mixed(self, seed, trainers):
        rng = random.Random(seed)
        n = rng.randrange(300000, 1000001)
        batch = rng.choice([64, 256, 1024])
        shuffle = rng.choice([0, 10000, 100000])
        kinds = [rng.choice(['cut', 'half-open cut', 'worker kill', 'dispatcher kill']) for _ in range(rng.randrange(3, 7))]
        total = n // batch
        ats = sorted(rng.sample(range(total // 10, total * 8 // 10), len(kinds)))
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d trainers, %d elements, batch %d, shuffle %d, ' \
                'faults %s at %s' % (seed, seed, trainers, n, batch, shuffle, kinds, ats)
        # Printed first as well: a fault that fails on the way (a dispatcher
        # that does not start again) fails the test without it.
        print('MixedFaults: %s' % where)
        real = free_ports(3)
        cluster = Cluster(dispatcher_args=['--split-size', str(rng.choice([1000, 4096]))])
        proxies = [CutProxy(p) for p in real]
        cutters = []
        try:
            for p, proxy in zip(real, proxies):
                cluster.add_worker(['--port', str(p), '--worker-address', '127.0.0.1:%d' % proxy.port])
            cluster.wait_workers_registered(3)
            ops = ([{"op": "shuffle", "buffer_size": shuffle, "seed": seed % 1000}] if shuffle else [])
            spec = {"source": {"type": "range", "stop": n}, "ops": ops + [{"op": "batch", "batch_size": batch}]}

            def act(kind):
                if kind.endswith('cut'):
                    # In the background: the trainer reads on meanwhile.
                    for p in proxies:
                        t = threading.Thread(target=lambda p=p: p.cut(half_open=kind.startswith('half')))
                        t.start()
                        cutters.append(t)
                elif kind == 'worker kill':
                    cluster.restart_worker(rng.randrange(3))
                else:
                    cluster.restart_dispatcher()
            args = ['--sharding', 'dynamic', '--timeout-ms', '60000']
            if trainers == 1:
                rc, got, err = stream_with_faults(cluster, spec, args,
                                                  [(at, lambda k=k: act(k)) for at, k in zip(ats, kinds)])
                self.assertEqual(rc, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
            else:
                got = self.ranks_with_faults(cluster, spec, args + ['--job-name', 'mixed'], trainers,
                                             [(at, lambda k=k: act(k)) for at, k in zip(ats, kinds)],
                                             where)
                err = None
            for t in cutters:
                t.join(30)
            assert_exactly_once(self, got, n, where)
            if err is not None:
                self.assertEqual(summary(err)['records_missing'], 0, '%s: %s' % (where, err[-3000:]))
        finally:
            for p in proxies:
                p.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)


    def ranks_with_faults(self, cluster, spec, args, trainers, faults, where):
        """Streams spec through `trainers` sluice-cat ranks of one job at
        once, calling act() once they read `at` batches between them, for
        each (at, act) of faults in order; returns every value read."""
        argv = cluster.cat_argv(spec, ['--max-outstanding', '4'] + args)
        got, ends = cats_with_faults(argv, trainers, 'value', [(at, lambda _, a=act: a()) for at, act in faults],
                                     where)
        for rc, err in ends:
            self.assertEqual(rc, 0, '%s: a rank failed: %s' % (where, err[-3000:]))
        return got


class ReportLostWithTheDispatcherConnection(unittest.TestCase):
    """A worker is lost, and the trainer's report of what it received (the
    dispatcher waits for every client's before it hands the lost splits out
    again) goes out on a dispatcher connection that breaks before the
    answer: the trainer must report again on the next connection. It did
    not (the report counted as in flight for ever), and the job waited for
    it until the trainer gave up; MixedFaults found it with a dispatcher
    killed just after a worker."""

    REPORT_RECEIVED_REQ = 20  # protocol/frame.h, sl_msg_type

    def test_a_report_lost_on_the_way_is_sent_again(self):
        n, batch = 400000, 1000
        cluster = Cluster(dispatcher_args=['--split-size', '1000', '--max-split-size', '1000'])
        proxy = CutProxy(cluster.dispatcher.port)
        try:
            for _ in range(2):
                cluster.add_worker(['--split-target-ms', '0'])
            cluster.wait_workers_registered(2)
            proxy.drop_frames(self.REPORT_RECEIVED_REQ)

            def lose_worker_and_the_report():
                cluster.workers[0].kill()
                wait_for(lambda: proxy.frames_dropped > 0, 'the trainer\'s report, thrown away on the way')
                proxy.drop_frames(None)
                proxy.cut(wait=0.2)
            spec = {"source": {"type": "range", "stop": n},
                    "ops": [{"op": "shuffle", "buffer_size": 10000, "seed": 3}, {"op": "batch", "batch_size": batch}]}
            argv = cluster.cat_argv(spec, ['--max-outstanding', '4', '--sharding', 'dynamic', '--timeout-ms', '60000'],
                                    dispatcher='127.0.0.1:%d' % proxy.port)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            got, batches = [], 0
            try:
                for line in proc.stdout:
                    got.extend(json.loads(line)['value'])
                    batches += 1
                    if batches == 20:
                        lose_worker_and_the_report()
                proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            err = proc.stderr.read()
            self.assertEqual(proc.returncode, 0, err[-3000:])
            assert_exactly_once(self, got, n, 'a DYNAMIC job whose trainer\'s report was lost')
            self.assertEqual(proxy.frames_dropped, 1)
        finally:
            proxy.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)


class BrokenCoordinatedConnections(unittest.TestCase):
    """Coordinated reads (a named job's consumers read in rounds) through
    connections broken with answers in flight: a consumer asks again for the
    rounds it did not get, the worker sends the batch it holds for it, and
    every consumer reads every round, its own batch of it. The consumers,
    their windows, the batch size and the cut points come from a seed,
    printed in every failure (SLUICE_CHAOS_SEED reruns one). The job has no
    end: the consumers read until each is past the last cut by 40 rounds,
    then they are stopped, so the cuts always find answers flowing."""

    def test_rounds_lost_with_a_connection_are_sent_again(self):
        self.cut_and_check(half_open=False)

    def test_rounds_asked_again_while_the_old_connection_waits_for_them_are_sent_again(self):
        # Only the consumer's end of each connection breaks: the worker
        # still has the old connection's requests waiting for their rounds
        # when the consumer asks for the same rounds on a new one. Before
        # each cut consumer 0 is stopped (SIGSTOP), and the others (windows
        # of 64 rounds, 32 a worker) run ahead until rounds wait for a place
        # among the 16 open on both workers; after it, consumer 0 goes on
        # once requests asked again wait beside the old ones on both. The
        # old request of a round is served first and takes the batch; the
        # new one gets it again from what the worker holds.
        self.cut_and_check(half_open=True)

    def cut_and_check(self, half_open):
        seed = chaos_seed()
        rng = random.Random(seed)
        consumers = rng.randrange(2, 9)
        batch = rng.choice([4, 100, 8192])  # 8192 int64s: 64 KiB, made in a region of shared memory and lent
        windows = [rng.randrange(1, 33) if i == 0 or not half_open else 64 for i in range(consumers)]
        ats = sorted(rng.sample(range(10, 150), rng.randrange(2, 5)))
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d consumers, windows %s, batch %d, %scuts at rounds %s' % (
            seed, seed, consumers, windows, batch, 'half-open ' if half_open else '', ats)
        real = free_ports(2)
        cluster = Cluster()
        proxies = [CutProxy(p) for p in real]
        cons = None
        try:
            for p, proxy in zip(real, proxies):
                cluster.add_worker(['--port', str(p), '--worker-address', '127.0.0.1:%d' % proxy.port])
            cluster.wait_workers_registered(2)
            spec = {"source": {"type": "range", "stop": 1 << 50}, "ops": [{"op": "repeat"},
                                                                           {"op": "batch", "batch_size": batch}]}
            cons = Consumers(cluster, spec, 'coord-cut', windows, ['--timeout-ms', '30000'])
            got, procs = cons.got, cons.procs

            def reading(upto):
                return cons.reading(upto, where)

            def connected():
                return all(len(p.pairs) >= consumers for p in proxies)

            def sent_again():
                return sum(metric(w.admin_port, 'sluice_worker_batches_sent_again_total', default=0)
                           for w in cluster.workers)

            def tasks():
                return [get_json(w.admin_port, '/v1/tasks')['tasks'][0] for w in cluster.workers]
            lost = []
            for at in ats:
                # sluice-cat's output comes in blocks: a consumer is ahead
                # of what was read here, and may still be connecting again
                # after the last cut. Cut once every consumer is connected
                # to both workers (each through its proxy) again.
                wait_for(lambda: reading(at) and connected(),
                         '%s: every consumer to read %d rounds, connected to both workers' % (where, at), timeout=120)
                if half_open:
                    procs[0].send_signal(signal.SIGSTOP)
                    wait_for(lambda: reading(0) and all(t['rounds']['waiting'] > 0 for t in tasks()),
                             '%s: rounds to wait for a place on both workers while consumer 0 is stopped' % where,
                             timeout=120)
                # Both workers' connections at once, while every consumer
                # reads on: answers are in flight on some of them.
                cutters = [threading.Thread(target=lambda p=p: lost.append(
                    p.cut(half_open=half_open, wait=0.2 if half_open else 5.0))) for p in proxies]
                for t in cutters:
                    t.start()
                for t in cutters:
                    t.join(30)
                if half_open:
                    wait_for(lambda: reading(0) and all(t['requests_waiting_again'] > 0 for t in tasks()),
                             '%s: requests asked again to wait beside the old ones' % where, timeout=120)
                    procs[0].send_signal(signal.SIGCONT)
            if not half_open:
                self.assertGreater(sum(lost), 0, '%s: the cuts threw nothing away' % where)
            # An answer thrown away is asked for again, and the worker holds
            # it: once sent again, every consumer reads on, 40 rounds more.
            wait_for(lambda: reading(0) and sent_again() > 0, '%s: a batch to be sent again (bytes thrown away '
                     'by each cut: %s)' % (where, lost), timeout=120)
            upto = max(len(g) for g in got) + 40
            wait_for(lambda: reading(upto), '%s: every consumer to read on to round %d' % (where, upto), timeout=120)
        finally:
            if cons:
                cons.stop()
            for p in proxies:
                p.close()
            bad = cluster.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        check_rounds(self, got, batch, where)


class CoordinatedWorkerLoss(unittest.TestCase):
    """Coordinated reads through lost workers: killed with -9, or stopped
    and declared lost after --worker-timeout-ms, with fresh workers joining
    meanwhile. A round the lost worker had not served to a consumer comes to
    that consumer from a worker that stands in, so every consumer reads every
    round, in order, and the job goes on (before 2026-12-02 every consumer
    failed at the first such round). The consumers, workers, windows, batch
    size (8192 int64s: lent in shared memory), the task buffer (1 MiB: the
    16 rounds open on a worker hold all of it while the consumer they wait
    for waits on a stand-in), the sharding and the faults come from a seed,
    printed in every failure (SLUICE_CHAOS_SEED reruns one). The job has no
    end: the consumers read until each is 50 rounds past the last round a
    lost worker was to serve, then they are stopped."""

    def test_every_consumer_reads_every_round_through_lost_workers(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        consumers = rng.randrange(2, 9)
        workers = rng.randrange(2, 5)
        batch = rng.choice([4, 100, 8192])
        buffer_mb = rng.choice([1, 64])
        windows = [rng.randrange(1, 33) for _ in range(consumers)]
        sharding = rng.choice(['off', 'dynamic'])
        faults = [(rng.choice(['kill', 'stop']), rng.random() < 0.5) for _ in range(rng.randrange(1, workers))]
        ats = sorted(rng.sample(range(20, 300), len(faults)))
        where = ('seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d consumers, %d workers, windows %s, batch %d, '
                 '--buffer-mb %d, sharding %s, faults (kind, fresh worker after) %s at rounds %s' % (
                     seed, seed, consumers, workers, windows, batch, buffer_mb, sharding, faults, ats))
        worker_args = ['--buffer-mb', str(buffer_mb)]
        cluster = Cluster(workers=workers, dispatcher_args=['--worker-timeout-ms', '1000'], worker_args=worker_args)
        cons, faulted, stopped, said = None, [], [], []
        try:
            cluster.wait_workers_registered(workers)
            spec = {"source": {"type": "range", "stop": 1 << 50}, "ops": [{"op": "repeat"},
                                                                           {"op": "batch", "batch_size": batch}]}
            cons = Consumers(cluster, spec, 'coord-loss', windows, ['--sharding', sharding, '--timeout-ms', '60000'])
            got = cons.got

            def reading(upto):
                return cons.reading(upto, where)
            live = list(cluster.workers)
            for (kind, fresh), at in zip(faults, ats):
                wait_for(lambda: reading(at), '%s: every consumer to read %d rounds' % (where, at), timeout=120)
                w = live.pop(rng.randrange(len(live)))
                faulted.append(w.addr)
                if kind == 'kill':
                    w.kill(signal.SIGKILL)
                else:
                    w.kill(signal.SIGSTOP)  # its connections stay open, and it answers nothing
                    stopped.append(w)
                if fresh:
                    live.append(cluster.add_worker(worker_args))
            jobs = get_json(cluster.dispatcher.admin_port, '/v1/jobs')['names']['coord-loss']
            job = jobs[0]['job_id']

            def lost_ends():
                tasks = get_json(cluster.dispatcher.admin_port, '/v1/jobs/%d' % job)['tasks']
                return [t['rounds'].get('end', 0) for t in tasks if t['worker_address'] in faulted]
            wait_for(lambda: reading(0) and len(lost_ends()) == len(faulted) and all(lost_ends()),
                     '%s: the dispatcher to declare every faulted worker lost' % where, timeout=60)
            upto = max(lost_ends() + ats) + 50
            wait_for(lambda: reading(upto), '%s: every consumer to read on to round %d' % (where, upto), timeout=180)
            stood_in = sum(metric(w.admin_port, 'sluice_worker_stand_in_batches_total', default=0) for w in live)
        finally:
            if cons:
                said = cons.stop()
            for w in stopped:
                w.kill(signal.SIGKILL)
            bad = cluster.close()
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly: %s' % (where, bad))
        self.assertGreater(stood_in, 0, '%s: no worker stood in for a lost one' % where)
        for addr in faulted:
            if any(x['_worker'] == addr for g in got for x in g):
                self.assertTrue(any('worker %s was lost; the rounds it was to serve' % addr in e for e in said),
                                '%s: no consumer said that others stand in for %s: %s' % (where, addr, said))
        served = set()
        for i, g in enumerate(got):
            self.assertEqual([x['_round'] for x in g], list(range(len(g))), '%s: consumer %d' % (where, i))
            for x in g:
                key = (x['_worker'], x['value'][0])
                self.assertNotIn(key, served, '%s: consumer %d, round %d: a batch of %s served twice' % (
                    where, i, x['_round'], x['_worker']))
                served.add(key)
        for r in range(min(len(g) for g in got)):
            # A round a lost worker served to some consumers only: the others
            # read it from a worker that stood in; never from two live ones.
            from_live = {g[r]['_worker'] for g in got} - set(faulted)
            self.assertLessEqual(len(from_live), 1, '%s: round %d from %s' % (where, r, from_live))

    def test_under_dynamic_every_record_comes_once_through_lost_workers(self):
        """The records a lost worker had read and not served (its split
        queue, its pipeline's buffers, the rounds it held) go out again,
        without those a consumer received, and so do a drained worker's once
        its rounds were served and its task let go: over a range of 2^50 (one epoch
        without end), every value below the point the dispatcher says every
        record before it reached a consumer (lost_splits.confirmed_below)
        is read exactly once by the consumers together, and no value twice.
        Before 2026-12-04 coordinated reads kept no outstanding splits and
        lost those records."""
        seed = chaos_seed()
        rng = random.Random(seed)
        consumers = rng.randrange(2, 9)
        workers = rng.randrange(2, 5)
        shuffle = rng.choice([0, 1000, 100000])
        batch = 1000 if shuffle == 100000 else rng.choice([16, 100, 1000])
        # A split is confirmed once all its records went out: at most 256
        # batches a split keeps the test's reading bounded.
        max_split = max(1024, min(65536, batch * 256) // 1024 * 1024)
        windows = [rng.randrange(1, 33) for _ in range(consumers)]
        faults = [(rng.choice(['kill', 'stop', 'drain']), rng.random() < 0.5)
                  for _ in range(rng.randrange(1, workers))]
        ats = sorted(rng.sample(range(20, 200), len(faults)))
        where = ('seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d consumers, %d workers, windows %s, batch %d, '
                 'shuffle %d, --max-split-size %d, faults (kind, fresh worker after) %s at rounds %s' % (
                     seed, seed, consumers, workers, windows, batch, shuffle, max_split, faults, ats))
        ops = ([{"op": "shuffle", "buffer_size": shuffle, "seed": seed}] if shuffle else []) + [
            {"op": "repeat"}, {"op": "batch", "batch_size": batch}]
        self.exactly_once_through(where, rng, ops, workers, windows, faults, ats, ['--max-split-size', str(max_split)])

    def test_a_long_shuffled_epoch_keeps_each_ledger_to_what_is_not_confirmed(self):
        """Behind a shuffle, a consumer gets scattered records of each split
        and the split's notice goes to one consumer only, so a ledger that
        kept what it received held about one run per record for as long as
        the epoch ran, and past --max-ledger-runs it stopped recording: a
        worker lost after that gave records twice. The dispatcher now tells
        coordinated consumers the place below which every record reached one
        of them (ClientHeartbeatResponse.confirmed_below), and their ledgers
        keep only what lies past it. Here each consumer receives 1,000,000
        or more records of one epoch (500,000 runs or more without that: it
        gets about every other record of a region) before a worker is lost,
        with --max-ledger-runs 400000. What lies past the place is bounded
        by counts, not by time: the shuffle's tail (a split's last record
        leaves a buffer of 1,000 some 7,000 records after its first), the
        rounds a worker holds open, and the splits a consumer confirms
        before it heartbeats (64 notices: --max-outstanding-splits 256 over
        4), each tens of thousands of records at the most. No consumer
        may say its ledger overflowed, and every record comes exactly once."""
        seed = chaos_seed()
        rng = random.Random(seed)
        consumers = rng.randrange(2, 4)
        workers = rng.randrange(2, 4)
        windows = [rng.randrange(1, 33) for _ in range(consumers)]
        faults = [(rng.choice(['kill', 'stop', 'drain']), rng.random() < 0.5)]
        ats = [rng.randrange(10000, 12000)]
        where = ('seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d consumers, %d workers, windows %s, faults (kind, '
                 'fresh worker after) %s at rounds %s' % (seed, seed, consumers, workers, windows, faults, ats))
        ops = [{"op": "shuffle", "buffer_size": 1000, "seed": seed}, {"op": "repeat"},
               {"op": "batch", "batch_size": 100}]
        said = self.exactly_once_through(where, rng, ops, workers, windows, faults, ats,
                                         ['--split-size', '1000', '--max-split-size', '1000',
                                          '--max-outstanding-splits', '256'], ['--max-ledger-runs', '400000'])
        for i, e in enumerate(said):
            self.assertNotIn('no longer fits its ledger', e, '%s: consumer %d' % (where, i))

    def test_a_stand_in_for_a_consumer_behind_gets_splits_past_the_bound(self):
        """A consumer that asks one round at a time falls behind; the live
        tasks then hold --max-outstanding-splits splits it has not
        confirmed, with its batches of them in their open rounds. A worker
        is lost: that consumer waits for a stand-in's batch of the lost
        worker's next round, and a task at the bound got no split to make
        it, while only that consumer's reading on could free the bound (the
        job stayed RUNNING, its consumers waiting, before 2026-12-04). A
        task whose pipeline waits for a split to make a batch outside its
        rounds now asks for it as such (GetSplitRequest.for_extra) and gets
        one at a time past the bound, up to 64 more a consumer; and a
        consumer whose requests of a task wait asks how far its splits are
        done (GetElementRequest.progress), as the one that asks ahead got
        its batches before their splits were done. Every record comes
        exactly once."""
        seed = chaos_seed()
        rng = random.Random(seed)
        consumers = rng.randrange(2, 4)
        workers = rng.randrange(2, 4)
        behind = rng.randrange(consumers)
        windows = [1 if i == behind else rng.randrange(8, 33) for i in range(consumers)]
        # Not much lower: splits of 1,000 behind a shuffle of 1,000 leave a
        # split's last record in the buffer for a dozen splits now and then,
        # the rounds hold a batch (a split) per consumer, and no split after
        # one not finished can be confirmed; with a bound of 24 a task could
        # not finish a split, and the job failed by name (OutstandingBound),
        # in 3 seeds of 15. Not higher: a live task must reach the bound while
        # the consumer is stopped (16 open rounds of a batch a consumer, and
        # a buffer of 16 batches).
        bound = rng.choice([40, 44])
        faults = [(rng.choice(['kill', 'stop']), rng.random() < 0.5)]
        ats = [rng.randrange(20, 100)]
        where = ('seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d consumers, %d workers, windows %s, consumer %d '
                 'behind, --max-outstanding-splits %d, faults (kind, fresh worker after) %s at rounds %s' % (
                     seed, seed, consumers, workers, windows, behind, bound, faults, ats))
        ops = [{"op": "shuffle", "buffer_size": 1000, "seed": seed}, {"op": "repeat"},
               {"op": "batch", "batch_size": 1000}]
        self.exactly_once_through(where, rng, ops, workers, windows, faults, ats,
                                  ['--split-size', '1000', '--max-split-size', '1000',
                                   '--max-outstanding-splits', str(bound)], behind=(behind, bound))

    def exactly_once_through(self, where, rng, ops, workers, windows, faults, ats, dispatcher_args, cat_args=(),
                             behind=None):
        """Coordinated consumers (one a window of windows) of a DYNAMIC job
        over ops on a range of 2^50, through faults (kind, whether a fresh
        worker joins after) at rounds ats, each on a worker drawn from rng;
        then every value below confirmed_below must have come once and none
        twice. behind: (consumer, bound): before each fault that consumer
        is stopped (SIGSTOP) until every live task holds bound outstanding
        splits, and goes on after it. Returns what the consumers said on
        stderr."""
        spec = {"source": {"type": "range", "stop": 1 << 50}, "ops": ops}
        cluster = Cluster(workers=workers, dispatcher_args=['--worker-timeout-ms', '1000'] + list(dispatcher_args))
        cons, stopped, view, said = None, [], None, []
        try:
            cluster.wait_workers_registered(workers)
            cons = Consumers(cluster, spec, 'coord-once', windows, ['--sharding', 'dynamic', '--timeout-ms', '60000'] +
                             list(cat_args))
            live = list(cluster.workers)
            faulted = []
            job = None

            def job_view():
                return get_json(cluster.dispatcher.admin_port, '/v1/jobs/%d' % job)
            for (kind, fresh), at in zip(faults, ats):
                wait_for(lambda: cons.reading(at, where), '%s: every consumer to read %d rounds' % (where, at),
                         timeout=120)
                job = get_json(cluster.dispatcher.admin_port, '/v1/jobs')['names']['coord-once'][0]['job_id']
                if behind:
                    cons.procs[behind[0]].send_signal(signal.SIGSTOP)
                    wait_for(lambda: all(t['outstanding_splits'] >= behind[1] for t in job_view()['tasks']
                                         if t['state'] == 'RUNNING'),
                             '%s: every live task to hold %d splits consumer %d did not confirm' % (
                                 where, behind[1], behind[0]), timeout=120)
                w = live.pop(rng.randrange(len(live)))
                faulted.append(w.addr)
                if kind == 'drain':
                    drain_worker(cluster, w.addr)
                else:
                    w.kill(signal.SIGKILL if kind == 'kill' else signal.SIGSTOP)
                if kind == 'stop':
                    stopped.append(w)
                if fresh:
                    live.append(cluster.add_worker())
                if behind:
                    cons.procs[behind[0]].send_signal(signal.SIGCONT)

            def all_gone():
                # A drained worker's task is done once every consumer is
                # past its rounds.
                v = job_view()
                return all(t['state'] in ('LOST', 'DONE') for t in v['tasks'] if t['worker_address'] in faulted)
            wait_for(lambda: cons.reading(0, where) and all_gone(),
                     '%s: every faulted worker\'s task to be lost or done' % where, timeout=60)
            # Every record the faulted workers held was handed out before this.
            handed = job_view()['splits']['records_handed_out']

            def confirmed_past_the_loss():
                nonlocal view
                cons.reading(0, where)
                view = job_view()
                lost = view['lost_splits']
                if view['state'] != 'RUNNING':
                    raise AssertionError('%s: the job is %s: %s' % (where, view['state'], view.get('error')))
                return (lost['awaiting_reports'] == 0 and lost['queued'] == 0 and
                        lost['confirmed_below'][2] > handed)
            try:
                wait_for(confirmed_past_the_loss, '%s: every record handed out before the loss (%d) to reach a '
                         'consumer' % (where, handed), timeout=300)
            except AssertionError as e:
                raise AssertionError('%s; the job then: %s; the consumers read %s rounds' % (
                    e, json.dumps({k: view.get(k) for k in ('state', 'lost_splits', 'splits', 'tasks', 'consumers')}),
                    [len(g) for g in cons.got]))
            # What reached a consumer came in a round up to the horizon then.
            horizon = view['coordinated']['round_horizon']
            try:
                wait_for(lambda: cons.reading(horizon + 1, where), '%s: every consumer to read round %d' % (
                    where, horizon), timeout=120)
            except AssertionError as e:
                raise AssertionError('%s; the job then: %s; the consumers read %s rounds' % (
                    e, json.dumps({k: job_view().get(k) for k in ('state', 'lost_splits', 'tasks', 'consumers')}),
                    [len(g) for g in cons.got]))
        finally:
            if cons:
                said = cons.stop()
            for w in stopped:
                w.kill(signal.SIGKILL)
            bad = cluster.close()
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly: %s' % (where, bad))
        self.assertEqual(view['lost_splits']['confirmed_below'][:2], [0, 0], where)
        below = view['lost_splits']['confirmed_below'][2]
        seen = collections.Counter(v for g in cons.got for x in g for v in x['value'])
        twice = [v for v, n in seen.items() if n > 1]
        self.assertEqual(twice[:10], [], '%s: %d values read more than once' % (where, len(twice)))
        missing = [v for v in range(below) if v not in seen]
        self.assertEqual(missing[:10], [], '%s: %d values below %d, which every consumer confirmed, never read '
                         '(report generation %d)' % (where, len(missing), below, view['lost_splits']['report_gen']))
        return said


def check_rounds(test, got, batch, where):
    """got[i]: what coordinated consumer i read (sluice-cat --with-worker,
    a range in batches of batch): rounds 0, 1, 2 ... in order; in each
    round that every consumer read, one worker's consecutive batches,
    consumer i the i-th; and each worker's rounds, in order, its batches
    from the first one on, none left out or given twice."""
    n = len(got)
    for i, g in enumerate(got):
        test.assertEqual([x['_round'] for x in g], list(range(len(g))), '%s: consumer %d' % (where, i))
    worker_next = collections.defaultdict(int)  # the first value of the worker's next round
    for r in range(min(len(g) for g in got)):
        row = [g[r] for g in got]
        test.assertEqual(len({x['_worker'] for x in row}), 1, '%s: round %d from several workers' % (where, r))
        first = worker_next[row[0]['_worker']]
        for i, x in enumerate(row):
            test.assertEqual(x['value'], list(range(first + i * batch, first + (i + 1) * batch)),
                             '%s: round %d, consumer %d (worker %s)' % (where, r, i, x['_worker']))
        worker_next[row[0]['_worker']] = first + n * batch


class Checkpoints(ThreeWorkers):
    """Iterator checkpoints (sl_iterator_checkpoint / sl_iterator_restore,
    sluice-cat --checkpoint-out / --resume-from): a consumer stops after a
    seeded number of batches mid-epoch and writes its checkpoint; a new
    process resumes from it, twice in a chain; across the three processes
    every element that passes the filter arrives exactly once."""

    def resume_chain(self, spec, expected, sharding):
        """Three sluice-cat processes over spec: the first two stop at seeded
        batch counts and write checkpoints, each next one resumes from the
        last; together they must give every expected value once."""
        seed = chaos_seed()
        rng = random.Random(seed)
        total = len(expected) // BATCH
        stops = sorted(rng.sample(range(total // 10, total * 7 // 10), 2))
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it), stops after batches %s' % (seed, seed, stops)
        ckpt = [os.path.join(self.cluster.dir, 'ckpt%d' % i) for i in range(2)]
        runs = [['--limit', str(stops[0]), '--checkpoint-out', ckpt[0]],
                ['--limit', str(stops[1] - stops[0]), '--resume-from', ckpt[0], '--checkpoint-out', ckpt[1]],
                ['--resume-from', ckpt[1]]]
        got = []
        for i, args in enumerate(runs):
            rc, batches, err = self.cluster.cat(spec, ['--sharding', sharding] + args)
            self.assertEqual(rc, 0, '%s: run %d: %s' % (where, i, err[-2000:]))
            got.extend(v for b in batches for v in b['value'])
        counts = collections.Counter(got)
        missing = [v for v in expected if counts[v] == 0]
        duplicated = sorted(v for v, n in counts.items() if n > 1)
        self.assertEqual((len(missing), len(duplicated), len(got)), (0, 0, len(expected)),
                         '%s: %d missing (first %s), %d duplicated (first %s)' %
                         (where, len(missing), missing[:10], len(duplicated), duplicated[:10]))

    def test_resume_mid_epoch_exactly_once_with_shuffle_and_filter(self):
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "filter", "key": "value", "cmp": "ne", "value": 7},
                        {"op": "shuffle", "buffer_size": 2000, "seed": 11},
                        {"op": "filter", "key": "value", "cmp": "lt", "value": N - 3},
                        {"op": "batch", "batch_size": BATCH}]}
        self.resume_chain(spec, [v for v in range(N) if v != 7 and v < N - 3], 'dynamic')

    def test_resume_under_data_sharding_exactly_once(self):
        """A static policy: the restored job's workers drop the checkpoint's
        positions before their shard, so the shards still split the rest."""
        self.assertEqual(self.cluster.close(), {})
        self.cluster = addressed_cluster(3)
        spec = {"source": {"type": "range", "stop": N},
                "ops": [{"op": "filter", "key": "value", "cmp": "ne", "value": 7},
                        {"op": "shuffle", "buffer_size": 2000, "seed": 11},
                        {"op": "batch", "batch_size": BATCH}]}
        self.resume_chain(spec, [v for v in range(N) if v != 7], 'data')

    def test_checkpoints_refuse_what_they_cannot_resume(self):
        spec = {"source": {"type": "range", "stop": 1000}, "ops": [{"op": "batch", "batch_size": 100}]}
        path = os.path.join(self.cluster.dir, 'ckpt')
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'off', '--limit', '2', '--checkpoint-out', path])
        self.assertNotEqual(rc, 0)
        self.assertIn('checkpoints need an iterator with a sharding policy', err)
        with open(path, 'wb') as f:
            f.write(b'not a checkpoint at all')
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--resume-from', path])
        self.assertNotEqual(rc, 0)
        self.assertIn('not a Sluice iterator checkpoint', err)
        # Another dataset's checkpoint.
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--limit', '2', '--checkpoint-out', path])
        self.assertEqual(rc, 0, err)
        other = {"source": {"type": "range", "stop": 999}, "ops": [{"op": "batch", "batch_size": 100}]}
        rc, _, err = self.cluster.cat(other, ['--sharding', 'dynamic', '--resume-from', path])
        self.assertNotEqual(rc, 0)
        self.assertIn('checkpoint of dataset', err)

    def test_a_version_1_checkpoint_still_resumes(self):
        # Checkpoints are written in version 3 (compact runs and an
        # integrity tag); one written by an earlier library (version 1:
        # posset bytes) must still resume, by a client without a token.
        # Made by hand: the dataset id of a real checkpoint, then positions
        # [0, 300) of epoch 0 of the range as one run.
        import struct
        spec = {"source": {"type": "range", "stop": 1000}, "ops": [{"op": "batch", "batch_size": 100}]}
        path = os.path.join(self.cluster.dir, 'ckpt')
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--limit', '1', '--checkpoint-out', path])
        self.assertEqual(rc, 0, err)
        with open(path, 'rb') as f:
            v3 = f.read()
        self.assertEqual(v3[:4], b'SLCK')
        self.assertEqual(struct.unpack_from('<I', v3, 4)[0], 4, 'checkpoints are written in version 4')
        dataset_id = struct.unpack_from('<Q', v3, 8)[0]
        positions = b'SLPS' + struct.pack('<IQ', 1, 1) + struct.pack('<IIQQ', 0, 0, 0, 300)
        with open(path, 'wb') as f:
            f.write(b'SLCK' + struct.pack('<IQ', 1, dataset_id) + positions)
        rc, batches, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--resume-from', path])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'value')), list(range(300, 1000)))
        # An unknown version is refused by name.
        with open(path, 'wb') as f:
            f.write(b'SLCK' + struct.pack('<IQ', 7, dataset_id) + positions)
        rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--resume-from', path])
        self.assertNotEqual(rc, 0)
        self.assertIn('checkpoint: version 7, this library reads versions 1 to 6', err)
        # Version 3 (no done epochs, a SHA-256 tag) still restores: here
        # one of no positions, which reads everything.
        import hashlib
        body = b'SLCK' + struct.pack('<IQIIQ', 3, dataset_id, 0, 0, 0)
        with open(path, 'wb') as f:
            f.write(body + hashlib.sha256(body).digest())
        rc, batches, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--resume-from', path])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'value')), list(range(1000)))
        # A checkpoint cut short, or with one bit flipped (attack
        # 16 of issue 15: a flip once gave 10,000 duplicates), is refused
        # by its checksum, not half read.
        for damaged, what in ((v3[:-1], 'cut short'), (v3[:20] + bytes([v3[20] ^ 4]) + v3[21:], 'a bit flipped'),
                              (v3[:-5] + bytes([v3[-5] ^ 1]) + v3[-4:], 'a bit of the checksum flipped')):
            with self.subTest(what):
                with open(path, 'wb') as f:
                    f.write(damaged)
                rc, _, err = self.cluster.cat(spec, ['--sharding', 'dynamic', '--resume-from', path])
                self.assertNotEqual(rc, 0)
                self.assertIn('checkpoint: it is damaged: its SHA-256 checksum does not match its bytes', err)


class StoreFillsWhileServing(unittest.TestCase):
    """The state store's file system fills up while the dispatcher serves: a
    commit fails, its answers are never sent (the client sees its connection
    close), the dispatcher keeps serving what was committed, and once space
    is back the same request succeeds and survives a restart."""

    def setUp(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix='sluice-full-')
        self.work = os.path.join(self.dir, 'work')
        os.makedirs(self.work)
        r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=20m', 'tmpfs', self.work], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, 'this test runs as root and mounts a small tmpfs: %s' % r.stderr)
        self.cluster = None

    def tearDown(self):
        import shutil
        bad = self.cluster.close() if self.cluster else {}
        subprocess.run(['umount', self.work], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.assertEqual(bad, {})

    def spec(self, i):
        # About 2 KB each: the store needs new pages every few datasets.
        return {"source": {"type": "range", "stop": 10 + i},
                "ops": [{"op": "filter", "key": "value", "cmp": "in", "value": list(range(i, i + 256))}]}

    def test_a_failed_commit_answers_nothing_and_loses_nothing_committed(self):
        self.cluster = Cluster(workers=1)
        self.cluster.dispatcher.stop()
        argv = list(self.cluster.dispatcher.argv)
        argv[argv.index('--work-dir') + 1] = self.work
        self.cluster.dispatcher = self.cluster._start(argv, 'dispatcher-tmpfs')
        admin = self.cluster.dispatcher.admin_port
        committed = []
        for i in range(3):  # committed before the file system fills
            rc, _, err = self.cluster.cat(self.spec(i), ['--sharding', 'off', '--format', 'count', '--limit', '0'])
            self.assertEqual(rc, 0, err)
            committed.append(i)
        filler = os.path.join(self.work, 'filler')
        with open(filler, 'wb') as f:
            try:
                while True:
                    f.write(b'\0' * (1 << 16))
                    f.flush()
            except OSError:
                pass
        failed_at, failed_err = None, ''
        for i in range(3, 200):
            rc, _, err = self.cluster.cat(self.spec(i), ['--sharding', 'off', '--format', 'count', '--limit', '0'],
                                          timeout=60)
            if rc != 0:
                failed_at, failed_err = i, err
                break
            committed.append(i)
        self.assertIsNotNone(failed_at, 'the store never filled')
        # The request whose commit failed got no answer: its connection
        # closed. Each sluice-cat registers its dataset, then creates a job;
        # which of the two meets the full store first depends on what the
        # heartbeats committed meanwhile, so either may. A registration that
        # was answered is committed.
        self.assertRegex(failed_err, r"(dataset .* refused|cannot open an iterator): .* closed the connection")
        if 'cannot open an iterator' in failed_err:
            committed.append(failed_at)
        self.assertTrue(self.cluster.dispatcher.alive())
        self.assertIn('the changes since the last commit are dropped and the state is reloaded',
                      self.cluster.dispatcher.stderr())
        listed = get_json(admin, '/v1/datasets')['datasets']
        self.assertEqual(len(listed), len(committed), 'only what was answered is there')
        os.unlink(filler)
        rc, _, err = self.cluster.cat(self.spec(failed_at), ['--sharding', 'off', '--format', 'count',
                                                              '--limit', '0'])
        self.assertEqual(rc, 0, err)
        self.cluster.restart_dispatcher()
        after = get_json(self.cluster.dispatcher.admin_port, '/v1/datasets')['datasets']
        self.assertEqual(len(after), len(set(committed) | {failed_at}))


class StuckWorker(unittest.TestCase):
    """A worker whose pipeline hangs (a plugin sleeping 3 s on value 5, once
    per process) while its heartbeats keep coming is declared lost once
    --stall-timeout-ms passes, and registers again as a new worker, which
    joins the running job."""

    def test_a_stuck_worker_is_lost_and_comes_back(self):
        import shutil
        import tempfile
        import harness
        plugdir = tempfile.mkdtemp(prefix='sluice-plug-')
        shutil.copy(os.path.join(harness.BUILD, 'tests', 'plugins', 'libsltest.so'), plugdir)
        c = Cluster(workers=2, dispatcher_args=['--stall-timeout-ms', '1000'],
                    worker_args=['--plugin-dir', plugdir])
        try:
            c.wait_workers_registered(2)
            spec = {"source": {"type": "range", "stop": 20},
                    "ops": [{"op": "map", "plugin": "libsltest.so", "function": "sleep_once_on_5",
                             "output": {"double": "int64"}},
                            {"op": "batch", "batch_size": 1}]}
            rc, batches, err = c.cat(spec, ['--sharding', 'off'], timeout=120)
            self.assertEqual(rc, 0, err)
            workers = get_json(c.dispatcher.admin_port, '/v1/workers')['workers']
            lost = [w for w in workers if w['state'] == 'LOST']
            self.assertEqual(len(lost), 2, workers)  # both ran the whole range (sharding off)
            for w in lost:
                self.assertIn('stuck: task', w['lost_reason'])
                self.assertIn('--stall-timeout-ms 1000', w['lost_reason'])
            # Each came back under a new id and read the whole range for the job.
            self.assertEqual(len([w for w in workers if w['state'] == 'LIVE']), 2, workers)
            counts = collections.Counter(v for b in batches for v in b['value'])
            self.assertEqual(sorted(counts), list(range(20)))
            self.assertTrue(all(counts[v] >= 2 for v in range(20)), counts)
        finally:
            bad = c.close()
            shutil.rmtree(plugdir, ignore_errors=True)
        self.assertEqual(bad, {})


if __name__ == '__main__':
    unittest.main()
