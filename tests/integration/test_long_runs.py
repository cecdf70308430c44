"""Exactly once over a long run: 300 epochs (a repeat) over 400 small text
files under DYNAMIC sharding, read by a chain of sluice-cat processes that
each stop after a seeded few hundred batches and write a checkpoint the next
one resumes from; once the chain goes back to an earlier checkpoint drawn at
random (what came after it is read again), and now and then a worker is
killed with -9 and started again. Every position (epoch, file, record)
arrives exactly once, and every record once per epoch; every checkpoint
stays small (its size and its runs, asserted as bounds: the ledger holds at
most --max-ledger-runs runs, far below the 120,000 (epoch, file) runs of
the whole run, or the checkpoint would fail). Set SLUICE_CHAOS_SEED to
replay one draw."""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import tempfile
import unittest

from harness import (Cluster, cats_end, cats_values, cats_with_faults, child_env, get_json, stop_until_batches_are_lost,
                     wait_for)

EPOCHS = 300
FILES = 400
RECORDS = 2          # per file: 800 elements an epoch, 240,000 in all
BATCH = 32
# The open epochs' runs the ledger may hold. A client learns which epochs
# are done from heartbeat answers (every 250 ms), and a process of the chain
# reads up to 28 epochs in its life, how fast depending on the machine: the
# epochs read since the last answer stay open meanwhile, and a killed
# worker's splits hold every later epoch open until they are read again.
# 50 epochs' worth (one run an element) leaves room for that on any
# machine, and is a third of the 120,000 runs of the whole run: a ledger
# that kept every epoch would pass it by epoch 100 and fail the checkpoint.
LEDGER_RUNS = 40000
# A checkpoint holds the done epochs as one number and the open epochs' runs,
# about 3 bytes each: at most LEDGER_RUNS of them, where the whole run's
# 120,000 runs would take some 360 KB. It asks the dispatcher first, so it
# holds the epochs open then, not those read since the last heartbeat: 1 to
# 5 KB were seen, up to 19 KB in a process that lost a worker (45 to 234 KB
# before the ask, when the processes of the chain outran the heartbeat).
CKPT_BYTES = 3 * LEDGER_RUNS + 1024


# Clients that heartbeat every 300 s, and a lease long enough for that: the
# only heartbeat answers are those the client asks for before its tick.
SLOW_HEARTBEATS = ['--client-timeout-ms', '600000', '--client-heartbeat-ms', '300000']


def chaos_seed():
    env = os.environ.get('SLUICE_CHAOS_SEED')
    return int(env) if env else random.randrange(1 << 32)


class TextFilesCase(unittest.TestCase):
    """A cluster of WORKERS workers over FILES text files of RECORDS lines,
    line r of file f holding f * RECORDS + r."""

    FILES, RECORDS, WORKERS, DISPATCHER_ARGS, WORKER_ARGS = FILES, RECORDS, 2, [], []

    def setUp(self):
        self.data = tempfile.mkdtemp(prefix='sluice-longrun-')
        self.files = []
        for f in range(self.FILES):
            path = os.path.join(self.data, 'part-%03d.txt' % f)
            with open(path, 'w') as out:
                out.writelines('%d\n' % (f * self.RECORDS + r) for r in range(self.RECORDS))
            self.files.append(path)
        self.cluster = Cluster(workers=self.WORKERS, dispatcher_args=['--data-root', self.data] + self.DISPATCHER_ARGS,
                               worker_args=['--data-root', self.data] + self.WORKER_ARGS)
        self.cluster.wait_workers_registered(self.WORKERS)

    def tearDown(self):
        bad = self.cluster.close()
        shutil.rmtree(self.data, ignore_errors=True)
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)

    def shuffled_epochs(self, seed, epochs):
        """The files' lines behind a shuffle of 64, repeated `epochs` times,
        in batches of BATCH."""
        return {"source": {"type": "text_lines", "files": self.files},
                "ops": [{"op": "shuffle", "buffer_size": 64, "seed": seed},
                        {"op": "repeat", "count": epochs},
                        {"op": "batch", "batch_size": BATCH}]}

    def read_then_checkpoint(self, spec, args, epochs):
        """sluice-cat reading `epochs` epochs of spec's batches (of BATCH),
        then writing a checkpoint: (returncode, batches, stderr, its path)."""
        ckpt = os.path.join(self.cluster.dir, 'ckpt')
        limit = epochs * self.FILES * self.RECORDS // BATCH
        rc, batches, err = self.cluster.cat(spec, args + ['--limit', str(limit), '--checkpoint-out', ckpt])
        return rc, batches, err, ckpt

    def assert_every_record(self, values, times, where):
        """Every record of the files is among values (one element a
        record, its line's number) exactly `times` times."""
        counts = [0] * (self.FILES * self.RECORDS)
        for v in values:
            counts[v] += 1
        wrong = [(v, c) for v, c in enumerate(counts) if c != times]
        self.assertEqual(wrong, [], '%s: records not read %d times (first %s)' % (where, times, wrong[:5]))


