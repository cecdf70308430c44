"""The dataset-by-id workflow on the command line: sluice-cat registers a
dataset under a name and prints its id and element spec (--dataset-name
--describe); another sluice-cat reads it by name or id (--dataset-id); a
name another spec holds is refused, and sluicectl lists the name
(docs/operations.md, docs/coming-from-tf-data.md)."""
import json
import subprocess
import unittest

from harness import ClusterCase, binary, child_env, parse_jsonl, values

SPEC = {"source": {"type": "range", "start": 0, "stop": 300},
        "ops": [{"op": "shuffle", "buffer_size": 64, "seed": 1}, {"op": "batch", "batch_size": 16}]}


class DatasetIds(ClusterCase):
    workers = 2

    def run_cat(self, args, timeout=300):
        r = subprocess.run([binary('sluice-cat'), '--dispatcher', self.c.dispatcher.addr] + args,
                           capture_output=True, text=True, timeout=timeout, env=child_env())
        return r.returncode, r.stdout, r.stderr

    def test_register_by_name_then_read_by_name_and_id(self):
        path = self.c.spec_file(SPEC)
        rc, out, err = self.run_cat(['--dataset', path, '--dataset-name', 'cli/train', '--describe'])
        self.assertEqual(rc, 0, err)
        info = json.loads(out)
        self.assertEqual(info['element_spec'], {'value': {'shape': [None], 'dtype': 'int64'}})
        did = info['dataset_id']
        # Again: the same id (idempotent), and a lookup says the same.
        rc, out, err = self.run_cat(['--dataset', path, '--dataset-name', 'cli/train', '--describe'])
        self.assertEqual((rc, json.loads(out)), (0, info), err)
        rc, out, err = self.run_cat(['--dataset-id', 'cli/train', '--describe'])
        self.assertEqual((rc, json.loads(out)), (0, info), err)
        for ref in ('cli/train', str(did)):
            rc, out, err = self.run_cat(['--dataset-id', ref, '--sharding', 'dynamic'])
            self.assertEqual(rc, 0, err)
            self.assertEqual(sorted(values(parse_jsonl(out), 'value')), list(range(300)))
            self.assertEqual(json.loads(err.strip().splitlines()[-1])['elements'], 300)
        r = subprocess.run([binary('sluicectl'), '--admin', '127.0.0.1:%d' % self.c.dispatcher.admin_port,
                            'datasets'], capture_output=True, text=True, timeout=60, env=child_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        row = [line.split() for line in r.stdout.splitlines() if line.split()[:1] == [str(did)]]
        self.assertEqual(row[0][-1], 'cli/train', r.stdout)

    def test_refusals_name_what_was_wrong(self):
        path = self.c.spec_file(SPEC)
        other = self.c.spec_file({"source": {"type": "range", "stop": 5}})
        rc, _, err = self.run_cat(['--dataset', path, '--dataset-name', 'cli/held', '--describe'])
        self.assertEqual(rc, 0, err)
        rc, out, err = self.run_cat(['--dataset', other, '--dataset-name', 'cli/held', '--describe'])
        self.assertEqual((rc, out), (1, ''))
        self.assertIn('dataset name "cli/held" is registered with another spec', err)
        rc, _, err = self.run_cat(['--dataset-id', 'cli/none', '--describe'])
        self.assertEqual(rc, 1)
        self.assertIn('--dataset-id cli/none: no dataset is registered under the name "cli/none"', err)
        rc, _, err = self.run_cat(['--dataset', path, '--dataset-name', 'bad name'])
        self.assertEqual(rc, 1)
        self.assertIn('character 3 is not one of', err)
        # Usage: exactly one of --dataset and --dataset-id; a name only with --dataset.
        self.assertEqual(self.run_cat(['--dataset', path, '--dataset-id', '1'])[0], 2)
        self.assertEqual(self.run_cat(['--dataset-id', '1', '--dataset-name', 'x'])[0], 2)
        self.assertEqual(self.run_cat(['--format', 'count'])[0], 2)


if __name__ == '__main__':
    unittest.main()
