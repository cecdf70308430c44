"""Protocol violations at a real dispatcher, and a worker's shared-memory
fields broken by a client, over a raw socket: each one is answered with an
ERROR frame of request id 0 naming it, and then the connection closes
(docs/protocol.md, "Limits": "On a violation ...")."""
import os
import re
import socket
import struct
import unittest

from cutproxy import varint
from harness import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
SL_EPROTO = -5001
ROLE_CLIENT = 1
ROLE_WORKER = 2
ROLE_DISPATCHER = 3


def protocol_version():
    """SL_PROTOCOL_VERSION from protocol/frame.h: the handshake must carry it."""
    with open(os.path.join(HERE, '..', '..', 'protocol', 'frame.h')) as f:
        return int(re.search(r'#define SL_PROTOCOL_VERSION (\d+)', f.read()).group(1))


HELLO_LEN = 44  # SL_HANDSHAKE_LEN


def hello(role, flags=0, nonce=bytes(32)):
    """A hello (protocol/frame.h): magic, version, role, flags, nonce."""
    return b'SLUC' + struct.pack('>HHI', protocol_version(), role, flags) + nonce


def decode_error(msg):
    """(code, message) of an encoded sluice.Error."""
    code, text, i = 0, '', 0
    while i < len(msg):
        key, i = varint(msg, i)
        if key == (1 << 3) | 0:
            v, i = varint(msg, i)
            code = v - (1 << 64) if v >= 1 << 63 else v
        elif key == (2 << 3) | 2:
            n, i = varint(msg, i)
            text = msg[i:i + n].decode()
            i += n
        else:
            raise AssertionError('unexpected field key %d in an Error' % key)
    return code, text


def frame(msg_type, request_id=7, msg=b'', payload=b''):
    return struct.pack('>HHIII', msg_type, 0, request_id, len(msg), len(payload)) + msg + payload


class RawClient(unittest.TestCase):
    """A cluster of `workers` workers for the class, spoken to as a client
    over raw sockets."""
    workers = 0

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(workers=cls.workers)

    @classmethod
    def tearDownClass(cls):
        bad = cls.c.close()
        if bad:
            raise AssertionError('daemons did not shut down cleanly: %r' % bad)

    def exchange(self, data, port=None, role=ROLE_DISPATCHER):
        """Handshakes as a client, sends data, and reads until the dispatcher
        (or the daemon at port, of role) closes: (the frames after its
        handshake as (type, request_id, message) tuples, whether it closed)."""
        s = socket.create_connection(('127.0.0.1', port or self.c.dispatcher.port), timeout=10)
        try:
            s.sendall(hello(ROLE_CLIENT) + data)
            got = b''
            closed = False
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        closed = True
                        break
                    got += chunk
            except socket.timeout:
                pass
        finally:
            s.close()
        self.assertEqual(got[:8], hello(role)[:8], 'no handshake: %r' % got[:64])
        frames, i = [], HELLO_LEN
        while i + 16 <= len(got):
            t, flags, rid, mlen, plen = struct.unpack('>HHIII', got[i:i + 16])
            frames.append((t, rid, got[i + 16:i + 16 + mlen]))
            i += 16 + mlen + plen
        self.assertEqual(i, len(got), 'a part-frame at the end: %r' % got[-32:])
        return frames, closed

    def assert_refused(self, data, code, text, **at):
        frames, closed = self.exchange(data, **at)
        self.assertTrue(closed, 'the dispatcher kept the connection open')
        self.assertTrue(frames, 'the dispatcher closed without an error frame')
        t, rid, msg = frames[-1]
        self.assertEqual((t, rid), (1, 0), 'the last frame is not an ERROR of request id 0: %r' % (frames,))
        got_code, got_text = decode_error(msg)
        self.assertEqual(got_code, code, got_text)
        self.assertIn(text, got_text)


