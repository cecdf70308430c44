"""Every sharding policy, coordinated reads, target workers and the job
lifecycle, end to end (issue 4): a dispatcher and 3 workers on loopback
read the tfrecord fixtures through sluice-cat, and each test checks the
exact multiset of ids it received and, with --with-worker, which worker
made each batch."""
import collections
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

from consumers import Consumers
from harness import (Cluster, binary, child_env, drain_worker, free_ports, get_json, metric, parse_jsonl, values,
                     wait_for)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, '..', 'data', 'tfrecord')
IDS = list(range(1000))  # basic-*-of-00004: ids 0..999, 250 per file in order


def basic_spec(data, files='basic-*-of-00004.tfrecord', batch=10, ops_before=(), ops_after=()):
    return {"source": {"type": "tfrecord", "files": os.path.join(data, files)},
            "ops": list(ops_before) + [{"op": "parse_example", "features": {"id": {"dtype": "int64"}}}] +
            list(ops_after) + [{"op": "batch", "batch_size": batch}]}


def ids_by_worker(batches):
    by = collections.defaultdict(list)
    for b in batches:
        by[b['_worker']].extend(b['id'])
    return by


def finish(p, timeout=300):
    """The rest of a process's stdout and its stderr, after a readline():
    communicate() would lose what the text wrapper already buffered."""
    out = p.stdout.read()
    err = p.stderr.read()
    p.wait(timeout)
    return out, err


