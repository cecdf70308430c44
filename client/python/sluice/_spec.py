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
