"""A standby controller after an operator's restore (``Election.forget``): its watch of the
leader key waited from a revision of the lost store, which the accepted one reaches late, so
it never saw the new leader go and never took over."""

from __future__ import annotations

import asyncio

from hafo.store.election import Election
from hafo.store.memory import MemoryStore

KEY = "/hafo/c/leader"


async def _standby_after_a_restore(forget: bool) -> bool:
    """Whether the standby leads within a second once the new leader resigned."""
    store = MemoryStore()
    lease_a, _ = await store.grant_lease(30)
    lease_b, _ = await store.grant_lease(30)
    a, b = Election(store, KEY, "a"), Election(store, KEY, "b")
    for i in range(50):  # a history with revisions the new store reaches late
        await store.put(f"/hafo/c/s/x{i}", b"{}")
    await a.campaign(lambda: lease_a)
    standby = asyncio.ensure_future(b.campaign(lambda: lease_b))
    await asyncio.sleep(0.05)
    assert not standby.done(), "b stands by"
    store.lose_data()  # etcd emptied; the operator restores; the leases are granted anew
    lease_a, _ = await store.grant_lease(30)
    lease_b, _ = await store.grant_lease(30)
    a.token = None
    await a.campaign(lambda: lease_a)  # a leads in the accepted store
    if forget:
        b.forget()  # what the controller does on an operator's accept
    await asyncio.sleep(0.05)
    await a.resign()
    try:
        await asyncio.wait_for(asyncio.shield(standby), 1.0)
    except TimeoutError:
        standby.cancel()
        await asyncio.gather(standby, return_exceptions=True)
        return False
    return b.token is not None


async def test_a_standby_looks_again_in_the_accepted_store() -> None:
    assert await _standby_after_a_restore(forget=True)


async def test_without_it_the_standby_misses_the_new_leader_s_end() -> None:
    assert not await _standby_after_a_restore(forget=False)
