"""Tests of the Python client (client/python/sluice) against real daemons on
free loopback ports, started through tests/integration/harness.py. Run them
with tests/python/run.py, which sets SLUICE_BUILD and SLUICE_LIB."""
import collections
import ctypes
import gc
import inspect
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest
import weakref

import numpy as np

import sluice
import sluice.client
from sluice import _lib
from cutproxy import CutProxy, without_field
from harness import Cluster, get_json, http, metric, values, wait_for
from pycase import SluiceCase

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.sysconf('SC_PAGE_SIZE')


def rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * PAGE


def free_port():
    """A loopback port nobody listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def owner_of(a):
    """The batch owner an array keeps alive through its .base chain."""
    while a is not None:
        if isinstance(a, ctypes.Array) and hasattr(a, 'batch'):
            return a.batch
        a = getattr(a, 'base', None)
    return None


# ---------------------------------------------------------------- the version

def seeded(what):
    """(seed, random.Random(seed)), the seed printed under what;
    SLUICE_TEST_SEED repeats a run."""
    seed = int(os.environ.get('SLUICE_TEST_SEED', time.time_ns() % 1000000))
    print('%s: seed %d (SLUICE_TEST_SEED=%d repeats it)' % (what, seed, seed), file=sys.stderr)
    return seed, random.Random(seed)


class Readers:
    """A thread per iterator of its: each takes `rounds` batches and keeps
    first(batch) of each in got[i]; at a round of pauses it says so in
    arrived[round] and waits for that round's event. failures lists what
    the readers raised."""

    def __init__(self, its, rounds, first, pauses=None):
        self.its, self.got, self.failures = its, [[] for _ in its], []
        self.pauses = pauses or {}
        self.arrived = {r: [] for r in self.pauses}
        self.threads = [threading.Thread(target=self._read, args=(i, rounds, first), daemon=True)
                        for i in range(len(its))]

    def _read(self, i, rounds, first):
        try:
            for r in range(rounds):
                if r in self.pauses:
                    self.arrived[r].append(i)
                    self.pauses[r].wait(timeout=300)
                self.got[i].append(first(next(self.its[i])))
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.failures.append('consumer %d: %r' % (i, e))

    def join(self, seconds):
        deadline = time.monotonic() + seconds
        for t in self.threads:
            t.join(timeout=max(1.0, deadline - time.monotonic()))

    def close(self):
        """Lets paused readers go and closes the iterators whose readers
        ended; one a stalled reader is still in stays open (the test
        failed): closing it under that thread would free it there."""
        for e in self.pauses.values():
            e.set()
        for t, it in zip(self.threads, self.its):
            if not t.is_alive():
                it.close()


class VersionTest(unittest.TestCase):

    def test_package_and_library_say_one_version(self):
        # A package loading a libsluice of another release would mislead
        # whoever reads __version__ in a bug report.
        self.assertEqual(sluice.__version__, _lib.load().sl_version().decode())


# ---------------------------------------------------------------- the builder

class BuilderTest(unittest.TestCase):

    def test_range_like_python_range(self):
        self.assertEqual(sluice.range(5).spec,
                         {'source': {'type': 'range', 'start': 0, 'stop': 5, 'step': 1, 'name': 'value'},
                          'ops': []})
        self.assertEqual(sluice.range(2, 10, 3, name='id').spec['source'],
                         {'type': 'range', 'start': 2, 'stop': 10, 'step': 3, 'name': 'id'})
        self.assertEqual(sluice.range(10, 0, -2).spec['source'],
                         {'type': 'range', 'start': 10, 'stop': 0, 'step': -2, 'name': 'value'})
        # NumPy integers become JSON integers.
        self.assertEqual(sluice.range(np.int64(3), np.int32(9)).to_json(),
                         '{"source":{"type":"range","start":3,"stop":9,"step":1,"name":"value"},"ops":[]}')

    def test_sources(self):
        self.assertEqual(sluice.tfrecord('/d/a.tfrecord').spec['source'],
                         {'type': 'tfrecord', 'files': ['/d/a.tfrecord'], 'compression': 'none'})
        self.assertEqual(sluice.tfrecord(['/d/a', '/d/b'], compression='gzip', on_corrupt='skip').spec['source'],
                         {'type': 'tfrecord', 'files': ['/d/a', '/d/b'], 'compression': 'gzip',
                          'on_corrupt': 'skip'})
        self.assertEqual(sluice.text_lines(['/d/t.txt']).spec['source'],
                         {'type': 'text_lines', 'files': ['/d/t.txt'], 'compression': 'none'})
        self.assertEqual(sluice.fixed_length_records('/d/r.bin', 16, header_bytes=4).spec['source'],
                         {'type': 'fixed_length_records', 'files': ['/d/r.bin'], 'record_bytes': 16,
                          'header_bytes': 4, 'footer_bytes': 0})

    def test_running_ops(self):
        ds = (sluice.range(0, 100).skip(2).take(50).shuffle(16).shuffle(8, seed=7, reshuffle_each_iteration=False)
              .repeat(3).repeat().batch(4).batch(2, drop_remainder=True))
        self.assertEqual(ds.spec['ops'], [
            {'op': 'skip', 'count': 2},
            {'op': 'take', 'count': 50},
            {'op': 'shuffle', 'buffer_size': 16, 'reshuffle_each_iteration': True},
            {'op': 'shuffle', 'buffer_size': 8, 'seed': 7, 'reshuffle_each_iteration': False},
            {'op': 'repeat', 'count': 3},
            {'op': 'repeat', 'count': -1},
            {'op': 'batch', 'batch_size': 4, 'drop_remainder': False},
            {'op': 'batch', 'batch_size': 2, 'drop_remainder': True},
        ])

    def test_ops_not_run_yet(self):
        ds = (sluice.tfrecord('/d/a')
              .parse_example({'label': {'dtype': 'int64', 'shape': []}, 'image': np.uint8,
                              'bbox': ('float32', (4,))})
              .decode_jpeg('image')
              .resize('image', 224, 256)
              .random_crop('image', 200, 210, seed=3)
              .random_resized_crop('image', 192, 160, scale=(0.25, 1), ratio=[0.5, 2], dtype=np.uint8, seed=9)
              .random_resized_crop('image', 96, 96)
              .resize('image', shorter_side=80, dtype='uint8')
              .color_jitter('image', brightness=0.4, contrast=(0.5, 1.5), saturation=2, hue=0.1, seed=1)
              .random_grayscale('image', p=0.2)
              .random_grayscale('image')
              .gaussian_blur('image', 23)
              .gaussian_blur('image', (5, 3), sigma=1.5, p=0.5, seed=2)
              .color_jitter('image', hue=0.1, p=0.8)
              .random_solarize('image', 128)
              .random_solarize('image', 191.5, p=0.2, seed=4)
              .random_flip('image')
              .normalize('image', (0.5, 0.4, 0.3), [0.2, 0.2, 0.2])
              .cast('image', np.float16)
              .map('libplug.so', 'my_fn', {'x': 'float32'}, num_parallel_calls='autotune', deterministic=False)
              .filter('label', 'in', [1, 2])
              .shard(4, 1)
              .shard('hint', 'hint')
              .interleave(4)
              .padded_batch(8, padded_shapes={'label': []}, padding_values={'label': -1})
              .cache()
              .cache('disk')
              .interleave(2, 3, num_parallel_calls='autotune')
              .prefetch(2))
        self.assertEqual(ds.spec['ops'], [
            {'op': 'parse_example', 'features': {'label': {'dtype': 'int64', 'shape': []},
                                                 'image': {'dtype': 'uint8'},
                                                 'bbox': {'dtype': 'float32', 'shape': [4]}}},
            {'op': 'decode_jpeg', 'key': 'image', 'channels': 3},
            {'op': 'resize', 'key': 'image', 'size': [224, 256]},
            {'op': 'random_crop', 'key': 'image', 'size': [200, 210], 'seed': 3},
            {'op': 'random_resized_crop', 'key': 'image', 'size': [192, 160], 'scale': [0.25, 1.0],
             'ratio': [0.5, 2.0], 'dtype': 'uint8', 'seed': 9},
            {'op': 'random_resized_crop', 'key': 'image', 'size': [96, 96]},
            {'op': 'resize', 'key': 'image', 'shorter_side': 80, 'dtype': 'uint8'},
            {'op': 'color_jitter', 'key': 'image', 'brightness': [0.6, 1.4], 'contrast': [0.5, 1.5],
             'saturation': [0.0, 3.0], 'hue': [-0.1, 0.1], 'seed': 1},
            {'op': 'random_grayscale', 'key': 'image', 'p': 0.2},
            {'op': 'random_grayscale', 'key': 'image'},
            {'op': 'gaussian_blur', 'key': 'image', 'kernel_size': [23, 23]},
            {'op': 'gaussian_blur', 'key': 'image', 'kernel_size': [5, 3], 'sigma': [1.5, 1.5], 'p': 0.5, 'seed': 2},
            {'op': 'color_jitter', 'key': 'image', 'hue': [-0.1, 0.1], 'p': 0.8},
            {'op': 'random_solarize', 'key': 'image', 'threshold': 128.0},
            {'op': 'random_solarize', 'key': 'image', 'threshold': 191.5, 'p': 0.2, 'seed': 4},
            {'op': 'random_flip', 'key': 'image'},
            {'op': 'normalize', 'key': 'image', 'mean': [0.5, 0.4, 0.3], 'std': [0.2, 0.2, 0.2]},
            {'op': 'cast', 'key': 'image', 'dtype': 'float16'},
            {'op': 'map', 'plugin': 'libplug.so', 'function': 'my_fn', 'output': {'x': 'float32'},
             'keep_input': True, 'num_parallel_calls': 'autotune', 'deterministic': False},
            {'op': 'filter', 'key': 'label', 'cmp': 'in', 'value': [1, 2]},
            {'op': 'shard', 'num_shards': 4, 'index': 1},
            {'op': 'shard', 'num_shards': 'hint', 'index': 'hint'},
            {'op': 'interleave', 'cycle_length': 4, 'block_length': 1},
            {'op': 'padded_batch', 'batch_size': 8, 'padded_shapes': {'label': []},
             'padding_values': {'label': -1}, 'drop_remainder': False},
            {'op': 'cache'},
            {'op': 'cache', 'storage': 'disk'},
            {'op': 'interleave', 'cycle_length': 2, 'block_length': 3, 'num_parallel_calls': 'autotune'},
            {'op': 'prefetch', 'buffer_size': 2},
        ])

    def test_color_jitter_refuses_a_negative_amount(self):
        with self.assertRaisesRegex(ValueError, 'color_jitter hue must be >= 0, got -0.1'):
            sluice.range(3).color_jitter('v', hue=-0.1)

    def test_resize_takes_a_size_or_a_shorter_side(self):
        ds = sluice.range(3)
        with self.assertRaisesRegex(TypeError, 'height and width, or shorter_side, not both'):
            ds.resize('v', 10, 10, shorter_side=5)
        with self.assertRaisesRegex(TypeError, 'needs height and width, or shorter_side'):
            ds.resize('v', 10)

    def test_immutable_and_json(self):
        base = sluice.range(10)
        a, b = base.batch(2), base.take(3)
        self.assertEqual(base.spec['ops'], [])
        self.assertEqual(a.spec['ops'], [{'op': 'batch', 'batch_size': 2, 'drop_remainder': False}])
        self.assertEqual(b.spec['ops'], [{'op': 'take', 'count': 3}])
        s = a.spec
        s['ops'].append({'op': 'bogus'})  # a copy: the dataset does not change
        self.assertEqual(len(a.spec['ops']), 1)
        self.assertEqual(sluice.from_spec(a.to_json()), a)
        self.assertEqual(sluice.from_spec(a.spec).to_json(indent=2), a.to_json(indent=2))
        with self.assertRaises(ValueError):
            sluice.from_spec({'source': {'type': 'range', 'stop': 1}, 'bogus': 1})

    def test_python_callables_refused(self):
        with self.assertRaisesRegex(TypeError, 'workers'):
            sluice.range(3).map(lambda x: x)
        with self.assertRaisesRegex(TypeError, 'workers'):
            sluice.range(3).filter(lambda x: True)


# ------------------------------------------------------ tensors to NumPy, offline

class ConvertTest(unittest.TestCase):
    """sl_tensor_t -> NumPy on tensors built here, for the dtypes and layouts
    no worker sends yet (bytes, ragged, every dtype)."""

    class Owner:
        pass

    def tensor(self, name, dtype, shape, buf, splits=None):
        t = _lib.Tensor()
        t.name = name.encode()
        t.dtype = dtype
        t.rank = len(shape)
        for i, d in enumerate(shape):
            t.shape[i] = d
        t.data = ctypes.addressof(buf)
        t.size = ctypes.sizeof(buf)
        if splits is not None:
            t.row_splits = ctypes.addressof(splits)
            t.num_row_splits = len(splits)
        return t

    def test_every_fixed_width_dtype(self):
        for code, name in enumerate(_lib.DTYPE_NAMES):
            if name in ('invalid', 'bytes'):
                continue
            npname = 'uint16' if name == 'bfloat16' else name
            src = np.arange(6).astype(npname).reshape(2, 3)
            buf = (ctypes.c_uint8 * src.nbytes).from_buffer_copy(src.tobytes())
            owner = self.Owner()
            a = sluice.client.tensor_to_numpy(owner, self.tensor('x', code, (2, 3), buf))
            self.assertEqual(a.shape, (2, 3), name)
            self.assertEqual(a.dtype, np.dtype(npname), name)
            np.testing.assert_array_equal(a, src)
            self.assertFalse(a.flags.owndata)
            self.assertEqual(a.ctypes.data, ctypes.addressof(buf))  # a view, not a copy
            self.assertIs(owner_of(a), owner)

    def test_bfloat16(self):
        import torch
        import sluice.torch as st
        bits = np.array([0x3F80, 0xC000, 0x4040], dtype='<u2')  # 1.0, -2.0, 3.0
        buf = (ctypes.c_uint8 * bits.nbytes).from_buffer_copy(bits.tobytes())
        a = sluice.client.tensor_to_numpy(self.Owner(), self.tensor('h', _lib.DTYPE_BFLOAT16, (3,), buf))
        self.assertFalse(a.flags.owndata)
        t = st.to_tensor(a)
        self.assertEqual(t.dtype, torch.bfloat16)
        self.assertEqual(t.tolist(), [1.0, -2.0, 3.0])
        self.assertEqual(t.data_ptr(), ctypes.addressof(buf))

    def test_an_unknown_dtype_is_refused_naming_the_component(self):
        # A worker newer than this package may send a dtype it does not
        # know: a clear error, not a misread array.
        unknown = len(_lib.DTYPE_NAMES) + 3
        buf = (ctypes.c_uint8 * 8)()
        with self.assertRaises(sluice.SluiceError) as cm:
            sluice.client.tensor_to_numpy(self.Owner(), self.tensor('pixels', unknown, (2,), buf))
        self.assertEqual(cm.exception.code, _lib.SL_EPROTO)
        self.assertIn('component "pixels" has dtype %d, which this package does not know' % unknown,
                      str(cm.exception))

    def test_bytes(self):
        vals = [b'ab', b'', b'xyz\x00', b'q']
        offs = np.cumsum([0] + [len(v) for v in vals]).astype('<u8')
        raw = offs.tobytes() + b''.join(vals)
        buf = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
        a = sluice.client.tensor_to_numpy(self.Owner(), self.tensor('s', _lib.DTYPE_BYTES, (2, 2), buf))
        self.assertEqual(a.shape, (2, 2))
        self.assertEqual(a.tolist(), [[b'ab', b''], [b'xyz\x00', b'q']])

    def test_ragged(self):
        splits = (ctypes.c_int64 * 4)(0, 2, 2, 5)  # 3 rows of 2, 0 and 3 values of shape [2]
        src = np.arange(10, dtype=np.float32)
        buf = (ctypes.c_uint8 * src.nbytes).from_buffer_copy(src.tobytes())
        v, s = sluice.client.tensor_to_numpy(self.Owner(), self.tensor('r', 12, (3, -1, 2), buf, splits))
        self.assertEqual(v.shape, (5, 2))
        np.testing.assert_array_equal(v.ravel(), src)
        self.assertEqual(s.tolist(), [0, 2, 2, 5])
        self.assertFalse(s.flags.owndata)

    def test_torch_conversion(self):
        import torch
        import sluice.torch as st
        a = np.arange(4, dtype=np.int64)
        t = st.to_tensor(a)
        self.assertEqual(t.data_ptr(), a.ctypes.data)
        self.assertEqual(st.to_tensor(np.arange(3, dtype=np.uint16)).dtype, torch.int32)
        self.assertEqual(st.to_tensor(np.arange(3, dtype=np.uint64)).tolist(), [0, 1, 2])
        with self.assertRaises(TypeError):
            st.to_tensor(np.array([2**63], dtype=np.uint64))
        self.assertEqual(st.to_tensor(np.array([b'a', b'b'], dtype=object)), [b'a', b'b'])
        v, s = st.to_tensor((np.zeros((2, 2), np.float32), np.array([0, 1, 2])))
        self.assertEqual((tuple(v.shape), s.tolist()), ((2, 2), [0, 1, 2]))


# --------------------------------------------------------- errors, no daemons

class NoServerTest(unittest.TestCase):

    def test_closed_port_fails_within_the_timeout(self):
        addr = '127.0.0.1:%d' % free_port()
        t0 = time.monotonic()
        with self.assertRaises(sluice.SluiceError) as cm:
            sluice.range(10).distribute(addr, timeout_ms=3000)
        self.assertLess(time.monotonic() - t0, 3.0)
        e = cm.exception
        self.assertIsInstance(e, sluice.SluiceConnectionError)
        self.assertEqual(e.code_name, 'ECONNREFUSED')
        self.assertIn(addr, str(e))
        self.assertEqual(sluice.client.live_handles()['iterators'], 0)

    def test_unanswering_dispatcher_times_out(self):
        # A listener that never answers the handshake.
        s = socket.socket()
        s.bind(('127.0.0.1', 0))
        s.listen(4)
        try:
            addr = '127.0.0.1:%d' % s.getsockname()[1]
            t0 = time.monotonic()
            with self.assertRaises(sluice.SluiceTimeoutError) as cm:
                sluice.range(10).distribute(addr, timeout_ms=1000)
            self.assertLess(time.monotonic() - t0, 3.0)
            self.assertEqual(cm.exception.code_name, 'ETIMEDOUT')
        finally:
            s.close()

    def test_bad_options(self):
        with self.assertRaises(sluice.InvalidArgumentError):
            sluice.range(3).distribute('127.0.0.1:1', sharding='sideways')
        for name in ('max_outstanding', 'per_worker_outstanding', 'window_bytes'):
            with self.assertRaisesRegex(sluice.InvalidArgumentError, name):
                sluice.range(3).distribute('127.0.0.1:1', **{name: -1})
        # 0 is the window sized by bytes: accepted, the connection fails instead.
        with self.assertRaises(sluice.SluiceError) as cm:
            sluice.range(3).distribute('127.0.0.1:1', max_outstanding=0, per_worker_outstanding=0, window_bytes=0,
                                       timeout_ms=2000)
        self.assertNotIsInstance(cm.exception, sluice.InvalidArgumentError, str(cm.exception))
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'consumer_index 2 is out of range'):
            sluice.range(3).distribute('127.0.0.1:1', num_consumers=2, consumer_index=2)
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'go together'):
            sluice.range(3).distribute('127.0.0.1:1', num_consumers=2)
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'target_workers'):
            sluice.range(3).distribute('127.0.0.1:1', target_workers='near')
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'per_worker_outstanding must be at most 16'):
            sluice.range(3).distribute('127.0.0.1:1', per_worker_outstanding=17)

    def test_library_not_found_lists_where_it_looked(self):
        env = dict(os.environ, SLUICE_LIB='/nonexistent/libsluice.so',
                   PYTHONPATH=os.path.join(REPO, 'client', 'python'))
        r = subprocess.run([sys.executable, '-c', 'import sluice; sluice.library_path()'], env=env,
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('LibraryNotFound', r.stderr)
        self.assertIn('/nonexistent/libsluice.so', r.stderr)

    def test_found_in_the_build_tree_without_sluice_lib(self):
        build = os.path.join(REPO, 'build', 'client', 'libsluice.so')
        if not os.path.exists(build):
            self.skipTest('no build/ tree')
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, 'client', 'python'))
        env.pop('SLUICE_LIB', None)
        r = subprocess.run([sys.executable, '-c', 'import sluice; print(sluice.library_path())'], env=env,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), build)


# ------------------------------------------------------- against real daemons

class ClusterTest(SluiceCase):
    """A dispatcher and two workers shared by the tests of this class."""

    def values_of(self, ds, key='value', **kw):
        out = []
        with ds.distribute(self.addr, **kw) as it:
            for b in it:
                out.extend(b[key].tolist())
        return out

    def test_dynamic_matches_sluice_cat(self):
        ds = sluice.range(0, 5000).shuffle(100, seed=3).batch(64)
        rc, batches, err = self.c.cat(ds.spec, ['--sharding', 'dynamic'])
        self.assertEqual(rc, 0, err)
        from_cat = collections.Counter(values(batches, 'value'))
        from_py = collections.Counter(self.values_of(ds, sharding='dynamic'))
        self.assertEqual(from_py, from_cat)
        self.assertEqual(from_py, collections.Counter(range(5000)))

    def test_dynamic_behind_a_shuffle_of_100000_is_exactly_once(self):
        """The user's path of the shuffle-repeat bug: distribute(...,
        sharding="dynamic") over range(1,000,000).shuffle(100000) once
        delivered 1,140,864 elements."""
        ds = sluice.range(0, 1000000).shuffle(100000, seed=1).batch(1024)
        counts = np.zeros(1000000, dtype=np.int64)
        with ds.distribute(self.addr, sharding='dynamic') as it:
            for b in it:
                np.add.at(counts, b['value'], 1)
        self.assertEqual(it.records_missing, 0, 'the iterator saw no batch lost')
        wrong = np.nonzero(counts != 1)[0]
        self.assertEqual(wrong.size, 0, '%d values not seen exactly once (first %s)' % (wrong.size, wrong[:5]))

    def test_coordinated_reads_give_each_consumer_its_batch_of_every_round(self):
        ds = sluice.range(0, 1000).repeat().batch(4)
        with ds.distribute(self.addr, job_name='py-coord', num_consumers=2, consumer_index=0) as a, \
                ds.distribute(self.addr, job_name='py-coord', num_consumers=2, consumer_index=1) as b:
            self.assertEqual(a.job_id, b.job_id)
            for _ in range(10):
                x = next(a)['value'].tolist()
                y = next(b)['value'].tolist()
                # The round's two batches are consecutive batches of one worker.
                self.assertEqual(x[-1] + 1, y[0])

    def test_coordinated_consumers_at_their_own_pace_get_their_batch_of_every_round(self):
        # Eight consumers in threads, windows of 1 to 32 rounds drawn from a
        # printed seed. Consumer 0 reads alone first, as far as it can: each
        # worker opens 16 rounds that no other consumer has taken from, and
        # its next requests wait for a place. Then the others start, and
        # every consumer must get, in round r, batch (r // 2) * 8 + c of
        # the worker whose round it is (round r is worker r mod 2's (r //
        # 2)-th), whichever requests found a place or a batch ready first.
        seed, rng = seeded('coordinated pace')
        n, rows, batches, rounds = 8, 4, 50, 300
        ds = sluice.range(0, rows * batches).repeat().batch(rows)
        windows = [32] + [rng.choice((1, 2, 4, 16, 32)) for _ in range(n - 1)]
        its = [ds.distribute(self.addr, job_name='py-coord-pace', num_consumers=n, consumer_index=c,
                             max_outstanding=windows[c]) for c in range(n)]
        readers = Readers(its, rounds, lambda b: int(b['value'][0]))
        got = readers.got
        try:
            readers.threads[0].start()
            wait_for(lambda: readers.failures or len(got[0]) >= 32, 'consumer 0 reading alone to round 32')
            for t in readers.threads[1:]:
                t.start()
            readers.join(120)
            self.assertEqual(readers.failures, [])
            self.assertEqual([len(g) for g in got], [rounds] * n, 'seed %d, windows %s: stalled' % (seed, windows))
            for c in range(n):
                for r, v in enumerate(got[c]):
                    want = ((r // 2 * n + c) % batches) * rows
                    self.assertEqual(v, want, 'seed %d, windows %s: round %d, consumer %d' % (seed, windows, r, c))
        finally:
            readers.close()

    def test_off_gives_each_value_once_per_worker(self):
        got = collections.Counter(self.values_of(sluice.range(0, 3000).batch(100), sharding='off'))
        self.assertEqual(got, collections.Counter({v: 2 for v in range(3000)}))

    def test_a_consumer_slower_than_its_workers_gets_every_batch_promptly(self):
        # max_outstanding 1: the budget is full whenever a batch waits, so
        # the loop asks for the next batch only when the caller takes one
        # and wakes it. Were that wake-up lost, each batch would wait for
        # the loop's next tick (a heartbeat, 250 ms here): 600 batches would
        # take 150 s, against about a second when it works. The consumer
        # pauses now and then so that batches do wait for it.
        import time
        deadline = time.monotonic() + 60
        got = []
        with sluice.range(0, 600).batch(1).distribute(self.addr, sharding='dynamic', max_outstanding=1,
                                                      per_worker_outstanding=1) as it:
            for n, b in enumerate(it):
                got.extend(b['value'].tolist())
                if n % 50 == 0:
                    time.sleep(0.01)
                self.assertLess(time.monotonic(), deadline, 'stalled after %d batches' % n)
        self.assertEqual(sorted(got), list(range(600)))

    def test_dtype_and_shape(self):
        with sluice.range(10, 0, -1, name='id').batch(4).distribute(self.addr, sharding='dynamic') as it:
            bs = list(it)
        self.assertEqual([sorted(b) for b in bs], [['id']] * 3)
        for b in bs:
            self.assertEqual(b['id'].dtype, np.int64)
            self.assertEqual(b['id'].ndim, 1)
        self.assertEqual(sorted(len(b['id']) for b in bs), [2, 4, 4])
        self.assertEqual(sorted(v for b in bs for v in b['id'].tolist()), list(range(1, 11)))
        # Unbatched elements arrive one scalar per batch, shape ().
        with sluice.range(3).distribute(self.addr, sharding='dynamic') as it:
            scalars = list(it)
        self.assertEqual([b['value'].shape for b in scalars], [()] * 3)
        self.assertEqual(sorted(int(b['value']) for b in scalars), [0, 1, 2])

    def test_arrays_are_views_and_release_the_batch(self):
        it = sluice.range(0, 256).batch(64).distribute(self.addr, sharding='dynamic')
        b = next(it)
        a = b['value']
        self.assertFalse(a.flags.owndata)
        self.assertTrue(a.flags.writeable)
        owner = owner_of(a)
        self.assertIsInstance(owner, sluice.client._Batch)
        self.assertTrue(owner.ptr)
        self.assertEqual(owner.num_elements, 64)
        # A slice and a torch tensor view the same memory and keep it alive.
        import torch
        part = a[10:20]
        t = torch.from_numpy(a)
        self.assertTrue(np.shares_memory(part, a))
        self.assertEqual(t.data_ptr(), a.ctypes.data)
        ref = weakref.ref(owner)
        expect = a.tolist()
        del b, a, owner
        self.assertEqual(sluice.client.live_handles()['batches'], 1)
        it.close()  # the batch outlives its iterator
        self.assertEqual(t.tolist(), expect)
        self.assertEqual(part.tolist(), expect[10:20])
        del part
        self.assertIsNotNone(ref())
        del t
        self.assertIsNone(ref())
        self.assertEqual(sluice.client.live_handles()['batches'], 0)

    def test_bad_spec_names_the_field(self):
        with self.assertRaises(sluice.SluiceError) as cm:
            sluice.range(10).batch(0).distribute(self.addr)
        e = cm.exception
        self.assertIsInstance(e, sluice.SpecError)
        self.assertIn('$.ops[0].batch_size', str(e))
        self.assertIn('$.ops[0].batch_size', e.message)
        self.assertEqual(e.code, _lib.SL_ESPEC)
        self.assertEqual(e.code_name, 'SL_ESPEC')
        with self.assertRaisesRegex(sluice.SpecError, r'\$\.source\.step'):
            sluice.range(0, 10, 0).distribute(self.addr)
        with self.assertRaisesRegex(sluice.SpecError, r'\$\.ops\[1\]\.plugin: must be a file name'):
            sluice.range(10).batch(2).map('/p/libplug.so', 'f', {'x': 'int64'}).distribute(self.addr)

    def test_iterator_error_carries_the_c_message(self):
        # An operator cancels the job: the next batch fails with SL_ECANCELLED
        # and sl_iterator_errmsg()'s text (from the dispatcher's heartbeat
        # answer or the worker's error frame, whichever comes first).
        import json
        import urllib.request
        it = sluice.range(0, 10**6).repeat().batch(64).distribute(self.addr)
        next(it)
        req = urllib.request.Request('http://127.0.0.1:%d/v1/jobs/%d' % (self.c.dispatcher.admin_port, it.job_id),
                                     data=json.dumps({'reason': 'stopped by test_python_client'}).encode(),
                                     method='DELETE')
        urllib.request.urlopen(req, timeout=5).read()
        t0 = time.monotonic()
        with self.assertRaises(sluice.JobCancelledError) as cm:
            for _ in it:
                self.assertLess(time.monotonic() - t0, 10)
        e = cm.exception
        self.assertEqual(e.code_name, 'SL_ECANCELLED')
        self.assertIn('cancelled', e.message)
        self.assertIn('job %d' % it.job_id, str(e))
        self.assertTrue(it.closed)
        self.assertEqual(list(it), [])

    def test_batch_over_max_batch_bytes_is_an_error_not_a_silent_loss(self):
        # 1000 int64 values make 8000-byte batches; the client takes 4000.
        it = sluice.range(0, 100000).batch(1000).distribute(self.addr, max_batch_bytes=4000)
        with self.assertRaises(sluice.SluiceError) as cm:
            for _ in it:
                pass
        self.assertEqual(cm.exception.code_name, 'SL_ETOOBIG')
        self.assertIn('exceeds the limit of 4000', str(cm.exception))

    def test_closing(self):
        ds = sluice.range(0, 10**6).repeat().batch(16)
        # close() mid-stream, then nothing more.
        it = ds.distribute(self.addr)
        next(it)
        it.close()
        it.close()
        self.assertTrue(it.closed)
        self.assertRaises(StopIteration, next, it)
        # A with block.
        with ds.distribute(self.addr) as it:
            next(it)
            self.assertEqual(sluice.client.live_handles()['iterators'], 1)
        self.assertTrue(it.closed)
        # Garbage collection.
        it = ds.distribute(self.addr)
        next(it)
        del it
        gc.collect()
        self.assertEqual(sluice.client.live_handles()['iterators'], 0)
        # Exhaustion.
        it = sluice.range(5).batch(5).distribute(self.addr, sharding='dynamic')
        self.assertEqual(len(list(it)), 1)
        self.assertTrue(it.closed)

    def test_named_job_splits_one_stream(self):
        ds = sluice.range(0, 4000).batch(50)
        a = ds.distribute(self.addr, sharding='dynamic', job_name='shared-py')
        b = ds.distribute(self.addr, sharding='dynamic', job_name='shared-py')
        self.assertEqual(a.job_id, b.job_id)
        got = []
        live = [a, b]
        while live:
            for it in list(live):
                try:
                    got.extend(next(it)['value'].tolist())
                except StopIteration:
                    live.remove(it)
        self.assertEqual(collections.Counter(got), collections.Counter(range(4000)))

    def test_checkpoint_resumes_mid_epoch_exactly_once(self):
        ds = sluice.range(0, 20000).shuffle(500, seed=3).batch(100)
        it = ds.distribute(self.addr, sharding='dynamic', checkpointable=True)
        got = []
        for _ in range(37):
            got.extend(next(it)['value'].tolist())
        ck = it.checkpoint()
        self.assertIsInstance(ck, bytes)
        self.assertEqual(it.state_dict(), {'checkpoint': it.checkpoint()})
        it.close()
        with ds.distribute(self.addr, sharding='dynamic', checkpoint=ck) as rest:
            for b in rest:
                got.extend(b['value'].tolist())
        self.assertEqual(len(got), 20000)
        self.assertEqual(sorted(got), list(range(20000)))
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'checkpoints need an iterator'):
            with ds.distribute(self.addr, sharding='off') as plain:
                next(plain)
                plain.checkpoint()
        with self.assertRaises(sluice.SluiceError) as cm:
            ds.distribute(self.addr, sharding='dynamic', checkpoint=b'garbage-bytes-not-a-checkpoint')
        self.assertIn('not a Sluice iterator checkpoint', str(cm.exception))

    def test_a_checkpoint_while_the_dispatcher_does_not_answer_resumes_exactly_once(self):
        """A checkpoint first asks the dispatcher which epochs are done and
        waits for the answer a heartbeat interval at most: with the
        dispatcher stopped it is taken all the same, from what the iterator
        holds, and resumes exactly once."""
        ds = sluice.range(0, 20000).shuffle(500, seed=4).repeat(3).batch(100)
        it = ds.distribute(self.addr, sharding='dynamic', checkpointable=True)
        got = []
        for _ in range(250):
            got.extend(next(it)['value'].tolist())
        pid = self.c.dispatcher.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            ck = it.checkpoint()
        finally:
            os.kill(pid, signal.SIGCONT)
        it.close()
        with ds.distribute(self.addr, sharding='dynamic', checkpoint=ck) as rest:
            for b in rest:
                got.extend(b['value'].tolist())
        counts = collections.Counter(got)
        self.assertEqual(len(got), 60000)
        self.assertEqual([v for v in range(20000) if counts[v] != 3], [])

    def test_ranks_of_a_named_job_checkpoint_merge_and_resume_as_more_ranks(self):
        # Three ranks of a named job read in turn, stop and checkpoint; the
        # merged checkpoint resumes as four ranks of another name: every
        # element once across all seven.
        ds = sluice.range(0, 30000).shuffle(500, seed=4).batch(100)
        ranks = [ds.distribute(self.addr, sharding='dynamic', job_name='ckpt-py', checkpointable=True)
                 for _ in range(3)]
        self.assertEqual(len({r.job_id for r in ranks}), 1)
        got = []
        for step in range(20):
            for r in ranks:
                got.extend(next(r)['value'].tolist())
        cks = [r.checkpoint() for r in ranks]
        for r in ranks:
            r.close()
        merged = sluice.merge_checkpoints(cks)
        resumed = [ds.distribute(self.addr, sharding='dynamic', job_name='ckpt-py-resumed', checkpoint=merged)
                   for _ in range(4)]
        self.assertEqual(len({r.job_id for r in resumed}), 1)
        live = list(resumed)
        while live:
            for it in list(live):
                try:
                    got.extend(next(it)['value'].tolist())
                except StopIteration:
                    live.remove(it)
        self.assertEqual(collections.Counter(got), collections.Counter(range(30000)))
        with self.assertRaisesRegex(sluice.ConflictError, 'restored from another checkpoint'):
            ds.distribute(self.addr, sharding='dynamic', job_name='ckpt-py-other', checkpoint=merged).close()
            ds.distribute(self.addr, sharding='dynamic', job_name='ckpt-py-other', checkpoint=cks[0])
        with self.assertRaisesRegex(sluice.DataError, 'checkpoint 2 of 2'):
            sluice.merge_checkpoints([cks[0], b'SLCK' + cks[1][4:-1] + bytes([cks[1][-1] ^ 1])])
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'no checkpoints'):
            sluice.merge_checkpoints([])

    def test_max_ledger_runs_bounds_the_record_and_a_checkpoint_past_it_is_refused(self):
        ds = sluice.range(0, 200000).shuffle(20000, seed=3).batch(100)
        with ds.distribute(self.addr, sharding='dynamic', checkpointable=True, max_ledger_runs=100) as it:
            for _ in range(50):
                next(it)
            with self.assertRaisesRegex(sluice.SluiceError, 'more than 100 runs of positions'):
                it.checkpoint()
        with self.assertRaisesRegex(sluice.InvalidArgumentError, 'max_ledger_runs must be'):
            ds.distribute(self.addr, sharding='dynamic', max_ledger_runs=-1)

    def test_torch_loader_state_dict_resumes_in_a_new_loader(self):
        import sluice.torch as st
        ds = sluice.range(0, 6000).shuffle(300, seed=5).batch(50)
        first = st.loader(ds, self.addr, sharding='dynamic')
        got = []
        for i, b in enumerate(first):
            got.extend(b['value'].tolist())
            if i == 40:
                state = first.state_dict()
                break
        first.close()
        second = st.loader(ds, self.addr, sharding='dynamic')
        second.load_state_dict(state)
        for b in second:
            got.extend(b['value'].tolist())
        self.assertEqual(sorted(got), list(range(6000)))
        with self.assertRaisesRegex(NotImplementedError, 'sharding="dynamic" and no job_name'):
            st.SluiceIterableDataset(sluice.range(3), self.addr).state_dict()
        with self.assertRaisesRegex(NotImplementedError, 'sharding="dynamic"'):
            st.loader(sluice.range(3), self.addr).state_dict()

    def test_torch_iterable_dataset_in_a_dataloader(self):
        import torch
        import sluice.torch as st
        ds = st.SluiceIterableDataset(sluice.range(0, 1000).batch(100), self.addr, sharding='dynamic')
        loader = torch.utils.data.DataLoader(ds, batch_size=None)
        seen = []
        for epoch in range(2):  # each epoch is a new job
            got = []
            for b in loader:
                self.assertIsInstance(b['value'], torch.Tensor)
                self.assertEqual(b['value'].dtype, torch.int64)
                got.extend(b['value'].tolist())
            seen.append(sorted(got))
        self.assertEqual(seen, [list(range(1000))] * 2)

    def test_torch_loader_zero_copy_and_pin(self):
        import torch
        import sluice.torch as st
        ld = st.loader(sluice.range(0, 640).batch(64), self.addr, pin_memory=True, sharding='dynamic')
        self.assertEqual(ld.pin_memory, torch.cuda.is_available())
        total, first = 0, None
        for b in ld:
            t = b['value']
            first = t if first is None else first
            total += int(t.sum())
        self.assertEqual(total, sum(range(640)))
        if not torch.cuda.is_available():
            # Not pinned: the tensor views its batch and keeps it alive.
            del b, t
            gc.collect()
            self.assertEqual(sluice.client.live_handles()['batches'], 1)
            self.assertEqual(len(first.tolist()), 64)
            del first
            self.assertEqual(sluice.client.live_handles()['batches'], 0)

    def test_training_loop(self):
        """The example of docs/python.md: linear regression y = 3x + 1 on
        batches served by the workers; the loss falls by 10x or more."""
        import torch
        import sluice.torch

        torch.manual_seed(0)
        ds = sluice.range(0, 1024).shuffle(1024, seed=1).repeat(40).batch(64, drop_remainder=True)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        losses = []
        for batch in sluice.torch.loader(ds, self.addr, sharding='dynamic'):
            x = batch['value'].to(torch.float32).unsqueeze(1) / 1024  # in [0, 1)
            y = 3 * x + 1
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.assertGreater(len(losses), 500)
        first, last = np.mean(losses[:5]), np.mean(losses[-20:])
        self.assertGreaterEqual(first / last, 10, 'loss %.4g -> %.4g' % (first, last))
        w, b = model.weight.item(), model.bias.item()
        self.assertAlmostEqual(w, 3, delta=0.1)
        self.assertAlmostEqual(b, 1, delta=0.1)

    @unittest.skipIf(os.environ.get('SLUICE_SANITIZED'), "ASan's quarantine holds freed memory: RSS says nothing")
    def test_resident_memory_flat_over_10000_batches(self):
        # Two workers under OFF each send 6000 batches of 64 int64.
        ds = sluice.range(0, 64 * 1000).repeat(6).batch(64)
        n, total, warm, before = 0, 0, 1000, None
        with ds.distribute(self.addr, sharding='off') as it:
            for b in it:
                total += int(b['value'].sum())
                n += 1
                if n == warm:
                    gc.collect()
                    before = rss_bytes()
                if n == warm + 10000:
                    break
            del b
            gc.collect()
            after = rss_bytes()
            self.assertLessEqual(sluice.client.live_handles()['batches'], 0)
        self.assertEqual(n, warm + 10000)
        grew = (after - before) / 2**20
        self.assertLess(grew, 20, 'RSS grew by %.1f MiB over 10000 batches' % grew)


def worker_metric(worker, name):
    """The sum of a worker's metric of that name (GET /metrics)."""
    import urllib.request
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % worker.admin_port, timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.split()[0] == name)


