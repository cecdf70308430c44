"""Shares of a dataset: share i of n is the same pipeline over every n-th
item of the source, starting at the i-th, so that the n shares together read
each source item exactly once.

sluice.torch gives each DataLoader worker process a share of its own as an
anonymous DYNAMIC job: libsluice can checkpoint and restore such a job (it
cannot checkpoint one consumer of a job that several consumers share), so
the loader's state is the shares' checkpoints and its restore is exactly
once."""
import copy

from .dataset import Dataset, from_spec

_FILE_SOURCES = ('tfrecord', 'text_lines', 'fixed_length_records')


def share_spec(dataset, index, count):
    """The spec dict of share index of count of dataset (a Dataset or a spec
    dict). Share 0 of 1 is the dataset itself.

    range(start, stop, step): range(start + index * step, stop, step * count).
    File sources: the entries index, index + count, ... of "files"; a glob
    pattern is one entry (the dispatcher expands it, the client cannot), so
    there must be at least count entries.

    Raises ValueError for a source that cannot be shared this way."""
    spec = dataset.spec if isinstance(dataset, Dataset) else from_spec(dataset).spec
    if isinstance(index, bool) or isinstance(count, bool) or not isinstance(index, int) or \
            not isinstance(count, int) or count < 1 or not 0 <= index < count:
        raise ValueError('share %r of %r: want 0 <= index < count' % (index, count))
    spec = copy.deepcopy(spec)
    if count == 1:
        return spec
    src = spec['source']
    kind = src.get('type')
    if kind == 'range':
        start, step = src.get('start', 0), src.get('step', 1)
        src['start'] = start + index * step
        src['step'] = step * count
        return spec
    if kind in _FILE_SOURCES:
        files = src['files'] if isinstance(src['files'], list) else [src['files']]
        if len(files) < count:
            raise ValueError('source.files: %d entries cannot make %d shares (one per DataLoader worker): give at '
                             'least as many files as workers (a glob pattern is one entry), or fewer workers'
                             % (len(files), count))
        src['files'] = files[index::count]
        return spec
    raise ValueError('source.type: a "%s" source cannot be split into shares' % kind)
