"""LeaseKeeper timing against a stub of the two store calls it makes (no etcd semantics are
imitated: the stub only says how long a keepalive takes and what the members answer)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from hafo.store.lease import LeaseKeeper

HEARTBEAT, TTL, MARGIN = 0.4, 2, 0.3


class StallingStore:
    """Keepalives take ``stall`` seconds (then time out, or answer TTL); the members say
    they have no leader when ``leaderless``."""

    def __init__(self, stall: float, leaderless: bool, answers: bool = False) -> None:
        self.stall, self.leaderless, self.answers = stall, leaderless, answers
        self.asked_at: list[float] = []

    async def keepalive(self, lease_id: int, timeout: float) -> int:
        await asyncio.sleep(min(self.stall, timeout))
        if self.stall >= timeout and not self.answers:
            raise TimeoutError
        return TTL

    async def keepalive_any(self, lease_id: int, timeout: float) -> int:
        return await self.keepalive(lease_id, timeout)

    async def warm_spares(self, lease_id: int, timeout: float) -> None:
        return None

    async def leaderless_majority(self, timeout: float = 0.5) -> bool:
        self.asked_at.append(time.monotonic())
        return self.leaderless


def keeper(store: Any) -> LeaseKeeper:
    lease = LeaseKeeper(store, ttl=TTL, heartbeat=HEARTBEAT, margin=MARGIN)
    lease.lease_id, lease.granted_ttl = 1, TTL
    lease.deadline = time.monotonic() + TTL - MARGIN
    return lease


@pytest.mark.parametrize(("stall", "leaderless", "asked", "extended"), [
    (0.0, True, False, False),    # a quick answer: nobody is asked
    (1.0, True, True, True),      # stalled by an election: proof gathered during the stall
    (1.0, False, True, False),    # stalled, but etcd has a leader: no extension
])
async def test_a_slow_keepalive_gathers_leaderless_proof_while_it_waits(
        stall: float, leaderless: bool, asked: bool, extended: bool) -> None:
    store = StallingStore(stall, leaderless)
    lease = keeper(store)
    started, before = time.monotonic(), lease.deadline
    ok = await lease._keepalive_gathering_proof()
    assert ok is (stall == 0.0)
    assert bool(store.asked_at) is asked
    if asked:  # asked after half a heartbeat, well before the keepalive's timeout
        assert HEARTBEAT / 2 - 0.05 <= store.asked_at[0] - started < HEARTBEAT - 0.05
    if extended:
        assert lease.deadline >= store.asked_at[0] + TTL - MARGIN - 0.01
    elif not ok:
        assert lease.deadline == before


async def test_a_slow_but_answered_keepalive_renews_from_its_send_time() -> None:
    store = StallingStore(stall=HEARTBEAT, leaderless=False, answers=True)
    lease = keeper(store)
    started = time.monotonic()
    assert await lease._keepalive_gathering_proof()
    assert started + TTL - MARGIN - 0.01 <= lease.deadline <= started + TTL - MARGIN + 0.05


class DeadEndpointStore(StallingStore):
    """Keepalives through the endpoint in use time out (its machine is off); one through
    every endpoint at once answers when ``others_answer``."""

    def __init__(self, others_answer: bool) -> None:
        super().__init__(stall=10.0, leaderless=False)
        self.others_answer = others_answer
        self.hedged_at: list[float] = []

    async def keepalive_any(self, lease_id: int, timeout: float) -> int:
        self.hedged_at.append(time.monotonic())
        if self.others_answer:
            return TTL
        await asyncio.sleep(timeout)
        raise TimeoutError


async def test_the_retry_after_a_failed_keepalive_goes_through_every_endpoint() -> None:
    store = DeadEndpointStore(others_answer=True)
    lease = keeper(store)
    task = asyncio.ensure_future(lease.run())
    try:
        await asyncio.sleep(HEARTBEAT * 2.5)
        assert store.hedged_at, "no keepalive through every endpoint after a failure"
        assert lease.valid()
    finally:
        task.cancel()


async def test_keepalives_through_every_endpoint_at_most_once_a_heartbeat() -> None:
    store = DeadEndpointStore(others_answer=False)
    lease = keeper(store)
    lease.deadline = time.monotonic() + 60  # not fenced meanwhile: only the pace is tested
    task = asyncio.ensure_future(lease.run())
    try:
        await asyncio.sleep(HEARTBEAT * 6)
    finally:
        task.cancel()
    gaps = [b - a for a, b in zip(store.hedged_at, store.hedged_at[1:], strict=False)]
    assert store.hedged_at and all(gap >= HEARTBEAT - 0.05 for gap in gaps), gaps


async def test_a_lease_declared_lost_ends_the_keeper_at_once() -> None:
    """Another request learnt that etcd no longer has the lease: ``run`` raises LeaseLost
    then, not at the next keepalive a heartbeat later."""
    from hafo.store.lease import LeaseLost

    store = StallingStore(stall=0.0, leaderless=False)
    lease = keeper(store)
    task = asyncio.ensure_future(lease.run())
    await asyncio.sleep(HEARTBEAT / 4)  # just after the first keepalive
    declared = time.monotonic()
    lease.declare_lost(2, "is gone")  # about another lease: nothing
    await asyncio.sleep(HEARTBEAT / 4)
    assert not task.done()
    declared = time.monotonic()
    lease.declare_lost(1, "is gone")
    with pytest.raises(LeaseLost, match="lease 1 is gone"):
        await asyncio.wait_for(task, HEARTBEAT)
    assert time.monotonic() - declared < HEARTBEAT / 4
    assert not lease.valid()