def lines(batches):
    """The numbers on the lines of sluice-cat's batches, in order."""
    return [int(v) for b in batches for v in b['line']]


class LongRun(TextFilesCase):

    def spec(self):
        return self.shuffled_epochs(5, EPOCHS)

    def kill(self, victim, rng):
        # Gate on state: the victim has a task that made batches, so it
        # holds splits the consumer has not confirmed.
        w = self.cluster.workers[victim]
        wait_for(lambda: any(t['state'] == 'RUNNING' and t['batches_produced'] > 0
                             for t in get_json(w.admin_port, '/v1/tasks')['tasks']),
                 'worker %d (%s) to make batches before it is killed' % (victim, w.addr), timeout=120)
        self.cluster.restart_worker(victim, down=rng.uniform(0.0, 0.5))

    def run_one(self, args, limit, kill_at, rng, where):
        """One sluice-cat of the chain: reads up to `limit` batches (all when
        None), killing a worker after batch kill_at (when not None); returns
        the batches' provenance runs and values."""
        argv = self.cluster.cat_argv(self.spec(), ['--sharding', 'dynamic', '--with-provenance',
                                                   '--max-ledger-runs', str(LEDGER_RUNS),
                                                   '--max-outstanding', '4'] + args +
                                     (['--limit', str(limit)] if limit else []))
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        runs, values, batches = [], [], 0
        try:
            for line in proc.stdout:
                b = json.loads(line)
                if 'line' not in b:
                    continue  # the last notices
                runs.extend(b['_provenance'])
                values.extend(int(v) for v in b['line'])
                batches += 1
                if kill_at is not None and batches == kill_at:
                    self.kill(rng.randrange(2), rng)
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = proc.stderr.read()
        self.assertEqual(proc.returncode, 0, '%s: sluice-cat failed: %s' % (where, err[-3000:]))
        return runs, values

    def check_checkpoint(self, path, where):
        with open(path, 'rb') as f:
            ckpt = f.read()
        self.assertEqual(ckpt[:4], b'SLCK', where)
        self.assertEqual(struct.unpack_from('<I', ckpt, 4)[0], 4, where)
        self.assertLessEqual(len(ckpt), CKPT_BYTES, '%s: a checkpoint of %d bytes' % (where, len(ckpt)))
        return struct.unpack_from('<Q', ckpt, 24)[0], len(ckpt)

    def test_300_epochs_over_400_files_exactly_once_with_checkpoints_a_restore_and_worker_kills(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        where = 'seed %d (SLUICE_CHAOS_SEED=%d reruns it)' % (seed, seed)
        total = EPOCHS * FILES * RECORDS // BATCH
        # Stops every few hundred batches; the chain goes back once, from
        # somewhere in its second half, to a checkpoint drawn at random.
        stops, at = [], 0
        while True:
            at += rng.randrange(300, 700)
            if at >= total - 100:
                break
            stops.append(at)
        back_after = rng.randrange(len(stops) // 2, len(stops))
        back_to = rng.randrange(0, back_after)
        kills = set(rng.sample(range(len(stops)), max(1, len(stops) // 4)))
        where += ': stops after batches %s, back from checkpoint %d to %d, kills in runs %s' % (
            stops, back_after, back_to, sorted(kills))
        # kept[i]: what the chain has taken for good after checkpoint i
        # was written (the runs and values read before it).
        kept_runs, kept_values = [], []
        marks = []  # (len(kept_runs), len(kept_values)) at each checkpoint
        sizes, dones, reads = [], [], []
        resume = None
        went_back = False
        i = 0
        while True:
            args = ['--resume-from', resume] if resume else []
            last = i >= len(stops)
            ckpt = os.path.join(self.cluster.dir, 'ckpt%d' % i)
            limit = None if last else (stops[i] - (stops[i - 1] if i > 0 else 0))
            if not last:
                args += ['--checkpoint-out', ckpt]
            kill_at = rng.randrange(1, limit) if (i in kills and not last) else None
            runs, values = self.run_one(args, limit, kill_at, rng, '%s: run %d' % (where, i))
            kept_runs.extend(runs)
            kept_values.extend(values)
            if last:
                break
            done, size = self.check_checkpoint(ckpt, '%s: checkpoint %d' % (where, i))
            # Done epochs follow the stream (how closely depends on the
            # machine's speed against the heartbeat interval: the bound on
            # the ledger above is what is asserted); never ahead of it.
            read = len(kept_values) // (FILES * RECORDS)
            self.assertLessEqual(done, read, '%s: checkpoint %d: done epochs %d after %d epochs read' %
                                 (where, i, done, read))
            sizes.append(size)
            dones.append(done)
            reads.append(read)
            marks.append((len(kept_runs), len(kept_values)))
            resume = ckpt
            if i == back_after and not went_back:
                # Restore from an earlier checkpoint: what was read after it
                # is read again, so it is dropped from what the chain kept.
                went_back = True
                del kept_runs[marks[back_to][0]:]
                del kept_values[marks[back_to][1]:]
                del marks[back_to + 1:]
                resume = os.path.join(self.cluster.dir, 'ckpt%d' % back_to)
                stops = stops[:back_to + 1] + [s - stops[back_after] + stops[back_to]
                                                for s in stops[back_after + 1:]]
                i = back_to + 1
                continue
            i += 1
        # Every position once: each (epoch, file) run expanded.
        seen = bytearray(EPOCHS * FILES * RECORDS)
        dup = []
        for e, f, b, n in kept_runs:
            for r in range(b, b + n):
                k = (e * FILES + f) * RECORDS + r
                if seen[k]:
                    dup.append((e, f, r))
                seen[k] = 1
        missing = seen.count(0)
        self.assertEqual((missing, len(dup)), (0, 0), '%s: %d positions missing, %d twice (first %s)' %
                         (where, missing, len(dup), dup[:5]))
        # Every record once per epoch: 300 times in all, and the values
        # match the positions (one element a record).
        self.assert_every_record(kept_values, EPOCHS, where)
        # The done epochs did follow: the last checkpoint's are past half of
        # the epochs read when it was written (each process hears several
        # answers). Not half of the run: going back far leaves the last
        # checkpoint early in it (back from 11 to 2 of 15 puts it at 40%).
        self.assertGreater(dones[-1], reads[-1] // 2, '%s: done epochs %s of epochs read %s' % (where, dones, reads))
        print('long run %s: %d checkpoints of at most %d bytes, done epochs up to %d' %
              (where, len(sizes), max(sizes), max(dones)))


class CheckpointFolds(TextFilesCase):
    """A checkpoint asks the dispatcher which epochs are done before it is
    written, so it holds the epochs still open, not every epoch read since
    the last heartbeat. The clients here heartbeat every 300 s: the only
    answer before the checkpoint's own is the one at connect, before any
    batch (a checkpoint without its own round trip holds all 30 epochs).
    One worker, so that no worker left behind holds an epoch open."""

    FILES, RECORDS, WORKERS, EPOCHS, READ = 100, 4, 1, 60, 30
    DISPATCHER_ARGS = SLOW_HEARTBEATS

    def test_a_checkpoint_holds_the_open_epochs_however_fast_they_were_read(self):
        spec = self.shuffled_epochs(3, self.EPOCHS)
        per_epoch = self.FILES * self.RECORDS
        args = ['--sharding', 'dynamic', '--max-outstanding', '4']
        rc, first, err, ckpt = self.read_then_checkpoint(spec, args, self.READ)
        self.assertEqual(rc, 0, err)
        with open(ckpt, 'rb') as f:
            raw = f.read()
        done, positions = struct.unpack_from('<QQ', raw, 24)
        # Epoch 29's last records may wait in the shuffle buffer or in
        # batches the caller did not take: epoch 28 and all before it were
        # given whole, and the dispatcher knows it.
        self.assertGreaterEqual(done, self.READ - 1, 'a checkpoint after %d epochs says %d done (%d positions, '
                                '%d bytes)' % (self.READ, done, positions, len(raw)))
        self.assertLessEqual(positions, 2 * per_epoch)
        # The dispatcher says as much: the released client's last heartbeat,
        # the checkpoint's own, is the last word on what reached it. Its
        # anonymous job ended as it left, and says where it ended.
        job = get_json(self.cluster.dispatcher.admin_port, '/v1/jobs')['jobs'][0]
        self.assertEqual((job['state'], job['error']), ('CANCELLED', 'its client released it before its end'), job)
        self.assertGreaterEqual(job['splits']['epochs_done'], done, job)
        self.assertLessEqual(job['splits']['epochs_done'], self.READ, job)
        # The rest, resumed from it: every record once per epoch in all.
        rc, rest, err = self.cluster.cat(spec, args + ['--resume-from', ckpt])
        self.assertEqual(rc, 0, err)
        self.assert_every_record(lines(first + rest), self.EPOCHS, 'resumed from a checkpoint after %d epochs' %
                                 self.READ)


class LedgerBound(TextFilesCase):
    """A client that reads many epochs of many files between two heartbeats
    (every 300 s here) with a ledger of 400 runs, four epochs of 100 files:
    once it holds half of that it asks the dispatcher which epochs are done
    and folds them, and past three quarters it waits for the answer (this
    reader outruns a round trip), so it never overflows and its checkpoint
    resumes exactly once. Without the ask it filled after four epochs, took
    no checkpoint, and said so."""

    FILES, RECORDS, WORKERS, EPOCHS, READ = 100, 4, 1, 40, 30
    DISPATCHER_ARGS = SLOW_HEARTBEATS

    def test_a_crowded_ledger_asks_which_epochs_are_done(self):
        spec = self.shuffled_epochs(4, self.EPOCHS)
        # A window of 4 batches (10 of an epoch's 100 files): a fold waits
        # until the caller took the batches that waited when it was said,
        # and the ledger grows by theirs meanwhile.
        args = ['--sharding', 'dynamic', '--max-ledger-runs', '400', '--max-outstanding', '4']
        rc, first, err, ckpt = self.read_then_checkpoint(spec, args, self.READ)
        self.assertEqual(rc, 0, 'the first read: ' + err)
        self.assertNotIn('no longer fits', err, 'the first read')
        rc, rest, err = self.cluster.cat(spec, args + ['--resume-from', ckpt])
        self.assertEqual(rc, 0, 'the resumed read: ' + err)
        self.assertNotIn('no longer fits', err, 'the resumed read')
        self.assert_every_record(lines(first + rest), self.EPOCHS, 'resumed from a checkpoint after %d epochs' %
                                 self.READ)


class ManySmallFiles(TextFilesCase):
    """A reader of many one-record files, one split each, with clients that
    heartbeat every 300 s and a dispatcher that holds a task back past 2,048
    splits no client confirmed: the client confirms them before its tick
    (every 1,024 split-done notices), so the job runs through. Without that
    the task would wait out the 300 s."""

    FILES, RECORDS, WORKERS, EPOCHS = 200, 1, 1, 50
    DISPATCHER_ARGS = SLOW_HEARTBEATS + ['--max-outstanding-splits', '2048']

    def test_a_fast_reader_confirms_its_splits_before_the_heartbeat_tick(self):
        spec = {"source": {"type": "text_lines", "files": self.files},
                "ops": [{"op": "repeat", "count": self.EPOCHS}, {"op": "batch", "batch_size": 50}]}
        rc, batches, err = self.cluster.cat(spec, ['--sharding', 'dynamic'], timeout=120)
        self.assertEqual(rc, 0, err)
        self.assert_every_record(lines(batches), self.EPOCHS, '%d one-record files' % self.FILES)


class ManySmallFilesLowBound(ManySmallFiles):
    """The same with --max-outstanding-splits 256, below the client's own
    1,024 notices: the dispatcher's heartbeat answers tell the client to
    confirm every quarter of the bound (64 splits), so the task held back
    at the bound is let go again within a round trip. Without that it
    waited out the 300 s tick at every 256 splits."""

    FILES, EPOCHS = 100, 20
    DISPATCHER_ARGS = SLOW_HEARTBEATS + ['--max-outstanding-splits', '256']


class ClientsOfOneJob(TextFilesCase):
    """Many clients of one named DYNAMIC job of one-record files."""

    FILES, RECORDS, WORKERS, EPOCHS = 100, 1, 2, 20
    CLIENTS = 16

    def read_once_an_epoch(self, meanwhile=None):
        """CLIENTS sluice-cat of one named DYNAMIC job, all joined before
        a worker runs it: every record once an epoch across them.
        meanwhile(procs) runs once they all read."""
        spec = {"source": {"type": "text_lines", "files": self.files},
                "ops": [{"op": "repeat", "count": self.EPOCHS}, {"op": "batch", "batch_size": 5}]}
        argv = self.cluster.cat_argv(spec, ['--sharding', 'dynamic', '--job-name', 'many'])
        outs = [tempfile.TemporaryFile(mode='w+') for _ in range(2 * self.CLIENTS)]
        port = self.cluster.dispatcher.admin_port
        for w in self.cluster.workers:
            w.kill(signal.SIGSTOP)
        try:
            procs = [subprocess.Popen(argv, stdout=outs[2 * i], stderr=outs[2 * i + 1], env=child_env())
                     for i in range(self.CLIENTS)]
            wait_for(lambda: [j['num_consumers'] for j in get_json(port, '/v1/jobs')['jobs']] == [self.CLIENTS],
                     'all %d clients joined' % self.CLIENTS)
        finally:
            for w in self.cluster.workers:
                w.kill(signal.SIGCONT)
        got = []
        try:
            if meanwhile:
                meanwhile(procs)
            got = cats_values(procs, outs, 'line')
        finally:
            cats_end(procs, outs)
        self.assert_every_record(got, self.EPOCHS, '%d clients, a bound of %d' % (self.CLIENTS, self.BOUND))


class ManyClientsLowBound(ClientsOfOneJob):
    """Sixteen clients of one named DYNAMIC job of one-record files, a
    task held at --max-outstanding-splits 32: between two holds a task
    makes about 7 batches of 5, fewer than its clients, so at each hold
    some client got no batch of it since its last (or none at all): its
    done_below is behind the task's oldest split, and only a batch of the
    task, which a held task does not make, moves it on. The dispatcher
    lists the task to such a client with probe_below, and the client asks
    the worker how far the task's splits are done
    (GetElementRequest.progress). Without that the job stopped for good at
    its first hold (--client-stall-ms 0: no client is let go for
    stalling). The workers are stopped (SIGSTOP) until every client joined,
    so that none comes after the job ended; every record then arrives once
    an epoch across the clients."""

    BOUND = 32
    DISPATCHER_ARGS = ['--max-outstanding-splits', str(BOUND), '--client-stall-ms', '0',
                       '--worker-timeout-ms', '600000']

    def test_clients_behind_a_held_task_ask_its_worker_how_far_its_splits_are_done(self):
        self.read_once_an_epoch()


class ClientsOfAWorkerThatCannotSay(ClientsOfOneJob):
    """ManyClientsLowBound where a worker cannot say what reached the
    clients: every client is stopped (SIGSTOP) at a moment the workers hold
    batches sent to them and not acknowledged, until a worker lets those go
    after its --hold-timeout-ms of 1 s; from then on its task says nothing
    of the splits those batches hold records of (GetSplitRequest.
    received_below stays below them; lost_below in its task view), and
    what it says past them counts once every client said it has them
    (received_past_lost; before 2026-12-05 it said nothing for good, and
    each of the task's holds waited for the clients' word). A client behind
    the lost splits, or behind the last splits of a done task (whose worker
    asks for no more), asks the worker how far its splits are done when the
    dispatcher lists the task with probe_below: without the asking the job
    stops. Every record once an epoch."""

    CLIENTS, BOUND, EPOCHS = 8, 32, 15
    DISPATCHER_ARGS = ManyClientsLowBound.DISPATCHER_ARGS
    WORKER_ARGS = ['--hold-timeout-ms', '1000']

    def test_clients_behind_a_held_task_its_worker_cannot_speak_for_ask_it(self):
        self.read_once_an_epoch(meanwhile=lambda procs: stop_until_batches_are_lost(procs, self.cluster.workers))


class ManyClientsSlowHeartbeats(ClientsOfOneJob):
    """Six clients that heartbeat every 300 s, a bound of 64: a client
    that got none of a held task's batches since its last hears that it is
    behind (probe_below) only at its tick, and the task waited that long at
    each hold. Its worker says in its next split request that every batch
    of its splits reached its client (each acknowledged:
    GetSplitRequest.received_below), asking at once when the last one
    is acknowledged, and the dispatcher confirms those splits without the
    clients' word: the job runs through."""

    CLIENTS, BOUND = 6, 64
    DISPATCHER_ARGS = SLOW_HEARTBEATS + ['--max-outstanding-splits', str(BOUND), '--client-stall-ms', '0',
                                         '--worker-timeout-ms', '600000']

    def test_a_held_task_goes_on_once_its_worker_saw_its_batches_received(self):
        self.read_once_an_epoch()


class WindowsFullOfHeldRequests(ClientsOfOneJob):
    """22 clients with 300 s heartbeats on three workers, a bound of 16:
    a client's window fills with requests waiting at held tasks, and the
    batch a task served after the client's last request to it, whose
    acknowledgement its worker waits for to say more reached the clients,
    went unacknowledged until the client's tick (ack_alone() then): the
    job stopped at its first hold for 300 s. Acknowledged on their own
    50 ms after they came now, and at once when the worker marks them
    (GetElementResponse.ack_at_once: the task is at the bound)."""

    CLIENTS, WORKERS, BOUND = 22, 3, 16
    DISPATCHER_ARGS = SLOW_HEARTBEATS + ['--max-outstanding-splits', str(BOUND), '--client-stall-ms', '0',
                                         '--worker-timeout-ms', '600000']

    def test_answers_after_a_clients_last_request_are_acknowledged_without_its_tick(self):
        self.read_once_an_epoch()


class ClientsAgainstTheBound(unittest.TestCase):
    """A seeded draw of what ManyClientsLowBound fixes: 8 to 24 clients of
    one named DYNAMIC job of one-record files, 1 to 3 workers, a bound of 8
    to 64 outstanding splits a task, batches of 1 to 8, and up to two
    workers killed with -9 and started again mid-run. The clients are
    stopped (SIGSTOP) around each kill: the job cannot end before it, and
    the killed worker's splits not yet confirmed are in the clients' hands
    or its buffers. 100 to 1,000 files, 20,000 records or more. Every
    record arrives once an epoch across the clients. The seed is printed
    in every failure (SLUICE_CHAOS_SEED reruns one)."""

    def test_drawn_clients_bounds_and_worker_kills_read_every_record_once_an_epoch(self):
        seed = chaos_seed()
        rng = random.Random(seed)
        workers, bound, batch = rng.randint(1, 3), rng.choice([8, 16, 32, 64]), rng.randint(1, 8)
        clients, files = rng.randint(8, 24), rng.randint(100, 1000)
        # 20,000 records or more: a hold lasts a round trip once its worker
        # says what reached the clients and they acknowledge its batches at
        # once (a client heartbeat, 250 ms, before the worker's word: 2,000
        # took up to 18 s then; 5,000 up to 25 s while answers no request
        # acknowledged waited for the client's tick).
        epochs = max(2, 20000 // files)
        total = files * epochs
        ats = sorted(rng.sample(range(total // batch // 10, total // batch * 7 // 10), rng.randint(0, 2)))
        kills = [(at, rng.randrange(workers), rng.uniform(0.0, 1.0)) for at in ats]
        where = ('seed %d (SLUICE_CHAOS_SEED=%d reruns it): %d clients, %d workers, bound %d, batch %d, '
                 '%d files x %d epochs, (batch, worker, down) kills %s' % (
                     seed, seed, clients, workers, bound, batch, files, epochs, kills))
        print('ClientsAgainstTheBound: %s' % where)
        data = tempfile.mkdtemp(prefix='sluice-bound-')
        paths = []
        for f in range(files):
            paths.append(os.path.join(data, 'part-%03d.txt' % f))
            with open(paths[-1], 'w') as out:
                out.write('%d\n' % f)
        cluster = Cluster(workers=workers, worker_args=['--data-root', data],
                          dispatcher_args=['--data-root', data, '--max-outstanding-splits', str(bound),
                                           '--client-stall-ms', '0', '--worker-timeout-ms', '600000'])
        try:
            cluster.wait_workers_registered(workers)
            spec = {"source": {"type": "text_lines", "files": paths},
                    "ops": [{"op": "repeat", "count": epochs}, {"op": "batch", "batch_size": batch}]}
            got = self.read_with_kills(cluster, spec, clients, kills, where)
        finally:
            bad = cluster.close()
            shutil.rmtree(data, ignore_errors=True)
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly: %s' % (where, bad))
        counts = [0] * files
        for v in got:
            counts[v] += 1
        wrong = [(v, c) for v, c in enumerate(counts) if c != epochs]
        self.assertEqual(wrong, [], '%s: records not read %d times (first %s)' % (where, epochs, wrong[:5]))

    def read_with_kills(self, cluster, spec, clients, kills, where):
        """Runs `clients` sluice-cat of one named job, all joined before a
        worker runs it (workers stopped until then); once the clients read
        `at` batches between them, stops them, kills the worker drawn and
        starts it again after `down` s, and lets them go on. Returns every
        line's number read."""
        argv = cluster.cat_argv(spec, ['--sharding', 'dynamic', '--job-name', 'bound'])
        port = cluster.dispatcher.admin_port

        def joined(procs):
            try:
                wait_for(lambda: [j['num_consumers'] for j in get_json(port, '/v1/jobs')['jobs']] == [clients],
                         '%s: all clients joined' % where)
            finally:
                for w in cluster.workers:
                    w.kill(signal.SIGCONT)

        def kill(procs, victim, down):
            for p in procs:
                p.send_signal(signal.SIGSTOP)
            try:
                cluster.restart_worker(victim, down=down)
            finally:
                for p in procs:
                    p.send_signal(signal.SIGCONT)
        for w in cluster.workers:
            w.kill(signal.SIGSTOP)
        try:
            got, ends = cats_with_faults(argv, clients, 'line',
                                         [(at, lambda procs, v=victim, d=down: kill(procs, v, d))
                                          for at, victim, down in kills], where, started=joined)
        finally:
            for w in cluster.workers:
                w.kill(signal.SIGCONT)
        for rc, err in ends:
            self.assertEqual(rc, 0, '%s: a client failed: %s' % (where, err[-3000:]))
        return [int(v) for v in got]

if __name__ == '__main__':
    unittest.main()
