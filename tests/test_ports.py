import re
import socket
from pathlib import Path

import pytest

import ports


def test_a_free_port_is_outside_the_kernel_s_ephemeral_range_and_binds() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        low, high = (int(part) for part in ranges.read().split())
    port = ports.free_port()
    assert port in ports.PICKED and not low <= port <= high
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def test_a_port_a_server_listens_on_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.free_port()))
        server.listen()
        held = server.getsockname()[1]
        choices = iter([held, held, ports.free_port()])
        monkeypatch.setattr(ports.random, "choice", lambda _: next(choices))
        port = ports.free_port()
        assert port != held and next(choices, None) is None


def test_a_port_a_server_holds_on_another_address_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kubelet of the local cluster listens on the pod bridge's gateway, not on loopback; a rank 0
    # told that port would fail to bind every address (EADDRINUSE).
    with socket.socket() as server:
        server.bind(("127.0.0.2", ports.free_port()))
        server.listen()
        held = server.getsockname()[1]
        choices = iter([held, ports.free_port()])
        monkeypatch.setattr(ports.random, "choice", lambda _: next(choices))
        assert ports.free_port() != held and next(choices, None) is None


def test_the_local_clusters_ports_are_never_picked() -> None:
    cluster = Path(__file__).parents[1] / "localcluster"
    defaults = re.findall(r"PORT=\$\{DDP_\w+:-(\d+)\}", "".join(p.read_text() for p in cluster.glob("*.sh")))
    assert defaults and not {int(port) for port in defaults} & set(ports.PICKED)
