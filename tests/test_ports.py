import socket

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
