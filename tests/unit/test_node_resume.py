"""Holding a node again after its lease expired in an etcd stall, keeping its work
(``NodeClaim.resume``), against a controller that moves that work (``apply_action`` with the
node seen down): whichever transaction comes second fails, so the work is never both kept
and moved. On the in-memory store, no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from hafo.agent.claim import NodeClaim
from hafo.agent.lease_record import read_record
from hafo.controller.apply import apply_action
from hafo.decisions.plan import Action, Cause
from hafo.model.cluster import Assignment, Liveness
from hafo.store import Election, EventLog, Keys, LeaseKeeper, Put, codec
from hafo.store.memory import MemoryStore

KEYS = Keys("t")


async def _node(store: MemoryStore, tmp: Path) -> tuple[NodeClaim, list[float], int]:
    """Node n1 registered (claimed at some revision) with the copy of workload w's
    assignment, its lease then expired; returns the claim, the published deadlines and the
    revision its assignments were seen at."""
    published: list[float] = []
    keeper = LeaseKeeper(store, 3, 1.0, 0.5, on_renew=published.append)
    claim = NodeClaim("n1", store, KEYS, keeper, tmp, EventLog(store, KEYS), 1.0,
                      lambda _why: None)
    result = await store.txn([], [Put(KEYS.node_assignment("n1", "w"), b"{}")])
    claim.claimed = 7
    keeper.lost.set()  # as LeaseKeeper.run does on a keepalive answered "expired"
    return claim, published, result.revision


async def _leader(store: MemoryStore) -> Election:
    lease, _ttl = await store.grant_lease(3)
    election = Election(store, KEYS.leader, "ctl")
    assert (await election.try_acquire(lease))[0]
    return election


def _failover() -> Action:
    return Action(kind="place", workload="w", cause=Cause.NODE_DOWN, why="node n1 is down",
                  expected_revision=0,
                  assignment=Assignment(workload="w", phase="placed", node="n2", gpus=(0,)))


def test_resume_keeps_the_registration_and_publishes_only_once_it_holds(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        claim, published, seen = await _node(store, tmp_path)
        assert await claim.resume({"w"}, seen)
        alive = await store.get(KEYS.alive("n1"))
        assert alive is not None
        liveness = Liveness.from_dict(codec.decode(alive.value))
        assert liveness.claimed == 7 and liveness.lease == claim.keeper.lease_id == alive.lease
        assert read_record(tmp_path) is not None and published
        # the controller's failover, decided on a view where n1 was down, now fails
        election = await _leader(store)
        assert await apply_action(election, KEYS, EventLog(store, KEYS), _failover(),
                                  ("n1",), down={"n1"}) is None
        assert await store.get(KEYS.assignment("w")) is None

    asyncio.run(scenario())


def test_no_resume_once_the_work_moved(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        claim, published, seen = await _node(store, tmp_path)
        election = await _leader(store)
        assert await apply_action(election, KEYS, EventLog(store, KEYS), _failover(),
                                  ("n1",), down={"n1"})
        assert await store.get(KEYS.node_assignment("n1", "w")) is None  # moved off n1
        assert not await claim.resume({"w"}, seen)
        assert await store.get(KEYS.alive("n1")) is None and not published

    asyncio.run(scenario())


def test_no_resume_when_the_copy_changed_or_the_name_is_held(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        claim, published, seen = await _node(store, tmp_path)
        await store.put(KEYS.node_assignment("n1", "w"), b'{"restarted": true}')
        assert not await claim.resume({"w"}, seen)
        store2 = MemoryStore()
        claim2, published2, seen2 = await _node(store2, tmp_path / "b")
        other, _ = await store2.grant_lease(3)
        await store2.put(KEYS.alive("n1"), b"{}", lease=other)
        assert not await claim2.resume({"w"}, seen2)
        assert not published and not published2

    asyncio.run(scenario())


def test_a_put_back_answered_after_a_resume_is_not_a_displacement(tmp_path: Path) -> None:
    """The identity watch put the liveness key back with the old lease, and that call
    retried through the stall; meanwhile the node resumed with a new lease. The key held
    by our new lease is ours: no fencing, no claim anew."""
    async def scenario() -> None:
        store = MemoryStore()
        claim, _published, seen = await _node(store, tmp_path)
        old, _ttl = await store.grant_lease(3)
        claim.keeper.lease_id = old
        claim.keeper.lost.clear()
        txn = store.txn

        async def resumed_meanwhile(*args: object, **kwargs: object) -> object:
            store.txn = txn  # type: ignore[method-assign]
            claim.keeper.lost.set()
            assert await claim.resume({"w"}, seen)  # a new lease holds the key now
            return await txn(*args, **kwargs)  # type: ignore[arg-type]

        store.txn = resumed_meanwhile  # type: ignore[method-assign]
        await claim.ensure_alive_key()  # no Displaced
        alive = await store.get(KEYS.alive("n1"))
        assert alive is not None and alive.lease == claim.keeper.lease_id != old

    asyncio.run(scenario())


def test_a_resume_whose_answer_was_lost_is_found_committed_when_retried(tmp_path: Path) -> None:
    """As etcd comes back from a stall, the resume's transaction commits but its answer times
    out; the agent tries again and finds the name held, by the lease it put it with: that is
    its own committed resume, not someone else's hold (fencing the node's work then would
    restart what the stall was meant to leave alone)."""
    async def scenario() -> None:
        store = MemoryStore()
        claim, published, seen = await _node(store, tmp_path)
        txn = store.txn

        async def committed_then_timed_out(*args: object, **kwargs: object) -> object:
            store.txn = txn  # type: ignore[method-assign]
            await txn(*args, **kwargs)  # type: ignore[arg-type]
            raise TimeoutError("the answer was lost")

        store.txn = committed_then_timed_out  # type: ignore[method-assign]
        with contextlib.suppress(TimeoutError):
            await claim.resume({"w"}, seen)
        assert await claim.resume({"w"}, seen)  # the retry
        alive = await store.get(KEYS.alive("n1"))
        assert alive is not None and alive.lease == claim.keeper.lease_id
        assert published
        # a key held by a lease that is not ours is still refused
        store2 = MemoryStore()
        claim2, _published2, seen2 = await _node(store2, tmp_path / "b")
        other, _ = await store2.grant_lease(3)
        await store2.put(KEYS.alive("n1"), b"{}", lease=other)
        assert not await claim2.resume({"w"}, seen2)

    asyncio.run(scenario())
