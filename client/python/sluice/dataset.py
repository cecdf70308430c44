"""The dataset builder: one function per source and one method per op, as in
tf.data. Each call returns a new Dataset whose spec is the JSON document of
docs/dataset-spec.md; nothing is checked here beyond what Python needs to
write JSON. The dispatcher validates the spec at registration and names the
offending field by its JSON path (sluice.SpecError).

Ops and sources the workers do not run yet (see docs/python.md) are written
into the spec like the others and refused by the dispatcher until they run."""
import copy
import json
import numbers
import operator
import os

from . import _spec


def _plain(v):
    """v as plain JSON values: NumPy scalars and arrays, tuples and dtypes
    become ints, floats, lists and dtype names."""
    if v is None or isinstance(v, (bool, str, int, float)):
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, numbers.Integral):
        return operator.index(v)
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, type):  # numpy.float32
        return _dtype_name(v)
    if hasattr(v, 'tolist'):  # a NumPy array or scalar, a torch tensor
        return _plain(v.tolist())
    if hasattr(v, 'dtype') or type(v).__module__ in ('numpy', 'torch'):
        return _dtype_name(v)
    return v  # json.dumps says what it cannot write


def _dtype_name(d):
    """A dtype given as 'float32', numpy.float32, numpy.dtype('f4') or
    torch.float32, as the spec's name ('float32'); Python's bytes and str
    are "bytes"."""
    if isinstance(d, str):
        return d
    if d in (bytes, str):
        return 'bytes'
    mod = type(d).__module__
    if mod == 'torch':
        return str(d).split('.', 1)[-1]
    try:
        import numpy
        return numpy.dtype(d).name
    except (ImportError, TypeError):
        return str(d)


def _files(files):
    if isinstance(files, (str, bytes, os.PathLike)):
        files = [files]
    return [os.fsdecode(f) for f in files]


def _omit_none(fields):
    return {k: _plain(v) for k, v in fields.items() if v is not None}


def _not_callable(op, fn):
    if callable(fn):
        raise TypeError(
            '%s runs on the workers, which cannot run Python: pass the name of a built-in or of a plugin '
            'function (with plugin=PATH to its shared object). To transform batches in Python, do it on the '
            'arrays distribute() yields.' % op)


