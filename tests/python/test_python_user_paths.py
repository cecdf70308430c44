"""The first paths a Python user walks, against real daemons: README.md's
Python example as written; a wait on a
job that no worker serves is said (SluiceWaitWarning), bounded by
timeout_ms, and Ctrl-C raises KeyboardInterrupt in next() at once;
next_timeout_ms bounds one next() and leaves the iterator open; errors
keep their class, code and message through DataLoader worker processes and
name what was wrong; the torch loaders check their arguments where they
are given (docs/python.md)."""
import contextlib
import errno
import io
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import unittest
import warnings

import sluice
from sluice import _lib
from harness import wait_for
from pycase import SluiceCase

PYTHONPATH = os.path.dirname(os.path.dirname(sluice.__file__))

WAIT_IN_NEXT = r'''
import signal
import sys
import sluice
# Ctrl-C as a user's process gets it: a test started from a background job
# inherits SIGINT ignored, and Python then installs no handler of its own.
signal.signal(signal.SIGINT, signal.default_int_handler)
it = sluice.distribute(sluice.range(0, 10).batch(2), sys.argv[1], timeout_ms=3600000)
try:
    next(it)
except KeyboardInterrupt:
    print("KeyboardInterrupt in next()", flush=True)
    it.close()
    sys.exit(3)
print("next() returned", flush=True)
'''


class NoWorker(SluiceCase):
    workers = 0

    def test_ctrl_c_raises_keyboard_interrupt_in_next(self):
        err = tempfile.NamedTemporaryFile('w+', dir=self.c.dir, suffix='.err', delete=False)
        p = subprocess.Popen([sys.executable, '-c', WAIT_IN_NEXT, self.addr], stdout=subprocess.PIPE, stderr=err,
                             text=True, env=dict(os.environ, PYTHONPATH=PYTHONPATH))
        try:
            # The warning comes from inside next(): the main thread waits there.
            wait_for(lambda: 'SluiceWaitWarning' in open(err.name).read(), 'the warning of the wait')
            p.send_signal(signal.SIGINT)
            out, _ = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        text = open(err.name).read()
        self.assertEqual(p.returncode, 3, text)
        self.assertEqual(out, 'KeyboardInterrupt in next()\n')
        self.assertRegex(text, r'SluiceWaitWarning: sluice: job \d+ on %s: no live worker for job \d+: the '
                               r'dispatcher \S+ lists none for it \(is a sluice-workerd running with --dispatcher '
                               r'\S+\?\); waiting up to timeout_ms = 3600000 ms' % self.addr)

    def test_the_wait_ends_at_timeout_ms(self):
        it = sluice.distribute(sluice.range(0, 10).batch(2), self.addr, timeout_ms=1000)
        with self.assertRaises(sluice.SluiceTimeoutError) as cm:
            next(it)
        self.assertRegex(str(cm.exception), r'no live worker for 1000 ms \(timeout_ms\)')
        # The context names the job; the message does not say it again.
        self.assertRegex(str(cm.exception), r'^job %d on \S+: no live worker' % it.job_id)
        self.assertTrue(it.closed)


class Readme(SluiceCase):
    """README.md's Python example runs as written against the cluster it
    starts (one worker), and prints what its comment says."""
    workers = 1

    def test_the_readme_python_example_runs_as_written(self):
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'README.md')) as f:
            blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
        self.assertEqual(len(blocks), 1, 'README.md has one Python example')
        code = blocks[0].replace('"127.0.0.1:5050"', repr(self.addr))
        first = re.search(r'# (torch.*)\n', code).group(1)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, 'README.md', 'exec'), {})
        lines = out.getvalue().splitlines()
        self.assertEqual(len(lines), 10, out.getvalue())
        self.assertEqual(re.sub(r'\s+', ' ', lines[0]), re.sub(r'\s+', ' ', first))
        self.assertTrue(all(line.startswith('torch.Size([100]) tensor([') for line in lines), lines)


