"""The store client logs etcd endpoint changes once per change of state, never once per retry.

Fake per-endpoint clients (no etcd, no sockets) stand in for aetcd: an endpoint is dead (every
call fails with a connection error) or alive (calls answer). The log lines are captured with
structlog's ``LogCapture`` at info level and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import MutableMapping
from typing import Any

import pytest
from aetcd import exceptions as etcd_errors
from structlog.testing import LogCapture

from hafo.store import TRANSIENT, EtcdStore

pytestmark = pytest.mark.timeout(30)

A, B, C = "http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://10.0.0.3:2379"
ENDPOINT_EVENTS = ("etcd endpoint failover", "etcd unreachable", "etcd reachable again")


class FakeClient:
    """An aetcd client for one endpoint: answers while its endpoint is alive."""

    def __init__(self, alive: set[str], endpoint: str) -> None:
        self.alive = alive
        self.endpoint = endpoint

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _check(self) -> None:
        if self.endpoint not in self.alive:
            raise etcd_errors.ConnectionFailedError(f"{self.endpoint}: connection refused")

    async def get(self, _key: bytes) -> None:
        self._check()
        return None

    async def refresh_lease(self, _lease: int) -> Any:
        self._check()
        return type("Reply", (), {"TTL": 5})()


class FakeStore(EtcdStore):
    """An EtcdStore whose endpoints are the fake clients; ``alive`` says which answer."""

    def __init__(self, endpoints: list[str], alive: set[str]) -> None:
        super().__init__(endpoints, timeout=0.2, retry_budget=0.05)
        self.alive = alive

    def _new_client(self, host: str, port: int, timeout: float) -> Any:
        return FakeClient(self.alive, f"{host}:{port}")


def endpoint_lines(capture: LogCapture) -> list[MutableMapping[str, Any]]:
    return [e for e in capture.entries if str(e["event"]).startswith(ENDPOINT_EVENTS)]


async def requests(store: EtcdStore, count: int) -> int:
    """Make ``count`` reads; returns how many failed (each retried within the budget; a
    read whose budget ran out raises the last transient error, as callers expect: a
    connect's timeout too, when a loaded machine spends the budget on one endpoint)."""
    failed = 0
    for _ in range(count):
        try:
            await store.get("/hafo/x")
        except TRANSIENT:
            failed += 1
    return failed


def summary(lines: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    """(level, event) of each endpoint line."""
    return [(e["log_level"], str(e["event"])) for e in lines]


@pytest.mark.parametrize(("endpoints", "alive", "expected"), [
    # every endpoint dead: the move to the next, then one warning, then silence
    ([A, B], set(), [("info", "etcd endpoint failover"),
                     ("warning", "etcd unreachable: no endpoint answers")]),
    ([A, B, C], set(), [("info", "etcd endpoint failover"), ("info", "etcd endpoint failover"),
                        ("warning", "etcd unreachable: no endpoint answers")]),
    # one endpoint only: never "failover" to itself, one warning
    ([A], set(), [("warning", "etcd unreachable: no endpoint answers")]),
    # the first of two dead: one line, the move, however many requests
    ([A, B], {"10.0.0.2:2379"}, [("info", "etcd endpoint failover")]),
    # the first alive: nothing to say
    ([A, B], {"10.0.0.1:2379"}, []),
])
async def test_lines_per_state_change_not_per_retry(
        capture: LogCapture, endpoints: list[str], alive: set[str],
        expected: list[tuple[str, str]]) -> None:
    store = FakeStore(endpoints, alive)
    try:
        failed = await requests(store, 8)
    finally:
        await store.close()
    assert failed == (8 if not alive else 0)
    lines = endpoint_lines(capture)
    assert summary(lines) == expected
    for line in lines:
        assert line.get("failed") != line.get("next"), f"failed == next: {line}"


async def test_the_move_names_both_endpoints(capture: LogCapture) -> None:
    store = FakeStore([A, B], {"10.0.0.2:2379"})
    try:
        await requests(store, 20)
    finally:
        await store.close()
    (line,) = endpoint_lines(capture)
    assert line["failed"] == "10.0.0.1:2379" and line["next"] == "10.0.0.2:2379"
    assert line["error"] == "ConnectionFailedError"


async def test_outage_then_recovery_then_outage(capture: LogCapture) -> None:
    alive: set[str] = set()
    store = FakeStore([A, B], alive)
    try:
        await requests(store, 5)
        alive.add("10.0.0.2:2379")
        await requests(store, 5)
        await requests(store, 5)  # answered: nothing more
        alive.clear()
        await requests(store, 5)
    finally:
        await store.close()
    lines = endpoint_lines(capture)
    assert summary(lines) == [
        ("info", "etcd endpoint failover"),
        ("warning", "etcd unreachable: no endpoint answers"),
        ("info", "etcd reachable again"),
        ("info", "etcd endpoint failover"),
        ("warning", "etcd unreachable: no endpoint answers"),
    ]
    assert lines[2]["endpoint"] == "10.0.0.2:2379" and lines[2]["unreachable_for"] >= 0
    assert lines[1]["endpoints"] == "10.0.0.1:2379,10.0.0.2:2379"


async def test_keepalives_on_a_dead_endpoint_warn_once(capture: LogCapture) -> None:
    alive: set[str] = set()
    store = FakeStore([A], alive)
    try:
        for _ in range(10):
            with pytest.raises(etcd_errors.ConnectionFailedError):
                await store.keepalive(1, 0.1)
        alive.add("10.0.0.1:2379")
        assert await store.keepalive(1, 0.1) == 5
        assert await store.keepalive(1, 0.1) == 5
    finally:
        await store.close()
    assert summary(endpoint_lines(capture)) == [
        ("warning", "etcd unreachable: no endpoint answers"),
        ("info", "etcd reachable again"),
    ]


class AuthenticatingClient(FakeClient):
    """A client of an etcd with authentication: connecting is an Authenticate call, which a
    powered-off member never answers (aetcd's own timeout ends it)."""

    async def connect(self) -> None:
        if self.endpoint not in self.alive:
            raise etcd_errors.ConnectionTimeoutError(f"{self.endpoint}: authenticate timed out")


class AuthenticatingStore(FakeStore):
    def _new_client(self, host: str, port: int, timeout: float) -> Any:
        return AuthenticatingClient(self.alive, f"{host}:{port}")


async def test_a_connect_that_fails_moves_to_the_next_endpoint(capture: LogCapture) -> None:
    """A store whose current endpoint is a dead machine must not retry it forever: with
    credentials the failure comes from connecting, before any call."""
    store = AuthenticatingStore([A, B, C], {"10.0.0.3:2379"})
    try:
        failed = await requests(store, 4)
    finally:
        await store.close()
    assert failed < 4, "never left the dead endpoints"
    assert store.endpoint == "10.0.0.3:2379"
    assert summary(endpoint_lines(capture))[:2] == [("info", "etcd endpoint failover"),
                                                    ("info", "etcd endpoint failover")]


class HangingConnectClient(FakeClient):
    """Connecting to a powered-off member with credentials: the Authenticate call hangs."""

    async def connect(self) -> None:
        if self.endpoint not in self.alive:
            await asyncio.sleep(3600)


class HangingConnectStore(FakeStore):
    def __init__(self, endpoints: list[str], alive: set[str]) -> None:
        super().__init__(endpoints, alive)
        self.timeout = 2.0  # a daemon's: far longer than a keepalive's

    def _new_client(self, host: str, port: int, timeout: float) -> Any:
        return HangingConnectClient(self.alive, f"{host}:{port}")


async def test_a_keepalive_never_waits_past_its_timeout_for_a_connect() -> None:
    """A keepalive through the current endpoint returns (fails) within its own timeout while
    the connect to a dead member hangs, and one through every endpoint answers within its
    timeout although another caller holds the connection lock connecting to the dead one."""
    store = HangingConnectStore([A, B], {"10.0.0.2:2379"})
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(TimeoutError):
            await store.keepalive(7, timeout=0.3)
        assert loop.time() - started < 0.6
        blocker = asyncio.ensure_future(store.get("/hafo/x"))  # connects to A, holding the lock
        await asyncio.sleep(0.05)
        started = loop.time()
        assert await store.keepalive_any(7, timeout=0.5) == 5
        assert loop.time() - started < 0.6
        with contextlib.suppress(asyncio.CancelledError, *TRANSIENT):
            await asyncio.wait_for(blocker, 0.5)
        await asyncio.sleep(0.05)  # the move to the endpoint that answered, in the background
        assert blocker.done()  # the connect to the dead member was abandoned for it
        assert store.endpoint == "10.0.0.2:2379"
        assert await store.keepalive(7, timeout=0.3) == 5
    finally:
        await store.close()


class SlowFailingClient(HangingConnectClient):
    """A member that stopped answering: a call fails after ``delay`` (a connect hangs)."""

    delay = 0.2

    async def refresh_lease(self, _lease: int) -> Any:
        if self.endpoint not in self.alive:
            await asyncio.sleep(self.delay)
        return await super().refresh_lease(_lease)

    async def get(self, _key: bytes) -> None:
        self._check()
        return None


class SlowFailingStore(HangingConnectStore):
    def _new_client(self, host: str, port: int, timeout: float) -> Any:
        return SlowFailingClient(self.alive, f"{host}:{port}")


async def test_a_failed_keepalive_does_not_wait_for_another_caller_s_connect() -> None:
    """A keepalive in flight when its connection fails returns (fails) within its own
    timeout, although another caller already rotated away from that connection and holds
    the connection lock connecting to a member that does not answer (as etcd comes back from
    a stall): the rotation it would do is in the background. Waiting for the lock let the
    failsafe's deadline pass and fenced work in the all-members etcd stall test."""
    alive = {"10.0.0.1:2379"}
    store = SlowFailingStore([A, B], alive)
    loop = asyncio.get_running_loop()
    try:
        await store.get("/hafo/x")  # connected to A
        alive.clear()  # every member stops answering
        keepalive = asyncio.ensure_future(store.keepalive(7, timeout=0.5))
        await asyncio.sleep(0.05)
        started = loop.time()
        blocker = asyncio.ensure_future(store.get("/hafo/x"))  # fails on A, connects to B
        await asyncio.sleep(0.05)
        assert store._lock.locked()  # the connect to B holds it
        with pytest.raises(TRANSIENT):
            await keepalive
        assert loop.time() - started < 0.4
        blocker.cancel()
        with contextlib.suppress(asyncio.CancelledError, *TRANSIENT):
            await blocker
    finally:
        await store.close()
