"""Loopback ports for servers a test starts, or tells a process to start, after it picks the port.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the range outgoing connections
take theirs from too: between the probe's close and the server's bind, one of the many connections the
suite makes (S3, the API server, the ranks') can take it (EADDRINUSE). A port below that range and below
the NodePort range is never taken that way; only another picker can choose it, one time in ten thousand,
and the probe's bind turns down one already in use.
"""

from __future__ import annotations

import random
import socket

PICKED = range(20000, 30000)


def free_port(host: str = "127.0.0.1") -> int:
    for _ in range(100):
        port = random.choice(PICKED)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} in {PICKED.start}-{PICKED.stop - 1} after 100 tries")
