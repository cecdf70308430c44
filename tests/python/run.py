#!/usr/bin/env python3
"""Runs the Python client's tests (tests/python/test_*.py) against one build
directory with Debian's /usr/bin/python3 (NumPy and PyTorch) and ends with
the line 'N passed, N failed'. Exit 1 on any failure.

    /usr/bin/python3 tests/python/run.py --build build [-k NAME]"""
import argparse
import os
import sys


def main():
    # Only as a script: a DataLoader worker started with spawn or
    # forkserver imports this module again (as __mp_main__), and must not
    # run the tests there.
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument('--build', default='build')
    ap.add_argument('-k', dest='pattern', default=None, help='only tests whose name contains this')
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    os.environ['SLUICE_BUILD'] = build
    os.environ['SLUICE_LIB'] = os.path.join(build, 'client', 'libsluice.so')

    def sanitizer_runtime(lib):
        """The path of libasan when lib was built with -fsanitize=address."""
        import re
        import subprocess
        try:
            out = subprocess.run(['ldd', lib], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        m = re.search(r'libasan\.so\S*\s+=>\s+(\S+)', out)
        return m.group(1) if m else None

    # An ASan build of libsluice loads into Python only with the ASan runtime
    # first in the process: run again with it preloaded. Leak checking stays
    # off, as CPython and PyTorch keep memory until exit on purpose.
    asan = sanitizer_runtime(os.environ['SLUICE_LIB']) if os.path.exists(os.environ['SLUICE_LIB']) else None
    if asan and asan not in os.environ.get('LD_PRELOAD', ''):
        os.environ['LD_PRELOAD'] = ' '.join(filter(None, [asan, os.environ.get('LD_PRELOAD')]))
        os.environ['SLUICE_CHILD_ASAN_OPTIONS'] = os.environ.get('ASAN_OPTIONS', '')
        # Last wins among repeated ASan options: detect_leaks=0 goes at the end.
        os.environ['ASAN_OPTIONS'] = ':'.join(filter(None, [os.environ.get('ASAN_OPTIONS'), 'detect_leaks=0']))
        os.environ['SLUICE_SANITIZED'] = '1'
        os.execv(sys.executable, [sys.executable] + sys.argv)

    # The package from the source tree; the daemons' harness and the runner
    # (suite.py) from the integration tests.
    sys.path.insert(0, os.path.join(repo, 'client', 'python'))
    sys.path.insert(0, os.path.join(repo, 'tests', 'integration'))
    sys.path.insert(0, here)

    import suite
    suite.run(here, args.pattern, 'python client (%s)' % args.build)


if __name__ == '__main__':
    main()
