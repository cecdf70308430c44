"""distribute(): registers a dataset, joins a job and iterates over its
batches through libsluice.

Each batch becomes a dict from component name to NumPy arrays that view the
batch's memory in place (no copy). The arrays keep a small owner object
alive through their .base chain; when the last array of a batch is gone, the
owner's finalizer calls sl_batch_release(). Bytes components are copied
into Python bytes objects, so they hold nothing."""
import ctypes
import errno
import json
import os
import struct
import threading
import time
import warnings

from . import _lib
from . import _spec
from .errors import InvalidArgumentError, SluiceTimeoutError, SluiceWaitWarning, from_code

import numpy as np

# sl_dtype_t -> NumPy typestr (little-endian, as on the wire).
_TYPESTR = {1: '|b1', 2: '|i1', 3: '<i2', 4: '<i4', 5: '<i8', 6: '|u1', 7: '<u2', 8: '<u4', 9: '<u8',
            10: '<f2', 11: '<u2', 12: '<f4', 13: '<f8'}

_DTYPES = {k: np.dtype(v) for k, v in _TYPESTR.items()}

# NumPy has no bfloat16: ml_dtypes gives one when it is installed; without
# it bfloat16 arrives as uint16 bits, marked in the dtype's metadata so that
# sluice.torch can still make torch.bfloat16 of it.
try:
    import ml_dtypes
    _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    _BFLOAT16 = np.dtype('<u2', metadata={'sluice_dtype': 'bfloat16'})

_INT_MAX = 2**31 - 1

# The longest one call into sl_iterator_next_wait() blocks: between calls
# Python runs its signal handlers (Ctrl-C). Only a wait this long costs a
# call more; a batch that is there returns at once.
_WAIT_MS = 100

# Live libsluice handles, for tests and leak hunting: live_handles().
_counts = {'batches': 0, 'iterators': 0}


def live_handles():
    """{'batches': n, 'iterators': m}: C batches not yet released and C
    iterators not yet closed by this process."""
    return dict(_counts)


class _Batch:
    """Owns one sl_batch_t; releases it when the last array viewing it goes."""

    __slots__ = ('ptr', '_release', '__weakref__')

    def __init__(self, ptr, release):
        self.ptr = ptr
        self._release = release
        _counts['batches'] += 1

    # Read from the C batch when asked: a trainer seldom asks, and two
    # ctypes calls per batch are a measurable share of the Python path.
    @property
    def num_elements(self):
        return _lib.load().sl_batch_num_elements(self.ptr) if self.ptr else None

    @property
    def task_id(self):
        return _lib.load().sl_batch_task_id(self.ptr) if self.ptr else None

    def release(self):
        """Frees the C batch now; arrays viewing it must not be used after."""
        p, self.ptr = self.ptr, None
        if p:
            self._release(p)
            _counts['batches'] -= 1

    def __del__(self):
        self.release()

    def __repr__(self):
        if not self.ptr:
            return '<sluice batch, released>'
        return '<sluice batch of %d elements from task %d>' % (self.num_elements, self.task_id)


# ctypes array types of n bytes, made here rather than with `c_char * n`:
# ctypes keeps every type made that way for good, and batches of varying
# sizes would make new ones without end. These are forgotten past _MAX_BUFS.
_BUFS = {}
_MAX_BUFS = 256


def _buf_type(n):
    t = _BUFS.get(n)
    if t is None:
        if len(_BUFS) >= _MAX_BUFS:
            _BUFS.clear()
        t = _BUFS[n] = type('sluice_bytes_%d' % n, (ctypes.Array,), {'_type_': ctypes.c_char, '_length_': n})
    return t


def _array(batch, ptr, shape, dtype):
    """A writable array viewing shape values of sl_dtype dtype at ptr. Its
    .base chain leads to a ctypes array over the C memory whose attribute
    batch is the owner: the batch stays alive as long as any view of it."""
    npdtype = _DTYPES[dtype]
    n = 1
    for d in shape:
        n *= d
    nbytes = n * npdtype.itemsize
    if not ptr or nbytes <= 0:  # no bytes at all: nothing to view
        a = np.zeros(shape, npdtype)
    else:
        buf = _buf_type(nbytes).from_address(ptr)
        buf.batch = batch
        a = np.frombuffer(buf, npdtype)
        if len(shape) != 1:
            a = a.reshape(shape)
    if dtype == _lib.DTYPE_BFLOAT16:
        a = a.view(_BFLOAT16)
    return a


def _strings(ptr, size, n, shape):
    """n bytes values (n + 1 uint64 offsets, then the bytes) as an object
    array of Python bytes of the given shape (copied)."""
    out = np.empty(n, dtype=object)
    if n:
        raw = ctypes.string_at(ptr, size)
        head = (n + 1) * 8
        offs = np.frombuffer(raw, '<u8', n + 1).tolist()
        out[:] = [raw[head + offs[k]:head + offs[k + 1]] for k in range(n)]
    return out.reshape(shape)


def tensor_to_numpy(batch, t):
    """One sl_tensor_t as NumPy: an array (dense), a (values, row_splits)
    tuple (ragged), an object array of bytes (bytes). batch is the owner the
    arrays keep alive."""
    return _convert(batch, t.name, t.dtype, tuple(t.shape[:t.rank]), t.data, t.size, t.row_splits,
                    t.num_row_splits)


