"""A TCP proxy on loopback whose connections the test can break in the middle
of an answer: cut() throws away what the upstream side sent next (bytes the
daemon counted as sent, that never arrive) and resets both sockets, as a
dropped route or a rebooted middlebox would. cut(half_open=True) resets the
client's side only and leaves the upstream side open and unread until
close(): the daemon does not learn that the connection is gone (a route
that died where only one end noticed), and what it sends on it goes
nowhere. New connections are forwarded again at once, unless refuse() made
the proxy reset them as they come, until accept_again(). drop_frames(t)
throws away the client's frames of type t (frame.h's sl_msg_type) on the
connections opened after it, until drop_frames(None): a request lost on
the way, while the rest of the connection goes on. rewrite_answers(t, fn)
passes the message of each upstream frame of type t, on the connections
opened after it, through fn (an older daemon's answer, without a field).
hold_after_first() makes the connections opened after it
deliver the upstream side's hello and first frame (the answer to the first
request) and hold back the rest until release(), as a slow or congested
route would; hold_connections_from(n) makes the n-th connection and those
after it deliver the hello only. Bounded: every wait has a timeout, and close() ends every
thread."""
import select
import socket
import struct
import threading
import time

HELLO_LEN = 44         # frame.h: SL_HANDSHAKE_LEN
FRAME_HEADER_LEN = 16  # frame.h: SL_FRAME_HEADER_LEN


def varint(buf, i):
    """(value, index past it) of the protobuf varint at buf[i]."""
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7f) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def without_field(msg, number):
    """A protobuf message's bytes without the fields of that number (for
    rewrite_answers(): an older daemon's answer)."""
    out, at = b'', 0
    while at < len(msg):
        tag, body = varint(msg, at)
        wire = tag & 7
        if wire == 0:
            _, end = varint(msg, body)
        elif wire == 2:
            size, start = varint(msg, body)
            end = start + size
        else:
            end = body + (8 if wire == 1 else 4)
        if tag >> 3 != number:
            out += msg[at:end]
        at = end
    return out


