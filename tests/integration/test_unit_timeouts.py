"""Every unit test that ctest runs has a timeout, so that a hung one fails
`make test` naming it instead of holding the run until CI gives up on it
(Criterion never returns from an assertion whose message is megabytes
long: tests/CMakeLists.txt)."""
import json
import os
import subprocess
import unittest

from harness import BUILD

# What CI allows the whole of `make test`: a test's bound must leave room for the rest.
CI_LIMIT_SECONDS = 90 * 60


class UnitTimeouts(unittest.TestCase):
    def test_every_ctest_test_has_a_timeout_well_within_ci_limit(self):
        r = subprocess.run(['ctest', '--test-dir', os.path.abspath(BUILD), '--show-only=json-v1'],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        tests = json.loads(r.stdout)['tests']
        self.assertGreater(len(tests), 0, 'ctest lists no test in %s' % BUILD)
        for t in tests:
            props = {p['name']: p['value'] for p in t.get('properties', [])}
            self.assertIn('TIMEOUT', props, '%s has no timeout' % t['name'])
            self.assertGreater(props['TIMEOUT'], 0, t['name'])
            self.assertLessEqual(props['TIMEOUT'], CI_LIMIT_SECONDS / 4, t['name'])


if __name__ == '__main__':
    unittest.main()