class RequestWindowTest(unittest.TestCase):
    """The GET_ELEMENT requests an iterator keeps in flight to one worker:
    per_worker_outstanding, by default half the window, 4 to 16
    (docs/protocol.md)."""

    def test_the_python_defaults_are_the_c_librarys(self):
        io = _lib.IteratorOpts()
        _lib.load().sl_iterator_opts_init(ctypes.byref(io))
        init = inspect.signature(sluice.client.BatchIterator.__init__).parameters
        dist = inspect.signature(sluice.client.distribute).parameters
        ds_dist = inspect.signature(sluice.Dataset.distribute).parameters
        for name in ('max_outstanding', 'per_worker_outstanding', 'window_bytes', 'timeout_ms', 'connect_timeout_ms',
                     'max_batch_bytes', 'dispatcher_timeout_ms', 'max_ledger_runs'):
            self.assertEqual(init[name].default, getattr(io, name), name)
            for sig in (dist, ds_dist):
                if name in sig:
                    self.assertEqual(sig[name].default, getattr(io, name), name)
        # 0: the window sized by window_bytes, 32 MiB (SizedWindowTest).
        self.assertEqual((io.max_outstanding, io.per_worker_outstanding, io.window_bytes), (0, 0, 0))
        # The field the library reads is the one _lib.py writes: the last.
        self.assertEqual(_lib.IteratorOpts.window_bytes.offset + ctypes.sizeof(ctypes.c_size_t),
                         ctypes.sizeof(_lib.IteratorOpts))

    def test_a_waiting_iterator_has_its_worker_hold_its_last_four_answers(self):
        # The caller takes nothing: the iterator asks until its budget
        # (max_outstanding, 8 here) is full, one request each time an
        # answer comes, and each request acknowledges the answers below
        # the oldest still in flight. Once the eighth is served, the worker
        # holds the answers nothing acknowledged: at most the last window,
        # 4 (8 were it the whole budget), and at least the eighth. Fewer
        # than 4 when answers came together: the fifth can arrive with the
        # fourth, before the eighth request goes (which then acknowledges
        # it), more often since small answers come through shared memory.
        # Given, not the defaults: those size the window by bytes, 32 and
        # 16 for these small batches (SizedWindowTest).
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)

            def metric(name):
                return worker_metric(c.workers[0], name)
            with sluice.range(0, 10**6).batch(64).distribute(c.dispatcher.addr, max_outstanding=8,
                                                             per_worker_outstanding=4) as it:
                wait_for(lambda: metric('sluice_worker_batches_served_total') >= 8,
                         'the worker to serve the iterator\'s budget of 8 batches')
                self.assertEqual(metric('sluice_worker_batches_served_total'), 8)
                held = metric('sluice_worker_held_batches')
                self.assertTrue(1 <= held <= 4, 'the worker holds %d batches for a window of 4' % held)
                self.assertEqual(len(next(it)['value']), 64)
        finally:
            bad = c.close()
        self.assertEqual(bad, {})


