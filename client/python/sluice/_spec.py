"""What a dataset spec given as a dict must look like before it is sent: a
"source" object and a list of op objects (the dispatcher checks the rest,
docs/dataset-spec.md). Used by dataset.py (from_spec) and client.py (a spec
given as a dict); imports nothing of the package."""
import builtins
import copy


def checked(spec):
    """(source, ops) of a spec dict, deep-copied; ValueError naming what is wrong."""
    if not isinstance(spec, dict) or not isinstance(spec.get('source'), dict):
        raise ValueError('a spec is an object with a "source" object (docs/dataset-spec.md)')
    extra = sorted(set(spec) - {'source', 'ops'})
    if extra:
        raise ValueError('$.%s: unknown field (a spec has only "source" and "ops")' % extra[0])
    ops = spec.get('ops', [])
    if not isinstance(ops, (list, tuple)) or not builtins.all(isinstance(o, dict) for o in ops):
        raise ValueError('the "ops" of a spec are a list of objects')
    return copy.deepcopy(spec['source']), copy.deepcopy(list(ops))


# What Dataset.cardinality() says besides a count, as tf.data's constants.
INFINITE = -1
UNKNOWN = -2

# Ops that yield one element per input element.
_ONE_TO_ONE = frozenset(('shuffle', 'parse_example', 'decode_jpeg', 'resize', 'random_crop', 'center_crop',
                         'random_resized_crop', 'color_jitter', 'random_grayscale', 'gaussian_blur',
                         'random_solarize', 'random_flip', 'normalize', 'cast', 'map',
                         'prefetch', 'cache', 'interleave'))


def _plain_int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def cardinality(source, ops):
    """The elements one pipeline over the whole source yields (a worker
    under sharding "off"), from the spec alone: a count, INFINITE or
    UNKNOWN (file sources: their records are counted by the dispatcher;
    filter; an op this module does not know)."""
    if source.get('type') != 'range':
        return UNKNOWN
    start, stop, step = (_plain_int(source.get(k, d)) for k, d in (('start', 0), ('stop', None), ('step', 1)))
    if start is None or stop is None or not step:
        return UNKNOWN
    n = len(builtins.range(start, stop, step))
    for op in ops:
        kind = op.get('op')
        if kind in _ONE_TO_ONE:
            continue
        if kind in ('batch', 'padded_batch'):
            b = _plain_int(op.get('batch_size'))
            if not b or b < 1:
                return UNKNOWN
            if n >= 0:
                n = n // b if op.get('drop_remainder') else -(-n // b)
        elif kind == 'take':
            c = _plain_int(op.get('count'))
            if c is None:
                return UNKNOWN
            if c >= 0:
                n = c if n == INFINITE else (min(n, c) if n >= 0 else n)
        elif kind == 'skip':
            c = _plain_int(op.get('count'))
            if c is None:
                return UNKNOWN
            if n >= 0:
                n = 0 if c < 0 else max(n - c, 0)
            elif c < 0 and n == INFINITE:
                return UNKNOWN  # skipping all of a dataset without end: it never yields
        elif kind == 'repeat':
            c = _plain_int(op.get('count', -1))
            if c is None:
                return UNKNOWN
            if n == 0 or c == 0:
                n = 0  # an empty iteration ends the repeat
            elif c < 0:
                n = INFINITE if n != UNKNOWN else UNKNOWN
            elif n >= 0:
                n *= c
        elif kind == 'shard':
            k, i = _plain_int(op.get('num_shards')), _plain_int(op.get('index'))
            if k is None or i is None or k < 1 or not 0 <= i < k:
                return UNKNOWN  # "hint": bound by the workers
            if n >= 0:
                n = n // k + (1 if i < n % k else 0)
        elif kind == 'filter':
            if n != 0:
                return UNKNOWN
        else:
            return UNKNOWN
        if n == UNKNOWN:
            return UNKNOWN
    return n


class TensorSpec(tuple):
    """One component of a dataset's elements, as the dispatcher derives it
    from the spec: shape is a tuple with None for a dimension the data
    decides (an image's size, a short last batch), or None when not even
    the rank is known (a plugin map's output); dtype is the name ("int64");
    ragged: travels as (values, row_splits), dimension 1 varies per row."""

    __slots__ = ()

    def __new__(cls, shape, dtype, ragged=False):
        return tuple.__new__(cls, (None if shape is None else tuple(shape), str(dtype), bool(ragged)))

    shape = property(lambda self: self[0])
    dtype = property(lambda self: self[1])
    ragged = property(lambda self: self[2])

    def __repr__(self):
        return 'TensorSpec(shape=%r, dtype=%r%s)' % (self.shape, self.dtype, ', ragged=True' if self.ragged else '')

    def is_compatible_with(self, other):
        """Whether other (a TensorSpec) can describe the same values: the
        same dtype and raggedness, and shapes that agree where both know."""
        if self.dtype != other.dtype or self.ragged != other.ragged:
            return False
        if self.shape is None or other.shape is None:
            return True
        return len(self.shape) == len(other.shape) and all(
            a is None or b is None or a == b for a, b in zip(self.shape, other.shape))
