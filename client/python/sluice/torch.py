"""PyTorch integration: batches from Sluice workers as torch tensors.

    import sluice, sluice.torch
    ds = sluice.range(0, 100_000).shuffle(4096).batch(64)
    for batch in sluice.torch.loader(ds, "127.0.0.1:5050", sharding="dynamic"):
        x = batch["value"]          # torch.int64, shape (64,)

Tensors come from torch.from_numpy() over the arrays of sluice.distribute():
no copy, and each tensor keeps its batch alive until it is freed. The batches
are already batched by the workers, so a torch DataLoader around
SluiceIterableDataset takes batch_size=None.

dtypes torch cannot view (NumPy's uint16 and uint32) are widened with a copy
to int32 and int64; uint64 is viewed as int64 when every value fits (a
TypeError otherwise); bfloat16 becomes torch.bfloat16 without a copy. Ragged
components are (values, row_splits) tuples of tensors; bytes components are
lists of Python bytes (nested for rank > 1).

State, like torchdata's StatefulDataLoader: loader(..., sharding="dynamic")
in one process, StatefulDataLoader(SluiceIterableDataset(...,
sharding="dynamic"), num_workers=n) across worker processes, each of which
reads a share of the source as a checkpointable job of its own."""
import copy
import inspect
import sys
import warnings

import numpy as np
import torch

from ._share import share_spec
from .client import BatchIterator, CheckpointBuilder, _check_window, distribute, merge_checkpoints
from .errors import InvalidArgumentError, SluiceUsageWarning
from . import _lib

# What sluice.distribute() takes besides the dataset and the dispatcher.
_DISTRIBUTE_ARGS = frozenset(p for p in inspect.signature(BatchIterator.__init__).parameters
                             if p not in ('self', 'dataset', 'dispatcher') and not p.startswith('_'))

# DataLoader's arguments, which a Sluice loader does not take, and where each goes instead.
_LOADER_ARGS = {
    'batch_size': 'the Sluice workers batch: put the batch in the dataset (ds.batch(%r)), and give a DataLoader '
                  'around a SluiceIterableDataset batch_size=None',
    'num_workers': 'sluice.torch.loader reads in this process (the Sluice workers do the work); for DataLoader '
                   'worker processes use torch.utils.data.DataLoader(sluice.torch.SluiceIterableDataset(ds, '
                   'dispatcher, sharding="dynamic"), batch_size=None, num_workers=%r), or StatefulDataLoader',
    'shuffle': 'shuffle in the dataset: ds.shuffle(buffer_size), before .batch()',
    'drop_last': 'drop the last partial batch in the dataset: ds.batch(n, drop_remainder=%r)',
    'collate_fn': 'map the batches in the loop, or use torch.utils.data.DataLoader(SluiceIterableDataset(...), '
                  'batch_size=None, collate_fn=...)',
    'persistent_workers': 'sluice.torch.loader starts no worker processes',
    'prefetch_factor': 'the Sluice iterator prefetches already, as many batches as window_bytes (32 MiB unless '
                       'given) holds, 8 to 32; to change it give window_bytes=, or max_outstanding=N to fix the '
                       'count (%r batches would be fewer than the default)',
    'sampler': 'a Sluice job has no indices to sample: sharding and shuffle are in the dataset and distribute()',
    'batch_sampler': 'a Sluice job has no indices to sample: batch in the dataset (ds.batch(n))',
    'worker_init_fn': 'sluice.torch.loader starts no worker processes',
    'timeout': 'give next_timeout_ms=, the longest one batch is waited for, in milliseconds (DataLoader\'s '
               'timeout=%r is in seconds)',
}


