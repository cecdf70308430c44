"""The deployment files against the daemons they start (docs/operations.md):

- deploy/k8s: the base and the local-workers overlay, rendered with `kubectl
  kustomize`: every object has what its kind requires, names resolve
  (selectors, Services, Secrets, volumes, the autoscaler's target), the
  images are the tag `make image` builds, Service ports are container ports
  and the daemons' --port/--admin-port, probes ask /healthz and /readyz on
  the admin port, the worker's memory budget is half its limit; then the real
  daemons run with the manifests' arguments (files of the Secret made here,
  ports free ones) and serve sluice-cat with the token and TLS, their probes
  answer, the autoscaler's metric is one the worker exports, and each
  placeholder secret in the repository stops a daemon at start;
- deploy/systemd: `systemd-analyze verify` on both units (and with the TLS
  drop-in) with the build's binaries, their hardening, LimitNOFILE against
  --max-connections, and the daemons run with the units' command lines;
- the image: `make image`'s script builds it, and the dispatcher and a worker
  run from it serve sluice-cat;
- a backup: a copy of a serving dispatcher's state store made with mdb_copy
  starts a dispatcher with the same state.

Each part is skipped, with the reason, where this machine lacks the tool
(kubectl, systemd-analyze, podman, or a podman that can run containers,
mdb_copy)."""
import base64
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import unittest

import oci
from harness import Cluster, Daemon, asan_build, binary, child_env, free_ports, get_json, http, parse_jsonl, wait_for
from test_security_auth import make_cert

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
K8S = os.path.join(ROOT, 'deploy', 'k8s')
SYSTEMD = os.path.join(ROOT, 'deploy', 'systemd')
DAEMONS = ('sluice-dispatcher', 'sluice-workerd')
WORKLOADS = ('StatefulSet', 'Deployment', 'DaemonSet')
SPEC = '{"source": {"type": "range", "stop": 5000}, "ops": [{"op": "batch", "batch_size": 500}]}'
TOKEN, ADMIN_TOKEN = 'k' * 32, 'a' * 32


def project_version():
    with open(os.path.join(ROOT, 'CMakeLists.txt')) as f:
        return re.search(r'project\(sluice VERSION ([0-9.]+)', f.read()).group(1)


def help_options(program):
    """{option: takes a value} from the program's --help: an option followed
    by one space and an upper-case word (or a|b) takes one."""
    out = subprocess.run([binary(program), '--help'], capture_output=True, text=True, env=child_env()).stdout
    opts = {}
    for m in re.finditer(r'(--[a-z][a-z0-9-]*)( (?=[A-Z]|\S*\|)\S+)?', out):
        opts.setdefault(m.group(1), bool(m.group(2)))
    return opts


def parse_flags(program, args):
    """[(option, value or None)] of args, checked against the program's
    --help: every option is one it lists, with a value when it takes one."""
    known = help_options(program)
    flags, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith('--'):
            raise AssertionError('%s: %r is not an option' % (program, a))
        name, eq, value = a.partition('=')
        if name not in known:
            raise AssertionError('%s does not take %s (its --help lists %s)' % (program, name, sorted(known)))
        if known[name] and not eq:
            if i + 1 >= len(args):
                raise AssertionError('%s %s needs a value' % (program, name))
            value, i = args[i + 1], i + 1
        elif not known[name] and eq:
            raise AssertionError('%s %s takes no value' % (program, name))
        flags.append((name, value if known[name] else None))
        i += 1
    return flags


def flag(flags, name):
    values = [v for n, v in flags if n == name]
    return values[-1] if values else None


def quantity(q):
    """A Kubernetes quantity as a number (bytes, cores)."""
    q = str(q)
    units = {'Ki': 2**10, 'Mi': 2**20, 'Gi': 2**30, 'Ti': 2**40, 'm': 1e-3, 'k': 1e3, 'M': 1e6, 'G': 1e9}
    for u, f in units.items():
        if q.endswith(u):
            return float(q[:-len(u)]) * f
    return float(q)


def make_secrets(directory):
    """Real files for every key of the Secret: tokens and a CA-signed certificate."""
    os.makedirs(directory, exist_ok=True)
    tls = make_cert(directory, 'ca', 'node')
    files = {}
    for key, made in (('tls.crt', tls[1]), ('tls.key', tls[3]), ('ca.crt', tls[5])):
        files[key] = os.path.join(directory, key)
        os.rename(made, files[key])
    for key, token in (('auth-token', TOKEN), ('admin-token', ADMIN_TOKEN)):
        files[key] = os.path.join(directory, key)
        with open(files[key], 'w') as f:
            f.write(token + '\n')
        os.chmod(files[key], 0o600)
    return files