class SizedWindowTest(SluiceCase):
    """max_outstanding 0 (the default): the iterator keeps as many batches
    requested and queued as window_bytes (32 MiB unless given) holds at the
    largest batch received so far, at least 8 and at most 32; 8 until the
    first batch came (docs/protocol.md). Each test has the caller take
    nothing and reads how many batches the one worker served: the window;
    then the caller takes one, and the worker serves one more, and no more.
    The requests go in order on one connection, so any the iterator sent
    past its window before the one that replaces the batch taken were
    served first: no pause is needed to see them."""
    workers = 1

    def served_while_waiting(self, batch, expected, **options):
        worker = self.c.workers[0]
        before = worker_metric(worker, 'sluice_worker_batches_served_total')

        def served():
            return worker_metric(worker, 'sluice_worker_batches_served_total') - before
        what = 'batches of %d int64 with %r' % (batch, options)
        with sluice.range(0, 10**8).batch(batch).distribute(self.addr, **options) as it:
            wait_for(lambda: served() >= expected, 'the worker to serve a window of %d batches' % expected)
            first = next(it)['value']
            self.assertEqual((len(first), int(first[0])), (batch, 0))
            wait_for(lambda: served() >= expected + 1, 'the worker to serve the batch that replaces the first')
            self.assertEqual(served(), expected + 1, what)

    def test_small_batches_grow_the_window_to_32(self):
        # 512 bytes a batch: 32 MiB holds far more, so the most, 32.
        self.served_while_waiting(64, 32)

    def test_a_window_bytes_that_holds_twelve_batches_keeps_twelve(self):
        # 256 KiB batches (2^15 int64) in 3 MiB.
        self.served_while_waiting(1 << 15, 12, window_bytes=12 << 18)

    def test_large_batches_keep_at_least_eight(self):
        # 256 KiB batches in 1 MiB would be 4: the least is 8.
        self.served_while_waiting(1 << 15, 8, window_bytes=1 << 20)

    def test_a_given_max_outstanding_is_kept(self):
        self.served_while_waiting(64, 5, max_outstanding=5)


