"""Starts real sluice daemons on free loopback ports for the integration
tests, runs sluice-cat against them, and cleans up after itself."""
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

BUILD = os.environ.get('SLUICE_BUILD', 'build')
LISTEN = re.compile(r'listening port=(\d+) admin_port=(\d+)')


def child_env():
    """The environment for our own binaries. Under the Python tests of an ASan
    build the interpreter runs with leak checks off (CPython keeps memory
    until exit); the daemons and tools get the original options back."""
    env = dict(os.environ)
    if 'SLUICE_CHILD_ASAN_OPTIONS' in env:
        env['ASAN_OPTIONS'] = env['SLUICE_CHILD_ASAN_OPTIONS']
        env.pop('LD_PRELOAD', None)
    return env


def binary(name):
    for sub in ('dispatcher', 'workerd', 'client', ''):
        p = os.path.join(BUILD, sub, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return os.path.abspath(p)
    raise FileNotFoundError('no %s under %s' % (name, BUILD))


@contextlib.contextmanager
def using_build(build):
    """binary() (and so Cluster) finds build's programs meanwhile (a benchmark
    against an earlier build)."""
    global BUILD
    before, BUILD = BUILD, build
    try:
        yield
    finally:
        BUILD = before


def asan_build():
    """Whether the daemons under test are built with AddressSanitizer (whose
    allocator keeps freed memory in a quarantine: RSS says less there)."""
    with open(binary('sluice-dispatcher'), 'rb') as f:
        return b'__asan_init' in f.read()


class Daemon:
    """A daemon process started on port 0; .port and .admin_port once it listens."""

    def __init__(self, argv, workdir, name, timeout=20):
        self.name = name
        self.out_path = os.path.join(workdir, name + '.out')
        self.err_path = os.path.join(workdir, name + '.err')
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=open(self.out_path, 'w'), stderr=open(self.err_path, 'w'),
                                     stdin=subprocess.DEVNULL, env=child_env())
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = LISTEN.search(open(self.out_path).read())
            if m:
                self.port, self.admin_port = int(m.group(1)), int(m.group(2))
                return
            if self.proc.poll() is not None:
                raise RuntimeError('%s exited with %d before listening: %s' % (name, self.proc.returncode,
                                                                                self.stderr()[-2000:]))
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError('%s printed no listening line within %ds' % (name, timeout))

    @property
    def addr(self):
        return '127.0.0.1:%d' % self.port

    def stderr(self):
        return open(self.err_path).read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self, timeout=20):
        """SIGTERM, and the exit code (0 for a clean shutdown, no leaks under ASan)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return 'hung'
        return self.proc.returncode

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig == signal.SIGKILL:
                self.proc.wait()


class Cluster:
    """A dispatcher and workers in a temporary directory."""

    def __init__(self, workers=0, dispatcher_args=(), worker_args=()):
        self.dir = tempfile.mkdtemp(prefix='sluice-it-')
        self.daemons = []
        self.workers = []
        self.dispatcher = self._start([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0',
                                       '--work-dir', os.path.join(self.dir, 'work')] + list(dispatcher_args),
                                      'dispatcher')
        try:
            for _ in range(workers):
                self.add_worker(worker_args)
        except BaseException:
            self.close()   # no daemon outlives a cluster that could not start
            raise

    def restart_dispatcher(self, sig=signal.SIGKILL, work_dir=None, stopped=None):
        """Stops the dispatcher with sig (-9: a crash) and starts it again on the
        same ports and work dir, as an operator's supervisor would (work_dir:
        on another, empty one: a new dispatcher that knows nothing); stopped(),
        if given, runs in between (an operator's backup or restore)."""
        old = self.dispatcher
        if sig == signal.SIGKILL:
            old.kill()
        else:
            old.stop()
        if stopped:
            stopped()
        argv = list(old.argv)
        argv[argv.index('--port') + 1] = str(old.port)
        argv[argv.index('--admin-port') + 1] = str(old.admin_port)
        if work_dir:
            argv[argv.index('--work-dir') + 1] = work_dir
        self.dispatcher = self._start(argv, 'dispatcher%d' % len(self.daemons))
        return self.dispatcher

    def backup_state(self):
        """An operator's offline backup: stops the dispatcher (SIGTERM), copies
        its state store aside and starts it again; the copy's path."""
        work = self.dispatcher.argv[self.dispatcher.argv.index('--work-dir') + 1]
        backup = os.path.join(self.dir, 'backup.mdb')
        self.restart_dispatcher(signal.SIGTERM, stopped=lambda: shutil.copy(os.path.join(work, 'state.mdb'), backup))
        return backup

    def restore_state(self, backup):
        """An operator's restore: stops the dispatcher (SIGTERM), puts backup
        in place of its state store and starts it again."""
        work = self.dispatcher.argv[self.dispatcher.argv.index('--work-dir') + 1]

        def restore():
            os.unlink(os.path.join(work, 'state.mdb-lock'))
            shutil.copy(backup, os.path.join(work, 'state.mdb'))
        return self.restart_dispatcher(signal.SIGTERM, stopped=restore)

    def restart_worker(self, i, sig=signal.SIGKILL, down=0.0):
        """Stops worker i with sig (-9: a crash), waits `down` seconds, and starts
        it again on the same ports, as a supervisor would."""
        old = self.workers[i]
        if sig == signal.SIGKILL:
            old.kill()
        else:
            old.stop()
        time.sleep(down)
        argv = list(old.argv)
        argv[argv.index('--port') + 1] = str(old.port)
        argv[argv.index('--admin-port') + 1] = str(old.admin_port)
        self.workers[i] = self._start(argv, 'worker%d-%d' % (i, len(self.daemons)))
        return self.workers[i]

    def _start(self, argv, name):
        d = Daemon(argv, self.dir, name)
        self.daemons.append(d)
        return d

    def add_worker(self, extra=()):
        w = self._start([binary('sluice-workerd'), '--dispatcher', self.dispatcher.addr, '--port', '0',
                         '--admin-port', '0'] + list(extra), 'worker%d' % len(self.workers))
        self.workers.append(w)
        return w

    def wait_workers_registered(self, n, timeout=20):
        """Waits until the dispatcher's health endpoint counts n live workers."""
        import urllib.request
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen('http://127.0.0.1:%d/healthz' % self.dispatcher.admin_port,
                                            timeout=2) as r:
                    if json.load(r).get('workers') == n:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError('dispatcher did not see %d workers within %ds' % (n, timeout))

    def spec_file(self, spec):
        fd, path = tempfile.mkstemp(prefix='spec-', suffix='.json', dir=self.dir)
        with os.fdopen(fd, 'w') as f:
            f.write(spec if isinstance(spec, str) else json.dumps(spec))
        return path

    def cat_argv(self, spec, args=(), fmt='jsonl', dispatcher=None):
        return [binary('sluice-cat'), '--dispatcher', dispatcher or self.dispatcher.addr, '--dataset',
                self.spec_file(spec), '--format', fmt] + list(args)

    def cat(self, spec, args=(), fmt='jsonl', timeout=300, dispatcher=None):
        """Runs sluice-cat to the end: (returncode, batches, stderr)."""
        r = subprocess.run(self.cat_argv(spec, args, fmt, dispatcher), capture_output=True, text=True,
                           timeout=timeout, env=child_env())
        return r.returncode, parse_jsonl(r.stdout), r.stderr

    def cat_across_restart(self, spec, args, at_bytes, victim, down=0.0, before=None, timeout=600):
        """Streams spec through sluice-cat (--format raw, args) and, once
        at_bytes were read, calls before() if given, then kills worker
        `victim` with -9 and starts it again on its ports after `down`
        seconds. Reading stops meanwhile. A hang is killed after timeout
        seconds. Returns (returncode, the raw bytes read, stderr)."""
        # stderr to a file: communicate() would read stdout past what its
        # buffered reader already holds.
        err_path = os.path.join(self.dir, 'cat-restart.err')
        with open(err_path, 'wb') as err_file:
            proc = subprocess.Popen(self.cat_argv(spec, args, fmt='raw'), stdout=subprocess.PIPE, stderr=err_file,
                                    env=child_env())
        watchdog = threading.Timer(timeout, proc.kill)  # a hang fails the test rather than the run
        watchdog.start()
        try:
            head = proc.stdout.read(at_bytes)
            if before:
                before()
            self.restart_worker(victim, down=down)
            tail = proc.stdout.read()
            proc.wait(timeout=timeout)
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with open(err_path, 'rb') as f:
            err = f.read().decode(errors='replace')
        return proc.returncode, head + tail, err

    def close(self):
        """Stops every daemon; returns {name: exit code} of those that did not exit 0."""
        bad = {}
        for d in reversed(self.daemons):
            rc = d.stop()
            if rc not in (0, -signal.SIGKILL):
                bad[d.name] = (rc, d.stderr()[-3000:])
        shutil.rmtree(self.dir, ignore_errors=True)
        return bad


class ClusterCase(unittest.TestCase):
    """Tests that share one cluster: `workers` workers (dispatcher_args and
    worker_args for their command lines), started once for the class and
    checked to shut down cleanly after it."""
    workers = 1
    dispatcher_args = ()
    worker_args = ()

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=cls.workers, dispatcher_args=cls.dispatcher_args, worker_args=cls.worker_args)
        try:
            cls.c.wait_workers_registered(cls.workers)
        except BaseException:
            cls.c.close()
            raise

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)