class ViolationsAtTheDispatcher(RawClient):

    def test_types_it_does_not_serve_get_an_error_frame(self):
        # A client's request that only workers serve, and frames no client
        # may send at all (the role table of protocol/frame.c).
        for msg_type, text in ((18, 'a dispatcher does not serve GET_ELEMENT_REQ'),
                               (19, 'a client may not send GET_ELEMENT_RESP'),
                               (3, 'a client may not send WORKER_REGISTER_RESP'),
                               (4, 'a client may not send WORKER_HEARTBEAT_REQ'),
                               (8, 'a client may not send GET_SPLIT_REQ')):
            with self.subTest(type=msg_type):
                self.assert_refused(frame(msg_type), SL_EPROTO, text)

    def test_after_a_request_in_the_same_read(self):
        # The release is answered (an error: no client secret) and that answer
        # waits for the commit; the violation behind it must still be told.
        release = bytes([0x08, 0x01, 0x10, 0x01])  # job_id 1, client_id 1
        self.assert_refused(frame(16, 1, release) + frame(18, 2), SL_EPROTO,
                            'a dispatcher does not serve GET_ELEMENT_REQ')

    def test_a_bad_header_gets_an_error_frame(self):
        self.assert_refused(frame(200), SL_EPROTO, 'unknown message type 200')
        self.assert_refused(struct.pack('>HHIII', 16, 1, 9, 0, 0), SL_EPROTO, 'unknown flags')

    def test_the_dispatcher_serves_on(self):
        self.assert_refused(frame(19), SL_EPROTO, 'GET_ELEMENT_RESP')  # no client may send it
        # A request on a new connection is answered, and that connection stays.
        s = socket.create_connection(('127.0.0.1', self.c.dispatcher.port), timeout=10)
        try:
            s.sendall(hello(ROLE_CLIENT) + frame(16, 5, bytes([0x08, 0x01, 0x10, 0x01])))
            got = b''
            h = HELLO_LEN
            while len(got) < h + 16 or len(got) < h + 16 + struct.unpack('>I', got[h + 8:h + 12])[0]:
                chunk = s.recv(65536)
                self.assertTrue(chunk, 'the dispatcher closed a good connection')
                got += chunk
        finally:
            s.close()
        t, _, rid, mlen, _ = struct.unpack('>HHIII', got[h:h + 16])
        self.assertEqual((t, rid), (1, 5))
        self.assertEqual(decode_error(got[h + 16:h + 16 + mlen])[0], -5014)  # SL_EPERM: not the client's secret


class SharedMemoryClaimsAtAWorker(RawClient):
    """A client's claims about a worker's shared memory (docs/protocol.md,
    "Shared memory") are checked: it cannot say it mapped a region it did
    not collect, nor give back slots it was not lent."""
    workers = 1

    def assert_worker_refuses(self, msg, text):
        w = self.c.workers[0]
        self.assert_refused(frame(18, 3, msg), SL_EPROTO, text, port=w.port, role=ROLE_WORKER)

    def test_a_region_it_did_not_collect(self):
        # task_id 1; shm_mapped (tag 13) without asking for a region
        self.assert_worker_refuses(bytes([0x08, 0x01, 0x68, 0x01]),
                                   'shm_mapped: no shared-memory region was collected on this connection')
        # shm (tag 12) asks for one, and the next request says it mapped it before collecting it
        self.assert_worker_refuses(bytes([0x08, 0x01, 0x60, 0x01, 0x68, 0x01]),
                                   'shm_mapped: no shared-memory region was collected on this connection')

    def test_slots_it_was_not_lent(self):
        # shm_released (tag 14) without a region, and with one that lent nothing
        self.assert_worker_refuses(bytes([0x08, 0x01, 0x70, 0x05]),
                                   'shm_released: no shared-memory region on this connection')
        self.assert_worker_refuses(bytes([0x08, 0x01, 0x60, 0x01, 0x70, 0x05]),
                                   'shm_released 5: 0 slots of shared memory were lent on this connection')


if __name__ == '__main__':
    unittest.main()
