"""The first paths a user walks with sluice-cat: a wait on a job that no
worker serves says what it waits for, honours --timeout-ms and ends on
Ctrl-C with exit 130; sharding off over several workers says that every
element comes once per worker; mistakes in addresses and specs get a message
that names them (docs/operations.md, docs/python.md)."""
import os
import signal
import subprocess
import tempfile
import unittest

from harness import Cluster, child_env, wait_for

SPEC = {"source": {"type": "range", "start": 0, "stop": 100}, "ops": [{"op": "batch", "batch_size": 10}]}


class NoWorker(unittest.TestCase):
    """A dispatcher with no worker at all."""

    def setUp(self):
        self.c = Cluster(workers=0)

    def tearDown(self):
        self.assertEqual(self.c.close(), {}, 'daemons exited uncleanly')

    def start_cat(self, args):
        err = tempfile.NamedTemporaryFile('w+', dir=self.c.dir, suffix='.err', delete=False)
        p = subprocess.Popen(self.c.cat_argv(SPEC, args, fmt='count'), stdout=subprocess.DEVNULL, stderr=err,
                             env=child_env())
        return p, err.name

    def test_the_wait_is_said_and_ctrl_c_ends_it(self):
        p, err = self.start_cat(['--timeout-ms', '3600000'])
        try:
            wait_for(lambda: 'no live worker for job' in open(err).read(), 'the notice of the wait')
            self.assertIsNone(p.poll())
            p.send_signal(signal.SIGINT)
            rc = p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        text = open(err).read()
        self.assertEqual(rc, 130, text)
        self.assertIn('sluice-cat: interrupted (SIGINT) after 0 batches, waiting on: no live worker for job', text)
        self.assertIn('is a sluice-workerd running with --dispatcher %s?' % self.c.dispatcher.addr, text)
        self.assertIn('"batches": 0', text)  # the summary line still comes
        self.assertIn('"first_batch_seconds": -1.0000, "last_batch_seconds": -1.0000', text)  # none came

    def test_the_wait_ends_at_the_timeout_with_its_option_named(self):
        p, err = self.start_cat(['--timeout-ms', '1000'])
        rc = p.wait(timeout=120)
        text = open(err).read()
        self.assertEqual(rc, 1, text)
        self.assertRegex(text, r'job \d+: no live worker for 1000 ms \(timeout_ms\): the dispatcher \S+ lists none '
                               r'for it; start sluice-workerd --dispatcher \S+, or wait longer with a larger '
                               r'timeout_ms \(sluice-cat --timeout-ms\)')

    def test_a_worker_that_comes_late_ends_the_wait(self):
        p, err = self.start_cat(['--timeout-ms', '3600000'])
        try:
            wait_for(lambda: 'no live worker for job' in open(err).read(), 'the notice of the wait')
            self.c.add_worker()
            rc = p.wait(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        text = open(err).read()
        self.assertEqual(rc, 0, text)
        self.assertIn('"elements": 100,', text)
        self.assertRegex(text, r'job \d+: a worker serves it now, after \d+ ms with none')


class ShardingOffOverWorkers(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=2)
        cls.c.wait_workers_registered(2)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def test_off_over_two_workers_says_each_element_comes_twice(self):
        rc, _, err = self.c.cat(SPEC, ['--sharding', 'off'], fmt='count')
        self.assertEqual(rc, 0, err)
        self.assertIn('"elements": 200,', err)
        self.assertRegex(err, r'sluice: job \d+ reads with sharding off from 2 workers: each of them reads the '
                              r'whole dataset, so every element comes once per worker \(2 times\); for each '
                              r'element once, use sharding dynamic')

    def test_dynamic_says_nothing_of_it(self):
        rc, _, err = self.c.cat(SPEC, ['--sharding', 'dynamic'], fmt='count')
        self.assertEqual(rc, 0, err)
        self.assertIn('"elements": 100,', err)
        self.assertNotIn('sharding off', err)


if __name__ == '__main__':
    unittest.main()


class Mistakes(unittest.TestCase):
    """What users get wrong first, each named in the message."""

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=1)
        cls.c.wait_workers_registered(1)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def cat(self, dispatcher, spec=SPEC, args=()):
        return self.c.cat(spec, list(args), fmt='count', dispatcher=dispatcher, timeout=120)

    def test_the_admin_port_given_as_the_dispatcher_is_named(self):
        admin = '127.0.0.1:%d' % self.c.dispatcher.admin_port
        rc, _, err = self.cat(admin, args=['--timeout-ms', '3600000'])
        self.assertEqual(rc, 1, err)
        self.assertIn("handshake: %s answered in HTTP: that is an HTTP port, such as a sluice daemon's admin port "
                      "(--admin-port); give its protocol port (--port)" % admin, err)
        # The admin endpoint serves on as before.
        from harness import get_json
        self.assertEqual(get_json(self.c.dispatcher.admin_port, '/healthz')['status'], 'ok')

    def test_a_host_name_that_does_not_resolve_is_said_so(self):
        rc, _, err = self.cat('no-such-host.invalid:5050')
        self.assertEqual(rc, 1, err)
        self.assertIn('cannot resolve the host name "no-such-host.invalid" of "no-such-host.invalid:5050"', err)
        self.assertNotIn('No route to host', err)

    def test_a_grpc_prefix_is_accepted_and_other_schemes_refused(self):
        rc, _, err = self.cat('grpc://' + self.c.dispatcher.addr)
        self.assertEqual(rc, 0, err)
        self.assertIn('"elements": 100,', err)
        rc, _, err = self.cat('http://' + self.c.dispatcher.addr)
        self.assertEqual(rc, 1, err)
        self.assertIn('bad address "http://%s": sluice peers speak their own protocol, not http: give host:port'
                      % self.c.dispatcher.addr, err)

    def test_an_unknown_spec_field_gets_the_closest_known_one(self):
        spec = {"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batchsize": 2}]}
        rc, _, err = self.cat(self.c.dispatcher.addr, spec)
        self.assertEqual(rc, 1, err)
        self.assertIn('$.ops[0].batchsize: unknown field; did you mean "batch_size"?', err)

    def test_a_file_source_without_data_root_names_the_json_path(self):
        spec = {"source": {"type": "tfrecord", "files": ["/nonexistent/x-*.tfrecord"]}}
        rc, _, err = self.cat(self.c.dispatcher.addr, spec)
        self.assertEqual(rc, 1, err)
        self.assertIn("$.source.files: file sources need the dispatcher's --data-root", err)


class FilesOutsideTheRoot(unittest.TestCase):

    def test_a_pattern_that_matches_nothing_names_its_json_path(self):
        root = tempfile.mkdtemp(prefix='sluice-root-')
        c = Cluster(workers=0, dispatcher_args=['--data-root', root])
        try:
            spec = {"source": {"type": "tfrecord", "files": [os.path.join(root, 'a.tfrecord'),
                                                             os.path.join(root, 'x-*.tfrecord')]}}
            open(os.path.join(root, 'a.tfrecord'), 'wb').close()
            rc, _, err = c.cat(spec, fmt='count', timeout=120)
            self.assertEqual(rc, 1, err)
            self.assertIn('$.source.files[1]: %s matches no file, or a file outside every --data-root'
                          % os.path.join(os.path.realpath(root), 'x-*.tfrecord'), err)
        finally:
            self.assertEqual(c.close(), {})
            import shutil
            shutil.rmtree(root, ignore_errors=True)