class DispatcherLossTest(unittest.TestCase):
    """A running iterator whose dispatcher dies (and stays away) fails once
    dispatcher_timeout_ms has passed, not before."""

    def test_iterator_fails_when_the_dispatcher_dies(self):
        c = Cluster(workers=1)
        try:
            c.wait_workers_registered(1)
            it = sluice.range(0, 10**6).repeat().batch(64).distribute(c.dispatcher.addr, timeout_ms=1500,
                                                                      dispatcher_timeout_ms=1500)
            next(it)
            c.dispatcher.kill()
            t0 = time.monotonic()
            with self.assertRaises(sluice.SluiceError) as cm:
                for _ in it:
                    pass
            self.assertLess(time.monotonic() - t0, 10)
            self.assertIsInstance(cm.exception, sluice.SluiceTimeoutError, str(cm.exception))
            self.assertIn('dispatcher_timeout_ms', str(cm.exception))
            self.assertTrue(it.closed)
        finally:
            c.close()


class CoordinatedAtScaleTest(unittest.TestCase):
    """Sixty-four coordinated consumers, as many ranks as a job of eight
    hosts of eight GPUs, through a worker that joins and a dispatcher
    killed with -9 and started again."""

    def test_every_round_holds_one_tasks_consecutive_batches_through_a_join_and_a_restart(self):
        # The consumers stop taking batches at round 50 (a worker joins) and
        # at round 120 (the dispatcher is killed and started again), so that
        # both come mid-run whatever the machine's speed: no consumer asks
        # past the horizon the dispatcher last answered (its next round plus
        # 64, the next being at most its window of 32 ahead of the caller).
        seed, rng = seeded('coordinated at scale')
        n, rows, batches, rounds = 64, 4, 1000, 300
        ds = sluice.range(0, rows * batches).repeat().batch(rows)
        windows = [rng.choice((1, 2, 4, 16, 32)) for _ in range(n)]
        c = Cluster(workers=3)
        try:
            c.wait_workers_registered(3)
            its = [ds.distribute(c.dispatcher.addr, job_name='coord-scale', num_consumers=n, consumer_index=i,
                                 max_outstanding=windows[i], timeout_ms=120000) for i in range(n)]
            readers = Readers(its, rounds, lambda b: int(b['value'][0]) // rows,
                              pauses={50: threading.Event(), 120: threading.Event()})
            got = readers.got
            try:
                for t in readers.threads:
                    t.start()
                wait_for(lambda: readers.failures or len(readers.arrived[50]) == n, 'every consumer at round 50')
                joined = c.add_worker()
                readers.pauses[50].set()
                wait_for(lambda: readers.failures or len(readers.arrived[120]) == n, 'every consumer at round 120')
                job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-scale'][0]['job_id']
                horizon = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['coordinated']['round_horizon']
                print('coordinated at scale: horizon %d when the dispatcher was killed' % horizon, file=sys.stderr)
                c.restart_dispatcher()
                readers.pauses[120].set()
                readers.join(240)
                where = 'seed %d, windows %s' % (seed, windows)
                self.assertEqual(readers.failures, [], where)
                self.assertEqual([len(g) for g in got], [rounds] * n, where + ': stalled')
                for r in range(rounds):
                    first = got[0][r]
                    self.assertEqual([g[r] for g in got], [(first + i) % batches for i in range(n)],
                                     '%s: round %d' % (where, r))
                self.assertLessEqual(horizon, 120 + 32 + 64, 'the horizon when the dispatcher was killed')
                after = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['coordinated']['round_horizon']
                self.assertGreaterEqual(after, rounds, 'the restarted dispatcher moved the horizon on')
                served = [t['batches_served'] for t in get_json(joined.admin_port, '/v1/tasks')['tasks']
                          if 'rounds' in t]
                self.assertTrue(served and served[0] > 0, 'the joined worker served no round: %s' % served)
            finally:
                readers.close()
        finally:
            c.close()