def _convert(batch, name, dtype, shape, data, size, row_splits, num_row_splits):
    """tensor_to_numpy() from the fields of an sl_tensor_t (name as bytes)."""
    if row_splits:
        splits = _array(batch, row_splits, (num_row_splits,), _INT64)
        rows = int(splits[-1]) if num_row_splits else 0
        vshape = (rows,) + shape[2:]
        if dtype == _lib.DTYPE_BYTES:
            n = int(np.prod(vshape, dtype=np.int64))
            return _strings(data, size, n, vshape), splits
        return _array(batch, data, vshape, dtype), splits
    if dtype == _lib.DTYPE_BYTES:
        return _strings(data, size, int(np.prod(shape, dtype=np.int64)), shape)
    if dtype not in _TYPESTR:
        raise from_code(_lib.SL_EPROTO, 'component "%s" has dtype %d, which this package does not know'
                        % (name.decode('utf-8', 'replace'), dtype))
    return _array(batch, data, shape, dtype)


_INT64 = _lib.DTYPE_NAMES.index('int64')

# sl_tensor_t as the C compiler lays it out (native alignment): name, dtype,
# rank, shape[SL_MAX_RANK], data, size, row_splits, num_row_splits. One
# unpack per tensor costs less than reading a ctypes Structure field by field.
_TENSOR = struct.Struct('@Pii%dqPNPN' % _lib.SL_MAX_RANK)
if _TENSOR.size != ctypes.sizeof(_lib.Tensor):  # pragma: no cover
    raise ImportError('sluice: sl_tensor_t is %d bytes to ctypes, %d to struct'
                      % (ctypes.sizeof(_lib.Tensor), _TENSOR.size))

# Component names seen, bytes -> str: a trainer's batches reuse a few names.
_NAMES = {}
_MAX_NAMES = 4096


def _name(p):
    raw = ctypes.string_at(p)
    s = _NAMES.get(raw)
    if s is None:
        if len(_NAMES) >= _MAX_NAMES:
            _NAMES.clear()
        s = _NAMES[raw] = raw.decode('utf-8', 'replace')
    return s


class _Reader:
    """Turns sl_batch_t pointers into dicts of arrays with as few calls
    into libsluice as a batch allows: the number of tensors, then per tensor
    its address, one copy of its bytes and one struct unpack."""

    __slots__ = ('_num', '_tensor', '_release')

    def __init__(self, lib):
        # These return at once: called holding the GIL (_lib.load_holding_gil).
        held = _lib.load_holding_gil()
        self._num = held.sl_batch_num_tensors
        self._tensor = held.sl_batch_tensor
        self._release = held.sl_batch_release

    def __call__(self, ptr):
        # The owner, made first, releases the batch however the rest ends.
        owner = _Batch(ptr, self._release)
        out = {}
        for i in range(self._num(ptr)):
            f = _TENSOR.unpack(ctypes.string_at(self._tensor(ptr, i), _TENSOR.size))
            name_p, dtype, rank, data = f[0], f[1], f[2], f[11]
            if dtype in _DTYPES and not f[13]:
                a = _array(owner, data, f[3:3 + rank], dtype)
            else:
                a = _convert(owner, ctypes.string_at(name_p), dtype, f[3:3 + rank], data, f[12], f[13], f[14])
            out[_name(name_p)] = a
        return out


