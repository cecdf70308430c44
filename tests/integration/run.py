#!/usr/bin/env python3
"""Runs the integration tests (tests/integration/test_*.py) against one build
directory and ends with the line 'N passed, N failed'."""
import argparse
import os
import sys
import time
import unittest

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('-k', dest='pattern', default=None, help='only tests whose name contains this')
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
sys.path.insert(0, here)

suite = unittest.defaultTestLoader.discover(here, pattern='test_*.py', top_level_dir=here)


def flatten(s):
    for t in s:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


tests = [t for t in flatten(suite) if not args.pattern or args.pattern in t.id()]
t0 = time.time()
result = unittest.TextTestRunner(verbosity=2).run(unittest.TestSuite(tests))
failed = len(result.failures) + len(result.errors)
print('integration (%s): %.0f s' % (args.build, time.time() - t0))
print('%d passed, %d failed' % (result.testsRun - failed, failed))
sys.exit(1 if failed or result.testsRun == 0 else 0)