def _check_distribute_args(kw, who):
    """Refuses, where they are given, arguments that distribute() would
    refuse later at iter(), with where they go instead."""
    for name, v in kw.items():
        if name in _LOADER_ARGS:
            hint = _LOADER_ARGS[name]
            if '%r' in hint:
                hint = hint % (v,)
            raise TypeError('%s takes no %s (a torch DataLoader argument): %s' % (who, name, hint))
        if name not in _DISTRIBUTE_ARGS:
            raise TypeError('%s got an unexpected argument %r; it takes the options of sluice.distribute(): %s'
                            % (who, name, ', '.join(sorted(_DISTRIBUTE_ARGS))))
    if 'sharding' in kw:
        BatchIterator._sharding(kw['sharding'])
    for name in ('timeout_ms', 'connect_timeout_ms', 'request_timeout_ms', 'dispatcher_timeout_ms',
                 'next_timeout_ms'):
        v = kw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidArgumentError('%s must be a positive integer, got %r' % (name, v), _lib.SL_EINVAL)
    _check_window(**{name: kw[name] for name in ('max_outstanding', 'per_worker_outstanding', 'window_bytes')
                     if kw.get(name) is not None})


def _collating_loader():
    """Whether iter() was called by a DataLoader that batches what it gets
    (batch_size not None: torch's _IterableDatasetFetcher with
    auto_collation), in this process or in a DataLoader worker."""
    f = sys._getframe(1)
    for _ in range(16):
        if f is None:
            break
        obj = f.f_locals.get('self')
        if obj is not None and type(obj).__name__ == '_IterableDatasetFetcher':
            return bool(getattr(obj, 'auto_collation', False))
        f = f.f_back
    return False

def _loader_len(ds, kw, resuming):
    """len() of a loader or SluiceIterableDataset: the batches one iter()
    yields, where the spec and the options fix that number whatever the
    Sluice workers; a TypeError saying why not otherwise (torch's
    convention for an IterableDataset without a length)."""
    from . import _spec
    if resuming:
        raise TypeError('len() is not known: the next iter() resumes from a checkpoint, and yields only what it '
                        'does not hold')
    if kw.get('sharding', 'off') in ('off', 0):
        raise TypeError('len() is not known under sharding "off": every Sluice worker yields the whole dataset, and '
                        'how many workers serve the job is not known before it runs (ds.cardinality() is what one '
                        'of them yields)')
    if kw.get('job_name') or kw.get('num_consumers') is not None:
        raise TypeError('len() is not known for a named job: its consumers split its batches between them as they '
                        'ask for them')
    spec = ds.spec if callable(getattr(ds, 'to_json', None)) else None
    if spec is None:
        raise TypeError('len() needs a sluice.Dataset, got %s' % type(ds).__name__)
    ops = [o for o in spec['ops'] if o.get('op') not in _spec._ONE_TO_ONE]
    if ops:
        raise TypeError('len() is not known: each Sluice worker runs %s on its own share of the source, so how many '
                        'batches come depends on how the source is split between the workers (a short last batch '
                        'per worker); ds.cardinality() is what one pipeline over the whole source yields'
                        % ops[0].get('op'))
    n = _spec.cardinality(spec['source'], [])
    if n < 0:
        raise TypeError('len() is not known: the source\'s records are counted by the dispatcher, not here')
    return n


_WIDEN = {np.dtype('<u2'): np.int32, np.dtype('<u4'): np.int64}

# dtypes torch.from_numpy() takes as they are: one set lookup decides for
# almost every array a trainer sees. (uint16 with sluice's bfloat16 metadata
# compares equal to uint16, which is not in here.)
_DIRECT = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                          np.float16, np.float32, np.float64))


def to_tensor(a):
    """One value of a batch dict (an array, a ragged tuple or a bytes
    array) as torch: tensors that share the array's memory where torch can."""
    if a.__class__ is np.ndarray and a.dtype in _DIRECT:
        return torch.from_numpy(a)
    if isinstance(a, tuple):
        return tuple(to_tensor(x) for x in a)
    if a.dtype == object:
        return a.tolist()
    if a.dtype.name == 'bfloat16' or (a.dtype.metadata or {}).get('sluice_dtype') == 'bfloat16':
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype in _WIDEN:
        return torch.from_numpy(a.astype(_WIDEN[a.dtype]))
    if a.dtype == np.uint64:
        if a.size and int(a.max()) >= 2**63:
            raise TypeError('a uint64 component holds values of 2^63 or more, which torch.int64 cannot hold')
        return torch.from_numpy(a.view(np.int64))
    return torch.from_numpy(a)