class CoordinatedWorkerLossTest(unittest.TestCase):
    """Coordinated consumers read on through a lost worker: the rounds it
    had not served to a consumer come from the other worker (before
    2026-12-02 the first such round raised SluiceConnectionError)."""

    def test_a_lost_workers_rounds_come_from_the_other_worker(self):
        c = Cluster(workers=2, dispatcher_args=['--worker-timeout-ms', '1000'])
        try:
            c.wait_workers_registered(2)
            ds = sluice.range(0, 1000).repeat().batch(4)
            its = [ds.distribute(c.dispatcher.addr, job_name='coord-lost-py', num_consumers=2, consumer_index=i,
                                 timeout_ms=60000) for i in range(2)]
            lost = c.workers[1].addr
            try:
                rounds = [[], []]  # the first value of each consumer's batch of each round
                for _ in range(4):  # rounds of both workers
                    for i, it in enumerate(its):
                        rounds[i].append(int(next(it)['value'][0]))
                c.workers[1].kill()
                job = get_json(c.dispatcher.admin_port, '/v1/jobs')['names']['coord-lost-py'][0]['job_id']

                def end_round():
                    tasks = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % job)['tasks']
                    return [t['rounds'].get('end') for t in tasks if t['worker_address'] == lost][0]
                # The consumers take turns, as synchronous training does.
                while end_round() is None or len(rounds[0]) < end_round() + 20:
                    for i, it in enumerate(its):
                        rounds[i].append(int(next(it)['value'][0]))
                # From the lost worker's end on, each round is one worker's
                # two consecutive batches, consumer 0 the first.
                for r in range(end_round(), len(rounds[0])):
                    self.assertEqual(rounds[1][r], (rounds[0][r] + 4) % 1000, 'round %d' % r)
            finally:
                for it in its:
                    it.close()
        finally:
            c.close()


