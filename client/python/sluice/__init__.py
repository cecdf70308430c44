"""Sluice: the Python client of the Sluice input-data service.

Build a dataset as in tf.data, then stream its batches from the workers:

    import sluice
    ds = sluice.range(0, 1_000_000).shuffle(4096, seed=7).batch(256)
    with ds.distribute("127.0.0.1:5050", sharding="dynamic") as it:
        for batch in it:           # {"value": numpy int64 array of shape (256,)}
            ...

The arrays view the batch's memory in libsluice (no copy); the batch is
released once its arrays are gone. sluice.torch adapts this to PyTorch.
libsluice is loaded through ctypes on first use: from $SLUICE_LIB, else from
where `cmake --install` put it, else from the repository's build/ tree.
See docs/python.md."""
from . import errors
from ._lib import LibraryNotFound, library_path
from ._spec import TensorSpec
from . import dataset as _dataset
from .dataset import Dataset, fixed_length_records, from_spec, text_lines, tfrecord
from .errors import (ConflictError, DataError, InvalidArgumentError, JobCancelledError, NotFoundError,
                     SluiceConnectionError, SluiceError, SluiceFileNotFoundError,
                     SluicePermissionError, SluiceTimeoutError, SluiceUsageWarning, SluiceWaitWarning,
                     SpecError)

__version__ = '0.1.0'

# sluice.range, left out of __all__ so that `from sluice import *` keeps the builtin.
range = _dataset.range

__all__ = [
    'Dataset', 'tfrecord', 'text_lines', 'fixed_length_records', 'from_spec', 'distribute', 'merge_checkpoints',
    'BatchIterator', 'register_dataset', 'from_dataset_id', 'dataset_element_spec', 'TensorSpec',
    'INFINITE_CARDINALITY', 'UNKNOWN_CARDINALITY', 'library_path', 'LibraryNotFound', 'errors', 'SluiceError', 'SpecError',
    'InvalidArgumentError', 'SluiceTimeoutError', 'SluiceConnectionError', 'JobCancelledError', 'DataError',
    'ConflictError', 'NotFoundError', 'SluiceWaitWarning',
    'SluiceFileNotFoundError', 'SluicePermissionError', 'SluiceUsageWarning',
]


INFINITE_CARDINALITY = -1
UNKNOWN_CARDINALITY = -2


def register_dataset(dispatcher, dataset, dataset_id=None, **options):
    """sluice.client.register_dataset(): registers dataset, optionally
    under a name, and returns its id."""
    from .client import register_dataset as _register
    return _register(dispatcher, dataset, dataset_id=dataset_id, **options)


def from_dataset_id(dispatcher, dataset_id, element_spec=None, **kwargs):
    """sluice.client.from_dataset_id(): a BatchIterator over a dataset
    registered before, by id or name."""
    from .client import from_dataset_id as _from
    return _from(dispatcher, dataset_id, element_spec=element_spec, **kwargs)


def dataset_element_spec(dispatcher, dataset_id, **options):
    """sluice.client.dataset_element_spec(): {name: TensorSpec} of a
    registered dataset, or None."""
    from .client import dataset_element_spec as _es
    return _es(dispatcher, dataset_id, **options)


def merge_checkpoints(checkpoints, auth_token_file=None):
    """sluice.client.merge_checkpoints(): one checkpoint of a named job's ranks."""
    from .client import merge_checkpoints as _merge
    return _merge(checkpoints, auth_token_file=auth_token_file)


def distribute(dataset, dispatcher, **kwargs):
    """sluice.client.distribute(): a BatchIterator over dataset's batches."""
    from .client import distribute as _distribute
    return _distribute(dataset, dispatcher, **kwargs)


def __getattr__(name):
    # Loaded on first use: NumPy for the client, PyTorch for sluice.torch.
    if name == 'BatchIterator':
        from .client import BatchIterator
        return BatchIterator
    if name in ('client', 'torch'):
        import importlib
        return importlib.import_module('.' + name, __name__)
    raise AttributeError('module %r has no attribute %r' % (__name__, name))
