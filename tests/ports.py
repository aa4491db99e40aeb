"""Loopback ports for servers a test starts, or tells a process to start, after it picks the port.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the range outgoing connections
take theirs from too: between the probe's close and the server's bind, one of the many connections the
suite makes (S3, the API server, the ranks') can take it (EADDRINUSE). A port below that range and below
the NodePort range is never taken that way; only another picker can choose it, one time in eight thousand,
and the probe's bind turns down one already in use.

The local clusters' own servers (localcluster/*.sh, the second cluster of test_local_cluster.py) sit at
20000-21999, some on the pod bridge's gateway rather than loopback: the picker stays above them, and the
probe binds every address, as torch's TCPStore does, so a server on any of them turns the port down.
"""

from __future__ import annotations

import random
import socket

PICKED = range(22000, 30000)


def free_port() -> int:
    for _ in range(100):
        port = random.choice(PICKED)
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {PICKED.start}-{PICKED.stop - 1} after 100 tries")
