"""The OCI image of `make image` under podman, for the integration tests
(test_deploy.py, test_multihost.py; docs/multi-host-tests.md).

image() builds the image once per test run from the build under test
(scripts/make-image.sh, tag localhost/sluice-test:VERSION-PID) and finds how
podman runs it here: plain podman, else `podman --runtime runc` with
deploy/podman/containers.conf, for hosts where crun cannot set rlimits
(docs/operations.md). It answers a Podman, or the reason why the image
cannot run here (no podman, a sanitizer build, the build failed or took
too long, no runtime that runs it). The image is removed at exit; images and
containers of earlier runs whose process is gone are removed by the next
one. Container runs a program of the image in the foreground (the podman
client relays its output and its exit code) and always removes it. Every
podman call is bounded in time."""
import atexit
import os
import re
import shutil
import signal
import subprocess
import time

from netns import _pid_alive

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
REPO = 'localhost/sluice-test'
BUILD_TIMEOUT = 300      # make-image.sh: about 20 s on the 2-core build machine
CMD_TIMEOUT = 120        # any other podman call (a first run sets up podman's storage)


def _last_line(r):
    return ((r.stderr or '') + (r.stdout or '')).strip().splitlines()[-1:] or ['exit %d' % r.returncode]


class Podman:
    """How podman runs the image here: argv (podman and its global options)
    and env (with CONTAINERS_CONF for runc)."""

    def __init__(self, tag, argv, env, user):
        self.tag, self.argv, self.env = tag, argv, env
        self.uid, self.gid = user     # the image's user (numeric), for volumes it must write
        self.ready_s = None           # seconds to build the image and find how to run it

    def __repr__(self):
        return ' '.join(self.argv)

    def call(self, args, timeout=CMD_TIMEOUT, check=False):
        r = subprocess.run(self.argv + list(args), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and r.returncode != 0:
            raise RuntimeError('%s %s failed (%d): %s' % (self, ' '.join(args), r.returncode, _last_line(r)[0]))
        return r

    def remove(self, name):
        """Removes container name, killing it if it runs; no error if it is gone."""
        self.call(['rm', '-f', '--ignore', '-t', '0', name])


def sweep_stale(prefix):
    """Removes the containers named prefix-PID-... of runs whose process is
    gone (a run killed with -9 cleans nothing up)."""
    if not shutil.which('podman'):
        return
    r = subprocess.run(['podman', 'ps', '-a', '--format', '{{.Names}}'], capture_output=True, text=True,
                       timeout=CMD_TIMEOUT)
    for n in r.stdout.split():
        m = re.match(r'%s-(\d+)-' % re.escape(prefix), n)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(['podman', 'rm', '-f', '--ignore', '-t', '0', n], capture_output=True, timeout=CMD_TIMEOUT)


def _sweep_images():
    """Removes the images REPO:...-PID of runs whose process is gone."""
    r = subprocess.run(['podman', 'images', '--format', '{{.Repository}}:{{.Tag}}', REPO], capture_output=True,
                       text=True, timeout=CMD_TIMEOUT)
    for t in r.stdout.split():
        m = re.match(r'.*-(\d+)$', t)
        if m and not _pid_alive(int(m.group(1))):
            subprocess.run(['podman', 'rmi', '-f', t], capture_output=True, timeout=CMD_TIMEOUT)


_images = {}     # build dir: (Podman or None, reason) or the error make-image.sh gave


def image(build, asan):
    """(Podman, None) when the image of build runs here, else (None, why
    not). Built and tried once per process and build; asan: build is a
    sanitizer build, whose programs need the sanitizer runtime (make image
    refuses it). make-image.sh failing is an error (RuntimeError), not a
    reason: the script is broken, not the machine."""
    build = os.path.abspath(build)
    if build not in _images:
        try:
            _images[build] = _make(build, asan)
        except RuntimeError as e:
            _images[build] = e
    if isinstance(_images[build], Exception):
        raise _images[build]
    return _images[build]


def _make(build, asan):
    if not shutil.which('podman'):
        return None, 'podman is not installed (scripts/install-deps.sh installs it)'
    if asan:
        return None, ('%s is a sanitizer build: the image is made from a normal build (its programs would need '
                      'the sanitizer runtime)' % build)
    _sweep_images()
    with open(os.path.join(build, 'CMakeCache.txt')) as f:
        version = re.search(r'CMAKE_PROJECT_VERSION:STATIC=(\S+)', f.read()).group(1)
    tag = '%s:%s-%d' % (REPO, version, os.getpid())
    t0 = time.time()
    # In a session of its own: on a timeout the builder goes with the script.
    p = subprocess.Popen(['bash', os.path.join(ROOT, 'scripts', 'make-image.sh'), build, tag],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        subprocess.run(['podman', 'rmi', '-f', tag], capture_output=True, timeout=CMD_TIMEOUT)
        return None, 'make-image.sh did not build the image within %d s' % BUILD_TIMEOUT
    if p.returncode != 0:
        raise RuntimeError('make-image.sh %s failed: %s' % (build, out.strip()[-1000:]))
    atexit.register(subprocess.run, ['podman', 'rmi', '-f', tag], capture_output=True, timeout=CMD_TIMEOUT)
    r = subprocess.run(['podman', 'image', 'inspect', '--format', '{{.Config.User}}', tag], capture_output=True,
                       text=True, timeout=CMD_TIMEOUT)
    m = re.fullmatch(r'(\d+):(\d+)', r.stdout.strip())
    if not m:
        raise RuntimeError('the image\'s user is not a numeric uid:gid: %r' % r.stdout.strip())
    user = (int(m.group(1)), int(m.group(2)))
    runners = [(['podman'], dict(os.environ))]
    conf = os.path.join(ROOT, 'deploy', 'podman', 'containers.conf')
    if shutil.which('runc'):
        runners.append((['podman', '--runtime', 'runc'], dict(os.environ, CONTAINERS_CONF=conf)))
    reasons = []
    for argv, env in runners:
        p = Podman(tag, argv, env, user)
        try:
            r = p.call(['run', '--rm', tag, 'sluicectl', '--help'])
        except subprocess.TimeoutExpired:
            reasons.append('%s: a trial run did not end within %d s' % (p, CMD_TIMEOUT))
            continue
        if r.returncode == 0 and 'usage: sluicectl' in r.stdout:
            p.ready_s = time.time() - t0
            return p, None
        reasons.append('%s: %s' % (p, _last_line(r)[0]))
    if not shutil.which('runc'):
        reasons.append('runc is not installed (scripts/install-deps.sh installs it)')
    return None, 'podman cannot run the image here: ' + '; '.join(reasons)


class Container:
    """Program args[0] of the image with the rest of args, run by podman in
    the foreground as container name, with run_args (--network, volumes)
    before the image; popen_kw go to subprocess.Popen (stdout, stderr).
    Like a process: .proc is the podman client, which exits with the
    program's exit code; stop() and kill() signal the program itself."""

    def __init__(self, podman, name, args, run_args=(), **popen_kw):
        self.podman, self.name = podman, name
        self.removed = False
        podman.remove(name)     # a container of that name left by an earlier run of this process
        self.proc = subprocess.Popen(podman.argv + ['run', '--rm', '--name', name] + list(run_args) +
                                     [podman.tag] + list(args), env=podman.env, **popen_kw)

    def signal(self, sig):
        self.podman.call(['kill', '--signal', str(int(sig)), self.name])

    def kill(self, timeout=CMD_TIMEOUT):
        """kill -9 of the program; its exit code (137)."""
        self.signal(signal.SIGKILL)
        return self.proc.wait(timeout)

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after timeout; the program's exit code. The
        container is removed whatever happens."""
        try:
            if self.proc.poll() is None:
                # The client passes SIGTERM on to the program (podman run's
                # --sig-proxy), one podman process fewer than podman kill.
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.signal(signal.SIGKILL)
                    try:
                        self.proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        self.proc.kill()     # the client; the container goes with rm -f below
                        self.proc.wait(timeout)
            return self.proc.returncode
        finally:
            if not self.removed:
                self.podman.remove(self.name)
                self.removed = True