def _positive(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= _INT_MAX:
        raise InvalidArgumentError('%s must be an integer in [1, %d], got %r' % (name, _INT_MAX, v),
                                   _lib.SL_EINVAL)
    return v


def _window(name, v):
    """max_outstanding, per_worker_outstanding: 0 (sized by window_bytes) or a count."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _INT_MAX:
        raise InvalidArgumentError('%s must be an integer in [0, %d] (0: sized by window_bytes), got %r'
                                   % (name, _INT_MAX, v), _lib.SL_EINVAL)
    return v


def _check_window(max_outstanding=0, per_worker_outstanding=0, window_bytes=0):
    """The request window's three options, as sl_iterator_open() takes them
    (BatchIterator, and the torch datasets where they are given)."""
    _window('max_outstanding', max_outstanding)
    _window('per_worker_outstanding', per_worker_outstanding)
    if per_worker_outstanding > 16:
        raise InvalidArgumentError('per_worker_outstanding must be at most 16 (what a worker holds for '
                                   'redelivery), got %r' % (per_worker_outstanding,), _lib.SL_EINVAL)
    if isinstance(window_bytes, bool) or not isinstance(window_bytes, int) or not 0 <= window_bytes < 2**63:
        raise InvalidArgumentError('window_bytes must be an integer >= 0 (0: 32 MiB), got %r' % (window_bytes,),
                                   _lib.SL_EINVAL)


def _spec_text(dataset):
    # A sluice.Dataset (dataset.py, which imports this module) by what it has.
    if callable(getattr(dataset, 'to_json', None)) and isinstance(getattr(dataset, 'spec', None), dict):
        return dataset.to_json()
    if isinstance(dataset, dict):
        source, ops = _spec.checked(dataset)
        return json.dumps({'source': source, 'ops': ops}, separators=(',', ':'))
    if isinstance(dataset, bytes):
        return dataset.decode('utf-8')
    if isinstance(dataset, str):
        return dataset
    raise TypeError('dataset must be a sluice.Dataset, a spec dict or JSON text, got %s' % type(dataset).__name__)


def element_spec_from_c(es):
    """An sl_elemspec_t as {name: TensorSpec}, or None when not known."""
    if not es.known:
        return None
    out = {}
    for i in range(es.num_components):
        c = es.components[i]
        shape = None if c.rank < 0 else tuple(None if d < 0 else d for d in c.shape[:c.rank])
        out[c.name.decode('utf-8', 'replace')] = _spec.TensorSpec(shape, _lib.DTYPE_NAMES[c.dtype], c.ragged)
    return out


def _checked_element_spec(given, served, dataset_id):
    """The element_spec a caller gave from_dataset_id(), as {name:
    TensorSpec}, checked against what the dispatcher derived (when it
    could): the dispatcher's where it knows, else the caller's."""
    if not isinstance(given, dict):
        raise TypeError('element_spec must be a dict from component name to sluice.TensorSpec (or a (shape, dtype) '
                        'pair), got %s' % type(given).__name__)
    spec = {}
    for name, v in given.items():
        if not isinstance(v, _spec.TensorSpec):
            if not isinstance(v, (tuple, list)) or len(v) not in (2, 3):
                raise TypeError('element_spec[%r] must be a sluice.TensorSpec or a (shape, dtype) pair, got %r'
                                % (name, v))
            v = _spec.TensorSpec(*v)
        spec[str(name)] = v
    if served is None:
        return spec
    if list(spec) != list(served) or not all(spec[k].is_compatible_with(served[k]) for k in spec):
        raise InvalidArgumentError('element_spec %r does not match what dataset %s yields: %r'
                                   % (spec, dataset_id, served), _lib.SL_EINVAL)
    return served


def _dataset_ref(ref):
    """(id, name) to look a dataset up by: an int id, or the name it was registered under."""
    if isinstance(ref, int) and not isinstance(ref, bool) and 0 < ref < 2**64:
        return ref, None
    if isinstance(ref, str) and ref:
        if ref.isdigit():
            return int(ref), None
        return 0, ref.encode('utf-8')
    raise InvalidArgumentError('dataset_id must be the id register_dataset() returned (an integer >= 1) or the name '
                               'it was registered under, got %r' % (ref,), _lib.SL_EINVAL)


class BatchIterator:
    """An iterator over the batches of one job: dicts from component name to
    NumPy arrays. Closed (its C handles freed) at the end of the job, by
    close(), on leaving a with block and when garbage-collected; arrays
    already handed out stay valid after that.

    Iterated again once it reached its end (a new `for` loop over it), it
    gives a new iterator over the same dataset with the same options: the
    next epoch, as iterating a tf.data dataset again is. Of a named job that
    is the next repetition: the first iterator joins repetition
    `repetition` (0 by default), and each new one opened this way one more,
    so that every rank that loops over its own distribute() joins the same
    repetition per epoch (docs/sharding.md).

    Not thread-safe: use one iterator from one thread at a time."""

    def __init__(self, dataset, dispatcher, sharding='off', job_name=None, num_consumers=None,
                 consumer_index=None, max_outstanding=0, timeout_ms=30000, per_worker_outstanding=0,
                 connect_timeout_ms=5000, request_timeout_ms=10000, max_batch_bytes=256 << 20,
                 target_workers='any', checkpointable=False, checkpoint=None, max_ledger_runs=0,
                 auth_token_file=None, tls_cert=None, tls_key=None, tls_ca=None,
                 dispatcher_timeout_ms=3600000, repetition=None, shared_memory=True, window_bytes=0,
                 next_timeout_ms=None, _repetitions=None, _dataset_id=None, _element_spec=None, _deltas=False):
        self._client = None
        self._it = None
        self._mu = threading.Lock()
        self.job_id = None
        self.dataset_id = None
        self.element_spec = None
        self.dispatcher = str(dispatcher)
        self.notice = ''
        self._ended = False
        if repetition is not None and (isinstance(repetition, bool) or not isinstance(repetition, int) or
                                       not 0 <= repetition < 2**64):
            raise InvalidArgumentError('repetition must be an integer >= 0, got %r' % (repetition,), _lib.SL_EINVAL)
        if repetition and not job_name:
            raise InvalidArgumentError('repetition %d needs a job_name: repetitions are the passes over a named '
                                       'job' % repetition, _lib.SL_EINVAL)
        self.repetition = (repetition or 0) if job_name else None
        # What the next iterator of this distribute() opens: the same
        # arguments, the next repetition (shared by every iterator opened
        # from the first, as tf.data counts per distributed dataset).
        self._again = dict(dataset=dataset, dispatcher=dispatcher, sharding=sharding, job_name=job_name,
                           num_consumers=num_consumers, consumer_index=consumer_index,
                           max_outstanding=max_outstanding, timeout_ms=timeout_ms,
                           per_worker_outstanding=per_worker_outstanding, window_bytes=window_bytes,
                           connect_timeout_ms=connect_timeout_ms, request_timeout_ms=request_timeout_ms,
                           max_batch_bytes=max_batch_bytes,
                           target_workers=target_workers, checkpointable=checkpointable,
                           max_ledger_runs=max_ledger_runs, auth_token_file=auth_token_file, tls_cert=tls_cert,
                           tls_key=tls_key, tls_ca=tls_ca, dispatcher_timeout_ms=dispatcher_timeout_ms,
                           shared_memory=shared_memory, next_timeout_ms=next_timeout_ms, _dataset_id=_dataset_id,
                           _element_spec=_element_spec)
        self._repetitions = _repetitions if _repetitions is not None else {'next': (repetition or 0) + 1}
        if (num_consumers is None) != (consumer_index is None):
            raise InvalidArgumentError('num_consumers and consumer_index go together, got %r and %r'
                                       % (num_consumers, consumer_index), _lib.SL_EINVAL)
        if num_consumers is not None:
            for name, v in (('num_consumers', num_consumers), ('consumer_index', consumer_index)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise InvalidArgumentError('%s must be an integer >= 0, got %r' % (name, v), _lib.SL_EINVAL)
            if num_consumers < 1 or consumer_index >= num_consumers:
                raise InvalidArgumentError('consumer_index %r is out of range for num_consumers %r'
                                           % (consumer_index, num_consumers), _lib.SL_EINVAL)
        if target_workers not in _lib.TARGET_WORKERS:
            raise InvalidArgumentError('target_workers must be one of %s, got %r'
                                       % (', '.join(_lib.TARGET_WORKERS), target_workers), _lib.SL_EINVAL)
        by_id = _dataset_id is not None
        if by_id:
            _dataset_ref(_dataset_id)
        self.spec = None if by_id else _spec_text(dataset)
        self.sharding = self._sharding(sharding)
        for name, v in (('timeout_ms', timeout_ms), ('connect_timeout_ms', connect_timeout_ms),
                        ('request_timeout_ms', request_timeout_ms), ('dispatcher_timeout_ms', dispatcher_timeout_ms)):
            _positive(name, v)
        # The longest one next() waits for a batch (DataLoader's timeout,
        # in ms); the iterator stays open past it. None: as long as it takes.
        self._next_timeout_ms = None if next_timeout_ms is None else _positive('next_timeout_ms', next_timeout_ms)
        self._first_wait_ms = min(_WAIT_MS, next_timeout_ms or _WAIT_MS)
        _check_window(max_outstanding, per_worker_outstanding, window_bytes)
        if isinstance(max_batch_bytes, bool) or not isinstance(max_batch_bytes, int) or max_batch_bytes < 1:
            raise InvalidArgumentError('max_batch_bytes must be a positive integer, got %r' % (max_batch_bytes,),
                                       _lib.SL_EINVAL)
        if isinstance(max_ledger_runs, bool) or not isinstance(max_ledger_runs, int) or max_ledger_runs < 0:
            raise InvalidArgumentError('max_ledger_runs must be an integer >= 0 (0: the most), got %r'
                                       % (max_ledger_runs,), _lib.SL_EINVAL)
        lib = self._lib = _lib.load()
        self._next = lib.sl_iterator_next_wait
        self._read = _Reader(lib)
        # One out-parameter for every sl_iterator_next(): a byref() per call
        # is an allocation the loop does not need.
        self._out = ctypes.c_void_p()
        self._out_ref = ctypes.byref(self._out)

        # No single wait may outlast timeout_ms, as in sluice-cat.
        co = _lib.ClientOpts()
        lib.sl_client_opts_init(ctypes.byref(co))
        co.connect_timeout_ms = min(connect_timeout_ms, timeout_ms)
        co.request_timeout_ms = min(request_timeout_ms, timeout_ms)
        # Security (docs/security.md): read by sl_client_open(), which keeps
        # what it needs; None leaves SLUICE_AUTH_TOKEN_FILE to decide.
        for name, v in (('auth_token_file', auth_token_file), ('tls_cert', tls_cert), ('tls_key', tls_key),
                        ('tls_ca', tls_ca)):
            if v is not None:
                if not isinstance(v, (str, bytes, os.PathLike)):
                    raise InvalidArgumentError('%s must be a path, got %r' % (name, v), _lib.SL_EINVAL)
                setattr(co, name, os.fsencode(v))
        client = ctypes.c_void_p()
        rc = lib.sl_client_open(self.dispatcher.encode(), ctypes.byref(co), ctypes.byref(client))
        self._client = client.value
        if rc < 0:
            err = from_code(rc, self._client_err(), 'dispatcher %s' % self.dispatcher)
            self._close_handles()
            raise err
        ds = ctypes.c_uint64()
        es = _lib.ElemSpec()
        if by_id:
            num, name = _dataset_ref(_dataset_id)
            rc = lib.sl_client_lookup_dataset(self._client, num, name, ctypes.byref(ds), ctypes.byref(es))
            what = 'dataset %s on %s' % (_dataset_id, self.dispatcher)
        else:
            spec = self.spec.encode('utf-8')
            rc = lib.sl_client_register_dataset_as(self._client, spec, len(spec), None, ctypes.byref(ds),
                                                   ctypes.byref(es))
            what = 'dataset refused by %s' % self.dispatcher
        if rc < 0:
            err = from_code(rc, self._client_err(), what)
            self._close_handles()
            raise err
        self.dataset_id = ds.value
        self.element_spec = element_spec_from_c(es)
        if _element_spec is not None:
            try:
                self.element_spec = _checked_element_spec(_element_spec, self.element_spec, self.dataset_id)
            except Exception:
                self._close_handles()
                raise

        io = _lib.IteratorOpts()
        lib.sl_iterator_opts_init(ctypes.byref(io))
        io.sharding = self.sharding
        name = job_name.encode('utf-8') if job_name is not None else None
        io.job_name = name
        io.max_outstanding = max_outstanding
        io.per_worker_outstanding = per_worker_outstanding
        io.window_bytes = window_bytes
        io.connect_timeout_ms = min(connect_timeout_ms, timeout_ms)
        io.timeout_ms = timeout_ms
        io.dispatcher_timeout_ms = dispatcher_timeout_ms
        io.max_batch_bytes = max_batch_bytes
        io.max_ledger_runs = max_ledger_runs
        io.num_consumers = num_consumers or 0
        io.consumer_index = consumer_index or 0
        io.target_workers = _lib.TARGET_WORKERS[target_workers]
        io.repetition = self.repetition or 0
        # Checkpoints need the batches' provenance (libsluice's opts.provenance).
        io.provenance = 1 if (checkpointable or checkpoint is not None) else 0
        # delta() (sluice.torch's StatefulDataLoader workers): the iterator
        # keeps what it records of each batch until delta() takes it.
        io.ledger_deltas = 1 if _deltas else 0
        # A worker on this host hands batches over in shared memory (docs/protocol.md).
        io.shm = 0 if shared_memory else -1
        it = ctypes.c_void_p()
        if checkpoint is not None:
            if not isinstance(checkpoint, (bytes, bytearray)):
                self._close_handles()
                raise InvalidArgumentError('checkpoint must be the bytes checkpoint() returned, got %r'
                                           % type(checkpoint).__name__, _lib.SL_EINVAL)
            ck = bytes(checkpoint)
            rc = lib.sl_iterator_restore(self._client, self.dataset_id, ctypes.byref(io), ck, len(ck),
                                         ctypes.byref(it))
        else:
            rc = lib.sl_iterator_open(self._client, self.dataset_id, ctypes.byref(io), ctypes.byref(it))
        self._it = it.value
        if self._it:
            _counts['iterators'] += 1
        if rc < 0:
            err = from_code(rc, self._iter_err(), 'cannot open an iterator on %s' % self.dispatcher)
            self._close_handles()
            raise err
        self.job_id = lib.sl_iterator_job_id(self._it)
        # What the dispatcher said on joining (the repetition had already
        # ended, or was collected and is created again).
        self.notice = lib.sl_iterator_notice(self._it).decode('utf-8', 'replace')

    @staticmethod
    def _sharding(s):
        if isinstance(s, str) and s.lower() in _lib.SHARDING:
            return _lib.SHARDING[s.lower()]
        if isinstance(s, int) and not isinstance(s, bool) and s in _lib.SHARDING.values():
            return s
        raise InvalidArgumentError('sharding must be one of %s, got %r' % (', '.join(_lib.SHARDING), s),
                                   _lib.SL_EINVAL)

    def _client_err(self):
        return self._lib.sl_client_errmsg(self._client).decode('utf-8', 'replace')

    def _iter_err(self):
        return self._lib.sl_iterator_errmsg(self._it).decode('utf-8', 'replace')

    # ---- iteration ----

    def __iter__(self):
        if not self._ended:
            return self
        return self.next_repetition()

    def next_repetition(self):
        """A new iterator over the same dataset with the same options: for a
        named job, the next repetition of this distribute() (each call one
        more); for an anonymous job, a new job of its own. What iter() gives
        once this iterator reached its end."""
        kw = dict(self._again)
        if kw['job_name']:
            kw['repetition'] = self._repetitions['next']
            self._repetitions['next'] += 1
        return BatchIterator(_repetitions=self._repetitions, **kw)

    def __next__(self):
        with self._mu:
            if not self._it:
                raise StopIteration
            rc = self._next(self._it, self._out_ref, self._first_wait_ms)
            if rc == -errno.EAGAIN:
                rc = self._wait()
            if rc == 0:
                return self._read(self._out.value)
            if rc == 1:
                self._ended = True
                self._close_handles()
                raise StopIteration
            if rc == -errno.EAGAIN:
                raise self._no_batch()
            msg = self._iter_err()
            said = 'job %s: ' % self.job_id  # libsluice's own prefix, which the context below says
            err = from_code(rc, msg[len(said):] if msg.startswith(said) else msg,
                            'job %s on %s' % (self.job_id, self.dispatcher))
            self._close_handles()
            raise err

    def _wait(self):
        """sl_iterator_next() in waits of _WAIT_MS, so that Python sees to its
        signals in between (Ctrl-C raises KeyboardInterrupt in the main
        thread at once), and warns once of what the wait is on when
        libsluice knows (no live worker serves the job). -EAGAIN once
        next_timeout_ms passed since next() began (its first wait was
        _first_wait_ms)."""
        if self._next_timeout_ms is not None:
            deadline = time.monotonic() + (self._next_timeout_ms - self._first_wait_ms) / 1000
        said = False
        while True:
            wait = _WAIT_MS
            if self._next_timeout_ms is not None:
                wait = min(wait, int((deadline - time.monotonic()) * 1000))
                if wait <= 0:
                    return -errno.EAGAIN
            rc = self._next(self._it, self._out_ref, wait)
            if rc != -errno.EAGAIN:
                return rc
            if not said:
                what = self._waiting()
                if what:
                    said = True
                    warnings.warn(SluiceWaitWarning('sluice: job %s on %s: %s' % (self.job_id, self.dispatcher, what)),
                                  stacklevel=3)

    def _waiting(self):
        """What the iterator waits on, when libsluice knows (sl_iterator_waiting()); '' otherwise."""
        buf = ctypes.create_string_buffer(512)
        if self._lib.sl_iterator_waiting(self._it, buf, len(buf)) == 0:
            return ''
        return buf.value.decode('utf-8', 'replace')

    def _no_batch(self):
        """The error of a next() that waited next_timeout_ms: the iterator
        stays open, and what comes later is not lost."""
        what = self._waiting()
        on = ' (%s)' % what if what else ''
        return SluiceTimeoutError('no batch within next_timeout_ms = %d ms%s; the iterator stays open: next() '
                                  'waits again, close() ends it' % (self._next_timeout_ms, on),
                                  -errno.ETIMEDOUT, 'job %s on %s' % (self.job_id, self.dispatcher))

    # ---- closing ----

    @property
    def closed(self):
        return self._it is None and self._client is None

    def close(self):
        """Leaves the job and frees the C handles. Arrays already handed out
        stay valid. Idempotent."""
        with self._mu:
            self._close_handles()

    def _close_handles(self):
        # The iterator first: sl_client_close() wants its iterators closed.
        it, self._it = self._it, None
        if it:
            self._missing = self._lib.sl_iterator_records_missing(it)
            self._lib.sl_iterator_close(it)
            _counts['iterators'] -= 1
        client, self._client = self._client, None
        if client:
            self._lib.sl_client_close(client)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        # A failed __init__ may leave no lock; the handles are None then.
        if getattr(self, '_it', None) or getattr(self, '_client', None):
            self._close_handles()

    def __repr__(self):
        rep = ' repetition %d' % self.repetition if self.repetition is not None else ''
        return '<sluice.BatchIterator job %s%s on %s%s>' % (self.job_id, rep, self.dispatcher,
                                                            ', closed' if self.closed else '')

    @property
    def queued(self):
        """Batches received and waiting to be returned (sl_iterator_queued():
        prefetched; 0 at every step means the loop waits on its input). A
        named DYNAMIC job's iterator gives them back to the job's other
        consumers when it is closed (docs/fault-tolerance.md). 0 once closed."""
        with self._mu:
            return self._lib.sl_iterator_queued(self._it) if self._it else 0

    @property
    def records_missing(self):
        """Records a worker delivered to this iterator that never reached it
        (sl_iterator_records_missing(): DYNAMIC, anonymous jobs; brought up
        to date at the end and at each checkpoint; kept once it is closed).
        0 unless a batch was lost on the way, which no path should do
        (docs/fault-tolerance.md)."""
        with self._mu:
            return self._lib.sl_iterator_records_missing(self._it) if self._it else getattr(self, '_missing', 0)

    def checkpoint(self):
        """The iterator's checkpoint as bytes: distribute(..., checkpoint=these
        bytes) in any process continues right after the last batch this
        iterator returned, every other element exactly once. Needs
        sharding="dynamic" and checkpointable=True (or an iterator that was
        itself restored), and no num_consumers. An iterator of a named job
        (one rank of several) holds what its own caller was given: merge the
        ranks' checkpoints with sluice.merge_checkpoints(). Asks the dispatcher
        which epochs are done first (one round trip, waited for a heartbeat
        interval at most), so that it holds only the epochs still open."""
        with self._mu:
            if not self._it:
                raise InvalidArgumentError('the iterator is closed: take the checkpoint before its end or '
                                           'close()', _lib.SL_EINVAL)
            buf, n = ctypes.c_void_p(), ctypes.c_size_t()
            rc = self._lib.sl_iterator_checkpoint(self._it, ctypes.byref(buf), ctypes.byref(n))
            if rc < 0:
                raise from_code(rc, self._iter_err(), 'checkpoint of job %s' % self.job_id)
            try:
                return ctypes.string_at(buf.value, n.value)
            finally:
                self._lib.sl_free(buf)

    def delta(self):
        """What the iterator recorded of the batches it returned since the
        last delta() (or since it opened), as bytes for a CheckpointBuilder
        in any process: about the size of those batches' provenance, never
        growing with the run. Needs an iterator opened with _deltas=True."""
        with self._mu:
            if not self._it:
                raise InvalidArgumentError('the iterator is closed', _lib.SL_EINVAL)
            buf, n = ctypes.c_void_p(), ctypes.c_size_t()
            rc = self._lib.sl_iterator_delta(self._it, ctypes.byref(buf), ctypes.byref(n), None, None)
            if rc < 0:
                raise from_code(rc, self._iter_err(), 'delta of job %s' % self.job_id)
            try:
                return ctypes.string_at(buf.value, n.value)
            finally:
                self._lib.sl_free(buf)

    def state_dict(self):
        """{"checkpoint": bytes}: see checkpoint()."""
        return {'checkpoint': self.checkpoint()}

    def load_state_dict(self, state):
        raise InvalidArgumentError('an open iterator cannot jump: pass the state\'s checkpoint to '
                                   'distribute(..., checkpoint=state["checkpoint"]), or use '
                                   'sluice.torch.loader, whose load_state_dict() does', _lib.SL_EINVAL)


def merge_checkpoints(checkpoints, auth_token_file=None):
    """Merges the checkpoints of the ranks of one named job (sharding
    "dynamic"), taken when all of them stopped at a common step, into one:
    the union of what their callers were given (add the last checkpoint of
    a rank that left the job mid-run, taken as it left, until the job's
    fold passes it: docs/python.md). Every rank then resumes
    with distribute(..., job_name=NAME, checkpoint=merged): the first
    creates the named job, the others join it, any number of them.
    checkpoints: a list of bytes from BatchIterator.checkpoint().
    auth_token_file: the cluster token they were made with (default:
    SLUICE_AUTH_TOKEN_FILE, if set). Needs no dispatcher. Raises DataError
    (damaged, another token) or InvalidArgumentError (other datasets, none
    given)."""
    cks = []
    for i, c in enumerate(checkpoints):
        if not isinstance(c, (bytes, bytearray)):
            raise InvalidArgumentError('checkpoint %d must be the bytes checkpoint() returned, got %r'
                                       % (i + 1, type(c).__name__), _lib.SL_EINVAL)
        cks.append(bytes(c))
    lib = _lib.load()
    n = len(cks)
    ptrs = (ctypes.c_void_p * max(n, 1))(*[ctypes.cast(ctypes.c_char_p(c), ctypes.c_void_p) for c in cks])
    lens = (ctypes.c_size_t * max(n, 1))(*[len(c) for c in cks])
    out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
    err = ctypes.create_string_buffer(512)
    token = os.fsencode(auth_token_file) if auth_token_file is not None else None
    rc = lib.sl_checkpoint_merge(ptrs, lens, n, token, ctypes.byref(out), ctypes.byref(out_len), err, len(err))
    if rc < 0:
        raise from_code(rc, err.value.decode('utf-8', 'replace'), 'merge_checkpoints')
    try:
        return ctypes.string_at(out.value, out_len.value)
    finally:
        lib.sl_free(out)


def distribute(dataset, dispatcher, sharding='off', job_name=None, num_consumers=None, consumer_index=None,
               max_outstanding=0, timeout_ms=30000, **options):
    """Registers dataset (a Dataset, a spec dict or JSON text) with the
    dispatcher at "host:port", joins the job named job_name (or creates an
    anonymous job) and returns a BatchIterator.

    sharding: "off", "dynamic", "file", "data", "file_or_data" or "hint".
    max_outstanding: batch requests in flight plus batches queued; 0
    (default): as many as window_bytes holds at the largest batch received
    so far, 8 to 32 (8 until the first batch).
    timeout_ms: the longest wait for a worker that does not answer; no
    single wait lasts longer (but one for the dispatcher, below).
    options: dispatcher_timeout_ms (3600000: how long a running iterator
    rides through a dispatcher it cannot reach, reading what the workers
    serve and reconnecting, before it fails; as tf.data service),
    per_worker_outstanding (requests in flight to one worker, at most 16;
    0, the default: half the window, 4 to 16), window_bytes (0: 32 MiB; the
    bytes the window of max_outstanding 0 holds: memory of at most the
    larger of 8 batches and window_bytes), connect_timeout_ms (5000),
    request_timeout_ms (10000), max_batch_bytes (256 MiB), target_workers,
    max_ledger_runs (0: 2,097,152, the most; the runs of positions the
    record of what arrived may hold, which checkpoints are made of);
    auth_token_file (the cluster token; default SLUICE_AUTH_TOKEN_FILE),
    tls_cert, tls_key, tls_ca (TLS 1.3, all three or none; docs/security.md).
    checkpointable: make it.checkpoint() possible (sharding="dynamic", no
    num_consumers); workers then send each batch's provenance.
    checkpoint: bytes from it.checkpoint(): a new iterator that continues
    right after that iterator's last batch (docs/fault-tolerance.md). With
    job_name: bytes from sluice.merge_checkpoints() of the ranks of a named
    job, which every rank of the resumed job passes with the same job_name.
    num_consumers, consumer_index: coordinated reads: consumer i of a named
    job over an infinite dataset gets the i-th batch of every round, all
    batches of a round from one worker (docs/sharding.md).
    repetition: which pass over a named job to join (default 0); a
    repetition that already ended gives its end at once (it.notice says
    so). Iterating the returned iterator again after its end opens the next
    repetition by itself (BatchIterator).
    options also takes target_workers: "any" (default) or "local" (only
    workers on this host), and shared_memory (True: a worker on this host
    hands its batches over in shared memory, where it offers it; False:
    every batch over the socket)."""
    return BatchIterator(dataset, dispatcher, sharding=sharding, job_name=job_name, num_consumers=num_consumers,
                         consumer_index=consumer_index, max_outstanding=max_outstanding, timeout_ms=timeout_ms,
                         **options)


def register_dataset(dispatcher, dataset, dataset_id=None, **options):
    """Registers dataset (a Dataset, a spec dict or JSON text) with the
    dispatcher at "host:port" and returns its id (an int), as tf.data
    service's register_dataset(). dataset_id: a name to register it under
    (1 to 127 of [A-Za-z0-9_.:/-], not all digits), which from_dataset_id()
    in any process takes in place of the id. A dataset is its (name, spec):
    registering the same pair again gives the same id; a name that another
    spec holds is refused (sluice.ConflictError). options: the client's:
    connect_timeout_ms, request_timeout_ms, auth_token_file, tls_cert,
    tls_key, tls_ca."""
    name = None
    if dataset_id is not None:
        if not isinstance(dataset_id, str) or not dataset_id:
            raise InvalidArgumentError('dataset_id must be a name (a non-empty str), got %r' % (dataset_id,),
                                       _lib.SL_EINVAL)
        name = dataset_id.encode('utf-8')
    spec = _spec_text(dataset).encode('utf-8')
    with _Client(dispatcher, **options) as c:
        ds = ctypes.c_uint64()
        rc = c.lib.sl_client_register_dataset_as(c.ptr, spec, len(spec), name, ctypes.byref(ds), None)
        if rc < 0:
            raise from_code(rc, c.err(), 'dataset refused by %s' % dispatcher)
        return ds.value


def dataset_element_spec(dispatcher, dataset_id, **options):
    """What the elements of a registered dataset (by id or name) hold, as
    the dispatcher derives it from the spec: {name: TensorSpec} in the order
    batches hold them, or None when the spec does not say."""
    num, name = _dataset_ref(dataset_id)
    with _Client(dispatcher, **options) as c:
        es = _lib.ElemSpec()
        rc = c.lib.sl_client_lookup_dataset(c.ptr, num, name, None, ctypes.byref(es))
        if rc < 0:
            raise from_code(rc, c.err(), 'dataset %s on %s' % (dataset_id, dispatcher))
        return element_spec_from_c(es)


def from_dataset_id(dispatcher, dataset_id, element_spec=None, sharding='off', job_name=None, **options):
    """A BatchIterator over a dataset registered before (register_dataset(),
    in any process): dataset_id is its id or the name it was registered
    under, as tf.data service's from_dataset_id(). The spec stays on the
    dispatcher; it.element_spec says what the batches hold before the first
    one comes. element_spec (optional): {name: TensorSpec or (shape,
    dtype)}, checked against the dispatcher's where the spec says, used
    where it does not. The other arguments are distribute()'s."""
    return BatchIterator(None, dispatcher, sharding=sharding, job_name=job_name, _dataset_id=dataset_id,
                         _element_spec=element_spec, **options)