class SlowBatches(SluiceCase):
    """next_timeout_ms bounds one next(), DataLoader's timeout in ms: past
    it next() raises SluiceTimeoutError and the iterator stays open, and
    what comes after is not lost."""
    workers = 0
    # A worker stopped (SIGSTOP) is not lost meanwhile, however slow the machine.
    dispatcher_args = ('--worker-timeout-ms', '600000')

    def next_or_timeout(self, it):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore', sluice.SluiceWaitWarning)  # the error says it too
                return next(it, None)
        except sluice.SluiceTimeoutError as e:
            self.assertFalse(it.closed)
            return e

    def read_on(self, it, limit=None):
        """The values of the next limit batches (None: to the end), through
        the timeouts a loaded machine may give between two of them (at
        most 2,000 in all: ten minutes)."""
        got, n = [], 0
        for _ in range(2000):
            while limit is None or n < limit:
                b = self.next_or_timeout(it)
                if isinstance(b, sluice.SluiceTimeoutError):
                    break
                if b is None:
                    return got
                got += list(b['value'])
                n += 1
            else:
                return got
        self.fail('2,000 timeouts of next_timeout_ms')

    def test_a_next_that_times_out_leaves_the_iterator_open(self):
        batches = 2000
        it = sluice.distribute(sluice.range(0, batches * 100).batch(100), self.addr, sharding='dynamic',
                               timeout_ms=600000, next_timeout_ms=300)
        got = []
        try:
            # No worker yet: each next() ends in a timeout, and once the
            # iterator knows (after 3 s) the error says what it waits on.
            for _ in range(200):
                e = self.next_or_timeout(it)
                self.assertIsInstance(e, sluice.SluiceTimeoutError)
                if 'no live worker' in str(e):
                    break
            self.assertRegex(str(e), r'^job %d on %s: no batch within next_timeout_ms = 300 ms \(no live worker '
                                     r'for job %d: .*\); the iterator stays open: next\(\) waits again, close\(\) '
                                     r'ends it \[ETIMEDOUT: ' % (it.job_id, self.addr, it.job_id))
            self.assertEqual(e.code, -errno.ETIMEDOUT)
            worker = self.c.add_worker()
            self.c.wait_workers_registered(1)
            got += self.read_on(it, 1)
            # A worker that stops answering: the batches received before
            # come, then a timeout (within as many next() calls as there
            # are batches); its batches after it continues.
            worker.kill(signal.SIGSTOP)
            try:
                for _ in range(batches):
                    b = self.next_or_timeout(it)
                    if isinstance(b, sluice.SluiceTimeoutError):
                        break
                    got += list(b['value'])
                self.assertIsInstance(b, sluice.SluiceTimeoutError)
                self.assertNotIn('no live worker', str(b))
            finally:
                worker.kill(signal.SIGCONT)
            late = len(got)
            got += self.read_on(it)
        finally:
            it.close()
        self.assertLess(late, batches * 100)
        self.assertEqual(sorted(int(v) for v in got), list(range(batches * 100)))


class Errors(SluiceCase):
    workers = 1
    """Errors keep their class, code and message, also through DataLoader
    worker processes."""

    def loader_of(self, spec, workers=1):
        import torch
        import sluice.torch as st
        return torch.utils.data.DataLoader(st.SluiceIterableDataset(spec, self.addr, sharding='off'),
                                           batch_size=None, num_workers=workers)

    def test_a_spec_error_through_dataloader_workers_keeps_its_code(self):
        spec = '{"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batchsize": 2}]}'
        with self.assertRaises(sluice.SpecError) as cm:
            list(self.loader_of(spec))
        e = cm.exception
        self.assertEqual((e.code, e.code_name), (_lib.SL_ESPEC, 'SL_ESPEC'))
        self.assertIn('$.ops[0].batchsize: unknown field; did you mean "batch_size"?', str(e))
        self.assertIn('DataLoader worker process', str(e))
        self.assertEqual(str(e).count('[SL_ESPEC: '), 1, str(e))

    def test_a_file_refusal_through_dataloader_workers_names_the_json_path(self):
        spec = sluice.tfrecord(['/nonexistent/x-*.tfrecord'])
        with self.assertRaises(sluice.SluicePermissionError) as cm:
            list(self.loader_of(spec))
        e = cm.exception
        self.assertIsInstance(e, PermissionError)
        self.assertEqual((e.code, e.errno), (-errno.EACCES, errno.EACCES))
        self.assertIn("$.source.files: file sources need the dispatcher's --data-root", str(e))

    def test_exceptions_pickle_with_their_code(self):
        try:
            sluice.distribute(sluice.range(10), '127.0.0.1:%d' % self.c.dispatcher.admin_port)
        except sluice.SluiceError as e:
            got = pickle.loads(pickle.dumps(e))
        self.assertEqual((type(got), got.code_name), (sluice.SluiceError, 'SL_EPROTO'))
        self.assertIn('answered in HTTP: that is an HTTP port, such as a sluice daemon\'s admin port', str(got))

    def test_a_name_that_does_not_resolve(self):
        with self.assertRaises(sluice.SluiceConnectionError) as cm:
            sluice.distribute(sluice.range(10), 'no-such-host.invalid:5050')
        self.assertEqual(cm.exception.code_name, 'SL_ENOHOST')
        self.assertIn('cannot resolve the host name "no-such-host.invalid"', str(cm.exception))

    def test_a_grpc_prefix_is_accepted(self):
        got = [int(v) for b in sluice.distribute(sluice.range(10).batch(5), 'grpc://' + self.addr)
               for v in b['value']]
        self.assertEqual(sorted(got), list(range(10)))


