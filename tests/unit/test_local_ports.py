"""Ports for local servers come from below the kernel's ephemeral range, never twice."""

from __future__ import annotations

import socket

from hafo.local.procs import LOWEST_PORT, _ephemeral_low, free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= p < _ephemeral_low() for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))