class _Client:
    """A libsluice client for one request, closed on leaving the with block."""

    def __init__(self, dispatcher, connect_timeout_ms=5000, request_timeout_ms=10000, auth_token_file=None,
                 tls_cert=None, tls_key=None, tls_ca=None):
        _positive('connect_timeout_ms', connect_timeout_ms)
        _positive('request_timeout_ms', request_timeout_ms)
        self.lib = _lib.load()
        co = _lib.ClientOpts()
        self.lib.sl_client_opts_init(ctypes.byref(co))
        co.connect_timeout_ms = connect_timeout_ms
        co.request_timeout_ms = request_timeout_ms
        for name, v in (('auth_token_file', auth_token_file), ('tls_cert', tls_cert), ('tls_key', tls_key),
                        ('tls_ca', tls_ca)):
            if v is not None:
                setattr(co, name, os.fsencode(v))
        client = ctypes.c_void_p()
        rc = self.lib.sl_client_open(str(dispatcher).encode(), ctypes.byref(co), ctypes.byref(client))
        self.ptr = client.value
        if rc < 0:
            err = from_code(rc, self.err(), 'dispatcher %s' % dispatcher)
            self.close()
            raise err

    def err(self):
        return self.lib.sl_client_errmsg(self.ptr).decode('utf-8', 'replace')

    def close(self):
        p, self.ptr = self.ptr, None
        if p:
            self.lib.sl_client_close(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class CheckpointBuilder:
    """The checkpoints of an iterator in another process, from its deltas
    (BatchIterator.delta()): a record of its own of what that iterator
    returned, fed the deltas in the order they were taken.
    checkpoint() gives the bytes the iterator's checkpoint() would have
    given right after the last delta applied. Needs no dispatcher.

    dataset_id: the iterator's (BatchIterator.dataset_id); checkpoint: the
    one the iterator was restored from, or None; auth_token_file and
    max_ledger_runs: the iterator's."""

    def __init__(self, dataset_id, checkpoint=None, auth_token_file=None, max_ledger_runs=0):
        self._lib = _lib.load()
        self._b = None
        ck = bytes(checkpoint) if checkpoint is not None else None
        b = ctypes.c_void_p()
        tf = os.fsencode(auth_token_file) if auth_token_file is not None else None
        rc = self._lib.sl_ckpt_builder_open(dataset_id, tf, max_ledger_runs, ck, len(ck) if ck else 0,
                                            ctypes.byref(b))
        self._b = b.value
        if rc < 0:
            err = from_code(rc, self._err(), 'checkpoint builder of dataset %d' % dataset_id)
            self.close()
            raise err

    def _err(self):
        return self._lib.sl_ckpt_builder_errmsg(self._b).decode('utf-8', 'replace')

    def apply(self, delta):
        """Applies one delta; a refused one changes nothing."""
        rc = self._lib.sl_ckpt_builder_apply(self._b, delta, len(delta))
        if rc < 0:
            raise from_code(rc, self._err(), 'delta')

    def checkpoint(self):
        buf, n = ctypes.c_void_p(), ctypes.c_size_t()
        rc = self._lib.sl_ckpt_builder_checkpoint(self._b, ctypes.byref(buf), ctypes.byref(n))
        if rc < 0:
            raise from_code(rc, self._err(), 'checkpoint')
        try:
            return ctypes.string_at(buf.value, n.value)
        finally:
            self._lib.sl_free(buf)

    def close(self):
        b, self._b = self._b, None
        if b:
            self._lib.sl_ckpt_builder_close(b)

    def __del__(self):
        if getattr(self, '_b', None):
            self.close()