class Dataset:
    """A source and a list of ops. Immutable: every op returns a new Dataset."""

    __slots__ = ('_source', '_ops')

    def __init__(self, source, ops=()):
        self._source = dict(source)
        self._ops = tuple(dict(o) for o in ops)

    # ---- what it is ----

    @property
    def spec(self):
        """The spec as a JSON-able dict (a fresh copy)."""
        return {'source': copy.deepcopy(self._source), 'ops': [copy.deepcopy(o) for o in self._ops]}

    def to_json(self, indent=None):
        """The spec as JSON text (compact unless indent is given)."""
        if indent is None:
            return json.dumps(self.spec, separators=(',', ':'))
        return json.dumps(self.spec, indent=indent)

    def __repr__(self):
        return 'sluice.Dataset(%s)' % self.to_json()

    def __eq__(self, other):
        return isinstance(other, Dataset) and self.spec == other.spec

    def cardinality(self):
        """The elements (batches, after a batch op) one pipeline over the
        whole source yields, from the spec alone, as tf.data's cardinality():
        a count, sluice.INFINITE_CARDINALITY (-1) or
        sluice.UNKNOWN_CARDINALITY (-2). Known for a range source through
        batch, take, skip, repeat, shard with numbers and the ops that yield
        one element per element; a file source's records are counted by the
        dispatcher, so its count is unknown here, as after a filter. What a
        trainer receives also depends on the sharding: under "off" each
        Sluice worker yields all of it."""
        return _spec.cardinality(self._source, self._ops)

    def __len__(self):
        """cardinality() when it is a count; a TypeError, as tf.data's
        len(), when it is infinite or unknown."""
        n = self.cardinality()
        if n == _spec.INFINITE:
            raise TypeError('the dataset is infinite (a repeat without a count)')
        if n < 0:
            raise TypeError('the dataset\'s length is unknown from its spec (a file source, whose records only the '
                            'dispatcher counts, a filter, or a shard "hint"): see Dataset.cardinality()')
        return n

    def __bool__(self):
        # A Dataset is never false, also when its len() is 0 or unknown.
        return True

    def __hash__(self):
        return hash(self.to_json())

    # ---- ops ----

    def op(self, op, **fields):
        """Appends {"op": op, **fields} (None fields left out): the escape
        hatch for an op this module has no method for."""
        entry = {'op': op}
        entry.update(_omit_none(fields))
        return Dataset(self._source, self._ops + (entry,))

    def batch(self, batch_size, drop_remainder=False):
        return self.op('batch', batch_size=batch_size, drop_remainder=drop_remainder)

    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=True):
        return self.op('shuffle', buffer_size=buffer_size, seed=seed,
                       reshuffle_each_iteration=reshuffle_each_iteration)

    def take(self, count):
        return self.op('take', count=count)

    def skip(self, count):
        return self.op('skip', count=count)

    def repeat(self, count=None):
        """count None (or -1) repeats forever."""
        return self.op('repeat', count=-1 if count is None else count)

    def parse_example(self, features, key=None):
        """features: {name: {"dtype": ..., "shape": [...], "default": ...,
        "varlen": bool}}; a value may also be a dtype alone or a (dtype,
        shape) pair. Dtypes are "int64", "float32" or "bytes" (Python's
        int, float, bytes and str, and NumPy's int64 and float32 say the
        same). key: the component holding the serialized Examples (the
        source's, by default)."""
        def dtype(d):  # Python's int and float are Example's int64 and float32
            return {int: 'int64', float: 'float32'}.get(d) if d in (int, float) else _dtype_name(d)

        out = {}
        for name, f in dict(features).items():
            if isinstance(f, dict):
                f = dict(f)
                if 'dtype' in f:
                    f['dtype'] = dtype(f['dtype'])
            elif isinstance(f, (tuple, list)) and len(f) == 2:
                f = {'dtype': dtype(f[0]), 'shape': f[1]}
            else:
                f = {'dtype': dtype(f)}
            out[str(name)] = f
        return self.op('parse_example', features=out, key=key)

    def decode_jpeg(self, key, channels=3):
        return self.op('decode_jpeg', key=key, channels=channels)

    def resize(self, key, height=None, width=None, dtype=None, shorter_side=None):
        """Bilinear, to height x width, or with shorter_side the shorter side
        to that length and the longer in proportion (torchvision's
        Resize(int)); dtype "float32" (the default, as tf.image.resize) or
        "uint8"."""
        if shorter_side is not None:
            if height is not None or width is not None:
                raise TypeError('resize() takes height and width, or shorter_side, not both')
            return self.op('resize', key=key, shorter_side=shorter_side,
                           dtype=None if dtype is None else _dtype_name(dtype))
        if height is None or width is None:
            raise TypeError('resize() needs height and width, or shorter_side')
        return self.op('resize', key=key, size=[height, width], dtype=None if dtype is None else _dtype_name(dtype))

    def random_crop(self, key, height, width, seed=None):
        return self.op('random_crop', key=key, size=[height, width], seed=seed)

    def center_crop(self, key, height, width):
        return self.op('center_crop', key=key, size=[height, width])

    def random_resized_crop(self, key, height, width, scale=None, ratio=None, dtype=None, seed=None):
        """torchvision's RandomResizedCrop: a window of a random share of the
        area (scale, default (0.08, 1.0)) and width / height (ratio, default
        (3/4, 4/3)), resized bilinearly to height x width; dtype "float32"
        (the default, as resize) or "uint8" (docs/dataset-spec.md)."""
        return self.op('random_resized_crop', key=key, size=[height, width],
                       scale=None if scale is None else [float(x) for x in scale],
                       ratio=None if ratio is None else [float(x) for x in ratio],
                       dtype=None if dtype is None else _dtype_name(dtype), seed=seed)

    def color_jitter(self, key, brightness=None, contrast=None, saturation=None, hue=None, p=None, seed=None):
        """torchvision's ColorJitter on uint8 images: each adjustment given as
        a number b (a factor drawn in [max(0, 1 - b), 1 + b]; for hue h, in
        [-h, h]) or as a (lo, hi) pair, applied in a random order; p < 1 to
        an image with that probability, as RandomApply (docs/dataset-spec.md)."""
        def rng(name, v, centre):
            if v is None:
                return None
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if v < 0:
                    raise ValueError('color_jitter %s must be >= 0, got %r' % (name, v))
                return [max(0.0, centre - float(v)), centre + float(v)] if centre else [-float(v), float(v)]
            lo, hi = v
            return [float(lo), float(hi)]
        return self.op('color_jitter', key=key, brightness=rng('brightness', brightness, 1.0),
                       contrast=rng('contrast', contrast, 1.0), saturation=rng('saturation', saturation, 1.0),
                       hue=rng('hue', hue, 0.0), p=None if p is None else float(p), seed=seed)

    def random_grayscale(self, key, p=None, seed=None):
        """torchvision's RandomGrayscale: with probability p (default 0.1)
        an image becomes gray, its 3 channels kept."""
        return self.op('random_grayscale', key=key, p=None if p is None else float(p), seed=seed)

    def gaussian_blur(self, key, kernel_size, sigma=None, p=None, seed=None):
        """torchvision's GaussianBlur on uint8 images: kernel_size an odd
        int or (height, width) -- note torchvision's pair is (width,
        height) --, sigma a number or the (lo, hi) it is drawn from per
        image (default (0.1, 2.0)); p < 1 to an image with that probability,
        as RandomApply."""
        ks = [kernel_size, kernel_size] if isinstance(kernel_size, int) else list(kernel_size)
        if sigma is not None:
            sigma = [float(sigma), float(sigma)] if isinstance(sigma, (int, float)) else [float(x) for x in sigma]
        return self.op('gaussian_blur', key=key, kernel_size=ks, sigma=sigma, p=None if p is None else float(p),
                       seed=seed)

    def random_solarize(self, key, threshold, p=None, seed=None):
        """torchvision's RandomSolarize on uint8 images: with probability p
        (default 0.5) every value at or above threshold (0 .. 255) becomes
        255 minus it."""
        return self.op('random_solarize', key=key, threshold=float(threshold), p=None if p is None else float(p),
                       seed=seed)

    def random_flip(self, key, direction=None, seed=None):
        """direction "left_right" (the default) or "up_down"."""
        return self.op('random_flip', key=key, direction=direction, seed=seed)

    def normalize(self, key, mean, std, scale=None):
        """(x - mean) / std per channel, to float32; scale=True divides by
        255 first (docs/dataset-spec.md)."""
        return self.op('normalize', key=key, mean=mean, std=std, scale=scale)

    def cast(self, key, dtype):
        return self.op('cast', key=key, dtype=_dtype_name(dtype))

    def map(self, plugin, function=None, output=None, keep_input=True, num_parallel_calls=None, deterministic=None):
        """Runs `function` of the C plugin `plugin` (a file name in the
        workers' --plugin-dir, docs/plugins.md) on every element; output maps
        the component names it makes to their dtypes."""
        _not_callable('map', plugin)
        _not_callable('map', function)
        return self.op('map', plugin=plugin, function=function,
                       output=None if output is None else {str(k): _dtype_name(v) for k, v in dict(output).items()},
                       keep_input=keep_input,
                       num_parallel_calls=num_parallel_calls, deterministic=deterministic)

    def filter(self, key=None, cmp=None, value=None, plugin=None, function=None, num_parallel_calls=None,
               deterministic=None):
        """Keeps the elements whose scalar component `key` compares true
        (cmp "eq", "ne", "lt", "le", "gt", "ge", or "in" with a list of
        values), or for which the plugin predicate `function` says keep."""
        _not_callable('filter', key)
        _not_callable('filter', function)
        return self.op('filter', key=key, cmp=cmp, value=value, plugin=plugin, function=function,
                       num_parallel_calls=num_parallel_calls, deterministic=deterministic)

    def shard(self, num_shards, index):
        """num_shards and index may be "hint" (bound under HINT sharding)."""
        return self.op('shard', num_shards=num_shards, index=index)

    def prefetch(self, buffer_size):
        return self.op('prefetch', buffer_size=buffer_size)

    def padded_batch(self, batch_size, padded_shapes=None, padding_values=None, drop_remainder=False):
        return self.op('padded_batch', batch_size=batch_size, padded_shapes=padded_shapes,
                       padding_values=padding_values, drop_remainder=drop_remainder)

    def cache(self, storage=None):
        """storage None or "memory" keeps the cache in the worker's memory,
        "disk" in the worker's LMDB cache (its --cache-dir)."""
        return self.op('cache', storage=storage)

    def interleave(self, cycle_length, block_length=1, num_parallel_calls=None):
        """Reads cycle_length files of the source at once, block_length
        records from each in turn; the first op after a file source.
        num_parallel_calls: an int, or "autotune" (the worker's --threads)."""
        return self.op('interleave', cycle_length=cycle_length, block_length=block_length,
                       num_parallel_calls=num_parallel_calls)

    # ---- running it ----

    def distribute(self, dispatcher, sharding='off', job_name=None, num_consumers=None, consumer_index=None,
                   max_outstanding=0, timeout_ms=30000, **options):
        """Registers the dataset with the dispatcher at "host:port", joins or
        creates a job and returns an iterator of batches: dicts from
        component name to NumPy arrays that view the batch's memory.
        max_outstanding 0 (default) and per_worker_outstanding 0 size the
        request window by window_bytes (0: 32 MiB). See sluice.distribute()
        for the options and sluice.client.BatchIterator for the arrays."""
        from .client import distribute
        return distribute(self, dispatcher, sharding=sharding, job_name=job_name, num_consumers=num_consumers,
                          consumer_index=consumer_index, max_outstanding=max_outstanding, timeout_ms=timeout_ms,
                          **options)