def _ephemeral_low():
    """The lowest port the kernel hands out for bind(0) and connect()."""
    try:
        with open('/proc/sys/net/ipv4/ip_local_port_range') as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    """n loopback ports free right now (for daemons whose address must be known in advance),
    below the kernel's ephemeral range: a port the kernel hands out (another daemon's
    --port 0, a connection's source port) could take one between this call and the daemon's
    bind, as a worker's connection to the dispatcher once took a later worker's port."""
    low = _ephemeral_low()
    lo = 10000 if low > 11000 else 1024
    rng = random.SystemRandom()
    socks, ports = [], []
    try:
        for _ in range(200 * n):
            if len(ports) == n:
                break
            p = rng.randrange(lo, low)
            if p in ports:
                continue
            s = socket.socket()
            try:
                s.bind(('127.0.0.1', p))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(p)
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        raise RuntimeError('no %d free ports below %d' % (n, low))
    return ports


def read_to_close(sock):
    """Everything the peer sends on sock until it closes."""
    got = b''
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def wait_for(pred, what='condition', timeout=60):
    """pred()'s first true value, polled until a generous deadline: a slow
    machine makes a failing test slower, never a passing one fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError('timed out after %ds waiting for %s' % (timeout, what))


def http_request(port, path, method='GET', token=None, body=None, tls=False, timeout=10):
    """An admin request to 127.0.0.1:port: (status, text, content type) of
    its answer, an error status too. token: sent as the bearer token; body:
    text sent with it; tls: over HTTPS without checking the certificate, as
    the kubelet's probes do."""
    import ssl
    import urllib.error
    import urllib.request
    req = urllib.request.Request('%s://127.0.0.1:%d%s' % ('https' if tls else 'http', port, path), method=method,
                                 data=body.encode() if body is not None else None)
    if token:
        req.add_header('Authorization', 'Bearer ' + token)
    ctx = None
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return r.status, r.read().decode(), r.headers.get('Content-Type', '')
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get('Content-Type', '')


