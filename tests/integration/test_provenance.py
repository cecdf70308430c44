"""Element provenance and split-done notices, end to end (issue 5's
foundation): a dispatcher and 2 workers run a DYNAMIC job over a range
source with shuffle, filter and batch(drop_remainder), and sluice-cat
--with-provenance shows where every element came from and which splits the
workers finished."""
import bisect
import collections
import unittest

from harness import Cluster, get_json

START, STOP, STEP = 7, 7 + 3 * 3000, 3  # 3000 elements: value = START + STEP * position
SPLIT = 97  # --split-size; the dispatcher rounds it up to a multiple of the batch size when it can
CUT = START + STEP * 2500               # a filter keeps values below this (whole splits dropped past it)
ODD = START + STEP * 1234               # and another drops this one


class ProvenanceTest(unittest.TestCase):
    def run_job(self, ops):
        c = Cluster(workers=2, dispatcher_args=['--split-size', str(SPLIT)])
        try:
            c.wait_workers_registered(2)
            spec = {"source": {"type": "range", "start": START, "stop": STOP, "step": STEP}, "ops": ops}
            rc, lines, err = c.cat(spec, ['--sharding', 'dynamic', '--with-provenance'])
            self.assertEqual(rc, 0, err)
            jobs = get_json(c.dispatcher.admin_port, '/v1/jobs')
            jobs = jobs.get('jobs', jobs) if isinstance(jobs, dict) else jobs
            self.assertEqual(len(jobs), 1, jobs)
            job = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % jobs[0]['id'])
            return lines, job
        finally:
            self.assertEqual(c.close(), {})

    def check(self, lines, job, kept, batch_size):
        batches = [b for b in lines if 'value' in b]
        done = [d for b in lines for d in b.get('_splits_done', [])]
        delivered = collections.Counter()
        seen = []
        for b in batches:
            runs = b['_provenance']
            self.assertTrue(runs, b)
            self.assertLessEqual(len(runs), len(b['value']))
            self.assertEqual(len(b['value']), batch_size)  # drop_remainder
            positions = [p for (epoch, f, begin, count) in runs for p in range(begin, begin + count)]
            self.assertTrue(all(r[0] == 0 and r[1] == 0 for r in runs), runs)
            # Provenance matches the values, element by element.
            self.assertEqual([START + STEP * p for p in positions], b['value'])
            seen.extend(positions)
        # Each element once, only elements the filter keeps.
        self.assertEqual(len(seen), len(set(seen)))
        self.assertTrue(set(seen) <= kept)
        # What is missing is what drop_remainder dropped: less than a batch per worker.
        self.assertLess(len(kept) - len(seen), 2 * batch_size)
        # One notice per split handed out, with the count of its records in
        # batches; the splits (of lengths the workers' rates chose) tile the
        # source once.
        self.assertEqual(sorted(d['split_id'] for d in done), sorted(set(d['split_id'] for d in done)))
        self.assertEqual(len(done), job['splits']['handed_out_all_epochs'], done)
        spans = sorted((d['begin'], d['end']) for d in done)
        self.assertEqual((spans[0][0], spans[-1][1]), (0, 3000), spans)
        self.assertTrue(all(e == b for (_, e), (b, _) in zip(spans, spans[1:])), spans)
        self.assertEqual(job['splits']['records_handed_out'], 3000)
        bounds = [b for b, _ in spans]
        for p in seen:
            delivered[bounds[bisect.bisect_right(bounds, p) - 1]] += 1
        for d in done:
            self.assertEqual(d['delivered'], delivered[d['begin']], d)

    def test_shuffle_filter_batch_every_record_accounted_once(self):
        ops = [{"op": "shuffle", "buffer_size": 300, "seed": 3},
               {"op": "filter", "key": "value", "cmp": "lt", "value": CUT},
               {"op": "filter", "key": "value", "cmp": "ne", "value": ODD},
               {"op": "batch", "batch_size": 16, "drop_remainder": True}]
        kept = {p for p in range(3000) if START + STEP * p < CUT and START + STEP * p != ODD}
        lines, job = self.run_job(ops)
        self.check(lines, job, kept, 16)

    def test_unshuffled_batches_are_one_run_each(self):
        ops = [{"op": "batch", "batch_size": 50, "drop_remainder": True}]
        lines, job = self.run_job(ops)
        self.check(lines, job, set(range(3000)), 50)
        # Splits of 100 (97 rounded up to the batch size): each batch is 50
        # contiguous records of one split, one run.
        batches = [b for b in lines if 'value' in b]
        self.assertEqual(len(batches), 60)
        self.assertTrue(all(len(b['_provenance']) == 1 for b in batches))

    def test_take_cuts_splits_short_and_every_split_handed_out_gets_its_notice(self):
        # Each worker stops after 200 elements: it is reading a split, has
        # more queued (prefetch), and may get some after its pipeline ended.
        ops = [{"op": "shuffle", "buffer_size": 50, "seed": 8}, {"op": "take", "count": 200},
               {"op": "batch", "batch_size": 25}]
        lines, job = self.run_job(ops)
        batches = [b for b in lines if 'value' in b]
        done = [d for b in lines for d in b.get('_splits_done', [])]
        seen = []
        for b in batches:
            positions = [p for (_, _, begin, count) in b['_provenance'] for p in range(begin, begin + count)]
            self.assertEqual([START + STEP * p for p in positions], b['value'])
            seen.extend(positions)
        self.assertEqual(len(seen), 400)
        self.assertEqual(len(seen), len(set(seen)))
        self.assertEqual(len(done), len({d['split_id'] for d in done}))
        self.assertEqual(len(done), job['splits']['handed_out_all_epochs'], (done, job['splits']))
        by_split = collections.Counter()
        for d in done:
            by_split[d['split_id']] = d['delivered']
            self.assertEqual(d['delivered'], sum(1 for p in seen if d['begin'] <= p < d['end']), d)
        self.assertEqual(sum(by_split.values()), 400)


if __name__ == '__main__':
    unittest.main()
