"""The test runner both run.py scripts share: discovers the test_*.py of one
directory, keeps the tests whose id contains a pattern, runs them and ends
with the line 'N passed, N failed'."""
import sys
import time
import unittest


def flatten(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def run(directory, pattern, label):
    """Runs the tests of directory (only those whose id contains pattern,
    unless it is None), prints '<label>: S s, K skipped' and 'N passed, N
    failed', and exits 1 on any failure or when no test ran."""
    suite = unittest.defaultTestLoader.discover(directory, pattern='test_*.py', top_level_dir=directory)
    tests = [t for t in flatten(suite) if not pattern or pattern in t.id()]
    t0 = time.time()
    result = unittest.TextTestRunner(verbosity=2).run(unittest.TestSuite(tests))
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    print('%s: %.0f s, %d skipped' % (label, time.time() - t0, skipped))
    print('%d passed, %d failed' % (result.testsRun - failed - skipped, failed))
    sys.exit(1 if failed or result.testsRun == 0 else 0)
