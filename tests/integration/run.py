#!/usr/bin/env python3
"""Runs the integration tests (tests/integration/test_*.py) against one build
directory and ends with the line 'N passed, N failed'. Without -k, the tests
of test_multihost.py run in a second process beside the others (lanes,
suite.py)."""
import argparse
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)

import suite  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('-k', dest='pattern', default=None, help='only tests whose name contains this')
suite.add_lane_args(ap)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)

suite.run(here, args.pattern, 'integration (%s)' % args.build, args.lane, args.lane_result)
