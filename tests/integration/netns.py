"""Hosts as Linux network namespaces, for the multi-host integration tests
(tests/integration/test_multihost.py; docs/multi-host-tests.md).

A Net is a private network: one namespace holding a bridge, and one
namespace per host, each with a veth into the bridge and its own address from
the benchmarking range 198.18.0.0/15 (RFC 2544), loopback up. Nothing is
created in the root namespace: the machine's own network is untouched, and
every name carries the test process's pid and a counter, so that parallel
runs never collide. Between two hosts the Net makes partitions (nftables
rules in the hosts' namespaces: each drops what comes in from the other's
address, so both directions are cut and each host's own stack sends as usual,
as across a real network whose link broke: the sockets see silence, not
errors) and heals them; on a host it throttles the link
(tc tbf). Processes are started in a host with `ip netns exec`. close()
stops every process it started and deletes every namespace, also after a
failure; a run that was killed before it could clean up is swept away by
the next one (namespaces whose pid is gone).

Every wait is bounded. unavailable() says why the machine cannot run this
(not root, no `ip netns`, no nft, no tc), so the tests can skip with the
reason."""
import atexit
import ctypes
import http.client
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

PREFIX = 'slmh'
NETNS_DIR = '/var/run/netns'
CLONE_NEWNET = 0x40000000
CMD_TIMEOUT = 20
_counter = itertools.count()
_open_nets = set()   # closed at exit too, if a run is interrupted (a run killed with -9: sweep_stale)
_libc = ctypes.CDLL(None, use_errno=True)


def _run(argv, timeout=CMD_TIMEOUT, check=True, input=None):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise RuntimeError('%s failed (%d): %s' % (' '.join(argv), r.returncode, (r.stderr or r.stdout).strip()))
    return r


def _pid_alive(pid):
    """Whether pid runs (a zombie does not: its run was killed)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


def _delete_ns(name):
    """Kills what still runs in namespace name, then deletes it."""
    r = _run(['ip', 'netns', 'pids', name], check=False)
    for p in r.stdout.split():
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _run(['ip', 'netns', 'del', name], check=False)


def sweep_stale():
    """Deletes the namespaces of earlier runs whose process is gone (a run
    killed with -9 cleans nothing up)."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return
    for n in names:
        m = re.match(r'%s-(\d+)-' % PREFIX, n)
        if m and not _pid_alive(int(m.group(1))):
            _delete_ns(n)


_unavailable = None


def unavailable():
    """None when this machine can run multi-host tests, else the reason why not."""
    global _unavailable
    if _unavailable is not None:
        return _unavailable or None
    why = ''
    if os.geteuid() != 0:
        why = 'network namespaces need root (euid %d)' % os.geteuid()
    else:
        for tool in ('ip', 'nft', 'tc'):
            if _run(['sh', '-c', 'command -v %s' % tool], check=False).returncode != 0:
                why = '%s is not installed (scripts/install-deps.sh installs it)' % tool
                break
    if not why:
        probe = '%s-%d-probe%d' % (PREFIX, os.getpid(), next(_counter))
        r = _run(['ip', 'netns', 'add', probe], check=False)
        if r.returncode != 0:
            why = '`ip netns add` fails here: %s' % r.stderr.strip()
        else:
            r = _run(['ip', 'netns', 'exec', probe, 'nft', 'list', 'ruleset'], check=False)
            if r.returncode != 0:
                why = 'nftables does not work in a network namespace here: %s' % r.stderr.strip()
            _delete_ns(probe)
    _unavailable = why
    return why or None


class Proc:
    """A process started in a host (subprocess.Popen underneath)."""

    def __init__(self, host, argv, name, **kw):
        self.host, self.name, self.argv = host, name, argv
        self.proc = subprocess.Popen(['ip', 'netns', 'exec', host.ns] + list(argv), **kw)

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after timeout; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


