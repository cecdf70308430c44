"""The first paths a Python user walks, against real daemons: a wait on a
job that no worker serves is said (SluiceWaitWarning), bounded by
timeout_ms, and Ctrl-C raises KeyboardInterrupt in next() at once; errors
keep their class, code and message through DataLoader worker processes and
name what was wrong; the torch loaders check their arguments where they
are given (docs/python.md)."""
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import sluice
from harness import Cluster, wait_for

PYTHONPATH = os.path.dirname(os.path.dirname(sluice.__file__))

WAIT_IN_NEXT = r'''
import sys
import sluice
it = sluice.distribute(sluice.range(0, 10).batch(2), sys.argv[1], timeout_ms=3600000)
try:
    next(it)
except KeyboardInterrupt:
    print("KeyboardInterrupt in next()", flush=True)
    it.close()
    sys.exit(3)
print("next() returned", flush=True)
'''


class NoWorker(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=0)
        cls.addr = cls.c.dispatcher.addr

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

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
        self.assertTrue(it.closed)


if __name__ == '__main__':
    unittest.main()
