"""The foundation, end to end: a real dispatcher and real workers on loopback,
batches streamed through libsluice (sluice-cat) with OFF and DYNAMIC."""
import collections
import concurrent.futures
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

from harness import Cluster, binary, get_json, parse_jsonl, summary, values, wait_for

RANGE_100K = {"source": {"type": "range", "start": 0, "stop": 100000},
              "ops": [{"op": "batch", "batch_size": 100}]}


def jobs(cluster):
    with urllib.request.urlopen('http://127.0.0.1:%d/v1/jobs' % cluster.dispatcher.admin_port, timeout=10) as r:
        return json.load(r)['jobs']


class ThreeWorkers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=3)
        cls.c.wait_workers_registered(3)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def assert_each(self, vals, times, n):
        counts = collections.Counter(vals)
        missing = [v for v in range(n) if counts[v] < times]
        extra = [v for v, k in counts.items() if k > times or not 0 <= v < n]
        self.assertEqual((len(missing), len(extra)), (0, 0),
                         'missing %s... extra %s...' % (missing[:5], extra[:5]))
        self.assertEqual(len(vals), times * n)

    def test_dynamic_delivers_every_element_once(self):
        rc, batches, err = self.c.cat(RANGE_100K, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assert_each(values(batches, 'value'), 1, 100000)
        # Splits are whole batches, so no worker makes a short one.
        self.assertEqual(len(batches), 1000)
        s = summary(err)
        self.assertEqual((s['elements'], s['batches']), (100000, len(batches)))
        self.assertGreaterEqual(s['bytes'], 800000)
        # When the first and the last batch came, within the read.
        self.assertTrue(0 <= s['first_batch_seconds'] <= s['last_batch_seconds'] <= s['seconds'], s)

    def test_off_delivers_every_element_once_per_worker(self):
        rc, batches, err = self.c.cat(RANGE_100K, ['--sharding', 'off'])
        self.assertEqual(rc, 0, err)
        self.assert_each(values(batches, 'value'), 3, 100000)
        # Under OFF each worker builds the same full batches.
        self.assertEqual(len(batches), 3000)
        self.assertTrue(all(len(b['value']) == 100 for b in batches))

    def test_the_request_window_per_worker_is_set_and_bounded(self):
        # --per-worker-outstanding (sl_iterator_opts_t.per_worker_outstanding,
        # half the window unless given) at both ends of its range: every
        # element once.
        for window in ('1', '16'):
            rc, batches, err = self.c.cat(RANGE_100K, ['--sharding', 'dynamic', '--per-worker-outstanding', window,
                                                       '--max-outstanding', '32'])
            self.assertEqual(rc, 0, err)
            self.assert_each(values(batches, 'value'), 1, 100000)
        # Past 16, what a worker holds for redelivery per trainer, or below
        # 1: refused before anything is asked, naming the option.
        for window in ('0', '17'):
            argv = self.c.cat_argv(RANGE_100K, ['--per-worker-outstanding', window])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn('--per-worker-outstanding: "%s" is not an integer in [1, 16]' % window, r.stderr)

    def test_the_window_in_bytes_is_set_and_bounded(self):
        # --window-mb (sl_iterator_opts_t.window_bytes, 32 MiB unless given)
        # sizes the window when --max-outstanding is not given (here 32:
        # 1 MiB holds far more batches of 800 bytes): every element once.
        # Below 1: refused before anything is asked, naming the option.
        rc, batches, err = self.c.cat(RANGE_100K, ['--sharding', 'dynamic', '--window-mb', '1'])
        self.assertEqual(rc, 0, err)
        self.assert_each(values(batches, 'value'), 1, 100000)
        argv = self.c.cat_argv(RANGE_100K, ['--window-mb', '0'])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('--window-mb: "0" is not an integer in [1, ', r.stderr)

    def test_every_worker_gets_its_share_of_the_requests(self):
        # Under OFF each of the three workers streams the whole range, so
        # the trainer reads from whichever it asks. Its budget (4 here) is
        # less than the three windows together (4 each): were each freed slot
        # given to the first task with room, the first would take most
        # requests (2564, 434 and 2 batches of 3000 with the pass starting at
        # the first task). Taken in turn, each gets about a third; half of
        # that is asked for.
        #
        # Turns decide the shares only while the trainer, not the workers,
        # sets the pace, so nothing here may depend on the machine's speed:
        # - Shares are counted from the first batch after every worker sent
        #   one. Before that, a worker that has not yet heard of its task
        #   answers "task unknown" and is asked again later, so the first
        #   one streams alone for a while (2006, 527 and 467 were seen when
        #   the start was counted, under the test lanes' load).
        # - The test reads a batch at a time, one a millisecond, and each
        #   batch (1000 elements, about 7 KB of JSON) fills sluice-cat's
        #   output buffer: a slot frees one batch at a time, never in a burst
        #   that the fastest worker would win (with 100-element batches read
        #   as fast as Python could, 1842, 638 and 520 were seen under load;
        #   now 954 or more, the ASan build under three busy loops too).
        # The job never ends; reading stops when the shares are counted.
        spec = {"source": {"type": "range", "stop": 10**6},
                "ops": [{"op": "batch", "batch_size": 1000}, {"op": "repeat"}]}
        proc = subprocess.Popen(self.c.cat_argv(spec, ['--sharding', 'off', '--with-worker', '--max-outstanding', '4']),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        watchdog = threading.Timer(300, proc.kill)  # a hang fails the test rather than the run
        watchdog.start()
        seen, counts, before = set(), collections.Counter(), 0
        try:
            for line in proc.stdout:
                worker = json.loads(line)['_worker']
                if len(seen) < 3:
                    seen.add(worker)
                    before += 1
                    # A worker still silent after 100,000 batches is not a start's skew.
                    self.assertLess(before, 100000, 'workers seen: %r' % seen)
                    continue
                counts[worker] += 1
                if sum(counts.values()) == 3000:
                    break
                time.sleep(0.001)
        finally:
            watchdog.cancel()
            proc.kill()
            proc.wait()
        self.assertEqual(sum(counts.values()), 3000, 'the stream ended early: %r' % counts)
        self.assertEqual(len(counts), 3, counts)
        self.assertGreaterEqual(min(counts.values()), 500, counts)

    def test_two_consumers_of_one_named_dynamic_job_share_it(self):
        spec = {"source": {"type": "range", "start": 0, "stop": 400000},
                "ops": [{"op": "batch", "batch_size": 100}]}
        args = ['--sharding', 'dynamic', '--job-name', 'shared-%d' % os.getpid(), '--max-outstanding', '2']
        procs = [subprocess.Popen(self.c.cat_argv(spec, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        # Nothing is read until both consumers joined the job: their pipes
        # fill and hold them after a few hundred of the 4000 batches, so the
        # first one cannot take the whole job before the second one starts.
        name = args[args.index('--job-name') + 1]
        wait_for(lambda: any(j['name'] == name and j['num_consumers'] == 2 for j in jobs(self.c)),
                 'both consumers to join job %s' % name)
        # Then read both at once: a consumer blocked on its output would hold the
        # job's end for the other (a DYNAMIC job ends once every consumer
        # has what was sent to it, docs/fault-tolerance.md).
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda p: p.communicate(timeout=300), procs))
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        got = [values(parse_jsonl(out), 'value') for out, _ in outs]
        self.assert_each(got[0] + got[1], 1, 400000)
        # Both consumers took part; neither saw what the other did.
        self.assertTrue(got[0] and got[1], 'one consumer received nothing: %d / %d' % (len(got[0]), len(got[1])))
        self.assertFalse(set(got[0]) & set(got[1]))

    def test_named_job_with_other_parameters_is_refused(self):
        name = 'conflict-%d' % os.getpid()
        # A job that never ends, running before the second request comes.
        spec = {"source": {"type": "range", "stop": 10000000},
                "ops": [{"op": "batch", "batch_size": 10}, {"op": "repeat"}]}
        p = subprocess.Popen(self.c.cat_argv(spec, ['--sharding', 'dynamic', '--job-name', name], fmt='count'),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: any(j['name'] == name and j['state'] == 'RUNNING' for j in jobs(self.c)),
                     'job %s to run' % name)
            rc, _, err = self.c.cat(spec, ['--sharding', 'off', '--job-name', name])
            self.assertNotEqual(rc, 0)
            self.assertIn('sharding dynamic, requested off', err)
        finally:
            p.kill()
            p.wait()

    def test_bad_spec_is_refused_naming_the_field(self):
        bad = {"source": {"type": "range", "start": 0, "stop": 10}, "ops": [{"op": "batch", "batch_size": "x"}]}
        rc, batches, err = self.c.cat(bad, ['--sharding', 'off'])
        self.assertNotEqual(rc, 0)
        self.assertIn('$.ops[0].batch_size', err)
        self.assertEqual(batches, [])
        self.assertTrue(self.c.dispatcher.alive())

    def test_unknown_source_is_refused_naming_it(self):
        rc, _, err = self.c.cat({"source": {"type": "nope"}}, ['--sharding', 'off'])
        self.assertNotEqual(rc, 0)
        self.assertIn('$.source.type', err)

    def test_the_daemons_threads_say_what_they_are(self):
        """top -H, perf and gdb show each thread's name (docs/operations.md): the
        dispatcher's file counter is sl-count, beside its loop."""
        def names(pid):
            out = []
            for tid in os.listdir('/proc/%d/task' % pid):
                try:
                    with open('/proc/%d/task/%s/comm' % (pid, tid)) as f:
                        out.append(f.read().strip())
                except OSError:
                    pass  # ended meanwhile
            return sorted(out)
        self.assertEqual(names(self.c.dispatcher.proc.pid), ['sl-count', 'sluice-dispatch'])
        for w in self.c.workers:
            self.assertIn('sluice-workerd', names(w.proc.pid))

    def test_garbage_on_the_wire_leaves_the_dispatcher_serving(self):
        for payload in (b'GET / HTTP/1.0\r\n\r\n', b'SLUC\x00\x09\x00\x01', b'SLUC\x00\x02\x00\x01' + b'\xff' * 64):
            s = socket.create_connection(('127.0.0.1', self.c.dispatcher.port), timeout=30)
            s.sendall(payload)
            s.settimeout(30)
            data = b''
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
            except socket.timeout:
                self.fail('dispatcher kept a bad connection open: %r' % payload)
            s.close()
        rc, batches, err = self.c.cat({"source": {"type": "range", "stop": 1000},
                                       "ops": [{"op": "batch", "batch_size": 100}]}, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(values(batches, 'value')), list(range(1000)))


class Failures(unittest.TestCase):
    def test_closed_dispatcher_port_fails_within_timeout(self):
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
        s.close()
        c = Cluster(workers=0)
        try:
            t = time.time()
            rc, _, err = c.cat(RANGE_100K, ['--timeout-ms', '3000'], dispatcher='127.0.0.1:%d' % port)
            self.assertNotEqual(rc, 0)
            self.assertLess(time.time() - t, 10)
            self.assertIn('127.0.0.1:%d' % port, err)
        finally:
            c.close()

    def test_silent_dispatcher_fails_within_timeout(self):
        # A socket that accepts but never answers the handshake.
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        s.listen(8)
        c = Cluster(workers=0)
        try:
            t = time.time()
            rc, _, err = c.cat(RANGE_100K, ['--timeout-ms', '1500'],
                               dispatcher='127.0.0.1:%d' % s.getsockname()[1])
            self.assertNotEqual(rc, 0)
            self.assertLess(time.time() - t, 10)
            self.assertIn('timed out', err)
        finally:
            s.close()
            c.close()

    def test_stalled_worker_fails_the_client_within_timeout(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            c.workers[0].kill(signal.SIGSTOP)
            t = time.time()
            rc, _, err = c.cat(RANGE_100K, ['--sharding', 'off', '--timeout-ms', '2000'])
            self.assertNotEqual(rc, 0)
            self.assertLess(time.time() - t, 15)
            self.assertIn('worker 127.0.0.1:%d' % c.workers[0].port, err)
        finally:
            c.workers[0].kill(signal.SIGCONT)
            c.close()

    def test_daemons_refuse_bad_command_lines(self):
        from harness import binary
        for argv in ([binary('sluice-dispatcher'), '--port', 'x', '--admin-port', '0', '--work-dir', '/tmp/x'],
                     [binary('sluice-dispatcher'), '--port', '0'],
                     [binary('sluice-workerd'), '--dispatcher', 'nohostport', '--port', '0', '--admin-port', '0']):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, argv)
            self.assertTrue(r.stderr.strip(), argv)

    def test_every_program_says_its_version(self):
        from harness import BUILD, binary
        with open(os.path.join(BUILD, 'CMakeCache.txt')) as f:
            version = re.search(r'^CMAKE_PROJECT_VERSION:STATIC=(.+)$', f.read(), re.M).group(1)
        # A daemon's --version wins over its missing required options.
        for name, argv in (('sluice-dispatcher', ['--log-level', 'info', '--version']),
                           ('sluice-workerd', ['--log-level', 'info', '--version']),
                           ('sluice-cat', ['--version']), ('sluicectl', ['--version'])):
            r = subprocess.run([binary(name)] + argv, capture_output=True, text=True, timeout=30)
            self.assertEqual((r.returncode, r.stdout, r.stderr), (0, '%s %s\n' % (name, version), ''), name)

    def test_config_file_sets_options_and_the_command_line_wins(self):
        from harness import binary
        c = Cluster(workers=0)
        try:
            cfg = os.path.join(c.dir, 'dispatcher.json')
            with open(cfg, 'w') as f:
                f.write('{"split-size": 7, "log-format": "json", "admin-bind": "127.0.0.1"}')
            bad = os.path.join(c.dir, 'bad.json')
            with open(bad, 'w') as f:
                f.write('{"split-size": "many"}')
            r = subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                                os.path.join(c.dir, 'w2'), '--config', bad], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 2)
            self.assertIn('split-size', r.stderr)
            d = c._start([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                          os.path.join(c.dir, 'w3'), '--config', cfg, '--log-format', 'text'], 'configured')
            w = c._start([binary('sluice-workerd'), '--dispatcher', d.addr, '--port', '0', '--admin-port', '0'],
                         'configured-worker')
            rc, batches, err = c.cat({"source": {"type": "range", "stop": 20}}, ['--sharding', 'dynamic'],
                                     dispatcher=d.addr)
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(values(batches, 'value')), list(range(20)))
            # The command line's text format won over the file's json.
            self.assertIn(' info sluice-dispatcher: ', d.stderr())
            self.assertTrue(w.alive())
        finally:
            c.close()

    def test_work_dir_in_use_is_refused(self):
        c = Cluster(workers=0)
        try:
            from harness import binary
            r = subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                                os.path.join(c.dir, 'work')], capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn('in use', r.stderr)
        finally:
            c.close()

    def test_a_worker_whose_port_is_taken_says_so_and_exits(self):
        # sl_worker_start() failed at the bind and freed a worker it had not
        # finished making: the free met a NULL timer and the worker died of
        # SIGSEGV (seen when another process took a test's chosen port).
        c = Cluster(workers=0)
        taken = socket.socket()
        try:
            taken.bind(('127.0.0.1', 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            r = subprocess.run([binary('sluice-workerd'), '--dispatcher', c.dispatcher.addr, '--bind', '127.0.0.1',
                                '--port', str(port), '--admin-port', '0'], capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn('in use', r.stderr)
            self.assertIn(str(port), r.stderr)
            self.assertNotIn('Sanitizer', r.stderr)
        finally:
            taken.close()
            c.close()


class BadStateStore(unittest.TestCase):
    """A work dir the dispatcher must not use is refused at start, with the
    reason, and nothing in it is written."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix='sluice-store-')
        self.mounts = []

    def tearDown(self):
        for m in reversed(self.mounts):
            subprocess.run(['umount', m], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, work):
        from harness import binary
        return subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir', work],
                              capture_output=True, text=True, timeout=30)

    def mount_tmpfs(self, path, options):
        os.makedirs(path)
        r = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs', path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, 'these tests run as root and mount a small tmpfs: %s' % r.stderr)
        self.mounts.append(path)

    def test_corrupt_store(self):
        work = os.path.join(self.dir, 'corrupt')
        os.makedirs(work)
        junk = bytes((i * 7 + 3) & 0xff for i in range(65536))
        with open(os.path.join(work, 'state.mdb'), 'wb') as f:
            f.write(junk)
        r = self.start(work)
        self.assertEqual(r.returncode, 1)
        self.assertIn('state store %s/state.mdb cannot be opened' % work, r.stderr)
        with open(os.path.join(work, 'state.mdb'), 'rb') as f:
            self.assertEqual(f.read(), junk)

    def test_a_check_of_a_corrupt_store_says_it_would_be_refused(self):
        """--check-store reads a store as a start would, without serving or
        writing it: a corrupt one is said refused, with the reason."""
        from harness import binary
        work = os.path.join(self.dir, 'checked')
        os.makedirs(work)
        junk = bytes((i * 5 + 1) & 0xff for i in range(65536))
        with open(os.path.join(work, 'state.mdb'), 'wb') as f:
            f.write(junk)
        r = subprocess.run([binary('sluice-dispatcher'), '--work-dir', work, '--check-store'], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        out = json.loads(r.stdout)
        self.assertFalse(out['loads'])
        self.assertIn('state store %s/state.mdb cannot be opened' % work, out['error'])
        self.assertIn('--check-store: state store', r.stderr)
        with open(os.path.join(work, 'state.mdb'), 'rb') as f:
            self.assertEqual(f.read(), junk)

    def test_a_check_reads_a_store_beside_its_dispatcher_and_on_read_only_media(self):
        """--check-store opens the store read-only and takes no lock of the
        work dir: it reads the store of a dispatcher that serves from it
        (before, the work dir's lock refused it), and a copy on read-only
        media (a bind mount made read-only in a mount namespace of its
        own; before, it needed a writable work dir), writing nothing."""
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            rc, batches, err = c.cat({"source": {"type": "range", "stop": 10}}, ['--sharding', 'dynamic'])
            self.assertEqual((rc, len(values(batches, 'value'))), (0, 10), err)
            work = os.path.join(c.dir, 'work')
            live = subprocess.run([binary('sluice-dispatcher'), '--work-dir', work, '--check-store'],
                                  capture_output=True, text=True, timeout=30)
            self.assertEqual(live.returncode, 0, live.stderr)
            held = json.loads(live.stdout)
            self.assertEqual((held['loads'], held['datasets'], held['jobs'], held['workers']), (True, 1, 1, 1),
                             live.stdout)
            # A backup: the store of the dispatcher stopped, copied.
            self.assertEqual(c.dispatcher.stop(), 0)
            backup = os.path.join(self.dir, 'backup')
            os.makedirs(backup)
            shutil.copy(os.path.join(work, 'state.mdb'), backup)
        finally:
            bad = c.close()
        self.assertEqual(bad, {})
        with open(os.path.join(backup, 'state.mdb'), 'rb') as f:
            before = f.read()
        check = '%s --work-dir %s --check-store' % (binary('sluice-dispatcher'), backup)
        r = subprocess.run(['unshare', '--mount', 'sh', '-c', 'mount --bind {0} {0} && mount -o remount,ro,bind {0} '
                            '&& ! touch {0}/probe 2>/dev/null && exec {1}'.format(backup, check)],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, 'these tests run as root and make a read-only bind mount: %s' % r.stderr)
        self.assertEqual(json.loads(r.stdout), held, r.stdout)
        self.assertEqual(sorted(os.listdir(backup)), ['state.mdb'], 'nothing written beside the store')
        with open(os.path.join(backup, 'state.mdb'), 'rb') as f:
            self.assertEqual(f.read(), before)

    def test_full_file_system(self):
        work = os.path.join(self.dir, 'full')
        self.mount_tmpfs(work, 'size=4m')
        r = self.start(work)
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r'work dir %s is full: \d+ bytes free' % re.escape(work))
        self.assertFalse(os.path.exists(os.path.join(work, 'state.mdb')))

    def test_read_only_file_system(self):
        from harness import binary
        work = os.path.join(self.dir, 'ro')
        self.mount_tmpfs(work, 'size=64m')
        # A store made while it was writable, by a dispatcher stopped cleanly.
        p = subprocess.Popen([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir', work],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertIn('listening', p.stdout.readline())
        p.terminate()
        self.assertEqual(p.wait(timeout=30), 0)
        with open(os.path.join(work, 'state.mdb'), 'rb') as f:
            before = f.read()
        subprocess.run(['mount', '-o', 'remount,ro', work], check=True)
        r = self.start(work)
        self.assertEqual(r.returncode, 1)
        self.assertIn(work, r.stderr)
        self.assertIn('Read-only file system', r.stderr)
        with open(os.path.join(work, 'state.mdb'), 'rb') as f:
            self.assertEqual(f.read(), before)


class WorkerJoinsLater(unittest.TestCase):
    def test_job_waits_for_a_worker_and_completes(self):
        c = Cluster(workers=0)
        try:
            p = subprocess.Popen(c.cat_argv({"source": {"type": "range", "stop": 5000},
                                             "ops": [{"op": "batch", "batch_size": 50}]}, ['--sharding', 'dynamic']),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # The job exists, without a task, before the worker comes.
            job = wait_for(lambda: jobs(c), 'the job to be created')[0]
            self.assertEqual((job['state'], job['tasks']), ('RUNNING', 0))
            c.add_worker()
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
            self.assertEqual(sorted(values(parse_jsonl(out), 'value')), list(range(5000)))
        finally:
            bad = c.close()
            self.assertEqual(bad, {})


if __name__ == '__main__':
    unittest.main()


class StoppedWorker(unittest.TestCase):
    """A worker answers a task's requests in order and parks those it has no
    batch for. One that stops answering (SIGSTOP: its connections stay open)
    held every request of a window of 4 after a few batches, for a share of
    4 a worker, while the other worker had batches ready, and the trainer
    waited on it. Each task now holds at most what leaves every other live
    task one slot of the window (3 here)."""

    def test_a_stopped_worker_does_not_hold_the_whole_window(self):
        # Not lost while stopped: the test ends long before 600 s.
        c = Cluster(workers=2, dispatcher_args=['--worker-timeout-ms', '600000'])
        stopped, proc = None, None
        try:
            c.wait_workers_registered(2)
            spec = {"source": {"type": "range", "stop": 10**7}, "ops": [{"op": "batch", "batch_size": 100}]}
            proc = subprocess.Popen(c.cat_argv(spec, ['--sharding', 'off', '--with-worker', '--max-outstanding', '4']),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines = queue.Queue()
            threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()

            def next_worker():
                try:
                    return json.loads(lines.get(timeout=120))['_worker']
                except queue.Empty:
                    raise AssertionError('no batch for 120 s; the workers: %s' % [
                        get_json(w.admin_port, '/v1/tasks')['tasks'] for w in c.workers if w is not stopped])

            first = next_worker()
            while next_worker() == first:
                pass
            stopped = next(w for w in c.workers if w.addr == first)
            stopped.kill(signal.SIGSTOP)
            # What the stopped worker sent before it stopped may still come;
            # then the other's, without end.
            others = 0
            while others < 2000:
                others += next_worker() != first
        finally:
            if stopped:
                stopped.kill(signal.SIGCONT)
            if proc:
                proc.kill()
                proc.wait()
            c.close()
