"""Helper of test_python_torch_state.py (not a test itself): a
StatefulDataLoader whose workers are started with "spawn" saves its state
mid-epoch and a second one resumes from it. multiprocessing's spawn imports
the main module again in each worker, so this runs as a script of its own,
guarded by __main__, not inside the test runner.

    python3 spawn_resume.py DISPATCHER  ->  {"missing": 0, "duplicated": 0, ...}"""
import collections
import json
import sys

import torch

import sluice
import sluice.torch as st


def main(addr):
    ds = sluice.range(0, 6000).shuffle(200, seed=6).batch(100)
    tds = st.SluiceIterableDataset(ds, addr, sharding='dynamic')
    # Iterated in this process first: what a spawned worker gets by pickle
    # must not carry this process's iterator.
    first_pass = len(list(torch.utils.data.DataLoader(tds, batch_size=None)))
    plain = len(list(torch.utils.data.DataLoader(tds, batch_size=None, num_workers=2,
                                                 multiprocessing_context='spawn')))
    got = []
    first = st.StatefulDataLoader(tds, num_workers=2, multiprocessing_context='spawn')
    it = iter(first)
    for _ in range(20):
        got += next(it)['value'].tolist()
    state = first.state_dict()
    for _ in range(3):  # taken after the save: the restore gives them again
        next(it)
    del it
    second = st.StatefulDataLoader(tds, num_workers=2, multiprocessing_context='spawn')
    second.load_state_dict(state)
    for b in second:
        got += b['value'].tolist()
    c, w = collections.Counter(got), collections.Counter(range(6000))
    print(json.dumps({'missing': sum((w - c).values()), 'duplicated': sum((c - w).values()),
                      'first_pass_batches': first_pass, 'plain_spawn_batches': plain}))


if __name__ == '__main__':
    main(sys.argv[1])