def cat(dispatcher, secrets, expect_elements=5000):
    """sluice-cat through dispatcher with the cluster token and TLS; checks every element came."""
    with tempfile.NamedTemporaryFile('w', suffix='.json') as spec:
        spec.write(SPEC)
        spec.flush()
        r = subprocess.run([binary('sluice-cat'), '--dispatcher', dispatcher, '--dataset', spec.name,
                            '--sharding', 'dynamic', '--format', 'count', '--auth-token-file', secrets['auth-token'],
                            '--tls-cert', secrets['tls.crt'], '--tls-key', secrets['tls.key'],
                            '--tls-ca', secrets['ca.crt']], capture_output=True, text=True, timeout=120,
                           env=child_env())
    assert r.returncode == 0, 'sluice-cat failed: %s' % r.stderr
    assert parse_jsonl(r.stderr.strip().splitlines()[-1])[0]['elements'] == expect_elements, r.stderr


def render(path):
    if not shutil.which('kubectl'):
        raise unittest.SkipTest('kubectl is not installed: deploy/k8s is not rendered')
    try:
        import yaml
    except ImportError:
        raise unittest.SkipTest('PyYAML (python3-yaml) is not installed for %s' % os.sys.executable)
    r = subprocess.run(['kubectl', 'kustomize', path], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError('kubectl kustomize %s failed: %s' % (path, r.stderr))
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def containers(objs):
    """(workload, pod spec, container) of every workload's containers."""
    for o in objs:
        if o['kind'] in WORKLOADS:
            pod = o['spec']['template']['spec']
            for c in pod['containers']:
                yield o, pod, c


class Kubernetes(unittest.TestCase):
    renders = {}

    @classmethod
    def setUpClass(cls):
        cls.renders = {'base': render(K8S), 'local-workers': render(os.path.join(K8S, 'overlays', 'local-workers'))}
        cls.base_direct = render(os.path.join(K8S, 'base'))

    def test_deploy_k8s_renders_the_base(self):
        strip = lambda objs: sorted((o['kind'], o['metadata']['name']) for o in objs)
        self.assertEqual(strip(self.renders['base']), strip(self.base_direct))
        kinds = {(o['kind'], o['metadata']['name']) for o in self.renders['base']}
        for want in (('StatefulSet', 'sluice-dispatcher'), ('Service', 'sluice-dispatcher'),
                     ('Deployment', 'sluice-worker'), ('Service', 'sluice-worker'),
                     ('HorizontalPodAutoscaler', 'sluice-worker')):
            self.assertIn(want, kinds)
        overlay = {(o['kind'], o['metadata']['name']) for o in self.renders['local-workers']}
        self.assertIn(('DaemonSet', 'sluice-worker'), overlay)
        self.assertNotIn(('Deployment', 'sluice-worker'), overlay)
        self.assertNotIn(('HorizontalPodAutoscaler', 'sluice-worker'), overlay)

    def test_every_object_has_what_its_kind_requires(self):
        for name, objs in self.renders.items():
            with self.subTest(render=name):
                by_kind = {}
                for o in objs:
                    for key in ('apiVersion', 'kind', 'metadata'):
                        self.assertIn(key, o)
                    self.assertRegex(o['metadata'].get('name', ''), r'^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$')
                    by_kind.setdefault(o['kind'], {})[o['metadata']['name']] = o
                pods = [(o, pod) for o, pod, _ in containers(objs)]
                for o in objs:
                    kind, name, spec = o['kind'], o['metadata']['name'], o.get('spec', {})
                    where = '%s/%s' % (kind, name)
                    if kind in WORKLOADS:
                        self.assertEqual(o['apiVersion'], 'apps/v1', where)
                        sel = spec['selector']['matchLabels']
                        labels = spec['template']['metadata']['labels']
                        self.assertTrue(sel and all(labels.get(k) == v for k, v in sel.items()),
                                        '%s: the selector %s does not select its pods %s' % (where, sel, labels))
                        pod = spec['template']['spec']
                        self.assertTrue(pod['containers'], where)
                        claims = {t['metadata']['name'] for t in spec.get('volumeClaimTemplates', [])}
                        volumes = {v['name']: v for v in pod.get('volumes', [])}
                        for c in pod['containers']:
                            self.assertTrue(c.get('name') and c.get('image'), where)
                            names = [p['name'] for p in c.get('ports', [])]
                            self.assertEqual(len(names), len(set(names)), where)
                            self.assertTrue(all(len(n) <= 15 for n in names), where)
                            for m in c.get('volumeMounts', []):
                                self.assertTrue(m['name'] in volumes or m['name'] in claims,
                                                '%s mounts %s, which is no volume' % (where, m['name']))
                            res = c.get('resources', {})
                            self.assertIn('limits', res, '%s: %s has no resource limits' % (where, c['name']))
                            for r in ('cpu', 'memory'):
                                self.assertLessEqual(quantity(res['requests'][r]), quantity(res['limits'][r]), where)
                        for v in volumes.values():
                            if 'secret' in v:
                                self.assertIn(v['secret']['secretName'], by_kind.get('Secret', {}),
                                              '%s: volume %s names a Secret that is not rendered' % (where, v['name']))
                            if 'persistentVolumeClaim' in v:
                                self.assertIn(v['persistentVolumeClaim']['claimName'],
                                              by_kind.get('PersistentVolumeClaim', {}), where)
                        self.assertTrue(pod['securityContext']['runAsNonRoot'], where)
                    if kind == 'StatefulSet':
                        svc = by_kind['Service'].get(spec['serviceName'])
                        self.assertIsNotNone(svc, '%s: serviceName names no Service' % where)
                        self.assertEqual(svc['spec'].get('clusterIP'), 'None', '%s: its Service is not headless' % where)
                        for t in spec['volumeClaimTemplates']:
                            self.assertTrue(t['spec']['accessModes'], where)
                            self.assertGreater(quantity(t['spec']['resources']['requests']['storage']), 0, where)
                    if kind == 'Service':
                        self.assertEqual(o['apiVersion'], 'v1')
                        self.assertTrue(spec['ports'], where)
                        chosen = [(w, pod) for w, pod in pods
                                  if all(w['spec']['template']['metadata']['labels'].get(k) == v
                                         for k, v in spec['selector'].items())]
                        self.assertTrue(chosen, '%s selects no pods' % where)
                        for p in spec['ports']:
                            self.assertIsInstance(p['port'], int, where)
                            for w, pod in chosen:
                                cports = {cp['name']: cp['containerPort'] for c in pod['containers']
                                          for cp in c.get('ports', [])}
                                target = p.get('targetPort', p['port'])
                                self.assertTrue(target in cports or target in cports.values(),
                                                '%s port %s: no container port %s in %s' % (where, p['name'], target,
                                                                                            w['metadata']['name']))
                                self.assertEqual(cports.get(target, target), p['port'],
                                                 '%s port %s: the Service and container ports differ' % (where, p['name']))
                    if kind == 'Secret':
                        self.assertTrue(o.get('data') or o.get('stringData'), where)
                    if kind == 'HorizontalPodAutoscaler':
                        self.assertEqual(o['apiVersion'], 'autoscaling/v2')
                        ref = spec['scaleTargetRef']
                        self.assertIn(ref['name'], by_kind.get(ref['kind'], {}), '%s scales nothing rendered' % where)
                        self.assertLessEqual(spec.get('minReplicas', 1), spec['maxReplicas'])
                        self.assertTrue(spec['metrics'], where)

    def test_images_are_the_tag_make_image_builds(self):
        for name, objs in self.renders.items():
            with self.subTest(render=name):
                for o, _, c in containers(objs):
                    self.assertEqual(c['image'], 'sluice:' + project_version(),
                                     '%s/%s: make image builds sluice:%s' % (o['kind'], o['metadata']['name'],
                                                                             project_version()))

    def test_ports_and_probes_are_the_daemons(self):
        for name, objs in self.renders.items():
            with self.subTest(render=name):
                services = {o['metadata']['name']: o for o in objs if o['kind'] == 'Service'}
                for o, pod, c in containers(objs):
                    where = '%s/%s' % (o['kind'], o['metadata']['name'])
                    program = c['args'][0]
                    self.assertIn(program, DAEMONS, where)
                    flags = parse_flags(program, c['args'][1:])
                    cports = {p['name']: p['containerPort'] for p in c['ports']}
                    self.assertEqual(cports['protocol'], int(flag(flags, '--port')), where)
                    self.assertEqual(cports['admin'], int(flag(flags, '--admin-port')), where)
                    if pod.get('hostNetwork'):
                        self.assertTrue(all(p.get('hostPort', p['containerPort']) == p['containerPort']
                                            for p in c['ports']), where)
                    admin_bind = flag(flags, '--admin-bind')
                    self.assertTrue(admin_bind and not admin_bind.startswith('127.'),
                                    '%s: the kubelet cannot probe an admin port on loopback' % where)
                    self.assertTrue(flag(flags, '--admin-token-file'), '%s: an admin port off loopback needs a token' % where)
                    self.assertTrue(flag(flags, '--admin-tls-cert') and flag(flags, '--admin-tls-key'),
                                    '%s: an admin token off loopback must not cross in the clear' % where)
                    probes = {k: c.get(k) for k in ('livenessProbe', 'readinessProbe')}
                    self.assertEqual(probes['livenessProbe']['httpGet']['path'], '/healthz', where)
                    self.assertEqual(probes['readinessProbe']['httpGet']['path'], '/readyz', where)
                    for k, p in list(probes.items()) + [('startupProbe', c.get('startupProbe'))]:
                        if p:
                            self.assertEqual(cports.get(p['httpGet']['port'], p['httpGet']['port']), cports['admin'],
                                             '%s: %s is not on the admin port' % (where, k))
                            self.assertEqual(p['httpGet'].get('scheme'), 'HTTPS', '%s: %s: the admin port speaks HTTPS'
                                             % (where, k))
                    if program == 'sluice-workerd':
                        host, _, port = flag(flags, '--dispatcher').rpartition(':')
                        self.assertIn(host, services, '%s: --dispatcher names no Service' % where)
                        self.assertIn(int(port), [p['port'] for p in services[host]['spec']['ports']
                                                  if p['name'] == 'protocol'], where)
                        self.assertTrue(flag(flags, '--worker-address').endswith(':%d' % cports['protocol']), where)
                        self.assertTrue(services[host]['spec'].get('publishNotReadyAddresses'),
                                        'workers must find a dispatcher that is not ready before they register')

    def test_the_worker_memory_budget_is_half_its_limit(self):
        for name, objs in self.renders.items():
            with self.subTest(render=name):
                for o, _, c in containers(objs):
                    if c['args'][0] != 'sluice-workerd':
                        continue
                    budget = int(flag(parse_flags('sluice-workerd', c['args'][1:]), '--max-memory-mb'))
                    limit = quantity(c['resources']['limits']['memory']) / 2**20
                    self.assertEqual(budget, limit / 2, '%s: --max-memory-mb %d, limits.memory %d MiB'
                                     % (o['kind'], budget, limit))

    def test_the_daemons_serve_with_the_manifests_arguments(self):
        """The dispatcher of the base and the workers of the base and the
        overlay, run with their manifests' arguments, serve sluice-cat with
        the token and TLS; their probes answer 200; the admin token guards
        /metrics, where the autoscaler's metric is."""
        base = self.renders['base']
        hpa = [o for o in base if o['kind'] == 'HorizontalPodAutoscaler'][0]
        pods = {o['kind']: (o, pod, c) for o, pod, c in containers(base)}
        pods['DaemonSet'] = [x for x in containers(self.renders['local-workers']) if x[0]['kind'] == 'DaemonSet'][0]
        d = tempfile.mkdtemp(prefix='sluice-deploy-')
        self.addCleanup(shutil.rmtree, d, True)
        secrets = make_secrets(os.path.join(d, 'secrets'))
        secret = [o for o in base if o['kind'] == 'Secret'][0]
        self.assertEqual(set(secret['data']), set(secrets), 'the Secret\'s keys')
        started = []

        def stop_all():
            bad = {x.name: x.stop() for x in started}
            self.assertEqual([n for n, rc in bad.items() if rc != 0], [], 'daemons that did not exit 0')
        self.addCleanup(stop_all)

        disp = self.start(pods['StatefulSet'], d, secrets, None, started)
        workers = [self.start(pods[k], d, secrets, disp, started) for k in ('Deployment', 'DaemonSet')]
        for x, (_, _, c) in zip([disp] + workers, [pods['StatefulSet'], pods['Deployment'], pods['DaemonSet']]):
            self.assertEqual(http(x.admin_port, c['livenessProbe']['httpGet']['path'], tls=True)[0], 200, x.name)
            wait_for(lambda: http(x.admin_port, c['readinessProbe']['httpGet']['path'], tls=True)[0] == 200,
                     '%s to be ready' % x.name, timeout=30)
        cat(disp.addr, secrets)
        self.assertEqual(http(workers[0].admin_port, '/metrics', tls=True)[0], 401, 'the admin token guards /metrics')
        status, text = http(workers[0].admin_port, '/metrics', token=ADMIN_TOKEN, tls=True)
        self.assertEqual(status, 200)
        for m in hpa['spec']['metrics']:
            if m['type'] == 'Pods':
                name = m['pods']['metric']['name']
                self.assertTrue(name.endswith('_per_second'), name)
                series = name[:-len('_per_second')] + '_sum'
                self.assertRegex(text, r'(?m)^%s ' % series, 'the worker exports no %s' % series)

    def start(self, workload, d, secrets, dispatcher, started):
        """The daemon of a manifest's container, run with its arguments: env
        references filled in (addresses 127.0.0.1), the Secret's files made
        here, other volumes temporary directories, ports free ones, an admin
        address off loopback made 127.0.0.1."""
        o, pod, c = workload
        name = '%s-%s' % (o['kind'].lower(), c['name'])
        env = {}
        for e in c.get('env', []):
            src = e['valueFrom']
            if 'fieldRef' in src:
                self.assertIn(src['fieldRef']['fieldPath'], ('status.podIP', 'status.hostIP'))
                env[e['name']] = '127.0.0.1'
            else:
                ref = src['resourceFieldRef']
                env[e['name']] = str(math.ceil(quantity(c['resources'][ref['resource'].split('.')[0]]
                                                        [ref['resource'].split('.')[1]]) / quantity(ref['divisor'])))
        args = [re.sub(r'\$\((\w+)\)', lambda m: env[m.group(1)], a) for a in c['args']]
        self.assertFalse([a for a in args if '$(' in a], 'arguments with an unknown env reference')
        volumes = {v['name']: v for v in pod.get('volumes', [])}
        mounts = {}
        for m in c.get('volumeMounts', []):
            v = volumes.get(m['name'], {})
            if 'secret' in v:
                mounts[m['mountPath']] = os.path.dirname(secrets['auth-token'])
            else:
                mounts[m['mountPath']] = os.path.join(d, name, m['name'])
                os.makedirs(mounts[m['mountPath']], exist_ok=True)
        port, = free_ports(1)
        out = []
        for n, v in parse_flags(args[0], args[1:]):
            if v is not None:
                given = v
                for path, local in mounts.items():
                    if v.startswith(path + '/') or v == path:
                        v = local + v[len(path):]
                if n == '--port':
                    v = str(port)
                elif n == '--admin-port':
                    v = '0'
                elif n == '--worker-address':
                    v = '127.0.0.1:%d' % port
                elif n == '--dispatcher':
                    v = dispatcher.addr
                elif n in ('--admin-bind', '--bind') and not v.startswith('127.'):
                    v = '127.0.0.1'
                elif v.startswith('/') and v == given:
                    raise AssertionError('%s %s %s: a path on no volume of the pod' % (name, n, v))
            out += [n] if v is None else [n, v]
        x = Daemon([binary(args[0])] + out, d, name)
        started.append(x)
        return x

    def test_the_placeholder_secrets_stop_the_daemons(self):
        """Each file of deploy/k8s/base/secrets, given in place of a real one,
        stops the dispatcher at start with exit code 1 and the file's name."""
        secret = [o for o in self.renders['base'] if o['kind'] == 'Secret'][0]
        d = tempfile.mkdtemp(prefix='sluice-deploy-')
        self.addCleanup(shutil.rmtree, d, True)
        real = make_secrets(os.path.join(d, 'real'))
        for key, data in sorted(secret['data'].items()):
            with self.subTest(key=key):
                files = dict(real)
                files[key] = os.path.join(d, 'placeholder-' + key)
                with open(files[key], 'wb') as f:
                    f.write(base64.b64decode(data))
                r = subprocess.run([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir',
                                    os.path.join(d, 'work-' + key), '--auth-token-file', files['auth-token'],
                                    '--admin-token-file', files['admin-token'], '--tls-cert', files['tls.crt'],
                                    '--tls-key', files['tls.key'], '--tls-ca', files['ca.crt']],
                                   capture_output=True, text=True, timeout=30, env=child_env())
                self.assertEqual(r.returncode, 1, 'the placeholder %s was accepted: %s' % (key, r.stdout + r.stderr))
                self.assertIn(files[key], r.stderr)

    def test_an_overlay_replaces_the_secret_as_the_readme_says(self):
        d = tempfile.mkdtemp(prefix='sluice-deploy-')
        self.addCleanup(shutil.rmtree, d, True)
        os.makedirs(os.path.join(d, 'secrets'))
        keys = ('auth-token', 'admin-token', 'tls.crt', 'tls.key', 'ca.crt')
        for k in keys:
            with open(os.path.join(d, 'secrets', k), 'w') as f:
                f.write('value of %s\n' % k)
        with open(os.path.join(d, 'kustomization.yaml'), 'w') as f:
            f.write('resources:\n  - %s\nsecretGenerator:\n  - name: sluice-secrets\n    behavior: replace\n'
                    '    files:\n%s' % (os.path.relpath(os.path.join(K8S, 'base'), d),
                                       ''.join('      - %s=secrets/%s\n' % (k, k) for k in keys)))
        objs = render(d)
        secret = [o for o in objs if o['kind'] == 'Secret'][0]
        self.assertEqual({k: base64.b64decode(v).decode() for k, v in secret['data'].items()},
                         {k: 'value of %s\n' % k for k in keys})
        for o, pod, _ in containers(objs):
            names = {v['secret']['secretName'] for v in pod['volumes'] if 'secret' in v}
            self.assertEqual(names, {secret['metadata']['name']}, o['metadata']['name'])


def unit_file(path):
    """{key: [values]} of a unit file's [Service] section (and the others')."""
    keys = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith(('#', '[')):
                k, _, v = line.partition('=')
                keys.setdefault(k, []).append(v)
    return keys


class Systemd(unittest.TestCase):
    UNITS = {'sluice-dispatcher': 'sluice-dispatcher.service', 'sluice-workerd': 'sluice-workerd.service'}

    @classmethod
    def setUpClass(cls):
        if not shutil.which('systemd-analyze'):
            raise unittest.SkipTest('systemd-analyze is not installed: deploy/systemd is not verified')
        cls.dir = tempfile.mkdtemp(prefix='sluice-units-')
        cls.units = {}
        for program, unit in cls.UNITS.items():
            with open(os.path.join(SYSTEMD, unit)) as f:
                text = f.read()
            assert '/usr/local/bin/%s ' % program in text
            text = text.replace('/usr/local/bin/%s ' % program, binary(program) + ' ')
            cls.units[program] = os.path.join(cls.dir, unit)
            with open(cls.units[program], 'w') as f:
                f.write(text)
            with open(os.path.join(SYSTEMD, 'tls.conf')) as f:
                with open(os.path.join(cls.dir, 'tls-' + unit), 'w') as g:
                    g.write(text + f.read())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def verify(self, path):
        r = subprocess.run(['systemd-analyze', 'verify', '--man=no', path], capture_output=True, text=True,
                           timeout=60, cwd=self.dir)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ''), 'systemd-analyze verify %s' % path)

    def test_systemd_analyze_verify(self):
        for program, path in self.units.items():
            with self.subTest(unit=program):
                self.verify(path)
                self.verify(os.path.join(self.dir, 'tls-' + os.path.basename(path)))

    def test_hardening(self):
        want = {'DynamicUser': 'yes', 'NoNewPrivileges': 'yes', 'ProtectSystem': 'strict', 'ProtectHome': 'yes',
                'PrivateTmp': 'yes', 'PrivateDevices': 'yes', 'CapabilityBoundingSet': '', 'Type': 'exec'}
        for program, path in self.units.items():
            keys = unit_file(path)
            with self.subTest(unit=program):
                for k, v in want.items():
                    self.assertEqual(keys.get(k), [v], k)
                self.assertEqual(keys['RestrictAddressFamilies'], ['AF_INET AF_INET6 AF_UNIX'])
                self.assertTrue(keys['SystemCallFilter'][0].startswith('@system-service'))
                self.assertEqual(keys['SystemCallErrorNumber'], ['EPERM'], 'a refused call fails, not kills')
                self.assertTrue(keys.get('StateDirectory') or keys.get('CacheDirectory'))
                self.assertIn('EnvironmentFile', keys)
                r = subprocess.run(['systemd-analyze', 'security', '--offline=yes', path], capture_output=True,
                                   text=True, timeout=60)
                m = re.search(r'Overall exposure level for \S+: ([0-9.]+)', r.stdout)
                if m:  # --offline needs systemd 252
                    self.assertLessEqual(float(m.group(1)), 2.0, r.stdout)

    def command_line(self, program, tls):
        """The unit's ExecStart as systemd would run it with the example
        environment file (and tls.conf), %d, %S and %C made directories here."""
        keys = unit_file(self.units[program])
        env = {}
        with open(os.path.join(SYSTEMD, os.path.basename(keys['EnvironmentFile'][0]))) as f:
            for line in f:
                if line.strip() and not line.startswith('#'):
                    k, _, v = line.strip().partition('=')
                    env[k] = v
        extra = keys.get('Environment', []) + (unit_file(os.path.join(SYSTEMD, 'tls.conf'))['Environment']
                                               if tls else [])
        creds = os.path.join(self.dir, 'credentials')  # one set, so that both daemons share the token and CA
        spec = {'%d': creds, '%S': os.path.join(self.dir, 'state'), '%C': os.path.join(self.dir, 'cache')}
        for e in extra:
            k, _, v = shlex.split(e)[0].partition('=')
            env[k] = re.sub(r'%[dSC]', lambda m: spec[m.group(0)], v)
        env = {k: (shlex.split(v) or [''])[0] if v[:1] in '"\'' and v else v for k, v in env.items()}
        argv = []
        for w in shlex.split(keys['ExecStart'][0]):
            w = re.sub(r'%[dSC]', lambda m: spec[m.group(0)], w)
            m = re.fullmatch(r'\$(\w+)', w)
            if m:
                argv += env.get(m.group(1), '').split()
            else:
                argv.append(re.sub(r'\$\{(\w+)\}', lambda m: env[m.group(1)], w))
        return argv, env, keys, creds

    def test_limit_nofile_covers_max_connections(self):
        for program in self.units:
            argv, _, keys, _ = self.command_line(program, False)
            flags = parse_flags(program, argv[1:])
            self.assertGreaterEqual(int(keys['LimitNOFILE'][0]), int(flag(flags, '--max-connections')) + 1024,
                                    program)

    def test_the_daemons_serve_with_the_units_command_lines(self):
        """Both units' command lines with the example environment files and
        tls.conf, their credentials made here, the example paths and addresses
        replaced: the dispatcher and worker serve sluice-cat."""
        started = []

        def stop_all():
            self.assertEqual({x.name: x.stop() for x in started}, {x.name: 0 for x in started})
        self.addCleanup(stop_all)
        dispatcher = dispatcher_secrets = None
        for program in ('sluice-dispatcher', 'sluice-workerd'):
            argv, env, keys, creds = self.command_line(program, True)
            secrets = make_secrets(creds) if dispatcher is None else dispatcher_secrets
            for c in keys['LoadCredential']:
                self.assertIn(c.split(':')[0], secrets)
            with open(os.path.join(SYSTEMD, 'tls.conf')) as f:
                for c in unit_file(f.name)['LoadCredential']:
                    self.assertIn(c.split(':')[0], secrets)
            port, = free_ports(1)
            out = []
            for n, v in parse_flags(program, argv[1:]):
                if n == '--port':
                    v = str(port)
                elif n == '--admin-port':
                    v = '0'
                elif n == '--dispatcher':
                    v = dispatcher.addr
                elif n == '--data-root':
                    v = tempfile.mkdtemp(dir=self.dir)
                out += [n] if v is None else [n, v]
            os.environ['SLUICE_AUTH_TOKEN_FILE'] = env['SLUICE_AUTH_TOKEN_FILE']
            try:
                x = Daemon([argv[0]] + out, self.dir, program)
            finally:
                del os.environ['SLUICE_AUTH_TOKEN_FILE']
            started.append(x)
            if program == 'sluice-dispatcher':
                dispatcher, dispatcher_secrets = x, secrets
        wait_for(lambda: http(dispatcher.admin_port, '/readyz')[0] == 200, 'the worker to register', timeout=30)
        cat(dispatcher.addr, dispatcher_secrets)


