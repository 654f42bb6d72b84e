"""Intents against a real etcd: their events share one lease per process (not one lease of a
day per write), a lease that is gone is granted again, and ``drain`` asks to move what is
placed on the node."""

from __future__ import annotations

import pytest

from hafo.model.cluster import Assignment, NodeRecord
from hafo.model.spec import WorkloadSpec
from hafo.store import EtcdStore, EventLog, Keys, codec, intents, read_snapshot
from hafo.store.client import KV

pytestmark = pytest.mark.timeout(60)

SPEC = WorkloadSpec(name="train", command=("python", "train.py"), gpus=1)


async def event_kvs(store: EtcdStore, keys: Keys) -> list[KV]:
    _revision, kvs = await store.get_prefix(keys.events)
    return kvs


async def add_node(store: EtcdStore, keys: Keys, name: str) -> None:
    await store.put(keys.node(name), codec.encode(NodeRecord(name, {}, ()).to_dict()))


async def test_intent_writes_share_one_event_lease(store: EtcdStore, keys: Keys) -> None:
    await add_node(store, keys, "n1")
    first = await intents.submit(store, keys, SPEC)
    await intents.submit(store, keys, SPEC)
    await intents.set_cordon(store, keys, "n1", True)
    await intents.set_cordon(store, keys, "n1", False)
    await intents.delete(store, keys, first.id)
    kvs = await event_kvs(store, keys)
    leases = {kv.lease for kv in kvs}
    assert len(kvs) == 5 and len(leases) == 1 and 0 not in leases
    lease = leases.pop()
    assert await store.lease_ttl(lease) > 86400 - 60  # the events are kept about a day
    assert await EventLog(store, keys).lease() == lease  # any log of this process shares it
    other = EtcdStore([f"http://{store.endpoint}"])
    try:  # another client (another process) has a lease of its own
        await intents.submit(other, keys, SPEC)
    finally:
        await other.close()
    assert len({kv.lease for kv in await event_kvs(store, keys)}) == 2


async def test_a_gone_event_lease_is_granted_again(store: EtcdStore, keys: Keys) -> None:
    await intents.submit(store, keys, SPEC)
    [before] = await event_kvs(store, keys)
    await store.revoke_lease(before.lease)  # e.g. etcd restored from an older backup
    assert await event_kvs(store, keys) == []
    await intents.submit(store, keys, SPEC)
    await intents.submit(store, keys, SPEC)
    kvs = await event_kvs(store, keys)
    assert len(kvs) == 2 and len({kv.lease for kv in kvs}) == 1
    assert kvs[0].lease != before.lease and await store.lease_ttl(kvs[0].lease) > 0


async def test_drain_asks_to_move_what_is_placed_there(store: EtcdStore, keys: Keys) -> None:
    await add_node(store, keys, "n1")
    await add_node(store, keys, "n2")
    for assignment in (Assignment("w1", "placed", "n1", (0,)),
                       Assignment("w2", "placed", "n2", (0,)),
                       Assignment("w3", "moving", "n1", (1,), stopping=3),
                       Assignment("w4", "placed", "n1", (2,))):
        await store.put(keys.assignment(assignment.workload),
                        codec.encode(assignment.to_dict()))
    assert await intents.drain(store, keys, "n1") == ["w1", "w4"]
    snapshot = await read_snapshot(store, keys)
    assert "n1" in snapshot.cordoned
    assert {w: m.reason for w, m in snapshot.moves.items()} == {"w1": "drain n1",
                                                                "w4": "drain n1"}