if __name__ == '__main__':
    unittest.main()


GET_OR_CREATE_JOB_RESP = 13  # protocol/frame.h, sl_msg_type


def checkpoint_head(ck):
    """(version, epochs_done, file, record) of a checkpoint's header: file
    and record are the place a version 5 or 6 starts at (0 for older ones;
    a version 6 one may start at the epoch's start too)."""
    version = int.from_bytes(ck[4:8], 'little')
    if version < 5:
        return version, int.from_bytes(ck[24:32], 'little'), 0, 0
    return (version, int.from_bytes(ck[24:32], 'little'), int.from_bytes(ck[32:36], 'little'),
            int.from_bytes(ck[40:48], 'little'))


def seeded_range(n, shuffle, batch, seed, epochs=1):
    """range(n), behind shuffle(shuffle) of a seed from seed unless shuffle
    is 0, repeated for `epochs`, in batches of batch: the dataset of the
    seeded named-job tests."""
    ds = sluice.range(0, n)
    if shuffle:
        ds = ds.shuffle(shuffle, seed=seed % 1000)
    if epochs > 1:
        ds = ds.repeat(epochs)
    return ds.batch(batch)


# The faults the seeded named-job tests draw: one of 3 workers, or the
# dispatcher, killed with -9 and started again (restart()).
KILLS = [('worker kill', k) for k in range(3)] + [('dispatcher kill', None)]


def restart(c, fault):
    """Kills what fault (of KILLS) names in cluster c with -9 and starts it again."""
    kind, worker = fault
    if kind == 'worker kill':
        c.restart_worker(worker)
    else:
        c.restart_dispatcher()


def read_round(live, got):
    """Takes a batch of each iterator in live, its values into got; one
    that ended is closed and leaves live."""
    for it in list(live):
        try:
            got.append(next(it)['value'])
        except StopIteration:
            live.remove(it)
            it.close()


def read_in_turn(its, got, before_round=None):
    """Takes a batch of each of its in turn, its values into got, until
    every one ended (and is closed); before_round(r), if given, is called
    before round r."""
    live, rounds = list(its), 0
    while live:
        if before_round:
            before_round(rounds)
        rounds += 1
        read_round(live, got)


def assert_each_once(test, got, n, where, epochs=1):
    """Every value of range(n) once an epoch (`epochs` times) across the
    arrays in got."""
    values_ = np.concatenate(got)
    wrong = np.nonzero(np.bincount(values_, minlength=n) != epochs)[0]
    test.assertEqual((len(values_), wrong[:10].tolist()), (n * epochs, []), where)


def read_until_placed(test, c, its, step, max_steps, where):
    """Takes step() (a batch for each of its, the ranks of one named job of
    cluster c) until the job's fold passed the epoch's start, then until the
    ranks' merged checkpoint starts there (version 5 or 6): a checkpoint's round
    trip hears the fold, and the next batch each rank is given makes it.
    At most max_steps; (merged checkpoint, checkpoint_head() of it)."""
    head, view = (None, None), None
    for k in range(max_steps):
        if k % 20 == 0:
            view = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % its[0].job_id)
            if view['lost_splits']['folded_below'] != [0, 0, 0]:
                merged = sluice.merge_checkpoints([it.checkpoint() for it in its])
                head = checkpoint_head(merged)
                if head[2:] != (0, 0):
                    return merged, head
        step()
    test.fail('%s: the merged checkpoint never started within the epoch in %d steps (the job\'s lost splits %s, '
              'consumers %s)' % (where, max_steps, view and view['lost_splits'], view and view['consumers']))


class RanksThatLeaveTest(unittest.TestCase):
    """Ranks of a named DYNAMIC job that leave mid-epoch give back the
    batches that waited for them (docs/fault-tolerance.md, "A rank that
    leaves"): the ranks that stay, and ranks that join later, read them."""

    def test_ranks_that_leave_mid_epoch_give_back_what_waited_for_them_exactly_once(self):
        # A seeded property test: 3 to 12 ranks of one named job read one
        # epoch of 300,000 to 1,500,000 records (behind no shuffle or a
        # shuffle of 2,000 to 100,000; batches of 64 to 256) in turn; all
        # but one leave at drawn steps within the first half of the epoch,
        # each once at least a batch waits for it (it.queued), and 0 to 2
        # ranks join later; 0 to 3 workers or the dispatcher are killed
        # with -9 and started again at drawn steps. Every record comes once
        # across all ranks. Before the ranks gave back, each leaving rank
        # took its waiting batches with it (missing), and a worker lost
        # after a rank left sent again what that rank had been given
        # (twice). SLUICE_TEST_SEED repeats a run.
        seed, rng = seeded('ranks that leave')
        n, batch = rng.randrange(300000, 1500001), rng.choice([64, 100, 256])
        shuffle = rng.choice([0, 2000, 20000, 100000])
        ranks = rng.randrange(3, 13)
        half = n // 2 // (ranks * batch)
        leave_at = sorted(rng.randrange(1, half) for _ in range(ranks - 1))
        join_at = sorted(rng.randrange(1, half * 2) for _ in range(rng.randrange(0, 3)))
        faults = {rng.randrange(1, half * 2): rng.choice(KILLS) for _ in range(rng.randrange(0, 4))}
        where = ('seed %d: %d records, batch %d, shuffle %d, %d ranks leaving at steps %s, joining at %s, faults %s' %
                 (seed, n, batch, shuffle, ranks, leave_at, join_at, sorted(faults.items())))
        print('ranks that leave: %s' % where, file=sys.stderr)
        ds = seeded_range(n, shuffle, batch, seed)
        # Splits of 1,000, up to 4,096 a task: a shuffle of 100,000 spans
        # about 100 ln(1000) = 700 splits.
        c = Cluster(workers=3, dispatcher_args=['--split-size', '1000', '--max-split-size', '1000',
                                                '--max-outstanding-splits', '4096'])
        got, given_back, waited = [], 0.0, 0

        def given_back_now():
            return metric(c.dispatcher.admin_port, 'sluice_dispatcher_records_given_back_total', default=0.0)
        try:
            c.wait_workers_registered(3)

            def rank():
                return ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='leavers')
            live = [rank() for _ in range(ranks)]
            step = 0
            while live:
                step += 1
                if step in faults:
                    if faults[step][0] == 'dispatcher kill':
                        given_back += given_back_now()  # its counters start again
                    restart(c, faults[step])
                for _ in range(join_at.count(step)):
                    live.append(rank())
                read_round(live, got)
                for _ in range(leave_at.count(step)):
                    it = live.pop(rng.randrange(len(live)))
                    # More than half the epoch is left: a batch comes.
                    self.assertTrue(wait_for(lambda: it.queued > 0, timeout=120), where)
                    waited += it.queued
                    it.close()
            given_back += given_back_now()
            assert_each_once(self, got, n, where)
            self.assertGreaterEqual(given_back, waited, '%s: the waiting batches were given back' % where)
        finally:
            bad = c.close()
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly' % where)

    def test_a_rank_whose_worker_stops_and_is_lost_gives_back_whole_and_holds_no_fold(self):
        # Two ranks of a named job read from two workers; one worker stops
        # (SIGSTOP) and a rank closes with batches waiting. Its leave to the
        # stopped worker goes unanswered until the dispatcher loses the
        # worker (--worker-timeout-ms 1500) and no longer lists its task:
        # the worker's splits go out again without what the rank received,
        # so the leave is whole and no fold of the job stops where the rank
        # left (no held_below in the job view). Before, a leave waiting on a
        # lost worker counted as not whole and held the fold for the rest of
        # the job.
        ds = sluice.range(0, 10**6).repeat().batch(100)
        c = Cluster(workers=2, dispatcher_args=['--worker-timeout-ms', '1500'])
        try:
            c.wait_workers_registered(2)
            r1, r2 = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='lost-leave') for _ in range(2)]
            for _ in range(20):
                next(r1)
                next(r2)
            pid = c.workers[0].proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                self.assertTrue(wait_for(lambda: r1.queued > 0, timeout=60))
                r1.close()
                view = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % r2.job_id)['lost_splits']
            finally:
                os.kill(pid, signal.SIGCONT)
            self.assertNotIn('held_below', view)
            self.assertEqual(view['report_gen'], 1, 'worker 0 was lost once: %s' % view)
            self.assertGreater(metric(c.dispatcher.admin_port, 'sluice_dispatcher_records_given_back_total',
                                      default=0.0), 0)
            next(r2)
            r2.close()
        finally:
            c.close()

    def test_the_fold_passes_where_ranks_left_and_a_checkpoint_resumes_exactly_once(self):
        # A seeded property test: 3 to 8 checkpointable ranks of one named
        # job read 80 epochs of 50,000 to 100,000 records (behind no
        # shuffle, a shuffle of 2,000 or of a fifth of the epoch, batches of
        # 64 to 256) in turn; 1 to all but one leave within the first half
        # of the first epoch, each once a batch waits for it, and 0 to 2
        # workers or the dispatcher are killed with -9 and started again.
        # The ranks that stay read on, and every 10 steps checkpoint, until
        # their checkpoints, merged with those the ranks that left took as
        # they left, say the first epoch is done: the fold passed the places
        # the ranks left at. Until the dispatcher took the records given
        # back as the fold's bound, a rank that left held the fold where it
        # left for the rest of the job, and every rank's record of what
        # reached it kept all it got from there (the run read all the
        # epochs and failed). 1 to 4 ranks resume from the
        # checkpoint under another name: every record comes once an epoch.
        # SLUICE_TEST_SEED repeats a run.
        seed, rng = seeded('the fold past ranks that left')
        n, batch, epochs = rng.randrange(50000, 100001), rng.choice([64, 100, 256]), 80
        shuffle = rng.choice([0, 2000, n // 5])
        ranks = rng.randrange(3, 9)
        half = n // 2 // (ranks * batch)
        leave_at = sorted(rng.randrange(1, half) for _ in range(rng.randrange(1, ranks)))
        faults = {rng.randrange(1, half * 2): rng.choice(KILLS) for _ in range(rng.randrange(0, 3))}
        resumed = rng.randrange(1, 5)
        where = ('seed %d: %d records x %d epochs, batch %d, shuffle %d, %d ranks leaving at steps %s, faults %s, '
                 '%d resuming' % (seed, n, epochs, batch, shuffle, ranks, leave_at, sorted(faults.items()), resumed))
        print('the fold past ranks that left: %s' % where, file=sys.stderr)
        ds = sluice.range(0, n)
        if shuffle:
            ds = ds.shuffle(shuffle, seed=seed % 1000)
        ds = ds.repeat(epochs).batch(batch)
        # The bound on a task's splits not confirmed paces the ranks: a
        # task gets a split given back at its next request, confirmed once
        # the splits it held before are, while the two other tasks read on,
        # so the ranks read up to about 6 x bound x 1,000 records past the
        # fold (34 epochs at most here, 19 seen) whatever the speed of
        # heartbeats, and no further without them. A shuffle of s holds
        # records of about s ln(1000) / 1000 splits, which the bound leaves
        # room for.
        bound = 64 if shuffle <= 2000 else 1 << math.ceil(math.log2(2 * shuffle * 7 / 1000))
        c = Cluster(workers=3, dispatcher_args=['--split-size', '1000', '--max-split-size', '1000',
                                                '--max-outstanding-splits', str(bound)])
        got, left = [], []
        try:
            c.wait_workers_registered(3)
            live = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='fold-past', checkpointable=True)
                    for _ in range(ranks)]
            step, head, last = 0, None, max(leave_at + list(faults))
            while head is None or head[1] < 1:
                step += 1
                if step in faults:
                    restart(c, faults[step])
                for it in live:
                    try:
                        got.append(next(it)['value'])
                    except StopIteration:
                        self.fail('%s: the data ended at step %d, and the merged checkpoint of the ranks that '
                                  'stayed never said the first epoch was done (last %s)' % (where, step, head))
                for _ in range(leave_at.count(step)):
                    it = live.pop(rng.randrange(len(live)))
                    self.assertTrue(wait_for(lambda: it.queued > 0, timeout=120), where)
                    left.append(it.checkpoint())  # what its caller was given
                    it.close()
                if step > last and step % 10 == 0:
                    merged = sluice.merge_checkpoints([it.checkpoint() for it in live] + left)
                    head = checkpoint_head(merged)
            print('the fold past ranks that left: step %d, merged checkpoint %s, %d bytes' % (step, head, len(merged)),
                  file=sys.stderr)
            for it in live:
                it.close()
            again = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='fold-past-resumed',
                                   checkpoint=merged) for _ in range(resumed)]
            read_in_turn(again, got)
            counts = np.bincount(np.concatenate(got), minlength=n)
            wrong = np.nonzero(counts != epochs)[0]
            self.assertEqual(wrong[:10].tolist(), [], '%s: %d values wrong, counts %s' % (
                where, len(wrong), counts[wrong[:10]].tolist()))
        finally:
            bad = c.close()
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly' % where)