class Image(unittest.TestCase):
    """The image make image builds, run with podman where podman can run
    containers; with runc and deploy/podman/containers.conf where crun cannot
    set rlimits (docs/operations.md)."""

    @classmethod
    def setUpClass(cls):
        # Built once per run from the build under test, shared with
        # test_multihost.py, removed at exit (oci.py).
        build = os.path.dirname(os.path.dirname(binary('sluice-dispatcher')))
        podman, why = oci.image(build, asan_build())
        if not podman:
            raise unittest.SkipTest('the image is not tested: ' + why)
        cls.podman, cls.env, cls.tag = podman.argv, podman.env, podman.tag

    def podman_run(self, name, args):
        p = subprocess.run(self.podman + ['run', '-d', '--name', name, '--network', 'host', self.tag] + args,
                           capture_output=True, text=True, timeout=120, env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.addCleanup(subprocess.run, ['podman', 'rm', '-f', '-t', '5', name], capture_output=True, timeout=60)

        def listening():
            logs = subprocess.run(['podman', 'logs', name], capture_output=True, text=True, env=self.env).stdout
            return re.search(r'listening port=(\d+) admin_port=(\d+)', logs)
        m = wait_for(listening, '%s to listen' % name, timeout=30)
        return int(m.group(1)), int(m.group(2))

    def test_the_image(self):
        inspect = subprocess.run(['podman', 'image', 'inspect', '--format',
                                  '{{.Config.User}} {{json .Config.Entrypoint}}', self.tag],
                                 capture_output=True, text=True, timeout=60)
        self.assertEqual(inspect.stdout.strip(), '10001:10001 ["/usr/bin/sluice-entrypoint"]')
        r = subprocess.run(self.podman + ['run', '--rm', self.tag, 'nonsense'], capture_output=True, text=True,
                           timeout=60, env=self.env)
        self.assertEqual(r.returncode, 2, r.stderr)
        suffix = '%d' % os.getpid()
        port, admin = self.podman_run('sluice-test-dispatcher-' + suffix,
                                      ['sluice-dispatcher', '--port', '0', '--admin-port', '0',
                                       '--work-dir', '/var/lib/sluice/work'])
        self.podman_run('sluice-test-worker-' + suffix,
                        ['workerd', '--dispatcher', '127.0.0.1:%d' % port, '--port', '0', '--admin-port', '0'])
        wait_for(lambda: http(admin, '/readyz')[0] == 200, 'the worker to register', timeout=30)
        with tempfile.NamedTemporaryFile('w', suffix='.json') as spec:
            spec.write(SPEC)
            spec.flush()
            r = subprocess.run([binary('sluice-cat'), '--dispatcher', '127.0.0.1:%d' % port, '--dataset', spec.name,
                                '--sharding', 'dynamic', '--format', 'count'], capture_output=True, text=True,
                               timeout=120, env=child_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(parse_jsonl(r.stderr.strip().splitlines()[-1])[0]['elements'], 5000)
        top = subprocess.run(['podman', 'top', 'sluice-test-dispatcher-' + suffix, 'huser'], capture_output=True,
                             text=True, env=self.env)
        self.assertEqual(top.stdout.split()[1:], ['10001'], 'the dispatcher runs as the image\'s user')


    def test_two_builds_of_one_build_are_the_same_image(self):
        # make-image.sh stamps the image and its files with SOURCE_DATE_EPOCH
        # (the last commit's time): a rebuild is the same image, so a
        # registry or a cluster can tell a real change from a rebuild.
        build = os.path.dirname(os.path.dirname(binary('sluice-dispatcher')))
        again = '%s:repro-%d' % (oci.REPO, os.getpid())
        r = subprocess.run(['bash', os.path.join(oci.ROOT, 'scripts', 'make-image.sh'), build, again],
                           capture_output=True, text=True, timeout=oci.BUILD_TIMEOUT)
        self.addCleanup(subprocess.run, ['podman', 'rmi', again], capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ids = [subprocess.run(['podman', 'image', 'inspect', '--format', '{{.Id}}', t], capture_output=True,
                              text=True, timeout=60).stdout.strip() for t in (self.tag, again)]
        self.assertTrue(ids[0], 'no image %s' % self.tag)
        self.assertEqual(ids[0], ids[1], 'two builds of %s differ' % build)


class Backup(unittest.TestCase):
    """docs/operations.md#backups: a copy of a serving dispatcher's state store
    made with mdb_copy, in a new work dir, is the same state."""

    def test_a_hot_copy_with_mdb_copy_is_the_state(self):
        if not shutil.which('mdb_copy'):
            raise unittest.SkipTest('mdb_copy (lmdb-utils) is not installed: the backup is not tested')
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            rc, _, err = c.cat(SPEC, ['--sharding', 'dynamic'], fmt='count')
            self.assertEqual(rc, 0, err)
            before = {p: get_json(c.dispatcher.admin_port, p) for p in ('/v1/datasets', '/v1/jobs')}
            restored = os.path.join(c.dir, 'restored')
            os.makedirs(restored)
            r = subprocess.run(['mdb_copy', '-n', os.path.join(c.dir, 'work', 'state.mdb'),
                                os.path.join(restored, 'state.mdb')], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            d = Daemon([binary('sluice-dispatcher'), '--port', '0', '--admin-port', '0', '--work-dir', restored],
                       c.dir, 'restored')
            c.daemons.append(d)
            after = {p: get_json(d.admin_port, p) for p in ('/v1/datasets', '/v1/jobs')}
            self.assertEqual([x['id'] for x in after['/v1/datasets']['datasets']],
                             [x['id'] for x in before['/v1/datasets']['datasets']])
            self.assertEqual([(j['id'], j['state']) for j in after['/v1/jobs']['jobs']],
                             [(j['id'], j['state']) for j in before['/v1/jobs']['jobs']])
        finally:
            self.assertEqual(c.close(), {})