def http(port, path, method='GET', token=None, body=None, tls=False):
    """http_request() without the content type: (status, text)."""
    return http_request(port, path, method, token, body, tls)[:2]


def admin_text(port, path, method='GET', token=None, body=None, timeout=10):
    """http_request()'s text of a 2xx answer; an AssertionError naming the
    status and the text of any other."""
    status, text, _ = http_request(port, path, method, token, body, timeout=timeout)
    if not 200 <= status < 300:
        raise AssertionError('%s http://127.0.0.1:%d%s: %d %s' % (method, port, path, status, text[:500]))
    return text


def dump_dom(url):
    """The DOM of url once headless Chromium ran its scripts (about 5 s of
    virtual time): (the DOM as text, Chromium's stderr)."""
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    if chromium is None:
        raise AssertionError('chromium is not installed (scripts/install-deps.sh installs it)')
    profile = tempfile.mkdtemp(prefix='sluice-chromium-')
    try:
        r = subprocess.run([chromium, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
                            '--no-first-run', '--disable-background-networking', '--disable-component-update',
                            '--disable-sync', '--user-data-dir=' + profile, '--virtual-time-budget=5000',
                            '--dump-dom', url], capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return r.stdout, r.stderr


def get_json(admin_port, path, timeout=10):
    """GET http://127.0.0.1:admin_port/path, decoded."""
    return json.loads(admin_text(admin_port, path, timeout=timeout))


def drain_worker(cluster, addr):
    """POST /v1/workers/{addr}/drain to the cluster's dispatcher; its answer, decoded."""
    return json.loads(admin_text(cluster.dispatcher.admin_port, '/v1/workers/%s/drain' % addr, 'POST', body=''))


def metric(admin_port, name, labels='', default=None, token=None):
    """A sample of a daemon's /metrics (labels: 'k="v",...' as printed), default when it has none;
    with token, asked with it as the admin bearer token."""
    text = admin_text(admin_port, '/metrics', token=token)
    m = re.search(r'^%s%s (\S+)$' % (re.escape(name), re.escape('{%s}' % labels if labels else '')), text, re.M)
    return float(m.group(1)) if m else default


def parse_jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def values(batches, key):
    out = []
    for b in batches:
        v = b[key]
        out.extend(v if isinstance(v, list) else [v])
    return out


def cats_values(procs, outs, key, timeout=180):
    """Waits for each sluice-cat of procs, its jsonl on outs[2 i] and its
    stderr on outs[2 i + 1] (files), to exit 0 within timeout seconds:
    every value of key they printed, as ints. AssertionError with the
    stderr of one that failed."""
    got = []
    for i, p in enumerate(procs):
        p.wait(timeout=timeout)
        outs[2 * i + 1].seek(0)
        if p.returncode != 0:
            raise AssertionError('sluice-cat exited with %d: %s' % (p.returncode, outs[2 * i + 1].read()[-2000:]))
        outs[2 * i].seek(0)
        got += [int(v) for b in parse_jsonl(outs[2 * i].read()) for v in b[key]]
    return got


def cats_end(procs, outs):
    """Kills what is left of procs and closes their files outs."""
    for p in procs:
        p.kill()
        p.wait()
    for f in outs:
        f.close()


def stop_until_batches_are_lost(procs, workers):
    """Stops the clients procs (SIGSTOP) at a moment a worker of workers
    holds batches sent to them and not acknowledged, until one lets those go
    after its --hold-timeout-ms (lost_below in its task view), then lets
    them go on. A moment no batch is held is tried again, up to 100 times
    (the job cannot end while they are stopped)."""
    def tasks():
        return [t for w in workers for t in get_json(w.admin_port, '/v1/tasks')['tasks']]
    for _ in range(100):
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        try:
            if any(t['held']['batches'] > 0 for t in tasks()):
                wait_for(lambda: any(t.get('lost_below') is not None for t in tasks()),
                         'a worker to let go of the batches it held for the stopped clients')
                return
        finally:
            for p in procs:
                p.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError('no moment a worker held a batch not acknowledged, in 100 tries')


def cats_with_faults(argv, n, key, faults, where, started=None):
    """Runs n sluice-cat of argv (jsonl) at once, their output and stderr
    read on threads; calls started(procs) once they run, then, for each
    (at, act) of faults in order, act(procs) once they printed `at` batches
    (lines with key) between them, or all ended. Returns (every value of
    key they printed, [(returncode, stderr)] of each); a process still
    running after 300 s is killed."""
    procs, got, lock, batches = [], [], threading.Lock(), [0]
    errs = [[] for _ in range(n)]

    def read(p):
        for line in p.stdout:
            b = json.loads(line)
            if key in b:
                with lock:
                    got.extend(b[key])
                    batches[0] += 1
    try:
        for i in range(n):
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=child_env()))
        threads = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs] + [
            threading.Thread(target=lambda p=p, e=e: e.append(p.stderr.read()), daemon=True)
            for p, e in zip(procs, errs)]
        for t in threads:
            t.start()
        if started:
            started(procs)
        for at, act in faults:
            wait_for(lambda: batches[0] >= at or all(p.poll() is not None for p in procs),
                     '%s: the clients to read %d batches' % (where, at), timeout=300)
            act(procs)
        for p in procs:
            p.wait(timeout=300)
        for t in threads:
            t.join(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return got, [(p.returncode, ''.join(e)) for p, e in zip(procs, errs)]


def summary(stderr):
    for line in reversed(stderr.splitlines()):
        line = line.strip()
        if line.startswith('{') and '"elements"' in line:
            return json.loads(line)
    return None
