"""Helper of test_python_torch_state.py (not a test itself): a trainer that
a test kills with -9. A StatefulDataLoader of two worker processes reads a
dataset; the process appends every batch it takes to VALUES (one JSON list a
line) and after every SAVE_EVERY batches saves the loader's state to STATE
(through pickle, written to a temporary file and renamed, with the number of
lines of VALUES it covers), then says "saved N" on stdout. It reads until
it is killed or the epoch ends.

    python3 killed_resume.py DISPATCHER VALUES STATE"""
import json
import os
import pickle
import sys

import sluice
import sluice.torch as st

SAVE_EVERY = 7


def dataset():
    """What the test reads (in both processes): 3 epochs of a shuffled,
    filtered range."""
    return (sluice.range(0, 40000).filter('value', 'ne', 11).filter('value', 'ne', 20001)
            .shuffle(2000, seed=8).repeat(3).batch(64))


def main(addr, values_path, state_path):
    # As in test_python_torch_state.py: under ASan the workers come from a
    # forkserver (a fork while another thread holds ASan's allocator lock
    # leaves the child stuck).
    context = None
    if os.environ.get('SLUICE_SANITIZED'):
        import multiprocessing
        context = multiprocessing.get_context('forkserver')
    dl = st.StatefulDataLoader(st.SluiceIterableDataset(dataset(), addr, sharding='dynamic'), num_workers=2,
                               multiprocessing_context=context)
    lines = 0
    with open(values_path, 'w') as values:
        for b in dl:
            values.write(json.dumps(b['value'].tolist()) + '\n')
            lines += 1
            if lines % SAVE_EVERY == 0:
                values.flush()
                os.fsync(values.fileno())
                tmp = state_path + '.tmp'
                with open(tmp, 'wb') as f:
                    pickle.dump({'lines': lines, 'state': dl.state_dict()}, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, state_path)
                print('saved %d' % lines, flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:4])
