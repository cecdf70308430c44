"""make demo's script end to end: it streams the whole epoch, says so, and
leaves no daemon behind (it once reported a clean stop while its daemons,
started in a subshell, kept running and held the work dir for the next run)."""
import os
import subprocess
import unittest

from harness import BUILD

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def demo_daemons():
    """Pids of sluice daemons the demo started: their output goes to its
    directory (var/demo/NAME.out). Other tests' daemons may run meanwhile
    in this repository's directory (the suite's lanes, suite.py)."""
    found = []
    demo_dir = os.path.join(REPO, 'var', 'demo') + os.sep
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            cmd = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\0')
            out = os.readlink('/proc/%s/fd/1' % pid)
        except OSError:
            continue
        if out.startswith(demo_dir) and cmd and os.path.basename(cmd[0]) in (b'sluice-dispatcher', b'sluice-workerd'):
            found.append(int(pid))
    return found


class Demo(unittest.TestCase):
    def test_demo_twice_streams_everything_and_stops_its_daemons(self):
        self.assertEqual(demo_daemons(), [], 'no demo daemon may run before the test')
        for run in range(2):  # the second run needs the work dir the first one left
            r = subprocess.run(['bash', os.path.join(REPO, 'scripts', 'demo.sh'), os.path.abspath(BUILD)],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, 'run %d: %s%s' % (run, r.stdout[-2000:], r.stderr[-2000:]))
            self.assertIn('demo: 20000000 elements in 19532 batches', r.stdout)
            # The progress line the demo shows is the last one: the whole total.
            self.assertRegex(r.stdout, r'(?m)^20000000 elements, 19532 batches, .*, the end$')
            self.assertIn('demo: dispatcher and workers stopped cleanly', r.stdout)
            self.assertEqual(demo_daemons(), [], 'run %d left daemons running' % run)
