"""Loads libsluice through ctypes and declares the parts of sluice.h that the
Python package calls. No compile step: the shared library is found at run
time (see find_library()).

Every function here is called with the GIL released (ctypes.CDLL does that),
so a trainer's other threads run while sl_iterator_next() waits."""
import ctypes
import os
import sys
import threading

# Error codes of sluice.h (system failures are -errno).
SL_EPROTO = -5001
SL_EVERSION = -5002
SL_ETOOBIG = -5003
SL_ESPEC = -5004
SL_ENOTFOUND = -5005
SL_ECONFLICT = -5006
SL_EREMOTE = -5007
SL_ECANCELLED = -5008
SL_ECLOSED = -5009
SL_EINTERNAL = -5010
SL_EDATA = -5011
SL_EINVAL = -5012
SL_EREFUSED = -5013
SL_EPERM = -5014
SL_EAUTH = -5015
SL_ELIMIT = -5016
SL_ENOHOST = -5017

CODE_NAMES = {
    SL_EPROTO: 'SL_EPROTO', SL_EVERSION: 'SL_EVERSION', SL_ETOOBIG: 'SL_ETOOBIG', SL_ESPEC: 'SL_ESPEC',
    SL_ENOTFOUND: 'SL_ENOTFOUND', SL_ECONFLICT: 'SL_ECONFLICT', SL_EREMOTE: 'SL_EREMOTE',
    SL_ECANCELLED: 'SL_ECANCELLED', SL_ECLOSED: 'SL_ECLOSED', SL_EINTERNAL: 'SL_EINTERNAL',
    SL_EDATA: 'SL_EDATA', SL_EINVAL: 'SL_EINVAL', SL_EREFUSED: 'SL_EREFUSED',
    SL_EPERM: 'SL_EPERM', SL_EAUTH: 'SL_EAUTH', SL_ELIMIT: 'SL_ELIMIT',
    SL_ENOHOST: 'SL_ENOHOST',
}

# sl_dtype_t, as numbered on the wire.
DTYPE_NAMES = ['invalid', 'bool', 'int8', 'int16', 'int32', 'int64', 'uint8', 'uint16', 'uint32', 'uint64',
               'float16', 'bfloat16', 'float32', 'float64', 'bytes']
DTYPE_BYTES = 14
DTYPE_BFLOAT16 = 11

SL_MAX_RANK = 8

SHARDING = {'off': 0, 'dynamic': 1, 'file': 2, 'data': 3, 'file_or_data': 4, 'hint': 5}
TARGET_WORKERS = {'any': 0, 'local': 1}


class Tensor(ctypes.Structure):
    """sl_tensor_t: valid until sl_batch_release() of its batch."""
    _fields_ = [
        ('name', ctypes.c_char_p),
        ('dtype', ctypes.c_int),
        ('rank', ctypes.c_int),
        ('shape', ctypes.c_int64 * SL_MAX_RANK),
        ('data', ctypes.c_void_p),
        ('size', ctypes.c_size_t),
        ('row_splits', ctypes.c_void_p),
        ('num_row_splits', ctypes.c_size_t),
    ]


class ComponentSpec(ctypes.Structure):
    """sl_component_spec_t."""
    _fields_ = [('name', ctypes.c_char * 64), ('dtype', ctypes.c_int), ('rank', ctypes.c_int),
                ('shape', ctypes.c_int64 * SL_MAX_RANK), ('ragged', ctypes.c_int)]


SL_MAX_COMPONENTS = 32


class ElemSpec(ctypes.Structure):
    """sl_elemspec_t."""
    _fields_ = [('known', ctypes.c_int), ('num_components', ctypes.c_int),
                ('components', ComponentSpec * SL_MAX_COMPONENTS)]


class ClientOpts(ctypes.Structure):
    """sl_client_opts_t."""
    _fields_ = [('connect_timeout_ms', ctypes.c_int), ('request_timeout_ms', ctypes.c_int),
                ('auth_token_file', ctypes.c_char_p), ('tls_cert', ctypes.c_char_p),
                ('tls_key', ctypes.c_char_p), ('tls_ca', ctypes.c_char_p)]


