"""The documents against the code, where a machine can tell (issue 13, "the
docs say what the code does"):

- every long option that sluice-dispatcher, sluice-workerd, sluice-cat and
  sluicectl list in --help appears in docs/;
- every byte and run count in docs/protocol.md's limits table is the code's:
  read from the error frames the daemons send when a limit is passed, and,
  for the limits of connections the client library opens, from the source;
- the table sizes the docs give as `max_workers` (N) and the like are the
  defaults in dispatcher/state.c and workerd/worker.c;
- every metric the daemons register is in docs/admin-api.md, and every
  metric there is registered;
- every link from one document to another leads to a file and a heading.

A failure names the document, the row or option, and what the code says."""
import glob
import os
import re
import socket
import struct
import subprocess
import tempfile
import unittest

from harness import BUILD, ClusterCase, Daemon, binary, child_env, read_to_close
from test_wire_errors import HELLO_LEN, decode_error, hello

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
DOCS = os.path.join(ROOT, 'docs')
ROLE_CLIENT, ROLE_WORKER, ROLE_DISPATCHER = 1, 2, 3
TOO_MUCH = 0xFFFFFFFF
LIMIT = re.compile(r'exceeds the limit of (\d+)')


def source(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def docs_text():
    text = {}
    for p in sorted(glob.glob(os.path.join(DOCS, '*.md'))):
        with open(p) as f:
            text[os.path.basename(p)] = f.read()
    return text


def c_int(expr, names=None):
    """The value of a C integer constant expression of the simple kind the
    headers use: (1u << 20), 2 * 1024 * 1024, 16 + 24 * NAME."""
    e = re.sub(r'\b(\d+)[uUlL]+\b', r'\1', expr)
    for name, value in (names or {}).items():
        e = re.sub(r'\b%s\b' % name, str(value), e)
    if not re.fullmatch(r'[\d\s()+*<-]+', e):
        raise AssertionError('not a constant expression this test can read: %r' % expr)
    return int(eval(e))  # digits and + * << ( ) only, checked above


def resolve(expr):
    """c_int() of expr with every NAME in it replaced by its #define from the
    headers of the source folders (include/, common/, protocol/, ...)."""
    names = {}
    for name in set(re.findall(r'\b[A-Z][A-Z0-9_]+\b', expr)):
        for p in sorted(glob.glob(os.path.join(ROOT, '*', '*.h'))):
            with open(p) as f:
                m = re.search(r'^#define %s (.+?)\s*(/\*.*)?$' % name, f.read(), re.M)
            if m:
                names[name] = resolve(m.group(1))
                break
        else:
            raise AssertionError('no #define %s in the headers' % name)
    return c_int(expr, names)


def define(path, name):
    m = re.search(r'^#define %s (.+?)\s*(/\*.*)?$' % name, source(path), re.M)
    if not m:
        raise AssertionError('no #define %s in %s' % (name, path))
    return m.group(1)


def function_body(path, name):
    text = source(path)
    m = re.search(r'^[^\n;]*\b%s\([^)]*\)\s*\{' % name, text, re.M)
    if not m:
        raise AssertionError('no function %s in %s' % (name, path))
    depth, i = 1, m.end()
    while depth:
        depth += {'{': 1, '}': -1}.get(text[i], 0)
        i += 1
    return text[m.end():i]


def refused_limit(sock):
    """Reads until the peer closes and returns the limit its last error frame
    of request id 0 names ("... exceeds the limit of N")."""
    got = read_to_close(sock)
    i, last = 0, None
    if got[:4] == b'SLUC':
        i = HELLO_LEN
    while i + 16 <= len(got):
        t, _, rid, mlen, plen = struct.unpack('>HHIII', got[i:i + 16])
        if t == 1 and rid == 0:
            last = decode_error(got[i + 16:i + 16 + mlen])[1]
        i += 16 + mlen + plen
    if last is None:
        raise AssertionError('no error frame from the peer: %r' % got[:200])
    m = LIMIT.search(last)
    if not m:
        raise AssertionError('the error frame names no limit: %r' % last)
    return int(m.group(1))


def probe_accepting(port, msg_type, msg_len, payload_len):
    """Handshakes as a client with a daemon's protocol port and sends a
    header over a limit: the limit the daemon answers with."""
    s = socket.create_connection(('127.0.0.1', port), timeout=10)
    try:
        s.sendall(hello(ROLE_CLIENT) +
                  struct.pack('>HHIII', msg_type, 0, 1, msg_len, payload_len))
        return refused_limit(s)
    finally:
        s.close()


def probe_worker_to_dispatcher():
    """Plays a dispatcher to a new sluice-workerd and answers its registration
    with a header claiming a payload over any limit: the limit the worker's
    connection to its dispatcher has."""
    ls = socket.socket()
    ls.bind(('127.0.0.1', 0))
    ls.listen(1)
    ls.settimeout(20)
    workdir = tempfile.mkdtemp(prefix='sluice-docs-')
    d = Daemon([binary('sluice-workerd'), '--dispatcher', '127.0.0.1:%d' % ls.getsockname()[1], '--port', '0',
                '--admin-port', '0'], workdir, 'worker')
    try:
        s, _ = ls.accept()
        s.settimeout(20)
        try:
            hs = b''
            while len(hs) < HELLO_LEN:
                hs += s.recv(HELLO_LEN - len(hs))
            s.sendall(hello(ROLE_DISPATCHER))
            head = b''
            while len(head) < 16 or len(head) < 16 + sum(struct.unpack('>II', head[8:16])):
                chunk = s.recv(65536)
                if not chunk:
                    raise AssertionError('sluice-workerd closed before it registered: %s' % d.stderr()[-2000:])
                head += chunk
            rid = struct.unpack('>I', head[4:8])[0]
            s.sendall(struct.pack('>HHIII', 3, 0, rid, 0, TOO_MUCH))  # WORKER_REGISTER_RESP
            return refused_limit(s)
        finally:
            s.close()
    finally:
        ls.close()
        d.stop()
        subprocess.run(['rm', '-rf', workdir])


class Options(unittest.TestCase):
    def test_every_long_option_of_every_help_is_in_the_docs(self):
        text = '\n'.join(docs_text().values())
        missing = []
        for name in ('sluice-dispatcher', 'sluice-workerd', 'sluice-cat', 'sluicectl'):
            r = subprocess.run([binary(name), '--help'], capture_output=True, text=True, timeout=30,
                               env=child_env())
            self.assertEqual(r.returncode, 0, '%s --help: %s' % (name, r.stderr))
            options = sorted(set(re.findall(r'(?<![\w-])--[a-z][a-z0-9-]*', r.stdout + r.stderr)))
            self.assertGreater(len(options), 2, '%s --help lists no options: %r' % (name, r.stdout))
            for o in options:
                if not re.search(r'(?<![\w-])%s(?![\w-])' % re.escape(o), text):
                    missing.append('%s %s' % (name, o))
        self.assertEqual(missing, [], 'options of --help that no file of docs/ mentions')


class ProtocolLimits(ClusterCase):

    def code_limits(self):
        """{row of the table: (the limit, {every byte count the row may state}, {run counts})}."""
        c = self.c
        msg_limit = probe_accepting(c.dispatcher.port, 16, TOO_MUCH, 0)
        self.assertEqual(msg_limit, c_int(define('protocol/frame.h', 'SL_MAX_MESSAGE_LEN')))
        with open(os.path.join(BUILD, 'protocol', 'gen', 'sluice.pb.h')) as f:
            sizes = {m.group(1): int(m.group(2))
                     for m in re.finditer(r'#define sluice_(\w+)_size\s+(\d+)', f.read())}
        largest = max(sizes.values())
        self.largest_name = max(sizes, key=sizes.get)

        # The dispatcher takes 1024 bytes more than the larger of a spec and
        # a position set of its default number of runs (dispatcher/server.c).
        dispatcher = probe_accepting(c.dispatcher.port, 16, 0, TOO_MUCH)
        spec = c_int(define('spec/spec.h', 'SL_SPEC_MAX_BYTES'))
        m = re.search(r'\.max_exclude_runs = ([^,]+),', function_body('dispatcher/state.c', 'sl_dstate_config_init'))
        runs = resolve(m.group(1))
        self.assertGreater(dispatcher - 1024, spec)

        worker_clients = probe_accepting(c.workers[0].port, 18, 0, TOO_MUCH)
        # A worker takes 1024 bytes more than a position set of the most runs
        # a task excludes (workerd/worker.c, workerd/task.h).
        worker_dispatcher = probe_worker_to_dispatcher()
        worker_runs = resolve('SL_TASK_MAX_EXCLUDE_RUNS')

        m = re.search(r'client_limits = \{\.max_payload = ([^}]+)\}', source('client/client.c'))
        client = c_int(m.group(1))
        m = re.search(r'\.max_payload = ([^}]+)\}', function_body('client/iterator.c', 'disp_resolved'))
        iterator_dispatcher = c_int(m.group(1))
        m = re.search(r'\.max_batch_bytes = ([^,]+),', source('client/iterator.c'))
        batch_default = c_int(m.group(1))
        self.assertIn('UINT32_MAX', function_body('client/iterator.c', 'task_resolved'))
        return {
            'message (`msg_len`), every receiver': (msg_limit, {msg_limit, largest}, set()),
            'payload, dispatcher (every connection it accepts)': (dispatcher, {dispatcher, spec, dispatcher - 1024},
                                                                  {runs}),
            'payload, worker, client connections it accepts': (worker_clients, {worker_clients}, set()),
            'payload, worker, its connection to the dispatcher': (worker_dispatcher,
                                                                  {worker_dispatcher, worker_dispatcher - 1024},
                                                                  {worker_runs}),
            'payload, `sl_client_t` (blocking connection to the dispatcher)': (client, {client}, set()),
            "payload, iterator's connection to the dispatcher": (iterator_dispatcher, {iterator_dispatcher}, set()),
            "payload, iterator's connections to workers": (batch_default, {batch_default, 2 ** 32 - 1}, set()),
        }

    def test_the_limits_table_is_the_code(self):
        expected = self.code_limits()
        text = docs_text()['protocol.md']
        section = text.split('\n## Limits\n', 1)[1].split('\n## ', 1)[0]
        rows = {}
        for line in section.splitlines():
            cells = [x.strip() for x in line.strip().strip('|').split('|')]
            if line.startswith('|') and len(cells) == 3 and cells[0] not in ('limit', '---'):
                rows[cells[0]] = cells[1]
        self.assertEqual(sorted(rows), sorted(expected),
                         'the rows of the limits table (a new row needs its value in test_docs.py)')
        units = {'bytes': 1, 'KiB': 1 << 10, 'MiB': 1 << 20}
        for row, value in rows.items():
            limit, allowed_bytes, allowed_runs = expected[row]
            stated = {int(n.replace(',', '')) * units[u]
                      for n, u in re.findall(r'(\d[\d,]*) (bytes|KiB|MiB)\b', value)}
            stated_runs = {int(n.replace(',', '')) for n in re.findall(r'(\d[\d,]*) runs\b', value)}
            self.assertIn(limit, stated, 'docs/protocol.md, limits, "%s": the code says %d bytes: %s'
                          % (row, limit, value))
            self.assertEqual(stated - allowed_bytes, set(), 'docs/protocol.md, limits, "%s": the code says %s: %s'
                             % (row, sorted(allowed_bytes), value))
            self.assertEqual(stated_runs, allowed_runs, 'docs/protocol.md, limits, "%s": %s' % (row, value))
        self.assertIn(self.largest_name, rows['message (`msg_len`), every receiver'])


class TableSizes(unittest.TestCase):
    def test_table_sizes_in_the_docs_are_the_defaults(self):
        code = {}
        for path, init in (('dispatcher/state.c', 'sl_dstate_config_init'), ('workerd/worker.c', 'sl_worker_config_init')):
            for name, expr in re.findall(r'\.(max_\w+) = ([^,/]+),', function_body(path, init)):
                if re.fullmatch(r'[\duU\s()+*<]+', expr):
                    code[name] = c_int(expr)
        for name in ('max_workers', 'max_datasets', 'max_jobs', 'max_clients_per_job', 'max_tasks'):
            self.assertIn(name, code)
        found, wrong = 0, []
        for doc, text in docs_text().items():
            for name, n in re.findall(r'`(max_\w+)` \((\d[\d,]*)\)', text):
                if name in code:
                    found += 1
                    if int(n.replace(',', '')) != code[name]:
                        wrong.append('docs/%s: `%s` (%s), the code has %d' % (doc, name, n, code[name]))
        self.assertGreater(found, 3)
        self.assertEqual(wrong, [])


def anchors(text):
    """The anchors of a document's headings, as GitHub makes them."""
    out = set()
    for m in re.finditer(r'^#{1,6} (.+)$', re.sub(r'```.*?```', '', text, flags=re.S), re.M):
        out.add(re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-'))
    return out


class Links(unittest.TestCase):
    def test_every_link_between_documents_leads_somewhere(self):
        docs = docs_text()
        broken = []
        for name, text in docs.items():
            for link in re.findall(r'\]\(([^)\s]+)\)', re.sub(r'```.*?```', '', text, flags=re.S)):
                if re.match(r'[a-z]+:', link):
                    continue
                path, _, anchor = link.partition('#')
                target = path or name
                if target not in docs:
                    if not os.path.exists(os.path.join(DOCS, path)):
                        broken.append('docs/%s: %s (no such file)' % (name, link))
                    continue
                if anchor and anchor not in anchors(docs[target]):
                    broken.append('docs/%s: %s (no such heading in %s)' % (name, link, target))
        self.assertEqual(broken, [])


class Metrics(unittest.TestCase):
    def test_every_metric_is_documented_and_every_documented_one_exists(self):
        registered = set()
        for d in ('dispatcher', 'workerd', 'pipeline', 'protocol', 'common', 'storage'):
            for p in glob.glob(os.path.join(ROOT, d, '*.c')):
                with open(p) as f:
                    registered |= set(re.findall(r'"(sluice_(?:dispatcher|worker)_[a-z_]+)"', f.read()))
        self.assertGreater(len(registered), 10)
        documented = set(re.findall(r'`(sluice_(?:dispatcher|worker)_[a-z_]+)', docs_text()['admin-api.md']))
        self.assertEqual(sorted(registered - documented), [], 'metrics missing from docs/admin-api.md')
        self.assertEqual(sorted(documented - registered), [], 'metrics in docs/admin-api.md the code does not have')


if __name__ == '__main__':
    unittest.main()