def batch_to_torch(batch, pin_memory=False):
    """A batch dict of NumPy arrays as a dict of torch tensors."""
    out = {}
    for k, v in batch.items():
        out[k] = to_tensor(v)
    if pin_memory:
        out = {k: _pin(v) for k, v in out.items()}
    return out


def _pin(v):
    if isinstance(v, torch.Tensor):
        return v.pin_memory()
    if isinstance(v, tuple):
        return tuple(_pin(x) for x in v)
    if isinstance(v, dict):  # what a user's collate_fn may make of a batch
        return {k: _pin(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_pin(x) for x in v]
    return v


class _Stamped:
    """What a SluiceIterableDataset yields inside a StatefulDataLoader: a
    batch, the share it came from, and what the share's iterator recorded
    of it (a delta: its provenance and split-done notices, a few bytes an
    element, not the share's whole checkpoint) with the share's dataset id.
    The loader's main process unwraps it and applies the delta to its
    CheckpointBuilder of the share."""

    __slots__ = ('batch', 'share', 'delta', 'dataset_id')

    def __init__(self, batch, share, delta, dataset_id):
        self.batch = batch
        self.share = share
        self.delta = delta
        self.dataset_id = dataset_id

    def restamp(self, batch):
        return _Stamped(batch, self.share, self.delta, self.dataset_id)

    def pin_memory(self):
        # DataLoader(pin_memory=True) calls this in its pinning thread.
        return self.restamp(_pin(self.batch))


class _StampedCollate:
    """A user's collate_fn applied to the batch inside a _Stamped."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, item):
        if isinstance(item, _Stamped):
            return item.restamp(self.fn(item.batch))
        return self.fn(item)


def _check_checkpoint(ck, where):
    if ck is not None and not isinstance(ck, (bytes, bytearray)):
        raise TypeError('%s must be bytes or None, got %s' % (where, type(ck).__name__))
    return bytes(ck) if ck is not None else None


class SluiceIterableDataset(torch.utils.data.IterableDataset):
    """A torch IterableDataset over a Sluice job. Each iter() registers the
    dataset and opens a new iterator and yields dicts of torch tensors.

    distribute_kwargs go to sluice.distribute(): sharding, job_name,
    max_outstanding, timeout_ms, ... (max_outstanding, per_worker_outstanding:
    0 by default, the request window sized by window_bytes). Use it in a
    DataLoader with batch_size=None.

    With sharding="dynamic" and no job_name the dataset is *shared out*:
    in a DataLoader of n worker processes, worker i reads share i of n of the
    source (sluice._share.share_spec: every n-th item of the range or of the
    files list) as an anonymous job of its own, checkpointable; with
    num_workers=0 the one share is the whole dataset. StatefulDataLoader
    collects the shares' checkpoints into a state that resumes each element
    exactly once. Otherwise (sharding="off", or a job_name naming a job the
    workers share) every loader process opens its own iterator over the
    whole job, and there is no state.

    With a job_name, each iter() joins one repetition of the named job (an
    epoch; docs/sharding.md): set_epoch(e) makes the next iter() join
    repetition e, and each later iter() in the same process one more. In a
    DataLoader with worker processes call set_epoch(epoch) before every
    epoch, as with torch's DistributedSampler: each epoch's workers start
    from the main process's copy, and without it every epoch would join
    repetition 0, which after the first has ended."""

    def __init__(self, ds, dispatcher, **distribute_kwargs):
        super().__init__()
        _check_distribute_args(distribute_kwargs, 'SluiceIterableDataset')
        self.ds = ds
        self.dispatcher = dispatcher
        self.distribute_kwargs = distribute_kwargs
        kw = distribute_kwargs
        self.shared_out = (kw.get('sharding') == 'dynamic' and not kw.get('job_name')
                           and kw.get('num_consumers') is None)
        # Set by StatefulDataLoader on its own copy: yield _Stamped items.
        self._stamp = False
        # What the next iter() resumes from: a loader state (every share's
        # checkpoint) or one share's state, or None.
        self._resume = None
        self._it = None
        self._share = (0, 1)
        # The repetition the next iter() joins (a named job), and whether
        # set_epoch() said so.
        self._repetition = 0
        self._epoch_set = False

    def set_epoch(self, epoch):
        """The next iter() joins repetition epoch of the named job (and each
        later iter() in this process one more)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError('epoch must be an integer >= 0, got %r' % (epoch,))
        self._repetition = epoch
        self._epoch_set = True

    def __len__(self):
        """The items one iter() yields (over every DataLoader worker), where
        that is fixed whatever the Sluice workers: an exactly-once sharding
        ("dynamic", "file", "data", ...) without job_name, over a range
        source whose ops each yield one element per element (no batch,
        take, skip, repeat, shard or filter): its length. A TypeError saying
        why otherwise, as torch's IterableDataset has none."""
        return _loader_len(self.ds, self.distribute_kwargs, self._resume is not None)

    def __getstate__(self):
        # What goes to a DataLoader worker started with "spawn": not the
        # iterator of an iteration in this process.
        state = dict(self.__dict__)
        state['_it'] = None
        return state

    def __iter__(self):
        # Not a generator itself: the share and the checkpoint to resume
        # from are fixed when iter() is called (in the DataLoader worker, or
        # in the main process with num_workers=0), before the caller can
        # clear what it set for this iteration.
        kw = dict(self.distribute_kwargs)
        if _collating_loader():
            warnings.warn('sluice: a DataLoader with a batch_size (1 by default) batches the Sluice batches again, '
                          'adding a dimension (shape (1, 64) for batches of 64): give it batch_size=None; the '
                          'Sluice workers batch (ds.batch(n))', SluiceUsageWarning, stacklevel=3)
        info = torch.utils.data.get_worker_info()
        if (info is not None and info.num_workers > 1 and not kw.get('job_name') and
                kw.get('sharding', 'off') == 'off'):
            warnings.warn('sluice: %d DataLoader worker processes each open a job of their own with sharding '
                          '"off": every element comes %d times per Sluice worker; give sharding="dynamic" (each '
                          'process then reads a share of the source) for each element once'
                          % (info.num_workers, info.num_workers), SluiceUsageWarning, stacklevel=3)
        spec, index, count = self.ds, 0, 1
        if self.shared_out:
            if info is not None:
                index, count = info.id, info.num_workers
            spec = share_spec(self.ds, index, count)
            kw['checkpointable'] = True
            if self._stamp:
                kw['_deltas'] = True
            ck = self._resume_for(index, count)
            if ck is not None:
                kw['checkpoint'] = ck
        self._resume = None
        if kw.get('job_name'):
            kw['repetition'] = kw.get('repetition', 0) + self._repetition
            self._repetition += 1
        it = distribute(spec, self.dispatcher, **kw)
        if (it.notice and kw.get('job_name') and not self._epoch_set and
                torch.utils.data.get_worker_info() is not None):
            warnings.warn('sluice: %s; in a DataLoader with worker processes call set_epoch(epoch) on the '
                          'SluiceIterableDataset before every epoch' % it.notice, stacklevel=2)
        self._it, self._share = it, (index, count)
        return self._batches(it, index)

    def _resume_for(self, index, count):
        state = self._resume
        if state is None:
            return None
        if 'share' in state:
            got = tuple(state['share'])
            if got != (index, count):
                raise ValueError('state of share %d of %d cannot resume share %d of %d (a DataLoader of %d '
                                 'workers)' % (got[0], got[1], index, count, count))
            return state['checkpoint']
        if state['shares'] != count:
            raise ValueError('state of %d shares cannot resume in %d (num_workers must stay the same: each '
                             'share is a dataset of its own)' % (state['shares'], count))
        return state['checkpoints'][index]

    def _batches(self, it, index):
        stamp = self._stamp
        try:
            for batch in it:
                out = batch_to_torch(batch)
                if stamp:
                    # Taken before the batch leaves: with the deltas before
                    # it, the main process's builder holds this batch and
                    # every batch of this share before.
                    out = _Stamped(out, index, it.delta(), it.dataset_id)
                yield out
        finally:
            it.close()

    def _need_shared_out(self):
        if not self.shared_out:
            raise NotImplementedError('state needs sharding="dynamic" and no job_name (each DataLoader worker '
                                      'then reads a share of its own); for a named job\'s state, read each rank '
                                      'through sluice.torch.loader(ds, ..., job_name=..., checkpointable=True) and '
                                      'merge the ranks\' state_dict()s with sluice.torch.merge_state_dicts()')

    def state_dict(self):
        """The state of this process's iteration: {"share": [i, n],
        "checkpoint": bytes or None}. Exact where nothing sits between the
        dataset and the training loop (num_workers=0); with worker processes
        use StatefulDataLoader, which knows which batches the loop took."""
        self._need_shared_out()
        if self._it is None or self._it.closed:
            if self._resume is not None and 'share' in self._resume:
                return dict(self._resume)
            return {'share': list(self._share), 'checkpoint': None}
        return {'share': list(self._share), 'checkpoint': self._it.checkpoint()}

    def load_state_dict(self, state):
        """The next iter() resumes from state: a share's state_dict(), or a
        StatefulDataLoader's."""
        self._need_shared_out()
        if not isinstance(state, dict) or not ('share' in state or 'shares' in state):
            raise TypeError('a state is a dict from state_dict(), got %r' % (state,))
        if 'share' in state:
            i, n = state['share']
            self._resume = {'share': [int(i), int(n)],
                            'checkpoint': _check_checkpoint(state.get('checkpoint'), 'state["checkpoint"]')}
        else:
            self._resume = _loader_state(state, state.get('shares'))


def _loader_state(state, shares):
    """A checked copy of a StatefulDataLoader state of shares shares."""
    if not isinstance(state, dict) or state.get('version', 1) != 1 or not isinstance(state.get('checkpoints'), list):
        raise TypeError('a StatefulDataLoader state is {"version": 1, "shares": n, "checkpoints": [...]}, got %r'
                        % (state,))
    if state.get('shares') != shares or len(state['checkpoints']) != shares:
        raise ValueError('state of %r shares (a DataLoader of that many workers) cannot resume in a loader of %d: '
                         'num_workers must stay the same, each share is a dataset of its own'
                         % (state.get('shares'), shares))
    return {'version': 1, 'shares': shares,
            'checkpoints': [_check_checkpoint(c, 'state["checkpoints"][%d]' % i)
                            for i, c in enumerate(state['checkpoints'])]}


class StatefulDataLoader(torch.utils.data.DataLoader):
    """A torch DataLoader over a SluiceIterableDataset (sharding="dynamic",
    no job_name) with state_dict() and load_state_dict(), like torchdata's
    StatefulDataLoader.

    Each of the num_workers worker processes reads a share of the source as
    an anonymous job of its own and sends, with every batch, what its
    iterator recorded of it (a delta: the batch's provenance, a few bytes an
    element); the main process applies the deltas of the batches the
    training loop took to a CheckpointBuilder per share. state_dict() is,
    for each share, the checkpoint its iterator had right after the last
    batch the loop took from it: batches the workers had made and the loop
    had not taken are not in it, so
    a loader given the state with load_state_dict() (in this process or
    another, with the same num_workers) continues on its next iter() with
    every element not yet taken, each exactly once.

    The arguments are DataLoader's, except: batch_size must be None (the
    Sluice workers batch), persistent_workers must be False (each iter()
    starts workers that read the state to resume from)."""

    def __init__(self, dataset, batch_size=None, num_workers=0, collate_fn=None, persistent_workers=False, **kw):
        if not isinstance(dataset, SluiceIterableDataset):
            raise TypeError('StatefulDataLoader reads a sluice.torch.SluiceIterableDataset, got %s'
                            % type(dataset).__name__)
        dataset._need_shared_out()
        if batch_size is not None:
            raise ValueError('batch_size must be None: the Sluice workers batch already (.batch() in the dataset)')
        if persistent_workers:
            raise ValueError('persistent_workers=True would keep the workers of the first iter(), and '
                             'load_state_dict() could not reach them')
        ds = copy.copy(dataset)
        ds._stamp = True
        ds._resume = None
        ds._it = None
        super().__init__(ds, batch_size=None, num_workers=num_workers,
                         collate_fn=_StampedCollate(collate_fn) if collate_fn is not None else None,
                         persistent_workers=False, **kw)
        self._shares = max(num_workers, 1)
        # The iteration under way, one per share: a CheckpointBuilder once
        # the loop took a batch of the share, else the checkpoint it resumed
        # from (or None).
        self._live = None
        self._resume = None  # a state for the next iter()

    def __iter__(self):
        resume, self._resume = self._resume, None
        live = list(resume['checkpoints']) if resume else [None] * self._shares
        self._live = live
        # The workers (or, with num_workers=0, the dataset's iter()) read
        # the state to resume from when the DataLoader iterator starts them.
        self.dataset._resume = resume
        try:
            inner = super().__iter__()
        finally:
            self.dataset._resume = None
        return self._unstamp(inner, live)

    def _unstamp(self, inner, live):
        kw = self.dataset.distribute_kwargs
        for item in inner:
            b = live[item.share]
            if not isinstance(b, CheckpointBuilder):
                b = live[item.share] = CheckpointBuilder(item.dataset_id, b, kw.get('auth_token_file'),
                                                         kw.get('max_ledger_runs', 0))
            b.apply(item.delta)
            yield item.batch
        # The epoch ended: the next state starts a new one.
        if self._live is live:
            self._live = None

    def state_dict(self):
        """{"version": 1, "shares": n, "checkpoints": [bytes or None] * n}:
        where the iteration under way is (None for a share the loop has taken
        nothing of). Between epochs, every checkpoint is None."""
        if self._live is not None:
            cks = [c.checkpoint() if isinstance(c, CheckpointBuilder) else c for c in self._live]
        elif self._resume is not None:
            cks = list(self._resume['checkpoints'])
        else:
            cks = [None] * self._shares
        return {'version': 1, 'shares': self._shares, 'checkpoints': cks}

    def load_state_dict(self, state):
        """The next iter() continues from state (what state_dict() gave, in
        a loader of the same num_workers)."""
        self._resume = _loader_state(state, self._shares)


def merge_state_dicts(states, auth_token_file=None):
    """One state of a named job's ranks: the state_dict() of every rank's
    loader (job_name, checkpointable=True), taken when all of them stopped
    at a common step, merged (sluice.merge_checkpoints()). Every loader of
    the resumed job, under another job_name and as many as there are then,
    takes it in load_state_dict(). Ranks that had not started (checkpoint
    None) read nothing and add nothing."""
    states = list(states)
    names = set()
    cks = []
    for i, st in enumerate(states):
        if not isinstance(st, dict) or 'rank_of' not in st:
            raise ValueError('state %d is not a named job\'s rank state (a loader with a job_name and '
                             'checkpointable=True gives one)' % (i + 1))
        names.add(st['rank_of'])
        if st.get('checkpoint') is not None:
            cks.append(st['checkpoint'])
    if len(names) > 1:
        raise ValueError('the states are of different named jobs: %s' % ', '.join(sorted(map(repr, names))))
    if not cks:
        raise ValueError('no rank has a checkpoint: none of them started an iteration')
    return {'checkpoint': merge_checkpoints(cks, auth_token_file=auth_token_file), 'merged_from': names.pop()}


class loader:  # noqa: N801 (used like a function: sluice.torch.loader(ds, ...))
    """An iterable of batches as dicts of torch tensors; each iter() opens a
    new iterator over the job (like iterating a DataLoader again).

    pin_memory: copy each batch into page-locked memory for faster
    host-to-GPU transfers. Only when torch.cuda.is_available(); without
    CUDA it is a no-op and the tensors stay zero-copy views.
    kw: the options of sluice.distribute().

    Like torchdata's StatefulDataLoader, state_dict() says where the
    iteration under way is, and load_state_dict() makes the next iter()
    continue from there, in this process or another: the batches not yet
    yielded, each element exactly once. This needs sharding="dynamic" and
    no job_name (the loader then asks for checkpointable iterators), or
    the ranks of a named job made checkpointable=True: each rank's
    state_dict() at a common step, merged with merge_state_dicts(), is
    what every loader of the resumed job (any number of ranks, under
    another job_name) takes in load_state_dict().

    With a job_name, iter() number e (from 0) joins repetition e of the
    named job (its epoch e, docs/sharding.md), so that ranks that each loop
    over their own loader read every epoch once between them; set_epoch(e)
    makes the next iter() join repetition e (a trainer that resumes at
    epoch e in a new process)."""

    def __init__(self, ds, dispatcher, pin_memory=False, **kw):
        _check_distribute_args(kw, 'sluice.torch.loader')
        self.ds = ds
        self.dispatcher = dispatcher
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.kw = kw
        self._it = None
        self._resume = None
        self._stateful = kw.get('sharding') == 'dynamic' and not kw.get('job_name')
        # A rank of a checkpointable named job: its state is its own share,
        # to be merged with the other ranks' (merge_state_dicts()).
        self._rank = (kw.get('sharding') == 'dynamic' and bool(kw.get('job_name')) and
                      bool(kw.get('checkpointable')))
        self._epoch = 0  # the repetition the next iter() joins (a named job)

    def set_epoch(self, epoch):
        """The next iter() joins repetition epoch of the named job; each one
        after it one more."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError('epoch must be an integer >= 0, got %r' % (epoch,))
        self._epoch = epoch

    def __iter__(self):
        self.close()
        kw = dict(self.kw)
        if kw.get('job_name'):
            kw['repetition'] = kw.get('repetition', 0) + self._epoch
            self._epoch += 1
        if self._stateful:
            kw['checkpointable'] = True
        if self._resume is not None:
            kw['checkpoint'], self._resume = self._resume, None
        it = self._it = distribute(self.ds, self.dispatcher, **kw)
        try:
            for batch in it:
                yield batch_to_torch(batch, self.pin_memory)
        finally:
            it.close()

    def __len__(self):
        """The batches one iter() yields, where that is fixed whatever the
        Sluice workers (see SluiceIterableDataset.__len__); a TypeError
        saying why otherwise."""
        return _loader_len(self.ds, self.kw, self._resume is not None)

    def close(self):
        """Closes the iterator of the iteration under way, if any."""
        if self._it is not None:
            self._it.close()
            self._it = None

    def _need_stateful(self):
        if not self._stateful and not self._rank:
            raise NotImplementedError('state_dict() needs sharding="dynamic", and with a job_name '
                                      'checkpointable=True: checkpoints resume a job of the loader\'s own, or '
                                      'the merged states of a named job\'s ranks')

    def state_dict(self):
        """{"checkpoint": bytes} of the iteration under way, or
        {"checkpoint": None} when none is (the next iter() starts anew).
        A rank of a named job adds "rank_of": its job_name; such states
        resume only once merged (merge_state_dicts())."""
        self._need_stateful()
        if self._it is None or self._it.closed:
            ck = self._resume
        else:
            ck = self._it.checkpoint()
        if self._rank:
            return {'checkpoint': ck, 'rank_of': self.kw['job_name']}
        return {'checkpoint': ck}

    def load_state_dict(self, state):
        """The next iter() continues from state (what state_dict() gave;
        for a named job's rank, what merge_state_dicts() made of every
        rank's)."""
        self._need_stateful()
        if not isinstance(state, dict):
            raise TypeError('state must be the dict state_dict() gave, got %r' % type(state).__name__)
        ck = state.get('checkpoint')
        if ck is not None and not isinstance(ck, (bytes, bytearray)):
            raise TypeError('state["checkpoint"] must be bytes or None, got %r' % type(ck).__name__)
        if 'rank_of' in state:
            raise ValueError('this is one rank\'s state of named job %r: merge every rank\'s state_dict() taken '
                             'at one step with sluice.torch.merge_state_dicts() and load that' % (state['rank_of'],))
        merged_from = state.get('merged_from')
        if merged_from is not None and not self._rank:
            raise ValueError('a merged state of named job %r resumes in loaders with a job_name and '
                             'checkpointable=True' % (merged_from,))
        if self._rank and ck is not None:
            if merged_from is None:
                raise ValueError('a loader of named job %r resumes from the merged states of a named job\'s '
                                 'ranks (sluice.torch.merge_state_dicts()), not from %r'
                                 % (self.kw['job_name'], sorted(state)))
            if merged_from == self.kw['job_name']:
                raise ValueError('resume under another job_name than %r: that job runs on until its gc '
                                 'timeout' % (merged_from,))
        self._resume = bytes(ck) if ck is not None else None