class Host:
    """One machine: a namespace with an address on the Net's bridge."""

    def __init__(self, net, name, addr):
        self.net, self.name, self.addr = net, name, addr
        self.ns = '%s-%s' % (net.tag, name)
        self.iface = 'eth0'
        self.throttled = False

    def __repr__(self):
        return 'Host(%s %s)' % (self.name, self.addr)

    def exec_argv(self, argv):
        return ['ip', 'netns', 'exec', self.ns] + list(argv)

    def run(self, argv, timeout=CMD_TIMEOUT, check=True, input=None):
        return _run(self.exec_argv(argv), timeout=timeout, check=check, input=input)

    def popen(self, argv, name=None, **kw):
        p = Proc(self, argv, name or os.path.basename(argv[0]), **kw)
        self.net.procs.append(p)
        return p

    def socket(self, family=socket.AF_INET, type=socket.SOCK_STREAM):
        """A socket of this host's namespace, made from this (the test's)
        process: the calling thread enters the namespace for the socket()
        call and goes back at once. What the socket does later happens in
        the namespace it was made in."""
        target = os.open(os.path.join(NETNS_DIR, self.ns), os.O_RDONLY)
        home = os.open('/proc/self/task/%d/ns/net' % threading.get_native_id(), os.O_RDONLY)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), 'setns into %s' % self.ns)
            try:
                return socket.socket(family, type)
            finally:
                if _libc.setns(home, CLONE_NEWNET) != 0:  # never left in the host's namespace
                    os._exit(70)
        finally:
            os.close(target)
            os.close(home)

    def http_get(self, port, path, timeout=5, text=False):
        """GET http://127.0.0.1:port/path inside this host (admin endpoints
        bind loopback), decoded as JSON (text: as text, for /metrics)."""
        s = self.socket()
        s.settimeout(timeout)
        try:
            s.connect(('127.0.0.1', port))
            conn = http.client.HTTPConnection('127.0.0.1', port, timeout=timeout)
            conn.sock = s
            conn.request('GET', path)
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError('GET %s on %s: %d %s' % (path, self.name, r.status, body[:200]))
            return body.decode() if text else json.loads(body)
        finally:
            s.close()

    def throttle(self, rate='100mbit', burst='64kb', latency='50ms'):
        """Limits what this host sends to rate (tc tbf on its interface)."""
        self.run(['tc', 'qdisc', 'add', 'dev', self.iface, 'root', 'tbf', 'rate', rate, 'burst', burst,
                  'latency', latency])
        self.throttled = True

    def unthrottle(self):
        if self.throttled:
            self.run(['tc', 'qdisc', 'del', 'dev', self.iface, 'root'], check=False)
            self.throttled = False

    def tc_stats(self):
        return self.run(['tc', '-s', 'qdisc', 'show', 'dev', self.iface]).stdout