class Static(unittest.TestCase):
    """FILE, DATA, FILE_OR_DATA and HINT over 3 workers of --worker-addresses."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-shard-')
        cls.data = os.path.join(cls.tmp, 'tfrecord')
        shutil.copytree(FIXTURES, cls.data)
        ports = free_ports(3)
        cls.addrs = ['127.0.0.1:%d' % p for p in ports]
        roots = ['--data-root', cls.data]
        cls.c = Cluster(dispatcher_args=roots + ['--worker-addresses', ','.join(cls.addrs)])
        for p, a in zip(ports, cls.addrs):
            cls.c.add_worker(roots + ['--port', str(p), '--worker-address', a])
        cls.c.wait_workers_registered(3)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert not bad, bad

    def cat(self, spec, *args):
        rc, batches, err = self.c.cat(spec, list(args) + ['--with-worker'])
        self.assertEqual(rc, 0, err)
        return batches

    def test_file_reads_each_file_on_the_worker_its_index_names(self):
        batches = self.cat(basic_spec(self.data), '--sharding', 'file')
        self.assertEqual(sorted(values(batches, 'id')), IDS)
        by = ids_by_worker(batches)
        # Worker i reads files i, i + 3, ...: file f holds ids [250 f, 250 f + 250).
        for i, a in enumerate(self.addrs):
            want = [x for f in range(4) if f % 3 == i for x in range(250 * f, 250 * f + 250)]
            self.assertEqual(sorted(by[a]), want, a)

    def test_data_reads_element_k_on_worker_k_mod_n_before_any_shuffle(self):
        spec = basic_spec(self.data, ops_after=[{"op": "shuffle", "buffer_size": 64, "seed": 3}])
        batches = self.cat(spec, '--sharding', 'data')
        self.assertEqual(sorted(values(batches, 'id')), IDS)
        by = ids_by_worker(batches)
        for i, a in enumerate(self.addrs):
            self.assertEqual(sorted(by[a]), [k for k in IDS if k % 3 == i], a)

    def test_file_or_data_picks_file_with_enough_files(self):
        batches = self.cat(basic_spec(self.data), '--sharding', 'file_or_data')
        by = ids_by_worker(batches)
        self.assertEqual(sorted(values(batches, 'id')), IDS)
        self.assertEqual(sorted(by[self.addrs[0]]), list(range(0, 250)) + list(range(750, 1000)))

    def test_file_or_data_picks_data_with_fewer_files_than_workers(self):
        spec = basic_spec(self.data, files='basic-0000[01]-of-00004.tfrecord')
        batches = self.cat(spec, '--sharding', 'file_or_data')
        self.assertEqual(sorted(values(batches, 'id')), list(range(500)))
        by = ids_by_worker(batches)
        for i, a in enumerate(self.addrs):
            self.assertEqual(sorted(by[a]), [k for k in range(500) if k % 3 == i], a)

    def test_hint_binds_the_shard_op_to_the_worker(self):
        spec = basic_spec(self.data, ops_after=[{"op": "shard", "num_shards": "hint", "index": "hint"}])
        batches = self.cat(spec, '--sharding', 'hint')
        self.assertEqual(sorted(values(batches, 'id')), IDS)
        by = ids_by_worker(batches)
        for i, a in enumerate(self.addrs):
            self.assertEqual(sorted(by[a]), [k for k in IDS if k % 3 == i], a)

    def test_file_with_fewer_files_than_workers_is_refused(self):
        spec = basic_spec(self.data, files='basic-0000[01]-of-00004.tfrecord')
        rc, _, err = self.c.cat(spec, ['--sharding', 'file'])
        self.assertNotEqual(rc, 0)
        self.assertIn('file sharding needs at least as many files as workers', err)
        self.assertIn('has 2 files, --worker-addresses lists 3 workers', err)

    def test_file_over_a_range_is_refused(self):
        rc, _, err = self.c.cat({"source": {"type": "range", "stop": 10}, "ops": []}, ['--sharding', 'file'])
        self.assertNotEqual(rc, 0)
        self.assertIn('file sharding needs a file source', err)

    def test_hint_without_a_hint_shard_is_refused(self):
        rc, _, err = self.c.cat(basic_spec(self.data), ['--sharding', 'hint'])
        self.assertNotEqual(rc, 0)
        self.assertIn('hint sharding binds a shard op', err)

    def test_a_hint_shard_under_another_policy_is_refused(self):
        spec = basic_spec(self.data, ops_after=[{"op": "shard", "num_shards": "hint", "index": "hint"}])
        rc, _, err = self.c.cat(spec, ['--sharding', 'data'])
        self.assertNotEqual(rc, 0)
        self.assertIn('which only HINT sharding binds', err)

    def test_a_worker_not_in_the_list_is_refused(self):
        w = self.c.add_worker(['--data-root', self.data])
        try:
            deadline = time.time() + 20
            while time.time() < deadline and 'not in the dispatcher' not in w.stderr():
                time.sleep(0.05)
            self.assertIn("is not in the dispatcher's --worker-addresses", w.stderr())
        finally:
            w.stop()
            self.c.daemons.remove(w)
            self.c.workers.remove(w)

    def test_off_reads_each_element_once_per_worker(self):
        batches = self.cat(basic_spec(self.data), '--sharding', 'off')
        self.assertEqual(collections.Counter(values(batches, 'id')), collections.Counter(IDS * 3))
        for a, ids in ids_by_worker(batches).items():
            self.assertEqual(sorted(ids), IDS, a)


class StaticNeedsAddresses(unittest.TestCase):
    def test_static_policy_without_worker_addresses_is_refused(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            rc, _, err = c.cat({"source": {"type": "range", "stop": 10}, "ops": []}, ['--sharding', 'data'])
            self.assertNotEqual(rc, 0)
            self.assertIn("data sharding needs the dispatcher's --worker-addresses", err)
        finally:
            self.assertEqual(c.close(), {})


    def test_worker_addresses_given_twice_or_with_empty_entries_are_usage_errors(self):
        tmp = tempfile.mkdtemp(prefix='sluice-wa-')
        try:
            for arg, want in (('127.0.0.1:1,127.0.0.1:1', '127.0.0.1:1 is listed twice'),
                              ('127.0.0.1:1,,127.0.0.1:2', 'without spaces or empty entries')):
                r = subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                                    os.path.join(tmp, 'w'), '--worker-addresses', arg], capture_output=True,
                                   text=True, timeout=30, env=child_env())
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(want, r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Dynamic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='sluice-dyn-')
        cls.data = os.path.join(cls.tmp, 'tfrecord')
        shutil.copytree(FIXTURES, cls.data)
        cls.roots = ['--data-root', cls.data]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cluster(self, workers=3, split_size=None):
        extra = ['--split-size', str(split_size)] if split_size else []
        c = Cluster(workers=workers, dispatcher_args=self.roots + extra, worker_args=self.roots)
        c.wait_workers_registered(workers)
        return c

    def test_dynamic_every_id_once_and_uneven_files_spread_over_workers(self):
        c = self.cluster(split_size=50)
        try:
            # 4 files of 250 ids over 3 workers, in splits of 50.
            rc, batches, err = c.cat(basic_spec(self.data), ['--sharding', 'dynamic', '--with-worker'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(values(batches, 'id')), IDS)
            # Every worker takes part. Not within one epoch of 20 splits:
            # two workers can take them all before the third asks (their
            # buffers hold more), the faster the machine the likelier. So
            # an unbounded job, read until each worker has served a batch
            # (within 60 s).
            spec = basic_spec(self.data, ops_after=[{"op": "repeat"}])
            p = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--with-worker']), stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, env=child_env())
            seen, stop = set(), threading.Timer(60, p.kill)  # a stalled job ends the read too
            stop.start()
            try:
                while len(seen) < 3:
                    line = p.stdout.readline()
                    if not line:
                        break
                    seen.add(parse_jsonl(line)[0]['_worker'])
            finally:
                stop.cancel()
                p.kill()
                p.communicate()
            self.assertEqual(len(seen), 3, 'workers that served: %s' % sorted(seen))
        finally:
            self.assertEqual(c.close(), {})

    def test_dynamic_repeat_3_is_three_epochs_each_exactly_once(self):
        c = self.cluster(split_size=50)
        try:
            spec = basic_spec(self.data, ops_after=[{"op": "repeat", "count": 3}])
            rc, batches, err = c.cat(spec, ['--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(collections.Counter(values(batches, 'id')), collections.Counter(IDS * 3))
        finally:
            self.assertEqual(c.close(), {})

    def test_a_worker_added_mid_epoch_takes_splits(self):
        # 200 epochs of 4 splits of 250 ids. While this test reads nothing,
        # sluice-cat's pipe and the two workers' buffers (16 batches each)
        # fill up and the workers stop taking splits, well before the 800
        # splits are out (a queue asks for up to 512 splits this short, but
        # an answer holds at most half a task's share of what is left); the
        # third worker then joins, starts its task (asking for splits at
        # once) and takes part.
        c = self.cluster(workers=2, split_size=250)
        try:
            spec = basic_spec(self.data, batch=250, ops_after=[{"op": "repeat", "count": 200}])
            p = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--with-worker', '--max-outstanding',
                                                   '1']), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=child_env())
            first = p.stdout.readline()
            w = c.add_worker(self.roots)
            c.wait_workers_registered(3)
            deadline = time.time() + 30
            running = False
            while time.time() < deadline and not running:
                jobs = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']
                job = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % jobs[0]['id'])
                running = any(t['worker_address'] == w.addr and t['state'] in ('RUNNING', 'DONE')
                              for t in job['tasks'])
                time.sleep(0.05)
            self.assertTrue(running)
            out, err = finish(p)
            self.assertEqual(p.returncode, 0, err)
            batches = parse_jsonl(first + out)
            self.assertEqual(collections.Counter(values(batches, 'id')), collections.Counter(IDS * 200))
            self.assertIn(w.addr, ids_by_worker(batches))
        finally:
            self.assertEqual(c.close(), {})


class SplitRates(unittest.TestCase):
    """A DYNAMIC task asks for splits of its measured rate times
    --split-target-ms; before it has a rate, for splits of the least size. A
    worker that ran a dataset before starts a new task of it at the rate it
    measured then, so that a second job (an evaluation pass each epoch) asks
    for long splits from its first request instead of waiting for a second
    hand-out a few batches in. A dataset it never ran starts at the least
    size. The first split of each job (the one that begins at record 0) says
    which: with a target of 1000 s, any rate of a range beyond 66 records a
    second asks for the most a split may be here, 65536."""

    def cluster(self, dispatcher_args=()):
        c = Cluster(workers=1, dispatcher_args=['--split-size', '1024', '--max-split-size', '65536'] +
                    list(dispatcher_args), worker_args=['--split-target-ms', '1000000'])
        c.wait_workers_registered(1)
        return c

    def first_split(self, c, stop):
        spec = {"source": {"type": "range", "stop": stop}, "ops": [{"op": "batch", "batch_size": 1024}]}
        rc, batches, err = c.cat(spec, ['--sharding', 'dynamic', '--with-provenance'])
        self.assertEqual(rc, 0, err[-2000:])
        self.assertEqual(sorted(values([b for b in batches if 'value' in b], 'value')), list(range(stop)))
        done = [d for b in batches for d in b.get('_splits_done', [])]
        self.assertEqual(sum(d['end'] - d['begin'] for d in done), stop, done)
        return next(d['end'] - d['begin'] for d in done if d['begin'] == 0)

    def test_a_new_task_starts_at_the_rate_of_a_running_task_of_the_dataset(self):
        c = self.cluster()
        first = None
        try:
            # A job of the dataset that stays running: its client reads a
            # batch and then nobody reads its output.
            spec = {"source": {"type": "range", "stop": 200000}, "ops": [{"op": "batch", "batch_size": 1024}]}
            first = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'dynamic', '--max-outstanding', '1'], fmt='raw'),
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env())
            first.stdout.read(8 * 1024)
            task = wait_for(lambda: [t for t in get_json(c.workers[0].admin_port, '/v1/tasks')['tasks']
                                     if t['split_records_per_second'] > 0], 'the running task to measure its rate')
            self.assertEqual(len(task), 1, task)
            self.assertEqual(self.first_split(c, 200000), 65536, 'a second job starts at the running task\'s rate')
            self.assertEqual(self.first_split(c, 300000), 1024, 'another dataset does not start at that rate')
        finally:
            if first:
                first.kill()
                first.wait()
            self.assertEqual(c.close(), {})

    def test_a_new_task_starts_at_the_rate_its_worker_remembers_of_a_removed_task(self):
        # Finished jobs are collected at once, and their tasks removed.
        c = self.cluster(['--job-gc-timeout-ms', '300'])

        def removed():
            wait_for(lambda: not get_json(c.workers[0].admin_port, '/v1/tasks')['tasks'], 'tasks to be removed')
        try:
            self.assertEqual(self.first_split(c, 200000), 1024, 'the first task of a dataset has no rate yet')
            removed()
            self.assertEqual(self.first_split(c, 200000), 65536, 'the next starts at the rate its worker measured')
            removed()
            self.assertEqual(self.first_split(c, 300000), 1024, 'another dataset does not start at that rate')
            removed()
            self.assertEqual(self.first_split(c, 200000), 65536, 'the first dataset\'s rate is still known')
        finally:
            self.assertEqual(c.close(), {})

    def test_a_new_dispatcher_gives_its_dataset_ids_no_rate_measured_under_the_old_one(self):
        # Dataset ids are the dispatcher's: one started on an empty work dir
        # gives the first id again, to another dataset.
        c = self.cluster(['--job-gc-timeout-ms', '300'])

        def dataset_ids():
            return [d['id'] for d in get_json(c.dispatcher.admin_port, '/v1/datasets')['datasets']]
        try:
            self.assertEqual(self.first_split(c, 200000), 1024)
            wait_for(lambda: not get_json(c.workers[0].admin_port, '/v1/tasks')['tasks'], 'tasks to be removed')
            old_ids = dataset_ids()
            c.restart_dispatcher(work_dir=os.path.join(c.dir, 'work-new'))
            c.wait_workers_registered(1)
            self.assertEqual(self.first_split(c, 300000), 1024, 'a rate measured under the old dispatcher')
            self.assertEqual(dataset_ids(), old_ids, 'the new dispatcher gave the other dataset the same id')
        finally:
            self.assertEqual(c.close(), {})


class ManyEpochs(unittest.TestCase):
    """A small dataset repeated many times under DYNAMIC (400 epochs of 2,000
    records: a validation set, or CIFAR-size data for hundreds of epochs).
    Once a task's epoch has no split left, the dispatcher hands it splits of
    the next ones (docs/sharding.md, Epochs ahead), so that its pipeline does
    not wait for a hand-out at each epoch's start: each of the two workers
    used to ask at least once an epoch, 800 requests, and DYNAMIC read such a
    job at an eightieth of OFF's rate. Every record of every epoch still
    comes exactly once."""
    EPOCHS = 400
    RECORDS = 2000

    def test_every_epoch_exactly_once_in_fewer_split_requests_than_epochs(self):
        c = Cluster(workers=2, dispatcher_args=['--split-size', '1000'])
        try:
            c.wait_workers_registered(2)
            spec = {"source": {"type": "range", "stop": self.RECORDS},
                    "ops": [{"op": "repeat", "count": self.EPOCHS}, {"op": "batch", "batch_size": 100}]}
            rc, batches, err = c.cat(spec, ['--sharding', 'dynamic', '--with-provenance'])
            self.assertEqual(rc, 0, err[-2000:])
            runs = collections.defaultdict(list)
            for b in batches:
                for epoch, _file, begin, count in b.get('_provenance', []):
                    runs[epoch].append((begin, count))
            self.assertEqual(sorted(runs), list(range(self.EPOCHS)))
            for epoch, rs in runs.items():
                at = 0
                for begin, count in sorted(rs):
                    self.assertEqual(begin, at, 'epoch %d: records from %d, not %d' % (epoch, begin, at))
                    at = begin + count
                self.assertEqual(at, self.RECORDS, 'epoch %d ends at record %d' % (epoch, at))
            self.assertEqual(collections.Counter(values([b for b in batches if 'value' in b], 'value')),
                             collections.Counter(list(range(self.RECORDS)) * self.EPOCHS))
            # 800 splits, at least 4 an answer to a worker asking with half of
            # its queue left (8, more for splits this short), and a few empty
            # answers at the end: 28-33 requests here.
            requests = metric(c.dispatcher.admin_port, 'sluice_dispatcher_requests_total', 'type="GET_SPLIT"')
            self.assertLess(requests, self.EPOCHS, 'split requests for %d epochs' % self.EPOCHS)
        finally:
            self.assertEqual(c.close(), {})


class Coordinated(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=3)
        cls.c.wait_workers_registered(3)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        assert not bad, bad

    SPEC = {"source": {"type": "range", "stop": 1000}, "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": 4}]}

    def consumers(self, name, n=2, limit=30, spec=None):
        procs = [subprocess.Popen(self.c.cat_argv(spec or self.SPEC, ['--job-name', name, '--num-consumers', str(n),
                                                                      '--consumer-index', str(i), '--limit',
                                                                      str(limit), '--with-worker']),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
                 for i in range(n)]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
            outs.append(parse_jsonl(out))
        return outs

    def test_each_round_comes_from_one_worker_and_consumers_get_distinct_batches(self):
        a, b = self.consumers('coord-rounds')
        self.assertEqual(len(a), 30)
        self.assertEqual(len(b), 30)
        workers = set()
        for x, y in zip(a, b):
            self.assertEqual(x['_round'], y['_round'])
            self.assertEqual(x['_worker'], y['_worker'], 'round %d' % x['_round'])
            self.assertNotEqual(x['value'], y['value'])
            workers.add(x['_worker'])
        self.assertEqual([x['_round'] for x in a], list(range(30)))
        self.assertEqual(len(workers), 3)
        # Round r's two batches are consecutive batches of that worker's stream.
        for x, y in zip(a, b):
            self.assertEqual(x['value'][-1] + 1, y['value'][0])

    def test_the_job_names_the_consumer_furthest_behind(self):
        # Two consumers of an endless job read; consumer 1 is stopped
        # (SIGSTOP) and consumer 0 reads on until the open rounds' bound on
        # the workers holds it: its reported round passes consumer 1's, and
        # the job view and sluicectl name consumer 1.
        procs = [subprocess.Popen(self.c.cat_argv(self.SPEC, ['--job-name', 'coord-behind', '--num-consumers', '2',
                                                              '--consumer-index', str(i)]),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
                 for i in range(2)]
        admin = self.c.dispatcher.admin_port
        try:
            for p in procs:
                p.stdout.readline()
            procs[1].send_signal(signal.SIGSTOP)
            threading.Thread(target=procs[0].stdout.read, daemon=True).start()  # consumer 0 reads on
            job_id = get_json(admin, '/v1/jobs')['names']['coord-behind'][0]['job_id']

            def consumers():
                return {c['consumer_index']: c for c in get_json(admin, '/v1/jobs/%d' % job_id)['consumers']}
            wait_for(lambda: len(consumers()) == 2 and consumers()[0]['round'] > consumers()[1]['round'] + 16,
                     'consumer 0 to report rounds past those of the stopped consumer 1')
            cs = consumers()
            out = subprocess.run([binary('sluicectl'), '--admin', '127.0.0.1:%d' % admin, 'job', str(job_id)],
                                 capture_output=True, text=True, env=child_env(), timeout=30)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn('client %d, consumer 1, next round %d, ' % (cs[1]['client_id'], cs[1]['round']), out.stdout)
            self.assertIn('furthest behind: consumer 1 (client %d), next round %d' % (cs[1]['client_id'],
                                                                                      cs[1]['round']), out.stdout)
        finally:
            for p in procs:
                p.kill()
                p.wait()

    def test_the_worker_says_which_consumers_the_lowest_open_round_waits_for(self):
        # Consumer 1 of 3 reads six rounds (two from each worker) and
        # leaves; consumers 0 and 2 never come. Each worker's lowest open
        # round is then its first, made, and waits for consumers 0 and 2.
        p = subprocess.run(self.c.cat_argv(self.SPEC, ['--job-name', 'coord-admin', '--num-consumers', '3',
                                                       '--consumer-index', '1', '--limit', '6']),
                           capture_output=True, text=True, env=child_env(), timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        job = get_json(self.c.dispatcher.admin_port, '/v1/jobs')['names']['coord-admin'][0]['job_id']
        firsts = []
        for w in self.c.workers:
            tasks = [t for t in get_json(w.admin_port, '/v1/tasks')['tasks'] if t['job_id'] == job]
            self.assertEqual(len(tasks), 1, w.addr)
            rounds = tasks[0]['rounds']
            self.assertEqual(rounds['consumers'], 3)
            self.assertEqual(rounds['waiting'], 0)
            self.assertGreaterEqual(rounds['open'], 2, 'two rounds of six on each of 3 workers')
            low = rounds['lowest_open']
            self.assertEqual((low['batches_made'], low['consumers_missing'], low['missing']), (3, 2, [0, 2]),
                             json.dumps(rounds))
            firsts.append(low['round'])
        self.assertEqual(sorted(firsts), [0, 1, 2])
        # A task without coordinated reads has no rounds (a job that does
        # not end, so that its tasks stay until it is collected).
        rc, _, err = self.c.cat(self.SPEC, ['--job-name', 'coord-none', '--limit', '3'])
        self.assertEqual(rc, 0, err)
        job = get_json(self.c.dispatcher.admin_port, '/v1/jobs')['names']['coord-none'][0]['job_id']
        tasks = [t for t in get_json(self.c.workers[0].admin_port, '/v1/tasks')['tasks'] if t['job_id'] == job]
        self.assertTrue(tasks and all('rounds' not in t for t in tasks))

    def test_coordinated_reads_need_a_named_job(self):
        rc, _, err = self.c.cat(self.SPEC, ['--num-consumers', '2', '--consumer-index', '0'])
        self.assertNotEqual(rc, 0)
        self.assertIn('coordinated reads (num_consumers 2) need a named job', err)

    def test_coordinated_reads_need_an_infinite_dataset(self):
        spec = {"source": {"type": "range", "stop": 10}, "ops": []}
        rc, _, err = self.c.cat(spec, ['--job-name', 'coord-finite', '--num-consumers', '2', '--consumer-index', '0'])
        self.assertNotEqual(rc, 0)
        self.assertIn('coordinated reads need an infinite dataset', err)

    def test_a_coordinated_task_whose_data_ends_fails_its_consumers(self):
        # Endless by its shape, but every iteration of the repeat yields
        # nothing, so the repeat ends: the consumer says so and fails (at
        # the round whose end came first), where it used to end after 0
        # rounds with status 0.
        spec = {"source": {"type": "range", "stop": 10},
                "ops": [{"op": "skip", "count": 100}, {"op": "repeat"}, {"op": "batch", "batch_size": 4}]}
        rc, out, err = self.c.cat(spec, ['--job-name', 'coord-empty', '--num-consumers', '1', '--consumer-index', '0'])
        self.assertNotEqual(rc, 0, err)
        self.assertEqual(out, [])
        self.assertRegex(err, r'worker \S+ ended task \d+ at round \d+, but coordinated reads have no end')
        # Under DYNAMIC the repeat goes on through empty iterations (other
        # workers may have taken their splits), which took epoch after epoch
        # without end. Its splits are read whole and yield nothing: a
        # consumer that waits asks how far they are done
        # (GetElementRequest.progress) and confirms them, so the task is not
        # held at --max-outstanding-splits, and past SL_REPEAT_EMPTY_MAX
        # empty iterations in a row the task fails, naming the cause. Should
        # a confirmation come late the bound fails the job first, naming the
        # same cause; either way the consumer fails with it.
        rc, out, err = self.c.cat(spec, ['--job-name', 'coord-empty-dyn', '--num-consumers', '1', '--consumer-index',
                                         '0', '--sharding', 'dynamic'], timeout=120)
        self.assertNotEqual(rc, 0, err)
        self.assertEqual(out, [])
        self.assertRegex(err, r'ops\[1\] \(repeat\): 1048576 iterations in a row took splits and yielded nothing: '
                              r'the ops before it drop every element|holds 16384 splits it has not finished, as many '
                              r'as --max-outstanding-splits 16384 allows, .* it drops every element it reads .*the '
                              r'task has served no batch')

    def test_a_worker_that_joins_enters_at_a_round_both_consumers_agree_on(self):
        # Batches of 500 values make lines of about 3 KB: while this test
        # reads nothing, each sluice-cat blocks on its full pipe after a few
        # dozen rounds, far from the 400 it will read. The third worker then
        # joins and its task enters at a round past every consumer's.
        spec = {"source": {"type": "range", "stop": 1000000},
                "ops": [{"op": "repeat"}, {"op": "batch", "batch_size": 500}]}
        c = Cluster(workers=2)
        try:
            c.wait_workers_registered(2)
            argv = lambda i: c.cat_argv(spec, ['--job-name', 'coord-join', '--num-consumers', '2',
                                               '--consumer-index', str(i), '--limit', '400',
                                               '--with-worker', '--max-outstanding', '2'])
            procs = [subprocess.Popen(argv(i), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=child_env()) for i in range(2)]
            first = [p.stdout.readline() for p in procs]
            w = c.add_worker()
            c.wait_workers_registered(3)
            deadline = time.time() + 30
            entered = None
            while time.time() < deadline and entered is None:
                jobs = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']
                job = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % jobs[0]['id'])
                if any(t['worker_address'] == w.addr for t in job['tasks']):
                    entered = job['coordinated']['round_horizon']
                time.sleep(0.05)
            self.assertIsNotNone(entered)
            self.assertLess(entered, 390)
            # Both read at once: a consumer waits for the other at each
            # worker's 16 open rounds.
            import concurrent.futures
            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                results = list(ex.map(finish, procs))
            outs = []
            for p, f, (out, err) in zip(procs, first, results):
                self.assertEqual(p.returncode, 0, err)
                outs.append(parse_jsonl(f + out))
            a, b = outs
            self.assertEqual(len(a), 400)
            self.assertEqual(len(b), 400)
            for x, y in zip(a, b):
                self.assertEqual(x['_round'], y['_round'])
                self.assertEqual(x['_worker'], y['_worker'], 'round %d' % x['_round'])
            # The new worker serves from one round on, the same for both.
            joined = [x['_round'] for x in a if x['_worker'] == w.addr]
            self.assertTrue(joined)
            self.assertGreater(joined[0], 0)
        finally:
            self.assertEqual(c.close(), {})

    def test_a_silent_workers_rounds_come_from_the_other_worker(self):
        # A stopped worker keeps its connections open and answers nothing;
        # the dispatcher declares it lost after --worker-timeout-ms, and the
        # consumers read its rounds from the other worker.
        self.lost_worker_is_stood_in_for(signal.SIGSTOP)

    def test_a_lost_workers_rounds_come_from_the_other_worker(self):
        self.lost_worker_is_stood_in_for(signal.SIGKILL)

    def lost_worker_is_stood_in_for(self, sig):
        # Before 2026-12-02 every consumer failed: "round 41 of the
        # coordinated reads was to come from worker ..., which was lost".
        c = Cluster(workers=2, dispatcher_args=['--worker-timeout-ms', '1000'])
        cons = None
        try:
            c.wait_workers_registered(2)
            cons = Consumers(c, self.SPEC, 'coord-lost', [None, None], ['--timeout-ms', '60000'])
            got, reading = cons.got, cons.reading
            lost = c.workers[1].addr
            # Both consumers read rounds of both workers before one goes.
            wait_for(lambda: reading(0) and all(any(x['_worker'] == lost for x in g) for g in got),
                     'both consumers to read rounds of worker 1')
            c.workers[1].kill(sig)
            # The job has no end: read until both are 100 rounds past the
            # last round the lost worker was to serve.
            job = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'][0]['id']

            def end_round():
                tasks = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['tasks']
                return [t['rounds'].get('end') for t in tasks if t['worker_address'] == lost][0]
            wait_for(lambda: reading(0) and end_round() is not None, 'the dispatcher to declare worker 1 lost')
            upto = end_round() + 100
            wait_for(lambda: reading(upto), 'both consumers to read to round %d' % upto, timeout=120)
            stood_in = metric(c.workers[0].admin_port, 'sluice_worker_stand_in_batches_total', default=0)
        finally:
            said = cons.stop() if cons else []
            if sig == signal.SIGSTOP:
                c.workers[1].kill(signal.SIGKILL)
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        for i, e in enumerate(said):
            self.assertIn('worker %s was lost; the rounds it was to serve and had not served to consumer %d come '
                          'from the other workers' % (lost, i), e)
        for i, g in enumerate(got):
            self.assertEqual([x['_round'] for x in g], list(range(len(g))), 'consumer %d' % i)
        a, b = got
        for x, y in zip(a, b):
            # A round the lost worker served to one consumer only: the other
            # read it from the worker that stood in.
            workers = {x['_worker'], y['_worker']}
            self.assertTrue(len(workers) == 1 or lost in workers, 'round %d from %s' % (x['_round'], workers))
        last_lost = max(x['_round'] for g in got for x in g if x['_worker'] == lost)
        self.assertTrue(all(x['_worker'] == c.workers[0].addr for g in got for x in g[last_lost + 1:]))
        self.assertGreater(stood_in, 0, 'no batch was served for a round of the lost worker')


class CoordinatedStandIn(unittest.TestCase):
    def test_a_stand_in_is_served_while_the_open_rounds_hold_the_whole_buffer(self):
        # Consumer 0 (one round at a time) is stopped; consumer 1 reads on
        # until the rounds open on both workers hold all of their buffers
        # (1 MiB: 16 batches of 64 KiB) for consumer 0. Worker 1 is killed
        # with rounds it served to consumer 1 only, which consumer 0 then
        # asks of worker 0: a stand-in, which needs a batch for which the
        # full buffer has no room. The pipeline makes it past the buffer
        # (without that, consumer 0 waited for ever, and consumer 1 for it).
        self.stand_in_when_full(8192, ['--buffer-mb', '1'])

    def test_a_stand_in_is_served_while_the_open_rounds_hold_the_whole_memory_budget(self):
        # The same with a buffer larger than the worker's memory budget
        # (16 MiB: 16 batches of 1 MiB), which the rounds open for consumer
        # 0 then fill: the stand-in's batch is made past the budget, by one
        # batch (before 2026-12-02 it waited for room that only consumer 0
        # could give back).
        self.stand_in_when_full(131072, ['--buffer-mb', '64', '--max-memory-mb', '16'])

    def stand_in_when_full(self, batch, worker_args):
        spec = {"source": {"type": "range", "stop": 1 << 50}, "ops": [{"op": "repeat"},
                                                                       {"op": "batch", "batch_size": batch}]}
        c = Cluster(workers=2, dispatcher_args=['--worker-timeout-ms', '1000'], worker_args=worker_args)
        cons = None
        try:
            c.wait_workers_registered(2)
            cons = Consumers(c, spec, 'coord-full', [1, 32], ['--no-shm', '--timeout-ms', '60000'])
            got, reading, procs = cons.got, cons.reading, cons.procs

            waits = [metric(w.admin_port, 'sluice_worker_memory_waits_total', default=0) for w in c.workers]

            def full(w):
                # The pipeline waits for room in the buffer, or for the
                # memory budget (for a finished batch, or in an op).
                tasks = get_json(w.admin_port, '/v1/tasks')['tasks']
                return tasks and (tasks[0]['buffer']['full'] or tasks[0]['buffer']['memory_full'] or
                                  metric(w.admin_port, 'sluice_worker_memory_waits_total',
                                         default=0) > waits[c.workers.index(w)])
            wait_for(lambda: reading(10), 'both consumers to read 10 rounds')
            procs[0].send_signal(signal.SIGSTOP)
            wait_for(lambda: reading(0) and all(full(w) for w in c.workers),
                     'the open rounds to fill both workers\' buffers while consumer 0 is stopped')
            lost = c.workers[1]
            lost.kill(signal.SIGKILL)
            job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-full'][0]['job_id']

            def end_round():
                tasks = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['tasks']
                return [t['rounds'].get('end') for t in tasks if t['worker_address'] == lost.addr][0]
            wait_for(lambda: reading(0) and end_round() is not None, 'the dispatcher to declare worker 1 lost')

            def rounds():  # as the consumers last said (sluice-cat's output lags)
                return {x['consumer_index']: x['round']
                        for x in get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['consumers']}
            wait_for(lambda: reading(0) and rounds().get(1, 0) > rounds().get(0, 0) + 1,
                     'consumer 1 to say it read ahead of the stopped consumer 0')
            procs[0].send_signal(signal.SIGCONT)
            upto = end_round() + 30
            wait_for(lambda: reading(upto), 'both consumers to read on to round %d' % upto, timeout=120)
            stood_in = metric(c.workers[0].admin_port, 'sluice_worker_stand_in_batches_total', default=0)
        finally:
            if cons:
                cons.stop()
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        self.assertGreater(stood_in, 0)
        for g in got:
            self.assertEqual([x['_round'] for x in g], list(range(len(g))))

class CoordinatedConsumers(unittest.TestCase):
    """sluice-cat consumers of the coordinated job "coord-drain" over a job
    without end, read on threads until stopped (no tests of its own)."""
    SPEC = {"source": {"type": "range", "stop": 1 << 50}, "ops": [{"op": "repeat"},
                                                                   {"op": "batch", "batch_size": 4}]}

    def consumers(self, c, windows, sharding='off'):
        self.cons = Consumers(c, self.SPEC, 'coord-drain', windows, ['--sharding', sharding, '--timeout-ms', '60000'])
        self.procs, self.readers, self.got = self.cons.procs, self.cons.readers, self.cons.got

    def reading(self, upto):
        return self.cons.reading(upto)

    def stop_consumers(self):
        return self.cons.stop()

    def task(self, c, addr):
        """The job's task on the worker at addr, or None (none yet)."""
        job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-drain'][0]['job_id']
        tasks = [t for t in get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['tasks']
                 if t['worker_address'] == addr]
        return tasks[0] if tasks else None


