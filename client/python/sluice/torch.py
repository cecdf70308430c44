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
lists of Python bytes (nested for rank > 1)."""
import numpy as np
import torch

from .client import distribute

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
    return v


def _no_checkpoints():
    raise NotImplementedError('a SluiceIterableDataset runs one iterator per DataLoader process, and their '
                              'checkpoints are not collected: use sluice.torch.loader, whose state_dict() and '
                              'load_state_dict() resume mid-epoch')


class SluiceIterableDataset(torch.utils.data.IterableDataset):
    """A torch IterableDataset over a Sluice job. Each iter() registers the
    dataset and opens a new iterator (an anonymous job per epoch, unless
    job_name names a shared one) and yields dicts of torch tensors.

    distribute_kwargs go to sluice.distribute(): sharding, job_name,
    max_outstanding, timeout_ms, ... Use it in a DataLoader with
    batch_size=None. With num_workers > 0 every loader process opens its own
    iterator: under sharding="off" each one gets the whole dataset; give a
    job_name and sharding="dynamic" to split one epoch between them."""

    def __init__(self, ds, dispatcher, **distribute_kwargs):
        super().__init__()
        self.ds = ds
        self.dispatcher = dispatcher
        self.distribute_kwargs = distribute_kwargs

    def __iter__(self):
        it = distribute(self.ds, self.dispatcher, **self.distribute_kwargs)
        try:
            for batch in it:
                yield batch_to_torch(batch)
        finally:
            it.close()

    def state_dict(self):
        _no_checkpoints()

    def load_state_dict(self, state):
        _no_checkpoints()


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
    no job_name (the loader then asks for checkpointable iterators)."""

    def __init__(self, ds, dispatcher, pin_memory=False, **kw):
        self.ds = ds
        self.dispatcher = dispatcher
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self.kw = kw
        self._it = None
        self._resume = None
        self._stateful = kw.get('sharding') == 'dynamic' and not kw.get('job_name')

    def __iter__(self):
        self.close()
        kw = dict(self.kw)
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

    def close(self):
        """Closes the iterator of the iteration under way, if any."""
        if self._it is not None:
            self._it.close()
            self._it = None

    def _need_stateful(self):
        if not self._stateful:
            raise NotImplementedError('state_dict() needs sharding="dynamic" and no job_name: checkpoints '
                                      'resume a job of the loader\'s own')

    def state_dict(self):
        """{"checkpoint": bytes} of the iteration under way, or
        {"checkpoint": None} when none is (the next iter() starts anew)."""
        self._need_stateful()
        if self._it is None or self._it.closed:
            return {'checkpoint': self._resume}
        return {'checkpoint': self._it.checkpoint()}

    def load_state_dict(self, state):
        """The next iter() continues from state (what state_dict() gave)."""
        self._need_stateful()
        ck = state.get('checkpoint') if isinstance(state, dict) else None
        if ck is not None and not isinstance(ck, (bytes, bytearray)):
            raise TypeError('state["checkpoint"] must be bytes or None, got %r' % type(ck).__name__)
        self._resume = bytes(ck) if ck is not None else None