class Net:
    """A bridge namespace and hosts on it. Use as a context manager or call
    close()."""

    def __init__(self, prefixlen=15):
        sweep_stale()
        self.tag = '%s-%d-%d' % (PREFIX, os.getpid(), next(_counter))
        self.prefixlen = prefixlen
        self.hosts = {}
        self.procs = []
        self.cuts = set()
        self.namespaces = []
        self.bridge_ns = self.tag + '-br'
        _open_nets.add(self)
        try:
            self._add_ns(self.bridge_ns)
            _run(['ip', '-n', self.bridge_ns, 'link', 'add', 'br0', 'type', 'bridge'])
            _run(['ip', '-n', self.bridge_ns, 'link', 'set', 'br0', 'up'])
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _add_ns(self, name):
        _run(['ip', 'netns', 'add', name])
        self.namespaces.append(name)
        _run(['ip', '-n', name, 'link', 'set', 'lo', 'up'])

    def add_host(self, name, addr):
        """A host named name (short: it is part of the namespace's name) with
        address addr, reachable from every other host of the Net."""
        h = Host(self, name, addr)
        self._add_ns(h.ns)
        port = 'p%d' % len(self.hosts)
        # Both ends are made in their namespaces directly, never in the root one.
        _run(['ip', '-n', self.bridge_ns, 'link', 'add', port, 'type', 'veth', 'peer', 'name', h.iface,
              'netns', h.ns])
        _run(['ip', '-n', self.bridge_ns, 'link', 'set', port, 'master', 'br0'])
        _run(['ip', '-n', self.bridge_ns, 'link', 'set', port, 'up'])
        _run(['ip', '-n', h.ns, 'addr', 'add', '%s/%d' % (addr, self.prefixlen), 'dev', h.iface])
        _run(['ip', '-n', h.ns, 'link', 'set', h.iface, 'up'])
        # The partition table: a set of peers whose packets are dropped as
        # they come in (netdev ingress: before the stack sees them). Not on
        # the way out: a packet the host's own qdisc layer drops is an error
        # its TCP sees (a connection whose own segments are dropped times out
        # in seconds), where a real partition is silence. Kernels without
        # netdev hooks drop at input instead, which the sender cannot see either.
        rules = ('table netdev sluice_cut {\n set peers { type ipv4_addr; }\n'
                 ' chain in { type filter hook ingress device "%s" priority 0; ip saddr @peers counter drop; }\n}\n'
                 % h.iface)
        h.cut_family = 'netdev'
        if h.run(['nft', '-f', '-'], input=rules, check=False).returncode != 0:
            rules = ('table inet sluice_cut {\n set peers { type ipv4_addr; }\n'
                     ' chain in { type filter hook input priority 0; ip saddr @peers counter drop; }\n}\n')
            h.run(['nft', '-f', '-'], input=rules)
            h.cut_family = 'inet'
        self.hosts[name] = h
        return h

    def wait_reachable(self, timeout=20):
        """Waits until every host reaches every other one (a TCP connect to a
        closed port answers with a reset once the bridge forwards)."""
        deadline = time.time() + timeout
        hosts = list(self.hosts.values())
        for a in hosts:
            for b in hosts:
                if a is b:
                    continue
                while True:
                    s = a.socket()
                    s.settimeout(1)
                    try:
                        s.connect((b.addr, 9))
                        ok = True
                    except ConnectionRefusedError:
                        ok = True
                    except OSError:
                        ok = False
                    finally:
                        s.close()
                    if ok:
                        break
                    if time.time() > deadline:
                        raise RuntimeError('%s cannot reach %s after %ds' % (a, b, timeout))
                    time.sleep(0.05)

    def partition(self, a, b):
        """Cuts a from b both ways: a drops what comes from b, b what comes from a."""
        for x, y in ((a, b), (b, a)):
            x.run(['nft', 'add', 'element', x.cut_family, 'sluice_cut', 'peers', '{ %s }' % y.addr])
        self.cuts.add((a, b))

    def heal(self, a, b):
        for x, y in ((a, b), (b, a)):
            x.run(['nft', 'delete', 'element', x.cut_family, 'sluice_cut', 'peers', '{ %s }' % y.addr])
        self.cuts.discard((a, b))

    def isolate(self, a):
        """Cuts a from every other host of the Net."""
        for b in self.hosts.values():
            if b is not a:
                self.partition(a, b)

    def heal_all(self):
        for a, b in list(self.cuts):
            self.heal(a, b)

    def cut_counters(self, a):
        """nft's view of host a's partition table (for failure messages)."""
        return a.run(['nft', 'list', 'table', a.cut_family, 'sluice_cut'], check=False).stdout

    def dropped(self, a):
        """Packets host a dropped so far as they came in from hosts cut from it."""
        m = re.search(r'counter packets (\d+)', self.cut_counters(a))
        if not m:
            raise RuntimeError('no drop counter in %s' % self.cut_counters(a))
        return int(m.group(1))

    def dropped_between(self, a, b):
        """Packets a cut between a and b dropped so far, on either side: a
        heartbeat in flight when the cut came has its answer dropped on
        the way back, and its sender then sends nothing more until it gives
        up on that answer."""
        return self.dropped(a) + self.dropped(b)

    def close(self):
        """Stops every process started in the Net (SIGTERM, SIGKILL after 10
        s) and deletes every namespace. Returns {name: exit code} of the
        processes that did not exit 0 on SIGTERM."""
        bad = {}
        for p in reversed(self.procs):
            try:
                rc = p.stop()
            except Exception as e:  # keep cleaning up
                rc = repr(e)
            if rc != 0:
                bad[p.name] = rc
        self.procs = []
        for name in reversed(self.namespaces):
            _delete_ns(name)
        self.namespaces = []
        _open_nets.discard(self)
        return bad


@atexit.register
def _close_open_nets():
    for net in list(_open_nets):
        net.close()
