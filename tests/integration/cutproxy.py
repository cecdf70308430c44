"""A TCP proxy on loopback whose connections the test can break in the middle
of an answer: cut() throws away what the upstream side sent next (bytes the
daemon counted as sent, that never arrive) and resets both sockets, as a
dropped route or a rebooted middlebox would. New connections are forwarded
again at once. Bounded: every wait has a timeout, and close() ends every
thread."""
import select
import socket
import struct
import threading
import time


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
        self.dropped = []        # bytes thrown away by each cut
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
            try:
                u = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(c)
                continue
            pair = [c, u, threading.Event(), threading.Event()]
            with self.lock:
                self.pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

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

    def _pump(self, pair):
        c, u, cut, done = pair
        try:
            while not self.closed:
                if cut.is_set():
                    self.dropped.append(self._throw_away_next(c, u))
                    break
                r, _, _ = select.select([c, u], [], [], 0.1)
                for src, dst in ((c, u), (u, c)):
                    if src in r:
                        data = src.recv(1 << 16)
                        if not data:
                            raise OSError('closed')
                        dst.sendall(data)
        except OSError:
            pass
        finally:
            _reset(c)
            _reset(u)
            with self.lock:
                if pair in self.pairs:
                    self.pairs.remove(pair)
            done.set()

    def cut(self, timeout=10):
        """Breaks every open connection, throwing away the next bytes the
        upstream side sends on it; returns the bytes thrown away."""
        with self.lock:
            pairs = list(self.pairs)
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
