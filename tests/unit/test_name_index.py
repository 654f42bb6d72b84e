"""The name index (``hafo.store.name_index``): workloads without their name key get it, the
index key is written only when every name is held by one workload, a submit of a new name
then reads no workload but by its key, and a restore or a recovery takes the index away (on
the in-memory store)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hafo.decisions.recovery import RecoveryPlan
from hafo.model.cluster import Submission
from hafo.model.spec import WorkloadSpec
from hafo.store import codec, intents
from hafo.store.backup import restore_backup, take_backup
from hafo.store.keys import Keys
from hafo.store.memory import MemoryStore
from hafo.store.name_index import ensure_name_index, is_indexed, named_workloads
from hafo.store.recovery import write_recovery

KEYS = Keys("unit")


def spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(name=name, command=("python", "train.py"), gpus=1)


async def unkeyed(store: MemoryStore, name: str, wid: str, at: float) -> Submission:
    """A workload written without its name key (as from before names were unique)."""
    submission = Submission(id=wid, spec=spec(name), submitted_at=at)
    await store.put(KEYS.workload(wid), codec.encode_submission(submission))
    return submission


@contextmanager
def prefix_reads(store: MemoryStore) -> Iterator[list[str]]:
    """The prefixes ``store.get_prefix`` is asked for meanwhile."""
    seen: list[str] = []
    original = store.get_prefix

    async def spy(prefix: str) -> Any:
        seen.append(prefix)
        return await original(prefix)

    store.get_prefix = spy  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        store.get_prefix = original  # type: ignore[method-assign]


async def test_a_fresh_cluster_is_indexed_at_once() -> None:
    store = MemoryStore()
    result = await ensure_name_index(store, KEYS)
    assert (result.written, result.complete) == (0, True)
    assert await is_indexed(store, KEYS)
    again = await ensure_name_index(store, KEYS)  # one read, nothing written
    assert (again.written, again.complete) == (0, True)


async def test_unkeyed_workloads_get_their_name_keys_and_submits_stop_scanning() -> None:
    store = MemoryStore()
    await unkeyed(store, "old", "old-aaaaaa", 1.0)
    created = await intents.submit(store, KEYS, spec("new"))  # before the index: a scan
    with prefix_reads(store) as seen:
        await intents.submit(store, KEYS, spec("another"))
    assert KEYS.workloads in seen
    result = await ensure_name_index(store, KEYS)
    assert (result.written, result.complete) == (1, True)
    name_kv = await store.get(KEYS.name("old"))
    assert name_kv is not None and name_kv.value == b"old-aaaaaa"
    with prefix_reads(store) as seen:
        third = await intents.submit(store, KEYS, spec("third"))
        same = await intents.submit(store, KEYS, spec("old"))
    assert KEYS.workloads not in seen
    assert third.change == "created"
    assert same.change == "unchanged" and same.submission.id == "old-aaaaaa"
    assert (await intents.submit(store, KEYS, spec("new"))).submission.id == \
        created.submission.id


async def test_a_name_two_workloads_share_keeps_the_scan_and_the_oldest() -> None:
    store = MemoryStore()
    await unkeyed(store, "twin", "twin-bbbbbb", 2.0)
    await unkeyed(store, "twin", "twin-aaaaaa", 1.0)
    await unkeyed(store, "single", "single-cccccc", 1.0)
    result = await ensure_name_index(store, KEYS)
    assert (result.written, result.complete, result.shared) == (1, False, ("twin",))
    assert not await is_indexed(store, KEYS)
    assert await store.get(KEYS.name("twin")) is None
    found = await intents.submit(store, KEYS, spec("twin"))
    assert (found.change, found.submission.id) == ("unchanged", "twin-aaaaaa")
    await intents.delete(store, KEYS, "twin-aaaaaa")
    await intents.delete(store, KEYS, "twin-bbbbbb")
    assert (await ensure_name_index(store, KEYS)).complete


async def test_a_name_key_of_a_workload_gone_moves_to_the_one_that_holds_the_name() -> None:
    store = MemoryStore()
    await store.put(KEYS.name("moved"), b"moved-gone00")
    await unkeyed(store, "moved", "moved-aaaaaa", 1.0)
    result = await ensure_name_index(store, KEYS)
    assert (result.written, result.complete) == (1, True)
    name_kv = await store.get(KEYS.name("moved"))
    assert name_kv is not None and name_kv.value == b"moved-aaaaaa"


@pytest.mark.parametrize("value", [b"not json", b"[1]", b'{"id": 3}', b'{"spec": {"name": 1}}'])
async def test_a_value_that_is_no_workload_record_is_passed_over(value: bytes) -> None:
    assert named_workloads([(KEYS.workload("x"), value)]) == {}
    store = MemoryStore()
    await store.put(KEYS.workload("x"), value)
    assert (await ensure_name_index(store, KEYS)).complete


async def test_replicas_are_not_named_workloads() -> None:
    store = MemoryStore()
    service = await intents.submit(store, KEYS, WorkloadSpec(
        name="web", command=("python", "serve.py"), replicas=2))
    replica = Submission(id=f"{service.submission.id}.0", spec=service.submission.spec,
                         submitted_at=1.0, service=service.submission.id)
    await store.put(KEYS.workload(replica.id), codec.encode_submission(replica))
    result = await ensure_name_index(store, KEYS)
    assert (result.written, result.complete) == (0, True)


async def test_a_restore_and_a_recovery_take_the_index_away() -> None:
    store = MemoryStore()
    await intents.submit(store, KEYS, spec("kept"))
    assert (await ensure_name_index(store, KEYS)).complete
    backup = await take_backup(store, KEYS)
    assert KEYS.names_indexed not in backup.keys  # a backup keeps no name keys either
    await restore_backup(store, KEYS, backup, replace=True)
    assert not await is_indexed(store, KEYS)
    assert (await ensure_name_index(store, KEYS)).complete
    plan = RecoveryPlan(cluster_id=None, generations=(), epoch_base=0, workloads=(),
                        services=(), names={}, nodes=(), dropped=())
    await write_recovery(store, KEYS, plan)
    assert not await is_indexed(store, KEYS)