class LoaderArguments(SluiceCase):
    """The torch loaders check their arguments where they are given."""

    def test_dataloader_arguments_are_refused_with_where_they_go(self):
        import sluice.torch as st
        ds = sluice.range(100).batch(10)
        with self.assertRaisesRegex(TypeError, r'takes no num_workers .*DataLoader\(sluice\.torch\.'
                                               r'SluiceIterableDataset\(.*batch_size=None, num_workers=2\)'):
            st.loader(ds, self.addr, num_workers=2)
        with self.assertRaisesRegex(TypeError, r'takes no batch_size .*ds\.batch\(32\)'):
            st.loader(ds, self.addr, batch_size=32)
        # The window sizes itself: the hint says so, not "max_outstanding=2" (fewer than the default).
        with self.assertRaisesRegex(TypeError, r'takes no prefetch_factor .*window_bytes=.*max_outstanding=N.*'
                                               r'2 batches would be fewer than the default'):
            st.loader(ds, self.addr, prefetch_factor=2)
        with self.assertRaisesRegex(TypeError, r"SluiceIterableDataset got an unexpected argument 'timeut'; "
                                               r"it takes the options of sluice\.distribute\(\): .*timeout_ms"):
            st.SluiceIterableDataset(ds, self.addr, timeut=5)
        with self.assertRaisesRegex(TypeError, r"loader takes no timeout .*give next_timeout_ms=, the longest one "
                                               r"batch is waited for, in milliseconds \(DataLoader's timeout=5 is "
                                               r"in seconds\)"):
            st.loader(ds, self.addr, timeout=5)
        with self.assertRaisesRegex(sluice.InvalidArgumentError, r'next_timeout_ms must be a positive integer, '
                                                                  r'got 0'):
            st.loader(ds, self.addr, next_timeout_ms=0)
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'sharding must be one of'):
            st.loader(ds, self.addr, sharding='dyn')

    def test_a_dataloader_that_batches_again_warns(self):
        import torch
        import sluice.torch as st
        tds = st.SluiceIterableDataset(sluice.range(100).batch(10), self.addr, sharding='dynamic')
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            shapes = {tuple(b['value'].shape) for b in torch.utils.data.DataLoader(tds)}
        self.assertEqual(shapes, {(1, 10)})  # what the warning is about
        said = [str(x.message) for x in w if issubclass(x.category, sluice.SluiceUsageWarning)]
        self.assertEqual(len(said), 1, said)
        self.assertIn('give it batch_size=None', said[0])
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            shapes = {tuple(b['value'].shape) for b in torch.utils.data.DataLoader(tds, batch_size=None)}
        self.assertEqual(shapes, {(10,)})
        self.assertEqual([x for x in w if issubclass(x.category, sluice.SluiceUsageWarning)], [])

    def test_sharding_off_in_dataloader_processes_warns(self):
        import torch
        import sluice.torch as st
        tds = st.SluiceIterableDataset(sluice.range(100).batch(10), self.addr, sharding='off')
        # Forked workers keep this filter: the warning comes back as an error.
        with warnings.catch_warnings():
            warnings.simplefilter('error', sluice.SluiceUsageWarning)
            with self.assertRaisesRegex(sluice.SluiceUsageWarning, r'2 DataLoader worker processes each open a job '
                                                                   r'of their own with sharding "off"'):
                list(torch.utils.data.DataLoader(tds, batch_size=None, num_workers=2))


if __name__ == '__main__':
    unittest.main()