class IteratorOpts(ctypes.Structure):
    """sl_iterator_opts_t; job_name is copied by sl_iterator_open()."""
    _fields_ = [
        ('sharding', ctypes.c_int),
        ('job_name', ctypes.c_char_p),
        ('max_outstanding', ctypes.c_int),
        ('per_worker_outstanding', ctypes.c_int),
        ('connect_timeout_ms', ctypes.c_int),
        ('timeout_ms', ctypes.c_int),
        ('max_batch_bytes', ctypes.c_size_t),
        ('num_consumers', ctypes.c_int),
        ('consumer_index', ctypes.c_int),
        ('target_workers', ctypes.c_int),
        ('provenance', ctypes.c_int),
        ('max_ledger_runs', ctypes.c_size_t),
        ('dispatcher_timeout_ms', ctypes.c_int),
        ('repetition', ctypes.c_uint64),
        ('ledger_deltas', ctypes.c_int),
        ('shm', ctypes.c_int),
        ('window_bytes', ctypes.c_size_t),
    ]


_LIB_NAMES = ('libsluice.so', 'libsluice.so.0')
_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """Where the library may be, in the order it is looked for: (path, why)."""
    out = []
    env = os.environ.get('SLUICE_LIB')
    if env:
        if os.path.isdir(env):
            out += [(os.path.join(env, n), 'SLUICE_LIB') for n in _LIB_NAMES]
        else:
            out.append((env, 'SLUICE_LIB'))
        # An explicit choice is final: never fall back to another library.
        return out
    # Installed: `cmake --install` writes _installed.py with the library
    # directory relative to this package, so the tree can be moved (DESTDIR).
    try:
        from . import _installed
        libdir = os.path.normpath(os.path.join(_here, _installed.LIBDIR))
        out += [(os.path.join(libdir, n), 'installed') for n in _LIB_NAMES]
    except ImportError:
        pass
    # The build tree of the repository this package sits in
    # (client/python/sluice -> the repository root).
    repo = os.path.normpath(os.path.join(_here, '..', '..', '..'))
    out += [(os.path.join(repo, 'build', 'client', n), 'build tree') for n in _LIB_NAMES]
    return out


_lock = threading.Lock()
_lib = None
_lib_path = None


class LibraryNotFound(OSError):
    """libsluice could not be loaded; the message lists every place tried."""


def library_path():
    """The path of the loaded libsluice (loads it on first use)."""
    load()
    return _lib_path


