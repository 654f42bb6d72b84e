"""The one load-watch-resync loop (``hafo.store.watched.WatchedPrefix``) and its three users'
rules: the controller's cache (a deleted liveness key is kept until its lease is confirmed
gone), the agent's assignments (placed, urgent) and the simulated fleet, on a scripted store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest

from hafo.agent.assignments import NodeAssignments
from hafo.model.cluster import Assignment, CheckpointInfo, Liveness
from hafo.sim.fleet import SimFleet
from hafo.store import (
    KV,
    ClusterCache,
    EtcdStore,
    Keys,
    Resync,
    StoreUnavailable,
    WatchEvent,
    codec,
)
from hafo.store.protocol import Store
from hafo.store.watched import WatchedPrefix

from .conftest import make_node, placed, status, submit

KEYS = Keys("c")


class ScriptedStore:
    """``get_prefix`` answers ``kvs`` at ``revision``; each watch yields what is queued on
    ``events`` (an exception is raised, None ends the watch); ``watches`` records the start
    revision of each watch; ``lease_queries`` counts the ``live_leases`` calls."""

    def __init__(self, revision: int = 0, kvs: list[KV] | None = None) -> None:
        self.revision = revision
        self.kvs = kvs or []
        self.events: asyncio.Queue[WatchEvent | Resync | BaseException | None] = asyncio.Queue()
        self.watches: list[int] = []
        self.leases: set[int] = set()
        self.lease_queries = 0

    async def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        return self.revision, [kv for kv in self.kvs if kv.key.startswith(prefix)]

    async def watch_prefix(self, prefix: str,
                           start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        self.watches.append(start_revision)
        while True:
            item = await self.events.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def live_leases(self) -> set[int]:
        self.lease_queries += 1
        return set(self.leases)


def as_store(store: ScriptedStore) -> Store:
    return cast(Store, store)


def kv(key: str, value: bytes, revision: int, lease: int = 0) -> KV:
    return KV(key, value, revision, revision, lease)


def put(key: str, value: bytes, revision: int, lease: int = 0) -> WatchEvent:
    return WatchEvent("put", kv(key, value, revision, lease))


def delete(key: str, revision: int) -> WatchEvent:
    return WatchEvent("delete", KV(key, b"", 0, revision, 0))


def text(kv: KV) -> str:
    if kv.value == b"bad":
        raise ValueError("undecodable")
    return kv.value.decode()


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str | None, str | None]] = []

    def __call__(self, key: str, old: str | None, new: str | None) -> None:
        self.changes.append((key, old, new))


def watched(store: ScriptedStore, recorder: Recorder | None = None) -> WatchedPrefix[str]:
    return WatchedPrefix(as_store(store), "/p/", text, recorder)


async def test_load_reads_the_prefix_and_reports_each_key() -> None:
    store = ScriptedStore(7, [kv("/p/a", b"1", 3), kv("/p/b", b"2", 5), kv("/q/x", b"3", 6)])
    seen = Recorder()
    prefix = watched(store, seen)
    assert await prefix.load() == 7
    assert prefix.values == {"/p/a": "1", "/p/b": "2"} and prefix.revision == 7
    assert seen.changes == [("/p/a", None, "1"), ("/p/b", None, "2")]
    assert prefix.changed.is_set()


async def test_events_put_and_delete_and_advance_the_revision() -> None:
    seen = Recorder()
    prefix = watched(ScriptedStore(), seen)
    prefix.apply(put("/p/a", b"1", 10))
    prefix.apply(put("/p/b", b"2", 10))  # one transaction, two keys: both applied
    prefix.apply(put("/p/a", b"3", 11))
    prefix.apply(delete("/p/b", 12))
    prefix.apply(delete("/p/never", 13))
    assert prefix.values == {"/p/a": "3"} and prefix.revision == 13
    assert seen.changes == [("/p/a", None, "1"), ("/p/b", None, "2"), ("/p/a", "1", "3"),
                            ("/p/b", "2", None), ("/p/never", None, None)]


async def test_a_resync_reports_what_went_and_what_is() -> None:
    seen = Recorder()
    prefix = watched(ScriptedStore(), seen)
    prefix.apply(put("/p/a", b"1", 10))
    prefix.apply(put("/p/b", b"2", 11))
    seen.changes.clear()
    prefix.apply(Resync(20, (kv("/p/b", b"5", 15), kv("/p/c", b"6", 18))))
    assert prefix.values == {"/p/b": "5", "/p/c": "6"} and prefix.revision == 20
    assert seen.changes == [("/p/a", "1", None), ("/p/b", "2", "5"), ("/p/c", None, "6")]


async def test_events_already_read_by_a_load_are_not_applied_again() -> None:
    """A ``load`` while ``follow`` runs (the agent re-registering): older events the watch
    still delivers must not undo it."""
    store = ScriptedStore(20, [kv("/p/a", b"new", 18)])
    prefix = watched(store)
    await prefix.load()
    prefix.apply(put("/p/a", b"old", 12))
    prefix.apply(put("/p/gone", b"x", 15))
    assert prefix.values == {"/p/a": "new"} and prefix.revision == 20
    prefix.apply(put("/p/a", b"newer", 21))
    assert prefix.values == {"/p/a": "newer"} and prefix.revision == 21


async def test_an_undecodable_value_is_skipped_and_the_last_good_one_kept() -> None:
    seen = Recorder()
    prefix = watched(ScriptedStore(), seen)
    prefix.apply(put("/p/a", b"1", 10))
    prefix.apply(put("/p/a", b"bad", 11))
    prefix.apply(put("/p/b", b"bad", 12))
    assert prefix.values == {"/p/a": "1"} and prefix.revision == 12
    assert seen.changes == [("/p/a", None, "1")]


async def test_follow_starts_the_watch_again_after_a_failure_and_ends_with_it() -> None:
    store = ScriptedStore(5)
    prefix = watched(store)
    await prefix.load()
    ticks: list[int] = []
    for item in (put("/p/a", b"1", 6), StoreUnavailable("etcd away"), put("/p/a", b"2", 9),
                 None):
        store.events.put_nowait(item)
    await asyncio.wait_for(prefix.follow(lambda: ticks.append(prefix.revision)), 5)
    assert store.watches == [6, 7]  # from the load, then from the revision reached
    assert ticks == [6, 9] and prefix.values == {"/p/a": "2"}


async def test_follow_does_not_swallow_other_errors() -> None:
    store = ScriptedStore(5)
    store.events.put_nowait(RuntimeError("bug"))
    with pytest.raises(RuntimeError):
        await asyncio.wait_for(watched(store).follow(), 5)


# -- the controller's cache ---------------------------------------------------------------


def alive_kv(node: str, lease: int, revision: int) -> KV:
    return kv(KEYS.alive(node), codec.encode(Liveness(node, lease, 0.0).to_dict()), revision,
              lease)


async def test_cache_keeps_a_deleted_liveness_key_until_its_lease_is_gone() -> None:
    store = ScriptedStore(10, [alive_kv("n1", 101, 3), alive_kv("n2", 102, 4),
                               kv(KEYS.node("n1"), codec.encode(make_node("n1").to_dict()), 2)])
    store.leases = {101, 102}
    cache = ClusterCache(as_store(store), KEYS)
    await cache.load()
    assert set(cache.alive) == {"n1", "n2"} and set(cache.nodes) == {"n1"}
    cache.apply_event(delete(KEYS.alive("n1"), 11))  # deleted by hand
    assert set(cache.alive) == {"n1", "n2"} and set(cache.unconfirmed) == {"n1"}
    cache.apply_event(Resync(12, (alive_kv("n1", 101, 3),)))  # n1 back, n2 and a node gone
    assert set(cache.alive) == {"n1", "n2"} and set(cache.unconfirmed) == {"n2"}
    assert cache.nodes == {} and cache.revision == 12
    confirm = asyncio.create_task(cache.confirm_expiries(interval=0.01))
    try:
        for _ in range(500):  # until the cache has asked etcd about the leases 3 times
            if store.lease_queries >= 3:
                break
            await asyncio.sleep(0.01)
        assert store.lease_queries >= 3
        assert set(cache.alive) == {"n1", "n2"}  # both leases live: nothing moves
        store.leases = {101}
        for _ in range(100):
            await asyncio.sleep(0.01)
            if "n2" not in cache.alive:
                break
        assert set(cache.alive) == {"n1"} and cache.unconfirmed == {}
    finally:
        confirm.cancel()


async def test_cache_a_liveness_key_put_again_is_confirmed_alive() -> None:
    store = ScriptedStore(10, [alive_kv("n1", 101, 3)])
    cache = ClusterCache(as_store(store), KEYS)
    await cache.load()
    cache.apply_event(delete(KEYS.alive("n1"), 11))
    assert cache.unconfirmed.keys() == {"n1"} and "n1" in cache.alive
    cache.apply_event(WatchEvent("put", alive_kv("n1", 103, 12)))
    assert cache.unconfirmed == {} and cache.alive["n1"].lease == 103
    assert cache.snapshot().revision == 12


async def test_cache_keeps_the_newest_checkpoint_past_the_reports() -> None:
    cache = ClusterCache(as_store(ScriptedStore()), KEYS)
    old = CheckpointInfo(step=5, epoch=9, path="/ck/a")
    new = CheckpointInfo(step=2, epoch=12, path="/ck/b")

    def report(node: str, ck: CheckpointInfo, revision: int) -> WatchEvent:
        return put(KEYS.status("w", node), codec.encode(status("w", node, checkpoint=ck)
                                                        .to_dict()), revision)

    cache.apply_event(put(KEYS.workload("w"), codec.encode_submission(submit("w")), 1))
    cache.apply_event(report("a", new, 2))
    cache.apply_event(report("b", old, 3))
    cache.apply_event(delete(KEYS.status("w", "a"), 4))
    snapshot = cache.snapshot()
    assert snapshot.checkpoints["w"] == new and set(snapshot.statuses) == {("w", "b")}
    cache.apply_event(delete(KEYS.workload("w"), 5))
    assert "w" not in cache.snapshot().checkpoints


async def test_cache_reads_every_kind_of_state_key() -> None:
    cache = ClusterCache(as_store(ScriptedStore()), KEYS)
    events: list[tuple[str, bytes]] = [
        (KEYS.leader, b"ctl-1"),
        (KEYS.cordon("n1"), b"{}"),
        (KEYS.assignment("w"), codec.encode(placed("w", "n1").to_dict())),
        (KEYS.controller("ctl-1"), codec.encode({"api": "http://x:1"})),
        (KEYS.move("w"), codec.encode({"workload": "w", "to": None, "reason": "r"})),
        (f"{KEYS.state}unheard-of/x", b"?"),
    ]
    for revision, (key, value) in enumerate(events, start=1):
        cache.apply_event(put(key, value, revision))
    snapshot = cache.snapshot()
    assert snapshot.leader == "ctl-1" and snapshot.cordoned == {"n1"}
    assert snapshot.assignments["w"].epoch == 3 and set(snapshot.moves) == {"w"}
    assert snapshot.controllers == ("ctl-1",)
    for revision, (key, _value) in enumerate(events, start=10):
        cache.apply_event(delete(key, revision))
    snapshot = cache.snapshot()
    assert snapshot.leader is None and not snapshot.cordoned and not snapshot.assignments
    assert not snapshot.moves and not snapshot.controllers


# -- the agent's assignments and the simulated fleet --------------------------------------


def copy(node: str, assignment: Assignment, revision: int) -> WatchEvent:
    return put(KEYS.node_assignment(node, assignment.workload),
               codec.encode(assignment.to_dict()), revision)


async def test_node_assignments_placed_and_urgent() -> None:
    mine = NodeAssignments(as_store(ScriptedStore()), KEYS, "n1")
    mine.copies.apply(copy("n1", placed("w1", "n1"), 5))
    mine.copies.apply(copy("n1", placed("w2", "n1"), 6))
    assert set(mine.placed) == {"w1", "w2"} and mine.placed["w1"].epoch == 5
    assert mine.changed.is_set() and mine.revision == 6
    stop = Assignment(workload="w2", phase="moving", node="n1", epoch=7, stopping=6,
                      urgent=True)
    mine.copies.apply(copy("n1", stop, 7))
    assert set(mine.placed) == {"w1"} and mine.urgent == {"w2": 6}
    mine.copies.apply(delete(KEYS.node_assignment("n1", "w2"), 8))
    mine.copies.apply(Resync(9, ()))
    assert mine.placed == {} and mine.urgent == {}


async def test_node_assignments_say_when_the_node_becomes_a_suspect() -> None:
    """A hang or straggler blamed on this node (``Assignment.suspects``): its agent runs its
    health checks at once, once per blame."""
    mine = NodeAssignments(as_store(ScriptedStore()), KEYS, "n1")
    told: list[str] = []
    mine.on_suspect = told.append
    mine.copies.apply(copy("n1", placed("w1", "n1"), 5))
    stop = Assignment(workload="w1", phase="moving", node="n1", epoch=6, stopping=5,
                      urgent=True, cause="hung", suspects={"n1": 900.0, "n2": 800.0})
    mine.copies.apply(copy("n1", stop, 6))
    assert told == ["w1"]
    again = Assignment(workload="w1", phase="placed", node="n1", epoch=7,
                       suspects={"n1": 900.0})
    mine.copies.apply(copy("n1", again, 7))
    assert told == ["w1"], "the same blame, placed again: not anew"
    other = Assignment(workload="w2", phase="moving", node="n1", epoch=8, stopping=4,
                       suspects={"n2": 950.0})
    mine.copies.apply(copy("n1", other, 8))
    assert told == ["w1"], "another node blamed"


async def test_sim_fleet_follows_every_nodes_copies() -> None:
    fleet = SimFleet(cast(EtcdStore, ScriptedStore()), KEYS, 3, gpus_per_node=2, prefix="s")
    first, second = sorted(fleet.nodes)[:2]
    fleet.copies.apply(copy(first, placed("w1", first), 5))
    fleet.copies.apply(copy(second, placed("w2", second), 6))
    fleet.copies.apply(copy("unknown-node", placed("w3", "unknown-node"), 7))
    assert set(fleet.nodes[first].desired) == {"w1"} and fleet.placed_on == {
        "w1": first, "w2": second}
    assert fleet._dirty == {first, second}
    fleet._dirty.clear()
    fleet.copies.apply(Resync(10, (kv(KEYS.node_assignment(second, "w2"),
                                      codec.encode(placed("w2", second).to_dict()), 6),)))
    assert fleet.nodes[first].desired == {} and set(fleet.nodes[second].desired) == {"w2"}
    assert first in fleet._dirty


async def test_a_load_older_than_what_the_watch_applied_is_dropped() -> None:
    store = ScriptedStore(20, [kv("/p/a", b"old", 18)])
    prefix = watched(store)
    prefix.apply(put("/p/a", b"new", 21))  # the watch got ahead of a slow read
    prefix.changed.clear()
    assert await prefix.load() == 20
    assert prefix.values == {"/p/a": "new"} and prefix.revision == 21
    assert prefix.changed.is_set()
