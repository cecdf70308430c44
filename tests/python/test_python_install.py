"""The package as a user installs it, away from the source tree: the wheel
of scripts/build-wheel.sh (make wheel) carries libsluice, installs with
pip into a virtual environment, and streams a job from real daemons with no
SLUICE_LIB, PYTHONPATH or repository in sight (docs/python.md, Install)."""
import glob
import os
import shutil
import subprocess
import tempfile

from pycase import SluiceCase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STREAM = r'''
import sys
import sluice
print(sluice.library_path())
with sluice.distribute(sluice.range(0, 100000).batch(1000), sys.argv[1]) as it:
    print(sum(int(b["value"].sum()) for b in it))
'''


class Wheel(SluiceCase):
    workers = 1

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix='sluice-wheel-')

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def run_ok(self, argv, **kw):
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)
        self.assertEqual(p.returncode, 0, '%s: %s%s' % (' '.join(argv), p.stdout[-2000:], p.stderr[-3000:]))
        return p.stdout

    def test_the_wheel_installs_into_a_venv_and_streams_a_job(self):
        dist = os.path.join(self.tmp, 'dist')
        self.run_ok(['bash', os.path.join(REPO, 'scripts', 'build-wheel.sh'), os.environ['SLUICE_BUILD'], dist])
        wheels = glob.glob(os.path.join(dist, 'sluice-*-py3-none-linux_*.whl'))
        self.assertEqual(len(wheels), 1, os.listdir(dist))
        # NumPy from the system's packages; pip of the system installs into
        # the venv (--python), offline.
        venv = os.path.join(self.tmp, 'venv')
        self.run_ok(['/usr/bin/python3', '-m', 'venv', '--system-site-packages', '--without-pip', venv])
        python = os.path.join(venv, 'bin', 'python')
        self.run_ok(['/usr/bin/python3', '-m', 'pip', '--python', python, 'install', '--quiet', '--no-deps',
                     '--no-index', wheels[0]])
        env = {k: v for k, v in os.environ.items() if k not in ('SLUICE_LIB', 'PYTHONPATH', 'SLUICE_BUILD')}
        out = self.run_ok([python, '-c', STREAM, self.addr], cwd=self.tmp, env=env).split('\n')
        site = self.run_ok([python, '-c', 'import sysconfig; print(sysconfig.get_paths()["platlib"])'],
                           env=env).strip()
        self.assertEqual(out[0], os.path.join(site, 'sluice', 'libsluice.so'),
                         'the library the wheel carries, loaded from the venv')
        self.assertEqual(int(out[1]), sum(range(100000)))
