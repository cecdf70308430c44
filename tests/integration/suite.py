"""The test runner both run.py scripts share: discovers the test_*.py of one
directory, keeps the tests whose id contains a pattern, runs them and ends
with the line 'N passed, N failed'.

Lanes. A test module may say `LANE = 'name'`, and a class of it another
one: its tests spend their time waiting on the clock in network namespaces
of their own (test_multihost.py: cuts, leases and outages of fixed length),
so they can run beside the others without sharing a port, a file or much
CPU with them (test_multihost.py fills two such lanes, each about as long
as the tests on loopback take in the normal build). Without a pattern,
run() then runs each lane in a process of its own at the same time (the
script again, with --lane NAME --lane-result FILE): the default lane's
output as it comes, the others' after it, and one total at the end. With a
pattern (-k), everything runs in one process as before."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

DEFAULT_LANE = 'main'


class TimedResult(unittest.TextTestResult):
    """Keeps how long each test took, setUp and tearDown included."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.took = []

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.took.append((time.monotonic() - self._t0, test.id()))


def flatten(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def lane_of(test):
    """The lane its class names (LANE), else the one its module names, else
    the default one. A module that failed to import is the loader's and runs
    in the default lane."""
    lane = getattr(type(test), 'LANE', None)
    return lane or getattr(sys.modules.get(type(test).__module__), 'LANE', DEFAULT_LANE)


def add_lane_args(ap):
    """The options a lane's process is started with (run.py's parsers)."""
    ap.add_argument('--lane', default=None, help='internal: run only this lane\'s tests')
    ap.add_argument('--lane-result', default=None, help='internal: where the lane writes its counts')


def print_slowest(took):
    print('slowest:')
    for t, name in sorted(took, reverse=True)[:10]:
        print('  %6.1f s  %s' % (t, name))


def run(directory, pattern, label, lane=None, lane_result=None):
    """Runs the tests of directory (only those whose id contains pattern,
    unless it is None; only lane's, if given), prints the slowest ten,
    '<label>: S s, K skipped' and 'N passed, N failed', and exits 1 on any
    failure or when no test ran. Without pattern and lane, and with tests
    in more than one lane, runs the lanes side by side (run_lanes())."""
    suite = unittest.defaultTestLoader.discover(directory, pattern='test_*.py', top_level_dir=directory)
    tests = [t for t in flatten(suite) if not pattern or pattern in t.id()]
    lanes = {lane_of(t) for t in tests}
    if lane is None and pattern is None and len(lanes) > 1:
        run_lanes(sorted(lanes, key=lambda x: x != DEFAULT_LANE), label)
    if lane is not None:
        tests = [t for t in tests if lane_of(t) == lane]
        label = '%s, lane %s' % (label, lane)
    t0 = time.time()
    result = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult).run(unittest.TestSuite(tests))
    if not lane_result:
        print_slowest(result.took)  # else the parent's, over all lanes
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    print('%s: %.0f s, %d skipped' % (label, time.time() - t0, skipped))
    if lane_result:
        with open(lane_result, 'w') as f:
            json.dump({'ran': result.testsRun, 'failed': failed, 'skipped': skipped, 'took': result.took}, f)
        sys.exit(0)  # the parent counts and decides
    print('%d passed, %d failed' % (result.testsRun - failed - skipped, failed))
    sys.exit(1 if failed or result.testsRun == 0 else 0)


def run_lanes(lanes, label):
    """Runs each lane in a process of its own (this script again), all at
    once; prints the first lane's output as it comes and each other's when
    it is done, then the slowest ten over all, the total time and counts.
    Exits 1 on any failure, a lane that ran no test, or one that ended
    without its counts (killed, or a crash of the runner)."""
    tmp = tempfile.mkdtemp(prefix='sluice-lanes-')
    t0 = time.time()
    procs = []
    for i, lane in enumerate(lanes):
        result = os.path.join(tmp, lane + '.json')
        log = None if i == 0 else open(os.path.join(tmp, lane + '.log'), 'w+')
        argv = [sys.executable] + sys.argv + ['--lane', lane, '--lane-result', result]
        procs.append((lane, subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT if log else None), result, log))
    ran = failed = skipped = 0
    took, bad = [], []
    for lane, proc, result, log in procs:
        rc = proc.wait()
        sys.stdout.flush()
        if log:
            log.seek(0)
            sys.stdout.write('== lane %s (ran beside lane %s)\n' % (lane, lanes[0]))
            sys.stdout.write(log.read())
            log.close()
        try:
            with open(result) as f:
                r = json.load(f)
        except (OSError, ValueError):
            bad.append('lane %s ended (exit %d) without its counts' % (lane, rc))
            continue
        if r['ran'] == 0:
            bad.append('lane %s ran no test' % lane)
        ran, failed, skipped = ran + r['ran'], failed + r['failed'], skipped + r['skipped']
        took += [tuple(x) for x in r['took']]
    shutil.rmtree(tmp)
    print_slowest(took)
    for b in bad:
        print(b)
    print('%s: %.0f s in %d lanes (%s), %d skipped' % (label, time.time() - t0, len(lanes), ', '.join(lanes), skipped))
    print('%d passed, %d failed' % (ran - failed - skipped, failed + len(bad)))
    sys.exit(1 if failed or bad or ran == 0 else 0)
