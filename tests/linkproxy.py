"""A TCP proxy on loopback that cuts, slows and counts connections: the network, in tests."""

from __future__ import annotations

import socket
import threading
import time


class LinkProxy:
    """A TCP proxy on loopback in front of a server (S3, the API server), standing in for the network: it
    breaks its first `cuts` connections after `cut_after` response bytes (a body cut mid-stream), paces
    each response to `rate` bytes/s (one slow connection), breaks every open connection when told
    (`cut_open`), closes new ones at once while `refusing` (the server down), and counts the ranged
    GETs it forwards and the most connections delivering responses at once."""

    def __init__(self, upstream: str, cuts: int = 0, cut_after: int = 0, rate: float = 0,
                 host: str = "127.0.0.1") -> None:
        """host: where it listens (the pod bridge's address, for pods to reach it through)."""
        host, port = upstream.rsplit("//", 1)[1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.cuts, self.cut_after, self.rate = cuts, cut_after, rate
        self.cut_done = self.ranged_requests = self.open_responses = self.most_connections_at_once = 0
        self.lock = threading.Lock()
        self.open: set[socket.socket] = set()
        self.refusing, self.refused = False, 0  # while refusing, each new connection is closed at once
        self.listener = socket.create_server((host, 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                if self.refusing:
                    self.refused += 1
                    _break(client)
                    continue
                cut = self.cut_done < self.cuts
                self.cut_done += cut
            server = socket.create_connection(self.upstream)
            with self.lock:
                self.open |= {client, server}
            threading.Thread(target=self._pipe, args=(client, server, None, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.cut_after if cut else None, False),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, limit: int | None, requests: bool) -> None:
        sent, started, counted = 0, time.monotonic(), False
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                if not requests and not counted:
                    counted = True
                    with self.lock:
                        self.open_responses += 1
                        self.most_connections_at_once = max(self.most_connections_at_once, self.open_responses)
                if requests:
                    with self.lock:
                        self.ranged_requests += data.lower().count(b"\r\nrange: bytes=")
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
                if self.rate and not requests:
                    time.sleep(max(0.0, started + sent / self.rate - time.monotonic()))
        except OSError:
            pass
        if counted:
            with self.lock:
                self.open_responses -= 1
        for sock in (src, dst):
            _break(sock)
            with self.lock:
                self.open.discard(sock)

    def cut_open(self) -> int:
        """Breaks every connection open now (a network blip); new ones go through. Returns how many."""
        with self.lock:
            cut, self.open = list(self.open), set()
        for sock in cut:
            _break(sock)
        return len(cut)

    def down(self) -> None:
        """The server out of reach: the connections open now are broken and new ones refused."""
        self.refusing = True
        self.cut_open()

    def close(self) -> None:
        self.listener.close()
        self.cut_open()


def _break(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
