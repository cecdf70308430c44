#!/usr/bin/env python3
"""The time from a healed network cut to the next batch, across hosts made
of network namespaces (tests/integration/netns.py): a dispatcher host, a
worker host and a trainer host; the trainer reads a DYNAMIC job as fast as
it can; the dispatcher host is cut from the others for --cut-s seconds, long
enough for the worker to run out of splits and the trainer to starve; then
healed. Measured: from the heal to the trainer's next batch. The baseline in
the same run, on the same healed hosts: a new trainer's first batch (process
start, connect, job, first batch), what any job pays. Prints one JSON line:
the medians over --runs cuts and the ratio heal / baseline (issue 21's goal:
batches again within about 2 s). Needs root and network namespaces; prints a
skip line with the reason otherwise."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'integration'))
ap = argparse.ArgumentParser()
ap.add_argument('--build', default='build')
ap.add_argument('--runs', type=int, default=5)
ap.add_argument('--cut-s', type=float, default=4.0)
args = ap.parse_args()
os.environ['SLUICE_BUILD'] = os.path.abspath(args.build)
import netns  # noqa: E402
from harness import binary, child_env  # noqa: E402

why = netns.unavailable()
if why:
    print(json.dumps({"bench": "heal_to_batch", "skipped": why}))
    sys.exit(0)

DISP, WORKER, TRAINER = '198.18.0.1', '198.18.1.1', '198.18.2.1'
work = subprocess.run(['mktemp', '-d', '/tmp/sluice-heal-XXXXXX'], capture_output=True, text=True).stdout.strip()
token = os.path.join(work, 'token')
with open(token, 'w') as f:
    f.write(os.urandom(32).hex() + '\n')
os.chmod(token, 0o600)
spec = os.path.join(work, 'spec.json')
with open(spec, 'w') as f:
    json.dump({"source": {"type": "range", "stop": 1 << 40}, "ops": [{"op": "batch", "batch_size": 100}]}, f)
small = os.path.join(work, 'small.json')
with open(small, 'w') as f:
    json.dump({"source": {"type": "range", "stop": 10}, "ops": [{"op": "batch", "batch_size": 10}]}, f)


def wait_line(proc, log, pattern, timeout=30):
    """Waits until the daemon's log file holds pattern."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log) as f:
            if pattern in f.read():
                return
        if proc.poll() is not None:
            sys.exit('bench: %s exited: %s' % (proc.args, open(log).read()[-2000:]))
        time.sleep(0.05)
    sys.exit('bench: no "%s" within %ds' % (pattern, timeout))


def log_file(name):
    return open(os.path.join(work, name + '.log'), 'w')


class Reader:
    """Reads the trainer's lines as they come, keeping the time of the last."""

    def __init__(self, proc):
        self.proc, self.last, self.lines = proc, 0.0, 0
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for _ in self.proc.stdout:
            with self.cond:
                self.last = time.monotonic()
                self.lines += 1
                self.cond.notify_all()

    def next_after(self, t, timeout=60):
        """The time of the first line read after monotonic time t."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.last <= t:
                left = deadline - time.monotonic()
                if left <= 0:
                    sys.exit('bench: no batch within %ds of the heal' % timeout)
                self.cond.wait(left)
            return self.last


net = netns.Net()
try:
    d, w, t = net.add_host('disp', DISP), net.add_host('w0', WORKER), net.add_host('t0', TRAINER)
    net.wait_reachable()
    common = ['--auth-token-file', token, '--log-level', 'warn']
    with log_file('dispatcher') as f:
        disp = d.popen([binary('sluice-dispatcher'), '--port', '5050', '--admin-port', '5051', '--work-dir',
                        os.path.join(work, 'state'), '--split-size', '1000'] + common, stdout=f, stderr=f)
    wait_line(disp.proc, os.path.join(work, 'dispatcher.log'), 'listening')
    with log_file('worker') as f:
        worker = w.popen([binary('sluice-workerd'), '--dispatcher', DISP + ':5050', '--port', '5060',
                          '--admin-port', '5061', '--worker-address', WORKER + ':5060', '--buffer-mb', '1'] + common,
                         stdout=f, stderr=f)
    wait_line(worker.proc, os.path.join(work, 'worker.log'), 'listening')
    deadline = time.time() + 30
    while d.http_get(5051, '/healthz').get('workers') != 1:
        if time.time() > deadline:
            sys.exit('bench: the worker did not register')
        time.sleep(0.05)
    cat = [binary('sluice-cat'), '--dispatcher', DISP + ':5050', '--auth-token-file', token]
    trainer = t.popen(cat + ['--dataset', spec, '--sharding', 'dynamic', '--format', 'jsonl', '--timeout-ms', '60000'],
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env())
    reader = Reader(trainer.proc)
    reader.next_after(time.monotonic() - 1)
    heal, fresh, starved = [], [], []
    for _ in range(args.runs):
        time.sleep(0.5)
        net.isolate(d)
        time.sleep(args.cut_s)
        before = reader.last
        healed = time.monotonic()
        net.heal_all()
        heal.append((reader.next_after(healed) - healed) * 1000)
        starved.append(round(healed - before, 2))   # how long the trainer had waited: it did starve
        t0 = time.monotonic()
        p = t.popen(cat + ['--dataset', small, '--sharding', 'dynamic', '--format', 'count'],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env())
        if p.proc.wait(60) != 0:
            sys.exit('bench: the baseline trainer failed')
        fresh.append((time.monotonic() - t0) * 1000)
    h, b = statistics.median(heal), statistics.median(fresh)
    print(json.dumps({
        "bench": "heal_to_batch",
        "heal_to_batch_ms": round(h, 1),
        "baseline": "a new trainer's first batch on the same healed hosts (process start to exit, 10 elements), "
                    "same run",
        "baseline_ms": round(b, 1),
        "ratio": round(h / b, 2),
        "cut_s": args.cut_s,
        "runs": args.runs,
        "heal_ms_each": [round(x) for x in heal],
        "trainer_starved_s_before_each_heal": starved,
    }))
finally:
    net.close()
    subprocess.run(['rm', '-rf', work])