class CoordinatedDrain(CoordinatedConsumers):
    """A worker drained while it serves coordinated reads (sluicectl drain,
    POST /v1/workers/{address}/drain) serves the rounds up to the horizon
    the consumers may have asked for already, and no more: the other
    workers take its share from the next round on, every round still comes
    whole from one worker, and once every consumer is past its last round
    its task is done and the worker lets it go, to be stopped without a
    lost round. The job has no end: the consumers read until stopped."""

    def test_a_drained_worker_serves_its_rounds_then_lets_its_task_go(self):
        self.drain_one_of_two('off')

    def test_a_drained_worker_of_a_dynamic_job_keeps_its_splits_until_its_rounds_are_served(self):
        # Under DYNAMIC a drained worker gets no more splits, but a task of
        # coordinated reads still gets them for the rounds it serves (the
        # dispatcher's rule: test_state's
        # a_drained_workers_coordinated_task_serves_the_rounds_given_then_is_let_go);
        # eight consumers, splits of a batch each, and a worker that keeps
        # few of them queued (--split-target-ms 0: split_prefetch, 8), so
        # that its rounds after the drain need splits handed out after it.
        self.drain_one_of_two('dynamic', [1, 2, 4, 8, 8, 16, 32, 128], ['--split-target-ms', '0'])

    def drain_one_of_two(self, sharding, windows=(8, 32), worker_args=()):
        c = Cluster(workers=2, dispatcher_args=['--split-size', '4', '--max-split-size', '4'], worker_args=worker_args)
        try:
            c.wait_workers_registered(2)
            self.consumers(c, windows, sharding)
            gone = c.workers[1]
            wait_for(lambda: self.reading(20) and all(any(x['_worker'] == gone.addr for x in g) for g in self.got),
                     'both consumers to read rounds of both workers')
            if sharding == 'dynamic':
                # Consumer 0 stopped, the drained task's lowest open round
                # stays while the others' heartbeats move the horizon on,
                # until the task has more of its rounds left to serve than
                # it can have made or queued: 16 open rounds, its buffer
                # and 8 splits of a batch each. Those need splits handed out
                # after the drain (without the rule its pipeline ends).
                self.procs[0].send_signal(signal.SIGSTOP)
                room = 16 * len(windows) + self.gone_task(gone)['buffer']['capacity_batches'] + 8 + 1
                wait_for(lambda: (self.horizon(c) - self.gone_task(gone)['rounds']['lowest_open']['round']) // 2 *
                         len(windows) > room + 8 * len(windows), 'the horizon to run ahead of the drained task')
            self.assertEqual(drain_worker(c, gone.addr)['state'], 'DRAINING')
            end = self.task(c, gone.addr)['rounds']['end']
            self.assertGreater(end, 20)
            if sharding == 'dynamic':
                lowest = self.gone_task(gone)['rounds']['lowest_open']['round']
                self.assertGreater((end - lowest) // 2 * len(windows), room, 'its rounds need splits after the drain')
                self.procs[0].send_signal(signal.SIGCONT)
            # Every consumer past its last round: the task is done and the
            # worker lets it go.
            wait_for(lambda: self.reading(end + 50) and not get_json(gone.admin_port, '/v1/tasks')['tasks'],
                     'the drained worker to let its task go')
            self.assertEqual(self.task(c, gone.addr)['state'], 'DONE')
            self.assertEqual(gone.stop(), 0)
            upto = max(len(g) for g in self.got) + 50
            wait_for(lambda: self.reading(upto), 'the consumers to read on to round %d' % upto)
            stood_in = metric(c.workers[0].admin_port, 'sluice_worker_stand_in_batches_total', default=0)
        finally:
            said = self.stop_consumers()
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        for e in said:
            self.assertNotIn('was lost', e)
        self.assertEqual(stood_in, 0, 'no round needed a stand-in')
        from_gone = [x['_round'] for x in self.got[0] if x['_worker'] == gone.addr]
        self.assertIn(max(from_gone), (end - 2, end - 1), 'its last round (it served every second one)')
        self.assertTrue(all(x['_worker'] == c.workers[0].addr for g in self.got for x in g[end:]))
        for i, g in enumerate(self.got):
            self.assertEqual([x['_round'] for x in g], list(range(len(g))), 'consumer %d' % i)
        if sharding == 'off':
            # Every round whole from one worker, consumer i its i-th batch,
            # and each worker's batches in order, none left out or twice.
            from test_fault_tolerance import check_rounds
            check_rounds(self, self.got, 4, 'drained worker')
        else:
            for r in range(min(len(g) for g in self.got)):
                self.assertEqual(len({g[r]['_worker'] for g in self.got}), 1, 'round %d' % r)
            firsts = [x['value'][0] for g in self.got for x in g]
            self.assertEqual(len(firsts), len(set(firsts)), 'a batch came twice')

    @staticmethod
    def gone_task(worker):
        return get_json(worker.admin_port, '/v1/tasks')['tasks'][0]

    @staticmethod
    def horizon(c):
        job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-drain'][0]['job_id']
        return get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['coordinated']['round_horizon']

    def test_a_job_whose_only_worker_is_drained_waits_for_another_and_reads_on(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            self.consumers(c, [4, 16])
            wait_for(lambda: self.reading(20), 'both consumers to read 20 rounds')
            first = c.workers[0]
            drain_worker(c, first.addr)
            end = self.task(c, first.addr)['rounds']['end']
            # The rounds below the end come, and no more: no worker serves
            # the job's next rounds. (What sluice-cat printed may wait in its
            # output buffer: the dispatcher says where each consumer is.)
            job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-drain'][0]['job_id']

            def rounds():
                return [x['round'] for x in get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['consumers']]
            wait_for(lambda: self.reading(0) and rounds() == [end, end] and
                     not get_json(first.admin_port, '/v1/tasks')['tasks'],
                     'the drained worker to serve its rounds and let its task go')
            self.assertEqual(self.task(c, first.addr)['state'], 'DONE')
            joined = c.add_worker()
            # It serves from past the horizon the consumers were given; the
            # rounds between stand in for no worker: it serves them too.
            wait_for(lambda: self.reading(0) and self.task(c, joined.addr) is not None, 'the new worker\'s task')
            start = self.task(c, joined.addr)['rounds']['start']
            wait_for(lambda: self.reading(start + 50), 'the consumers to read on to round %d' % (start + 50))
            stood_in = metric(joined.admin_port, 'sluice_worker_stand_in_batches_total', default=0)
        finally:
            self.stop_consumers()
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        self.assertGreaterEqual(start, end)
        self.assertEqual(stood_in, 2 * (start - end), 'each consumer a batch of each round in [%d, %d)' % (end, start))
        for i, g in enumerate(self.got):
            self.assertEqual([x['_round'] for x in g], list(range(len(g))), 'consumer %d' % i)
            self.assertTrue(all(x['_worker'] == joined.addr for x in g[end:]))


class CoordinatedRestart(CoordinatedConsumers):
    """A coordinated consumer killed and started again takes its consumer
    index once its predecessor is away, and asks from the round its
    predecessor last said it was at (a heartbeat interval behind at most); a
    round its predecessor had taken its batch of (and lost with it) gives it
    the task's next batch instead. It hands its caller the rounds from the
    furthest any consumer of the job was at, so that consumers restarted
    together start at one round. Before 2026-12-02
    it started at round 0, read rounds the workers had forgotten as new
    ones, and failed where its predecessor's rounds began. One stopped
    cleanly (its iterator closed, its lease released at once) comes back
    the same way (before 2026-12-03 it started at round 0)."""

    def restart(self, killed, sig=signal.SIGKILL):
        """Stops the consumers `killed` with sig (SIGTERM: sluice-cat closes
        its iterator, which releases its lease at once) and starts them
        again."""
        c = Cluster(workers=2, dispatcher_args=['--client-timeout-ms', '1000'])
        try:
            c.wait_workers_registered(2)
            self.consumers(c, [8, 32])
            wait_for(lambda: self.reading(500), 'both consumers to read 500 rounds')
            for i in killed:
                self.procs[i].send_signal(sig)
                self.procs[i].wait(30)
            before = [list(g) for g in self.got]
            job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-drain'][0]['job_id']

            def view():
                return get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)

            def consumers():
                return view()['consumers']
            if sig == signal.SIGKILL:
                wait_for(lambda: sum(x['state'] == 'away' for x in consumers()) == len(killed),
                         'the killed consumers to be away')
            else:
                wait_for(lambda: sorted(x['consumer_index'] for x in view()['gone']) == sorted(killed),
                         'the stopped consumers to be gone')
            was = {x['consumer_index']: x['round'] for x in consumers() + view()['gone']}
            procs, readers, got = self.procs, self.readers, self.got
            self.consumers(c, [8, 32])  # both again; the ones not killed are refused their index
            for i in range(2):
                if i not in killed:
                    self.procs[i].wait(30)
                    self.assertIn('consumer_index %d is taken' % i, self.procs[i].stderr.read())
                    self.procs[i], self.readers[i], self.got[i] = procs[i], readers[i], got[i]
            upto = {i: len(self.got[i]) + 300 for i in range(2)}
            wait_for(lambda: self.reading(0) and all(len(self.got[i]) >= upto[i] for i in range(2)),
                     'every consumer to read 300 rounds more')
            started = {x['consumer_index']: x.get('start_round') for x in consumers()}
        finally:
            said = self.stop_consumers()
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly: %s' % bad)
        rounds_of = {}
        for i in range(2):
            g = self.got[i]
            if i in killed:
                self.assertNotIn('already took', said[i])
                # It asks from where its predecessor was, and hands out
                # rounds from where the job's furthest consumer was.
                self.assertEqual(g[0]['_round'], started[i], 'consumer %d' % i)
                self.assertGreaterEqual(started[i], was[i])
                self.assertGreater(was[i], 0)
                self.assertEqual(started[i] > was[i], 'are dropped' in said[i], said[i])
            self.assertEqual([x['_round'] for x in g], list(range(g[0]['_round'], g[0]['_round'] + len(g))),
                             'consumer %d' % i)
            rounds_of[i] = {x['_round']: x for x in g}
        # Each round from one worker (a batch its predecessor took and lost
        # gives way to the worker's next), no batch twice.
        for r in set(rounds_of[0]) & set(rounds_of[1]):
            self.assertEqual(rounds_of[0][r]['_worker'], rounds_of[1][r]['_worker'], 'round %d' % r)
        if len(killed) == 2:
            # Their predecessors stopped apart (windows of 8 and 32 rounds):
            # both start at the furthest, so that their steps take the same
            # rounds again. Before 2026-12-02 each started where its own was.
            self.assertEqual(started[0], started[1])
            self.assertEqual(started[0], max(was.values()))
            self.assertEqual(self.got[0][0]['_round'], self.got[1][0]['_round'])
        # Every batch read, by the killed consumers and by the rest, once.
        read = [before[i] for i in killed] + self.got
        seen = collections.Counter((x['_worker'], x['value'][0]) for g in read for x in g)
        self.assertEqual([k for k, n in seen.items() if n > 1], [], 'batches given twice')

    def test_a_restarted_consumer_starts_where_the_furthest_consumer_was(self):
        self.restart(killed=[1])

    def test_consumers_restarted_together_start_at_one_round(self):
        self.restart(killed=[0, 1])

    def test_consumers_stopped_cleanly_and_started_again_start_at_one_round(self):
        # Closed iterators release their leases at once: before 2026-12-03
        # the new ones started at round 0 and failed.
        self.restart(killed=[0, 1], sig=signal.SIGTERM)

    def test_a_consumer_stopped_cleanly_and_started_again_reads_on(self):
        self.restart(killed=[1], sig=signal.SIGTERM)


class TargetWorkers(unittest.TestCase):
    def test_local_reads_only_from_workers_on_the_clients_host(self):
        ports = free_ports(3)
        c = Cluster()
        try:
            c.add_worker(['--port', str(ports[0]), '--worker-address', '127.0.0.1:%d' % ports[0]])
            c.add_worker(['--port', str(ports[1]), '--worker-address', '127.0.0.1:%d' % ports[1]])
            c.add_worker(['--port', str(ports[2]), '--worker-address', '127.0.0.2:%d' % ports[2]])
            c.wait_workers_registered(3)
            spec = {"source": {"type": "range", "stop": 100}, "ops": [{"op": "batch", "batch_size": 10}]}
            rc, batches, err = c.cat(spec, ['--target-workers', 'local', '--with-worker'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(collections.Counter(values(batches, 'value')), collections.Counter(list(range(100)) * 2))
            self.assertEqual({b['_worker'] for b in batches}, {'127.0.0.1:%d' % p for p in ports[:2]})
            rc, batches, err = c.cat(spec, ['--target-workers', 'any'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(len(values(batches, 'value')), 300)
        finally:
            self.assertEqual(c.close(), {})

    def test_local_without_a_local_worker_is_refused(self):
        port = free_ports(1)[0]
        c = Cluster()
        try:
            c.add_worker(['--port', str(port), '--worker-address', '127.0.0.2:%d' % port])
            c.wait_workers_registered(1)
            rc, _, err = c.cat({"source": {"type": "range", "stop": 10}, "ops": []}, ['--target-workers', 'local'])
            self.assertNotEqual(rc, 0)
            self.assertIn("no live worker is on this client's host 127.0.0.1", err)
        finally:
            self.assertEqual(c.close(), {})


class Lifecycle(unittest.TestCase):
    SPEC = {"source": {"type": "range", "stop": 50}, "ops": [{"op": "batch", "batch_size": 10}]}

    def test_a_finished_jobs_repetition_ends_at_once_and_the_next_reads_again(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            rc, batches, err = c.cat(self.SPEC, ['--job-name', 'again'])
            self.assertEqual(rc, 0, err)
            # The job finishes once its task reports DONE.
            wait_for(lambda: all(j['state'] == 'FINISHED' for j in get_json(c.dispatcher.admin_port,
                                                                              '/v1/jobs')['jobs']), 'the job to finish')
            rc, batches2, err = c.cat(self.SPEC, ['--job-name', 'again'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(batches2, [], 'a late client of repetition 0 reads no epoch twice')
            self.assertIn('job "again" repetition 0 (id ', err)
            self.assertIn('had already ended (FINISHED)', err)
            rc, batches3, err = c.cat(self.SPEC, ['--job-name', 'again', '--repetition', '1'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(values(batches3, 'value')), list(range(50)))
        finally:
            self.assertEqual(c.close(), {})

    def test_a_job_without_clients_is_collected_and_its_tasks_removed(self):
        c = Cluster(workers=1, dispatcher_args=['--client-timeout-ms', '300', '--client-rejoin-ms', '300',
                                                '--job-gc-timeout-ms', '300'])
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "repeat"}]}
            p = subprocess.Popen(c.cat_argv(spec, ['--job-name', 'gc', '--format', 'count']),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
            # The job exists before its client stops (a fixed pause assumed
            # the machine was fast enough).
            wait_for(lambda: get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'], 'job gc to be created')
            # A stopped client sends no heartbeat: its lease expires (it is
            # away), it is released, then the job without clients is collected.
            p.send_signal(19)  # SIGSTOP
            deadline = time.time() + 30
            job = None
            while time.time() < deadline:
                job = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'][0]
                if job['state'] == 'CANCELLED':
                    break
                time.sleep(0.05)
            self.assertEqual(job['state'], 'CANCELLED')
            self.assertIn('no client', job['error'])
            deadline = time.time() + 30
            while time.time() < deadline:
                if get_json(c.dispatcher.admin_port, '/v1/workers')['workers'][0]['active_tasks'] == 0:
                    break
                time.sleep(0.05)
            self.assertEqual(get_json(c.dispatcher.admin_port, '/v1/workers')['workers'][0]['active_tasks'], 0)
            deadline = time.time() + 30
            while time.time() < deadline and 'removed (cancelled)' not in c.workers[0].stderr():
                time.sleep(0.05)
            self.assertIn('removed (cancelled)', c.workers[0].stderr())
            p.send_signal(18)  # SIGCONT
            _, err = p.communicate(timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertRegex(err, 'released after|was cancelled')
        finally:
            self.assertEqual(c.close(), {})

    def test_a_cancelled_job_gives_its_clients_a_clear_error(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            spec = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "repeat"}]}
            p = subprocess.Popen(c.cat_argv(spec, ['--job-name', 'cancel-me', '--format', 'count']),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
            deadline = time.time() + 20
            jobs = []
            while time.time() < deadline and not jobs:
                jobs = get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']
                time.sleep(0.05)
            req = urllib.request.Request('http://127.0.0.1:%d/v1/jobs/%d' % (c.dispatcher.admin_port, jobs[0]['id']),
                                         method='DELETE')
            urllib.request.urlopen(req, timeout=5).read()
            _, err = p.communicate(timeout=60)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn('was cancelled', err)
        finally:
            self.assertEqual(c.close(), {})


if __name__ == '__main__':
    unittest.main()