# ---- sources ----

def range(start, stop=None, step=1, name='value'):  # noqa: A001 (mirrors tf.data.Dataset.range)
    """The integers start, start + step, ... below stop, as int64 scalars;
    range(n) counts 0 .. n-1, as Python's range does."""
    if stop is None:
        start, stop = 0, start
    return Dataset(dict({'type': 'range'}, **_omit_none({'start': start, 'stop': stop, 'step': step,
                                                         'name': name})))


def tfrecord(files, compression='none', on_corrupt=None, name=None):
    """The records of TFRecord files ("none" or "gzip"), one bytes component
    (default name "record"). on_corrupt: what a worker does with a record
    whose CRC does not match (left to the service's default when None)."""
    return Dataset(dict({'type': 'tfrecord', 'files': _files(files)},
                        **_omit_none({'compression': compression, 'on_corrupt': on_corrupt, 'name': name})))


def text_lines(files, compression='none', name=None):
    """The lines of text files ("none" or "gzip"), one bytes component
    (default name "line")."""
    return Dataset(dict({'type': 'text_lines', 'files': _files(files)},
                        **_omit_none({'compression': compression, 'name': name})))


def fixed_length_records(files, record_bytes, header_bytes=0, footer_bytes=0, name=None):
    """Records of record_bytes bytes after a header and before a footer,
    one bytes component (default name "record"). Uncompressed files only."""
    return Dataset(dict({'type': 'fixed_length_records', 'files': _files(files)},
                        **_omit_none({'record_bytes': record_bytes, 'header_bytes': header_bytes,
                                      'footer_bytes': footer_bytes, 'name': name})))


def from_spec(spec):
    """A Dataset from a spec given as a dict or as JSON text."""
    if isinstance(spec, (str, bytes)):
        spec = json.loads(spec)
    return Dataset(*_spec.checked(spec))