def load():
    """Loads libsluice once and declares its functions; returns the CDLL."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path, why in _candidates():
            if not os.path.exists(path):
                tried.append('%s (%s): not there' % (path, why))
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append('%s (%s): %s' % (path, why, e))
                continue
            _declare(lib)
            _lib_path = path
            _lib = lib
            return lib
        raise LibraryNotFound(
            'sluice: cannot load libsluice. Set SLUICE_LIB to the path of libsluice.so '
            '(built as BUILD/client/libsluice.so), or install it with cmake --install. Looked at:\n  '
            + '\n  '.join(tried))


def _declare(lib):
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    P = ctypes.POINTER

    def fn(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)

    fn('sl_strerror', c_char_p, c_int)
    fn('sl_version', c_char_p)
    fn('sl_dtype_name', c_char_p, c_int)
    fn('sl_dtype_size', c_size_t, c_int)
    fn('sl_sharding_parse', c_int, c_char_p, P(c_int))
    fn('sl_client_opts_init', None, P(ClientOpts))
    fn('sl_client_open', c_int, c_char_p, P(ClientOpts), P(c_void_p))
    fn('sl_client_close', None, c_void_p)
    fn('sl_client_errmsg', c_char_p, c_void_p)
    fn('sl_client_register_dataset', c_int, c_void_p, c_char_p, c_size_t, P(ctypes.c_uint64))
    fn('sl_client_register_dataset_as', c_int, c_void_p, c_char_p, c_size_t, c_char_p, P(ctypes.c_uint64),
       P(ElemSpec))
    fn('sl_client_lookup_dataset', c_int, c_void_p, ctypes.c_uint64, c_char_p, P(ctypes.c_uint64), P(ElemSpec))
    fn('sl_iterator_opts_init', None, P(IteratorOpts))
    fn('sl_iterator_open', c_int, c_void_p, ctypes.c_uint64, P(IteratorOpts), P(c_void_p))
    fn('sl_iterator_next', c_int, c_void_p, P(c_void_p))
    fn('sl_iterator_next_wait', c_int, c_void_p, P(c_void_p), c_int)
    fn('sl_iterator_waiting', c_size_t, c_void_p, c_char_p, c_size_t)
    fn('sl_iterator_errmsg', c_char_p, c_void_p)
    fn('sl_iterator_job_id', ctypes.c_uint64, c_void_p)
    fn('sl_iterator_close', None, c_void_p)
    fn('sl_batch_num_elements', ctypes.c_uint64, c_void_p)
    fn('sl_batch_num_tensors', c_int, c_void_p)
    fn('sl_batch_tensor', P(Tensor), c_void_p, c_int)
    fn('sl_batch_size', c_size_t, c_void_p)
    fn('sl_batch_task_id', ctypes.c_uint64, c_void_p)
    fn('sl_batch_worker', ctypes.c_char_p, c_void_p)
    fn('sl_batch_round', ctypes.c_uint64, c_void_p)
    fn('sl_iterator_notice', ctypes.c_char_p, c_void_p)
    fn('sl_iterator_records_missing', ctypes.c_uint64, c_void_p)
    fn('sl_iterator_queued', ctypes.c_uint, c_void_p)
    fn('sl_batch_release', None, c_void_p)
    fn('sl_iterator_checkpoint', c_int, c_void_p, P(c_void_p), P(c_size_t))
    fn('sl_iterator_restore', c_int, c_void_p, ctypes.c_uint64, P(IteratorOpts), c_char_p, c_size_t, P(c_void_p))
    fn('sl_iterator_delta', c_int, c_void_p, P(c_void_p), P(c_size_t), P(c_void_p), P(c_size_t))
    fn('sl_ckpt_builder_open', c_int, ctypes.c_uint64, c_char_p, c_size_t, c_char_p, c_size_t, P(c_void_p))
    fn('sl_ckpt_builder_apply', c_int, c_void_p, c_char_p, c_size_t)
    fn('sl_ckpt_builder_checkpoint', c_int, c_void_p, P(c_void_p), P(c_size_t))
    fn('sl_ckpt_builder_errmsg', c_char_p, c_void_p)
    fn('sl_ckpt_builder_close', None, c_void_p)
    fn('sl_free', None, c_void_p)
    fn('sl_checkpoint_merge', c_int, P(c_void_p), P(c_size_t), c_size_t, c_char_p, P(c_void_p), P(c_size_t),
       ctypes.c_char_p, c_size_t)


_held = None


def load_holding_gil():
    """libsluice again, as a ctypes.PyDLL: its functions run without
    releasing the GIL. For the few that return at once (a batch's accessors,
    sl_batch_release()), where handing the GIL over and taking it back costs
    more than the call; never for one that waits (sl_iterator_next())."""
    global _held
    if _held is None:
        lib = ctypes.PyDLL(library_path())
        for name, restype, argtypes in (('sl_batch_num_tensors', ctypes.c_int, [ctypes.c_void_p]),
                                        ('sl_batch_tensor', ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]),
                                        ('sl_batch_release', None, [ctypes.c_void_p])):
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = argtypes
        _held = lib
    return _held


def strerror(code):
    """sl_strerror(code) as str; works without the library for SL_* codes."""
    try:
        return load().sl_strerror(code).decode('utf-8', 'replace')
    except LibraryNotFound:
        return os.strerror(-code) if -4096 < code < 0 else CODE_NAMES.get(code, 'unknown error')


def code_name(code):
    """'SL_ESPEC' or 'ETIMEDOUT' for a negative code."""
    if code in CODE_NAMES:
        return CODE_NAMES[code]
    import errno
    return errno.errorcode.get(-code, 'E%d' % -code) if code < 0 else str(code)


if sys.byteorder != 'little':  # pragma: no cover
    raise ImportError('sluice: batches are little-endian; this interpreter runs on a big-endian machine')