def lockstep_through_faults(test, what, ranks_from, resumed_from):
    """The fold by place under faults, a seeded property test (`what`
    names it): lockstep ranks, as many as drawn from range(*ranks_from),
    read 30-50% of the first of two epochs of 2,000,000 to 3,000,000
    records (behind no shuffle, shuffle(2000) or shuffle(20000), batches of
    64 to 256) while workers and the dispatcher are killed with -9 between
    steps and started again; they read on until their merged checkpoint
    starts within an epoch (version 5 or 6). range(*resumed_from) ranks
    resume from it under another name, through more kills, and every
    element comes exactly once an epoch. SLUICE_TEST_SEED repeats a run.

    The second epoch is room for the fold to pass the first's start: a
    lost worker's splits are read again behind what their new task holds,
    and their records stay in its shuffle buffer as long as any
    (shuffle(20000) keeps the last of a few thousand records for about
    170,000 draws of that task, 500,000 records of the job's three tasks);
    with one epoch, 1 run in 30 ran out of data first. Half the runs give
    the ranks a bound of 20,000 runs, which a rank's scattered share past
    the fold passes as runs: its ledger keeps it as bitmaps, and its
    worker-loss reports carry them (position set version 3), which the
    dispatcher reads within the lost splits."""
    seed, rng = seeded(what)
    n, batch, shuffle = rng.randrange(2000000, 3000001), rng.choice([64, 100, 256]), rng.choice([0, 2000, 20000])
    ranks, resumed = rng.randrange(*ranks_from), rng.randrange(*resumed_from)
    bound = rng.choice([0, 20000])
    steps = n * rng.randrange(30, 51) // 100 // (ranks * batch)
    kinds = KILLS + KILLS[-1:]
    first = {rng.randrange(steps // 10, steps * 6 // 10): rng.choice(kinds) for _ in range(rng.randrange(1, 4))}
    epochs = 2
    left = (n * epochs - steps * ranks * batch) // (resumed * batch)
    later = {rng.randrange(left // 10, left * 7 // 10): rng.choice(kinds) for _ in range(rng.randrange(0, 3))}
    where = ('seed %d: %d records x %d epochs, batch %d, shuffle %d, %d ranks (max_ledger_runs %d) for %d steps '
             '(faults %s), %d resumed (faults %s)' % (seed, n, epochs, batch, shuffle, ranks, bound, steps,
                                                      sorted(first.items()), resumed, sorted(later.items())))
    print('%s: %s' % (what, where), file=sys.stderr)
    ds = seeded_range(n, shuffle, batch, seed, epochs)
    # Splits of 1,000, at most 512 of them a task: room for a buffer of
    # 20,000, which holds records of about 20 ln(1000) = 140 splits
    # (fewer, and the job fails by name: its shuffle spans more splits
    # than its task may hold). The resumed job starts at the
    # checkpoint's place, which can lag a million records behind what
    # the ranks read (a lost worker's splits hold the fold); past it
    # most records were consumed, and its splits grow to hold 1,000
    # records not consumed each (before they did not, and a seed's
    # resumed shuffle spanned more than 512 of them). The fold lags the
    # front by what the tasks hold, the shuffles' tails (3 x 20000
    # ln(1000) = 414,000 records) and what the ranks hold.
    c = Cluster(workers=3, dispatcher_args=['--split-size', '1000', '--max-split-size', '1000',
                                            '--max-outstanding-splits', '512'])
    got = []
    try:
        c.wait_workers_registered(3)
        its = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='faults', checkpointable=True,
                             max_ledger_runs=bound) for _ in range(ranks)]

        def step():
            for it in its:
                got.append(next(it)['value'])
        for k in range(steps):
            if k in first:
                restart(c, first[k])
            step()
        # A lost worker's splits hold the fold until they are read
        # again, after what the workers hold ahead.
        job = its[0].job_id
        merged, head = read_until_placed(test, c, its, step, (n * epochs * 95 // 100 - steps * ranks * batch) //
                                         (ranks * batch), where)
        read = sum(len(v) for v in got)
        where += ', resumed at epoch %d file %d record %d after %d records read' % (head[1], head[2], head[3], read)
        print('%s: %s' % (what, where), file=sys.stderr)
        test.assertTrue(0 < head[3] <= n, where)
        for it in its:
            it.close()
        http(c.dispatcher.admin_port, '/v1/jobs/%d' % job, method='DELETE')
        live = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='faults-resumed', checkpoint=merged)
                for _ in range(resumed)]
        read_in_turn(live, got, lambda r: r in later and restart(c, later[r]))
        assert_each_once(test, got, n, where, epochs)
    finally:
        bad = c.close()
    test.assertEqual(bad, {}, '%s: daemons exited uncleanly' % where)


class NamedLongEpochTest(unittest.TestCase):
    """A named job's ranks that checkpoint over one long shuffled epoch:
    the fold by place (docs/fault-tolerance.md, "Done epochs")."""

    def test_lockstep_ranks_keep_their_ledgers_to_what_lies_past_the_given_place(self):
        # Three ranks read in lockstep (one batch each a step, as DDP ranks
        # do) 900,000 to 1,100,000 records each of one epoch of 4,000,000
        # behind shuffle(2000), each with max_ledger_runs 100,000. A rank
        # gets a third of the batches, so its ledger keeps about a run a
        # record it got: without the fold by place every rank overflowed
        # past 100,000 runs and its checkpoint failed. With it, each drops
        # what every rank was given. The merged checkpoint starts within
        # the epoch (version 5 or 6); two ranks resume from it, under the same
        # bound, and every element comes exactly once. Splits of 1,000 to
        # 4,000 records, so that how far the fold lags does not follow how
        # fast this machine reads.
        seed, rng = seeded('named long epoch')
        n, bound, steps = 4000000, 250000, rng.randrange(9000, 11000)
        ds = sluice.range(0, n).shuffle(2000, seed=7).batch(100)
        c = Cluster(workers=3, dispatcher_args=['--split-size', '1000', '--max-split-size', '1000',
                                                '--max-outstanding-splits', '64'])
        try:
            c.wait_workers_registered(3)
            addr = c.dispatcher.addr
            ranks = [ds.distribute(addr, sharding='dynamic', job_name='long-py', checkpointable=True,
                                   max_ledger_runs=bound) for _ in range(3)]
            got = []
            for _ in range(steps):
                for r in ranks:
                    got.append(next(r)['value'])
            cks = [r.checkpoint() for r in ranks]
            # The job view shows each rank's record against its bound, as
            # its heartbeats (one came with each checkpoint) said.
            said = [(co.get('ledger_runs'), co.get('ledger_max_runs')) for co in
                    get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % ranks[0].job_id)['consumers']]
            self.assertEqual([m for _, m in said], [bound] * 3, said)
            self.assertTrue(all(0 < r < bound for r, _ in said), said)
            for r in ranks:
                r.close()
            merged = sluice.merge_checkpoints(cks)
            version, epochs_done, file, record = checkpoint_head(merged)
            where = 'seed %d, %d steps: merged checkpoint version %d at epoch %d file %d record %d, %d bytes' % (
                seed, steps, version, epochs_done, file, record, len(merged))
            print('named long epoch: %s' % where, file=sys.stderr)
            self.assertIn(version, (5, 6), where)
            self.assertEqual((epochs_done, file), (0, 0), where)
            self.assertGreater(record, 0, where)
            resumed = [ds.distribute(addr, sharding='dynamic', job_name='long-py-resumed', checkpoint=merged,
                                     max_ledger_runs=bound) for _ in range(2)]
            read_in_turn(resumed, got)
            assert_each_once(self, got, n, where)
        finally:
            c.close()

    def test_lockstep_ranks_checkpoint_through_faults_and_resume_exactly_once(self):
        # The fold by place under faults, a seeded property test: 2 to 4
        # lockstep ranks, 1 to 4 resuming (lockstep_through_faults()).
        lockstep_through_faults(self, 'named ranks through faults', (2, 5), (1, 5))

    def test_dozens_of_ranks_checkpoint_through_faults_and_resume_exactly_once(self):
        # The same with a data-parallel job's dozens of ranks: 16 to 48 of
        # them, 4 to 16 resuming. Each client hears about one in that many
        # of the split-done notices, and confirms at its share of a quarter
        # of the bound (512 / 4 / 48 = 2 notices).
        lockstep_through_faults(self, 'dozens of ranks through faults', (16, 49), (4, 17))

    def test_ranks_behind_shuffle_100000_keep_bitmaps_through_a_worker_loss_and_resume_exactly_once(self):
        # User sizes, seeded: 2 or 3 ranks of a named job read 10 to 12
        # million records of an epoch of 16 million behind shuffle(100000)
        # on 6 workers, in lockstep, with max_ledger_runs 200,000; a worker
        # is killed with -9 on the way. The job's fold lags the hand-out by
        # millions of records (the buffers' tails), and each rank holds a
        # scattered share of that stretch: as runs, one a record, a rank
        # passed even the most, 2,097,152, after 9-10 million records
        # (docs/fault-tolerance.md). As bitmaps it stays far below 200,000;
        # the worker loss makes the ranks report their shares (version 3:
        # as runs they pass the bound) and the lost splits go out again
        # without what the ranks had. The dispatcher's --max-exclude-runs is
        # 200,000 too: each rank had about 400,000 scattered records of the
        # lost splits, which as runs passed it, and the report's refusal
        # failed the rank's iterator; as bitmaps they take a few thousand
        # units. The ranks' checkpoints (version 6)
        # merge, 1 to 3 ranks resume from it, and every record comes once.
        seed, rng = seeded('ranks behind shuffle(100000)')
        n, bound, ranks, resumed = 16000000, 200000, rng.randrange(2, 4), rng.randrange(1, 4)
        steps = rng.randrange(10000000, 12000001) // (ranks * 256)
        kill_at, victim = rng.randrange(steps // 4, steps * 3 // 4), rng.randrange(6)
        where = 'seed %d: %d ranks for %d steps, worker %d killed at step %d, %d resumed' % (
            seed, ranks, steps, victim, kill_at, resumed)
        ds = sluice.range(0, n).shuffle(100000, seed=seed % 1000).batch(256)
        c = Cluster(workers=6, dispatcher_args=['--max-exclude-runs', str(bound)])
        got = []
        try:
            c.wait_workers_registered(6)
            its = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='wide', checkpointable=True,
                                 max_ledger_runs=bound) for _ in range(ranks)]
            for k in range(steps):
                if k == kill_at:
                    c.restart_worker(victim)
                for it in its:
                    got.append(next(it)['value'])
            cks = [it.checkpoint() for it in its]
            view = get_json(c.dispatcher.admin_port, '/v1/jobs/%d' % its[0].job_id)
            held = [co.get('ledger_runs') for co in view['consumers']]
            where += ': fold at %s, ranks hold %s runs, checkpoints of %s bytes' % (
                view['lost_splits']['folded_below'], held, [len(k) for k in cks])
            print('ranks behind shuffle(100000): %s' % where, file=sys.stderr)
            self.assertTrue(all(0 < h < bound // 2 for h in held), where)
            self.assertEqual([checkpoint_head(k)[0] for k in cks], [6] * ranks, where)
            for it in its:
                it.close()
            merged = sluice.merge_checkpoints(cks)
            live = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='wide-resumed', checkpoint=merged,
                                  max_ledger_runs=bound) for _ in range(resumed)]
            read_in_turn(live, got)
            assert_each_once(self, got, n, where)
        finally:
            c.close()

    def test_a_checkpoint_of_many_shuffled_workers_restores_within_the_bound_through_a_dispatcher_restart(self):
        # User sizes, seeded: 6 to 8 workers behind shuffle(100000) hold
        # about 100,000 records each in their buffers when an anonymous
        # job's iterator checkpoints 3 to 4 million records of 8 million:
        # the checkpoint's holes, one run of consumed records between two,
        # about 50,000 runs a worker. The dispatcher's --max-exclude-runs is
        # 200,000: as runs it refused the restore ("position set of N runs,
        # more than the limit"); it keeps them as bitmaps where they crowd
        # (docs/fault-tolerance.md). It is killed (-9) and restarted while
        # the restored job reads (its store holds the positions as bitmaps),
        # and every record comes once.
        seed, rng = seeded('a checkpoint of many shuffled workers')
        n, w, bound = 8000000, rng.randrange(6, 9), 200000
        steps, kill_at = rng.randrange(3000000, 4000001) // 256, rng.randrange(10, 4000)
        where = 'seed %d: %d workers, %d batches read, the dispatcher killed at batch %d of the restored job' % (
            seed, w, steps, kill_at)
        ds = sluice.range(0, n).shuffle(100000, seed=seed % 1000).batch(256)
        c = Cluster(workers=w, dispatcher_args=['--max-exclude-runs', str(bound)])
        got = []
        try:
            c.wait_workers_registered(w)
            it = ds.distribute(c.dispatcher.addr, sharding='dynamic', checkpointable=True)
            for _ in range(steps):
                got.append(next(it)['value'])
            ck = it.checkpoint()
            it.close()
            had = np.sort(np.concatenate(got))
            runs = 1 + int(np.count_nonzero(np.diff(had) != 1))
            where += ': %d runs consumed, a checkpoint of %d bytes' % (runs, len(ck))
            print('many shuffled workers: %s' % where, file=sys.stderr)
            self.assertGreater(runs, bound, where + ' (fewer runs than the bound: the test would show nothing)')
            live = ds.distribute(c.dispatcher.addr, sharding='dynamic', checkpoint=ck)
            units = metric(c.dispatcher.admin_port, 'sluice_dispatcher_exclude_runs')
            self.assertTrue(units and 0 < units < bound // 4, '%s: %s units held' % (where, units))
            read_in_turn([live], got, lambda r: r == kill_at and c.restart_dispatcher())
            assert_each_once(self, got, n, where)
        finally:
            bad = c.close()
        self.assertEqual(bad, {}, '%s: daemons exited uncleanly' % where)

    def test_a_dispatcher_that_does_not_start_a_job_at_the_place_is_refused(self):
        # A checkpoint that starts within the epoch (version 5 or 6), restored
        # against a dispatcher whose answer lacks restore_place_taken (an
        # older one, as a proxy that strips the field makes it look): it
        # would start the job at the epoch's start and give the records
        # before the place again, so the restore is refused by name.
        n = 2000000
        ds = sluice.range(0, n).batch(100)
        c = Cluster(workers=2, dispatcher_args=['--split-size', '1000', '--max-split-size', '1000',
                                                '--max-outstanding-splits', '64'])
        proxy = None
        try:
            c.wait_workers_registered(2)
            its = [ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='placed', checkpointable=True)
                   for _ in range(2)]

            def step():
                for it in its:
                    next(it)
            merged, head = read_until_placed(self, c, its, step, n * 9 // 10 // 200, 'a restore at a place')
            for it in its:
                it.close()
            proxy = CutProxy(c.dispatcher.port)
            proxy.rewrite_answers(GET_OR_CREATE_JOB_RESP, lambda msg: without_field(msg, 10))
            with self.assertRaises(sluice.SluiceError) as cm:
                ds.distribute('127.0.0.1:%d' % proxy.port, sharding='dynamic', job_name='placed-older',
                              checkpoint=merged)
            self.assertIn('record %d (within the epoch), and dispatcher 127.0.0.1:%d does not start a job there (it is '
                          'older)' % (head[3], proxy.port), str(cm.exception))
            # Restored anonymously, so refused, the job the restore made
            # ends at once with its only client (before 2026-12-05 its tasks
            # read on for nobody until its gc timeout).
            before = {j['id'] for j in get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs']}
            with self.assertRaises(sluice.SluiceError) as cm:
                ds.distribute('127.0.0.1:%d' % proxy.port, sharding='dynamic', checkpoint=merged)
            self.assertIn('does not start a job there', str(cm.exception))
            made = [j for j in get_json(c.dispatcher.admin_port, '/v1/jobs')['jobs'] if j['id'] not in before]
            self.assertEqual([(j['name'], j['state'], j['num_consumers']) for j in made], [('', 'CANCELLED', 0)])
            # Straight to the dispatcher, the same checkpoint starts there.
            it = ds.distribute(c.dispatcher.addr, sharding='dynamic', job_name='placed-newer', checkpoint=merged)
            first = next(it)['value']
            it.close()
            self.assertGreaterEqual(int(first.min()), head[3])
        finally:
            if proxy:
                proxy.close()
            bad = c.close()
        self.assertEqual(bad, {}, 'daemons exited uncleanly')
