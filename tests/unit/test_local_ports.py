"""Ports for local servers come from below the kernel's ephemeral range and the agents'
default ``node.ports``, never twice, and from disjoint slices for pytest-xdist workers."""

from __future__ import annotations

import socket

import pytest

from hafo.local.procs import (
    LOWEST_PORT,
    NODE_PORTS_FIRST,
    _ephemeral_low,
    _worker_slice,
    free_port,
)


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= p < _ephemeral_low() for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_free_ports_stay_below_the_agents_default_node_ports() -> None:
    """Agents hand a replica's port 0 out of ``node.ports`` (30000-32767 by default)."""
    assert all(p < NODE_PORTS_FIRST for p in (free_port() for _ in range(200)))


def test_xdist_workers_hand_out_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(_worker_slice(20000, 29999))
        low, high = slices[-1]
        assert all(low <= free_port() <= high for _ in range(50))
    assert slices[0][1] < slices[1][0] and slices[1][1] < slices[2][0]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "master")  # not a worker: the whole range
    assert _worker_slice(20000, 29999) == (20000, 29999)
