"""LeaseKeeper on the in-memory store, in virtual time: renewals, outages, lease loss, the
leaderless and failsafe extensions. Exact times, no sleeps."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from hafo.store.lease import LeaseKeeper, LeaseLost
from hafo.store.memory import MemoryStore

from .virtual_time import run

TTL, HEARTBEAT, MARGIN = 3, 1.0, 0.5


def keeper(store: MemoryStore, failsafe: bool | None = None) -> LeaseKeeper:
    async def confirm(_timeout: float) -> float | None:
        return TTL - MARGIN if failsafe else None  # every controller promised, or not

    return LeaseKeeper(store, TTL, HEARTBEAT, MARGIN,
                       failsafe=confirm if failsafe is not None else None)


async def watch_validity(lease: LeaseKeeper, until: float, step: float = 0.05) -> list[float]:
    """The virtual times (every ``step``) at which the lease was not valid."""
    loop = asyncio.get_running_loop()
    invalid = []
    while loop.time() < until:
        if not lease.valid():
            invalid.append(round(loop.time(), 2))
        await asyncio.sleep(step)
    return invalid


def test_a_kept_lease_never_lapses_and_renews_every_heartbeat() -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store)
        lease_id = await lease.grant()
        task = asyncio.create_task(lease.run())
        invalid = await watch_validity(lease, 600.0)
        assert invalid == []
        assert await store.lease_ttl(lease_id) >= TTL - 1
        deadline_left = lease.deadline - asyncio.get_running_loop().time()
        assert TTL - MARGIN - HEARTBEAT <= deadline_left <= TTL - MARGIN
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert 590 <= store.calls <= 620  # one keepalive a heartbeat (plus the watcher's)

    run(main)


@pytest.mark.parametrize(("outage", "lapses"), [(1.2, False), (4.0, True)])
def test_an_outage_shorter_than_the_deadline_keeps_the_lease_valid(outage: float,
                                                                   lapses: bool) -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store)
        await lease.grant()
        task = asyncio.create_task(lease.run())
        loop = asyncio.get_running_loop()
        await asyncio.sleep(5.0)
        store.outage()
        began = loop.time()
        invalid = await watch_validity(lease, began + outage)
        store.restore()  # a restarted etcd gives every lease its TTL again
        invalid += await watch_validity(lease, began + outage + 3.0)
        assert bool(invalid) is lapses
        if lapses:  # invalid from the deadline (2.5 s after the last ack at most) to the end
            assert began + TTL - MARGIN - HEARTBEAT - 0.1 <= invalid[0] <= began + TTL - MARGIN
            assert invalid[-1] < began + outage + 0.2  # valid again once etcd answers
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(main)


def test_a_lease_that_expired_raises_lease_lost() -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store)
        lease_id = await lease.grant()
        task = asyncio.create_task(lease.run())
        await asyncio.sleep(2.0)
        store.cut_off()  # etcd runs on: the lease expires meanwhile
        await asyncio.sleep(TTL + 1.0)
        store.restore()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(task, 5.0)
        assert lease.lost.is_set() and not lease.valid()
        assert lease_id not in await store.live_leases()

    run(main)


def test_a_revoked_lease_is_lost_at_the_next_heartbeat() -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store)
        lease_id = await lease.grant()
        task = asyncio.create_task(lease.run())
        await asyncio.sleep(1.5)
        await store.revoke_lease(lease_id)
        revoked = asyncio.get_running_loop().time()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(task, 5.0)
        assert asyncio.get_running_loop().time() - revoked <= HEARTBEAT + 0.01

    run(main)


@pytest.mark.parametrize(("leaderless", "extended"), [(True, True), (False, False)])
def test_a_stalled_keepalive_asks_the_members_and_extends_only_without_a_leader(
        leaderless: bool, extended: bool) -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store)
        await lease.grant()
        loop = asyncio.get_running_loop()
        store.leaderless = leaderless
        store.slow["keepalive"] = 10.0  # an election stalls every write
        before = lease.deadline
        asked = loop.time()
        ok = await lease._keepalive_gathering_proof()
        assert ok is False
        assert loop.time() - asked == pytest.approx(HEARTBEAT)  # the keepalive's timeout
        if extended:  # proof from half a heartbeat in: that time + TTL - margin
            assert lease.deadline == pytest.approx(asked + HEARTBEAT / 2 + TTL - MARGIN)
        else:
            assert lease.deadline == before

    run(main)


@pytest.mark.parametrize(("confirmed", "lapses"), [(True, False), (False, True)])
def test_failsafe_confirmation_carries_the_lease_through_a_total_outage(
        confirmed: bool, lapses: bool) -> None:
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store, failsafe=confirmed)
        await lease.grant()
        task = asyncio.create_task(lease.run())
        await asyncio.sleep(3.0)
        store.outage()  # etcd gone for 30 s: the controllers say so too (or not)
        began = asyncio.get_running_loop().time()
        invalid = await watch_validity(lease, began + 30.0)
        store.restore()
        invalid += await watch_validity(lease, began + 33.0)
        assert bool(invalid) is lapses
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(main)


def test_a_keepalive_that_outlasts_its_timeout_does_not_hold_back_the_failsafe() -> None:
    """As etcd comes back from a stall, keepalives were answered 3 to 4 s after they were
    sent although their timeout was 1 s (and the members' status answers may be as late).
    The keeper stops waiting at the timeout, so its failsafe questions go on and the
    controllers' promises keep the lease valid."""
    async def main() -> None:
        store = MemoryStore()
        lease = keeper(store, failsafe=True)
        await lease.grant()
        real = store.keepalive

        async def unheeding(lease_id: int, timeout: float) -> int:
            try:
                return await real(lease_id, timeout)
            except BaseException:  # a cancellation or timeout that takes 4 s to end
                await asyncio.shield(asyncio.sleep(4.0))
                raise

        real_status = store.leaderless_majority

        async def unheeding_members(timeout: float = 0.5) -> bool:
            if store.available:
                return await real_status(timeout=timeout)
            # etcd is down: no member answers, and the question takes 4 s to give up
            await asyncio.shield(asyncio.sleep(timeout + 4.0))
            return False

        store.keepalive = unheeding  # type: ignore[method-assign]
        store.keepalive_any = unheeding  # type: ignore[method-assign]
        store.leaderless_majority = unheeding_members  # type: ignore[method-assign]
        task = asyncio.create_task(lease.run())
        await asyncio.sleep(3.0)
        store.outage()
        began = asyncio.get_running_loop().time()
        invalid = await watch_validity(lease, began + 20.0)
        store.restore()
        invalid += await watch_validity(lease, began + 25.0)
        assert invalid == []
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(main)