def _reset(sock):
    """Closes sock with an RST (SO_LINGER 0), as a broken connection ends."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class CutProxy:
    def __init__(self, target_port, target_host='127.0.0.1'):
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(('127.0.0.1', 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs = []          # [client socket, upstream socket, cut requested Event, cut done Event]
        self.half_open = False   # cut(): the upstream sockets stay open (in stale) until close()
        self.throw_wait = 5.0    # cut(): how long to wait for the upstream bytes to throw away
        self.refusing = False    # refuse(): new connections are reset at once
        self.drop_type = None    # drop_frames(): the client's frames of this type are thrown away
        self.frames_dropped = 0
        self.rewrite = None      # rewrite_answers(): (frame type, fn of its message bytes)
        self.stale = []
        self.dropped = []        # bytes thrown away by each cut
        self.hold_new = False    # hold_after_first(): new connections hold after the first bytes
        self.hold_from = 0       # hold_connections_from(): the first connection that holds after its hello
        self.accepted = 0
        self.released = threading.Event()
        self.held = threading.Event()  # a connection holds bytes back
        self.closed = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.closed:
            r, _, _ = select.select([self.listener], [], [], 0.2)
            if not r:
                continue
            try:
                c, _ = self.listener.accept()
            except OSError:
                continue
            if self.refusing:
                _reset(c)
                continue
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(c)
                continue
            pair = [c, u, threading.Event(), threading.Event()]
            with self.lock:
                self.pairs.append(pair)
                self.accepted += 1
                hello_only = 0 < self.hold_from <= self.accepted
                hold = self.hold_new or hello_only
            threading.Thread(target=self._pump, args=(pair, hold, 0 if hello_only else 1, self.drop_type is not None,
                                                      self.rewrite), daemon=True).start()

    @staticmethod
    def _throw_away_next(c, u, wait=5.0):
        """The bytes of what upstream u sends next, thrown away: an answer in
        flight, or the answer to a request the client c sends meanwhile (its
        requests still go through: with none in flight, a client whose
        answers were all delivered asks again once it has read them). 0 when
        nothing came within wait seconds or upstream closed."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            r, _, _ = select.select([c, u], [], [], 0.1)
            if u in r:
                try:
                    return len(u.recv(1 << 20))
                except OSError:
                    return 0
            if c in r:
                data = c.recv(1 << 16)
                if not data:
                    return 0
                u.sendall(data)
        return 0

    @staticmethod
    def _first_frame_end(data, frames=1):
        """Where the hello (44 bytes, no token) and the first frame after it
        (none: frames 0) end in the upstream bytes data, or None while data
        ends before (frame.h: a 16-byte header, msg_len and payload_len at 8
        and 12)."""
        if frames == 0:
            return HELLO_LEN if len(data) >= HELLO_LEN else None
        if len(data) < HELLO_LEN + FRAME_HEADER_LEN:
            return None
        msg_len, payload_len = struct.unpack_from('>II', data, HELLO_LEN + 8)
        end = HELLO_LEN + FRAME_HEADER_LEN + msg_len + payload_len
        return end if len(data) >= end else None

    @staticmethod
    def _frames(pending, data, each):
        """What of one side's bytes goes on: the hello, then what each(type,
        frame) returns for each whole frame (pending[0]: the bytes of a frame
        not yet whole, or of the hello; pending[1]: hello bytes seen)."""
        buf, out = pending[0] + data, b''
        if pending[1] < HELLO_LEN:
            take = min(len(buf), HELLO_LEN - pending[1])
            out, buf = buf[:take], buf[take:]
            pending[1] += take
        while len(buf) >= FRAME_HEADER_LEN:
            ftype, = struct.unpack_from('>H', buf, 0)
            msg_len, payload_len = struct.unpack_from('>II', buf, 8)
            end = FRAME_HEADER_LEN + msg_len + payload_len
            if len(buf) < end:
                break
            out += each(ftype, buf[:end])
            buf = buf[end:]
        pending[0] = buf
        return out

    def _client_frame(self, ftype, frame):
        """A client's frame, or nothing for one of type drop_type."""
        if self.drop_type is not None and ftype == self.drop_type:
            with self.lock:
                self.frames_dropped += 1
            return b''
        return frame

    @staticmethod
    def _rewritten(rewrite, ftype, frame):
        """An upstream frame, its message through rewrite's fn if of its type."""
        if ftype != rewrite[0]:
            return frame
        msg_len, payload_len = struct.unpack_from('>II', frame, 8)
        msg = rewrite[1](frame[FRAME_HEADER_LEN:FRAME_HEADER_LEN + msg_len])
        return (frame[:8] + struct.pack('>II', len(msg), payload_len) + msg +
                frame[FRAME_HEADER_LEN + msg_len:])

    def _pump(self, pair, hold=False, frames=1, parse=False, rewrite=None):
        c, u, cut, done = pair
        pending = [b'', 0]  # parse: the client's bytes of a frame not yet whole, hello bytes seen
        upstream = [b'', 0]  # rewrite: the same of the upstream bytes
        seen = b''     # hold: the upstream bytes until the end of the first frame
        passed = not hold
        kept = b''     # upstream bytes past it, held back until release()
        try:
            while not self.closed:
                if cut.is_set():
                    self.dropped.append(self._throw_away_next(c, u, self.throw_wait))
                    break
                if passed and kept and self.released.is_set():
                    c.sendall(kept)
                    kept = b''
                holding = bool(kept) or (hold and passed and not self.released.is_set())
                if holding:
                    self.held.set()
                r, _, _ = select.select([c] if holding else [c, u], [], [], 0.1)
                for src, dst in ((c, u), (u, c)):
                    if src in r:
                        data = src.recv(1 << 16)
                        if not data:
                            raise OSError('closed')
                        if src is c and parse:
                            data = self._frames(pending, data, self._client_frame)
                            if not data:
                                continue
                        if src is u and rewrite:
                            data = self._frames(upstream, data, lambda t, f: self._rewritten(rewrite, t, f))
                            if not data:
                                continue
                        if src is u and not passed:
                            # Up to the first frame's end goes through as it
                            # comes (the hello first: the client waits for it).
                            start = len(seen)
                            seen += data
                            end = self._first_frame_end(seen, frames)
                            if end is not None:
                                data, kept, passed = data[:end - start], data[end - start:], True
                        dst.sendall(data)
        except OSError:
            pass
        finally:
            _reset(c)
            with self.lock:
                if cut.is_set() and self.half_open and not self.closed:
                    self.stale.append(u)
                else:
                    _reset(u)
                if pair in self.pairs:
                    self.pairs.remove(pair)
            done.set()

    def hold_after_first(self):
        """Connections opened from now on deliver the upstream side's first
        read, then hold back what it sends until release() (the client's
        side still goes through)."""
        self.released.clear()
        self.held.clear()
        with self.lock:
            self.hold_new = True

    def hold_connections_from(self, n):
        """The n-th connection the proxy accepts (counting from 1) and every
        later one deliver the upstream side's hello, then hold back what it
        sends until release() (the client's side still goes through)."""
        self.released.clear()
        self.held.clear()
        with self.lock:
            self.hold_from = n

    def drop_frames(self, frame_type):
        """The client's frames of frame_type, on connections opened from
        now on, are thrown away (None: none)."""
        self.drop_type = frame_type

    def rewrite_answers(self, frame_type, fn):
        """The message of each upstream frame of frame_type, on connections
        opened from now on, becomes fn(message bytes)."""
        self.rewrite = (frame_type, fn)

    def refuse(self):
        """New connections are reset as they come (a host that cannot be
        reached for a while), until accept_again()."""
        self.refusing = True

    def accept_again(self):
        self.refusing = False

    def release(self):
        """What held connections held back goes through, and new ones no
        longer hold."""
        with self.lock:
            self.hold_new = False
            self.hold_from = 0
        self.released.set()

    def cut(self, timeout=10, half_open=False, wait=5.0):
        """Breaks every open connection, throwing away the next bytes the
        upstream side sends on it within wait seconds; returns the bytes
        thrown away. With half_open, the upstream side stays open (see
        above)."""
        with self.lock:
            pairs = list(self.pairs)
            self.half_open = half_open
            self.throw_wait = wait
        n = len(self.dropped)
        for p in pairs:
            p[2].set()
        for p in pairs:
            p[3].wait(timeout)
        return sum(self.dropped[n:])

    def close(self):
        self.closed = True
        self.thread.join(timeout=5)
        self.listener.close()
        with self.lock:
            pairs = list(self.pairs)
        for p in pairs:
            p[3].wait(5)
        with self.lock:
            stale, self.stale = self.stale, []
        for u in stale:
            _reset(u)


def worker_behind(cluster, hold=False, extra=()):
    """A worker added to cluster (with the options extra) that reaches its
    dispatcher through a new CutProxy: (the worker, the proxy). With hold,
    the proxy delivers the registration's answer and holds what the
    dispatcher sends after it (its notices and heartbeat answers) until
    release()."""
    proxy = CutProxy(cluster.dispatcher.port)
    if hold:
        proxy.hold_after_first()
    try:
        return cluster.add_worker(['--dispatcher', '127.0.0.1:%d' % proxy.port] + list(extra)), proxy
    except BaseException:
        proxy.close()
        raise
