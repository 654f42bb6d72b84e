"""How many endpoint lines the store client logs against real sockets: closed ports (nothing
listens, every connection is refused) and a real etcd. One line per change of state, however
many requests and retries (an agent once logged ``etcd endpoint failover`` 344 times in 40 s,
each with ``failed == next``)."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

import pytest
from structlog.testing import LogCapture

from hafo.local.etcd import EtcdCluster
from hafo.local.procs import free_port
from hafo.store import TRANSIENT, EtcdStore, Keys

pytestmark = pytest.mark.timeout(60)

ENDPOINT_EVENTS = ("etcd endpoint failover", "etcd unreachable", "etcd reachable again")


def endpoint_lines(capture: LogCapture) -> list[MutableMapping[str, Any]]:
    return [e for e in capture.entries if str(e["event"]).startswith(ENDPOINT_EVENTS)]


async def test_every_endpoint_dead_for_5_s_logs_at_most_3_lines(capture: LogCapture) -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    store = EtcdStore(dead, timeout=0.5, retry_budget=1.0)
    attempts = 0
    failures = 0

    def count(_seconds: float, error: BaseException | None) -> None:
        nonlocal attempts
        attempts += 1

    store.observer = count
    deadline = time.monotonic() + 5.0
    try:
        while time.monotonic() < deadline:
            try:
                await store.get("/hafo/x")
            except TRANSIENT:
                failures += 1
    finally:
        await store.close()
    lines = endpoint_lines(capture)
    print(f"{attempts} attempts in {failures} failed requests over 5 s: {len(lines)} lines")
    assert failures >= 3 and attempts >= 10, "the client did not retry"
    assert 1 <= len(lines) <= 3, lines
    assert [e["log_level"] for e in lines][-1] == "warning"
    assert all(e.get("failed") != e.get("next") for e in lines), lines


async def test_one_of_two_endpoints_dead_logs_the_move_once(
        etcd_server: EtcdCluster, keys: Keys, capture: LogCapture) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = EtcdStore([f"http://{dead}", *etcd_server.endpoints], timeout=1.0)
    try:
        for i in range(50):
            await store.put(keys.node(f"n{i % 5}"), b"x")
            await store.get(keys.node(f"n{i % 5}"))
    finally:
        await store.close()
    (line,) = endpoint_lines(capture)
    assert line["event"] == "etcd endpoint failover" and line["log_level"] == "info"
    assert line["failed"] == dead and line["next"] == store.endpoint
