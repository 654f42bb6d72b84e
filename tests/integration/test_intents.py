"""Intents against a real etcd: their events share one lease per process (not one lease of a
day per write), a lease that is gone is granted again, and ``drain`` asks to move what is
placed on the node."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from hafo.model.cluster import Assignment, NodeRecord
from hafo.model.spec import WorkloadSpec
from hafo.store import EtcdStore, EventLog, Keys, codec, intents, read_snapshot
from hafo.store.client import KV

pytestmark = pytest.mark.timeout(60)

SPEC = WorkloadSpec(name="train", command=("python", "train.py"), gpus=1)


def named(name: str) -> WorkloadSpec:
    return dataclasses.replace(SPEC, name=name)


async def event_kvs(store: EtcdStore, keys: Keys) -> list[KV]:
    _revision, kvs = await store.get_prefix(keys.events)
    return kvs


async def add_node(store: EtcdStore, keys: Keys, name: str) -> None:
    await store.put(keys.node(name), codec.encode(NodeRecord(name, {}, ()).to_dict()))


async def test_intent_writes_share_one_event_lease(store: EtcdStore, keys: Keys) -> None:
    await add_node(store, keys, "n1")
    first = (await intents.submit(store, keys, SPEC)).submission
    await intents.submit(store, keys, named("second"))
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
        await intents.submit(other, keys, named("third"))
    finally:
        await other.close()
    assert len({kv.lease for kv in await event_kvs(store, keys)}) == 2


async def test_a_gone_event_lease_is_granted_again(store: EtcdStore, keys: Keys) -> None:
    await intents.submit(store, keys, SPEC)
    [before] = await event_kvs(store, keys)
    await store.revoke_lease(before.lease)  # e.g. etcd restored from an older backup
    assert await event_kvs(store, keys) == []
    await intents.submit(store, keys, named("b"))
    await intents.submit(store, keys, named("c"))
    kvs = await event_kvs(store, keys)
    assert len(kvs) == 2 and len({kv.lease for kv in kvs}) == 1
    assert kvs[0].lease != before.lease and await store.lease_ttl(kvs[0].lease) > 0


async def test_submit_is_declarative_and_names_are_unique(store: EtcdStore, keys: Keys) -> None:
    created = await intents.submit(store, keys, SPEC)
    assert created.change == "created"
    same = await intents.submit(store, keys, SPEC)
    assert (same.change, same.submission.id) == ("unchanged", created.submission.id)
    changed = dataclasses.replace(SPEC, env={"LR": "0.1"})
    updated = await intents.submit(store, keys, changed)
    assert (updated.change, updated.submission.id) == ("updated", created.submission.id)
    assert updated.submission.submitted_at == created.submission.submitted_at
    with pytest.raises(intents.Refused, match=r"spec\.replicas"):
        await intents.submit(store, keys, dataclasses.replace(SPEC, replicas=2))
    # many submits of one new name at once: one workload
    racing = dataclasses.replace(SPEC, name="race")
    results = await asyncio.gather(*(intents.submit(store, keys, racing) for _ in range(8)))
    assert len({r.submission.id for r in results}) == 1
    assert sorted(r.change for r in results).count("created") == 1
    _rev, kvs = await store.get_prefix(keys.workloads)
    assert sum(codec.decode_submission(kv.value).spec.name == "race" for kv in kvs) == 1
    # deleted: the name is free again, for a new workload
    await intents.delete(store, keys, await intents.resolve_ref(store, keys, "race"))
    again = await intents.submit(store, keys, racing)
    assert again.change == "created" and again.submission.id != results[0].submission.id


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
