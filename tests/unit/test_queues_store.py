"""Queues in the store: their keys in the snapshot (a bad value skipped), the intents that
declare and delete them, submit's refusal of an undeclared queue, a queue-only change that
restarts nothing, and backups that carry them (on the in-memory store)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from structlog.testing import capture_logs

from hafo.model.cluster import Assignment, Submission
from hafo.model.queues import QueueSpec
from hafo.model.spec import WorkloadSpec
from hafo.store import codec, intents
from hafo.store.backup import take_backup
from hafo.store.keys import Keys
from hafo.store.memory import MemoryStore
from hafo.store.state import read_snapshot

KEYS = Keys("unit")
TEAM_A = QueueSpec(name="team-a", gpus=8, cohort="research", borrowing_limit=4)
TEAM_B = QueueSpec(name="team-b", gpus=4, cohort="research", lending_limit=2, weight=2.0)


def spec(name: str = "train", queue: str = "default", **kwargs: Any) -> WorkloadSpec:
    return WorkloadSpec(name=name, command=("python", "train.py"), gpus=1, queue=queue,
                        **kwargs)


async def kinds_of_events(store: MemoryStore) -> list[str]:
    _, kvs = await store.get_prefix(KEYS.events)
    return [codec.decode_event(kv.value).kind for kv in kvs]


# -- the snapshot ---------------------------------------------------------------------------

async def test_the_snapshot_holds_the_declared_queues() -> None:
    store = MemoryStore()
    assert (await read_snapshot(store, KEYS)).queues == {}
    for queue in (TEAM_A, TEAM_B):
        await store.put(KEYS.queue(queue.name), codec.encode_queue(queue))
    assert dict((await read_snapshot(store, KEYS)).queues) == {"team-a": TEAM_A,
                                                              "team-b": TEAM_B}


@pytest.mark.parametrize("value", [
    b"not json", b"[1]", b'{"name": "bad", "gpus": 1}',  # the key names another queue
    b'{"name": "bad-one", "gpus": -1}',
    b'{"name": "bad-one", "cohort": "c"}',  # a cohort needs a quota
    b'{"name": "bad-one", "gpus": 1, "lending_limit": 1}',  # a limit needs a cohort
])
async def test_a_value_that_is_no_queue_is_skipped_with_a_warning(value: bytes) -> None:
    store = MemoryStore()
    await store.put(KEYS.queue("team-a"), codec.encode_queue(TEAM_A))
    await store.put(KEYS.queue("bad-one"), value)
    with capture_logs() as logs:
        snapshot = await read_snapshot(store, KEYS)
    assert dict(snapshot.queues) == {"team-a": TEAM_A}
    assert [(e["log_level"], e["key"]) for e in logs] == [("warning", KEYS.queue("bad-one"))]


# -- set_queue / delete_queue ----------------------------------------------------------------

async def test_set_queue_creates_updates_and_says_unchanged() -> None:
    store = MemoryStore()
    assert await intents.set_queue(store, KEYS, TEAM_A) == "created"
    assert await intents.set_queue(store, KEYS, TEAM_A) == "unchanged"
    bigger = replace(TEAM_A, gpus=16)
    assert await intents.set_queue(store, KEYS, bigger) == "updated"
    assert (await read_snapshot(store, KEYS)).queues["team-a"] == bigger
    assert await kinds_of_events(store) == ["queue-set", "queue-set"]


async def test_set_queue_replaces_a_value_that_does_not_decode() -> None:
    store = MemoryStore()
    await store.put(KEYS.queue("team-a"), b"garbage")
    assert await intents.set_queue(store, KEYS, TEAM_A) == "updated"
    assert (await read_snapshot(store, KEYS)).queues["team-a"] == TEAM_A


async def test_delete_queue() -> None:
    store = MemoryStore()
    with pytest.raises(intents.NotFound, match="no queue 'team-a'"):
        await intents.delete_queue(store, KEYS, "team-a")
    await intents.set_queue(store, KEYS, TEAM_A)
    await intents.delete_queue(store, KEYS, "team-a")
    assert (await read_snapshot(store, KEYS)).queues == {}
    assert (await kinds_of_events(store))[-1] == "queue-deleted"


async def test_a_queue_that_workloads_name_is_not_deleted() -> None:
    store = MemoryStore()
    await intents.set_queue(store, KEYS, TEAM_A)
    await intents.set_queue(store, KEYS, TEAM_B)
    ids = sorted([(await intents.submit(store, KEYS, spec(name, "team-a"))).submission.id
                  for name in ("one", "two")])
    await intents.submit(store, KEYS, spec("svc", "team-b", replicas=2))
    with pytest.raises(intents.Refused) as refused:
        await intents.delete_queue(store, KEYS, "team-a")
    assert "2 workload(s)" in str(refused.value) and f"e.g. {ids[0]}" in str(refused.value)
    assert refused.value.field == "name"
    with pytest.raises(intents.Refused, match="1 workload"):  # a service counts once
        await intents.delete_queue(store, KEYS, "team-b")
    assert set((await read_snapshot(store, KEYS)).queues) == {"team-a", "team-b"}


# -- submit ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("declared", "queue", "refusal"), [
    ((), "default", None),                     # no queue declared: anything goes, as before
    ((), "anything", None),
    ((TEAM_A,), "team-a", None),
    ((TEAM_A, TEAM_B), "team-c", "no queue 'team-c' is declared (queues: team-a, team-b)"),
    ((TEAM_A,), "default", "which is not declared here"),
])
async def test_submit_to_a_queue(declared: tuple[QueueSpec, ...], queue: str,
                                 refusal: str | None) -> None:
    store = MemoryStore()
    for q in declared:
        await intents.set_queue(store, KEYS, q)
    if refusal is None:
        done = await intents.submit(store, KEYS, spec(queue=queue))
        assert done.change == "created" and done.submission.spec.queue == queue
        return
    with pytest.raises(intents.Refused) as refused:
        await intents.submit(store, KEYS, spec(queue=queue))
    assert str(refused.value).startswith("spec.queue: ") and refusal in str(refused.value)
    assert refused.value.field == "spec.queue"
    assert (await read_snapshot(store, KEYS)).workloads == {}


async def place(store: MemoryStore, wid: str) -> None:
    assignment = Assignment(workload=wid, phase="placed", node="n1", gpus=(0,))
    await store.put(KEYS.assignment(wid), codec.encode(assignment.to_dict()))


async def test_changing_only_the_queue_restarts_nothing() -> None:
    store = MemoryStore()
    for q in (TEAM_A, TEAM_B):
        await intents.set_queue(store, KEYS, q)
    wid = (await intents.submit(store, KEYS, spec(queue="team-a"))).submission.id
    await place(store, wid)
    done = await intents.submit(store, KEYS, spec(queue="team-b"))
    assert done.change == "updated" and "nothing restarts" in done.how
    assert await store.get(KEYS.move(wid)) is None
    assert (await read_snapshot(store, KEYS)).workloads[wid].spec.queue == "team-b"
    # any other change still moves it, to run the new spec
    done = await intents.submit(store, KEYS, spec(queue="team-b", priority=5))
    assert "planned move" in done.how and await store.get(KEYS.move(wid)) is not None


async def test_a_services_queue_change_replaces_no_replica() -> None:
    store = MemoryStore()
    for q in (TEAM_A, TEAM_B):
        await intents.set_queue(store, KEYS, q)
    service = spec("svc", "team-a", replicas=2)
    sid = (await intents.submit(store, KEYS, service)).submission.id
    for n in range(2):  # as the controller writes them: each runs the service's template
        replica = Submission(id=f"{sid}.{n}", spec=service.template, submitted_at=1.0,
                             service=sid)
        await store.put(KEYS.workload(replica.id), codec.encode_submission(replica))
    done = await intents.submit(store, KEYS, replace(service, queue="team-b"))
    assert done.change == "updated" and "nothing restarts" in done.how
    workloads = (await read_snapshot(store, KEYS)).workloads
    new_template = workloads[sid].spec.template
    assert [workloads[f"{sid}.{n}"].spec == new_template for n in range(2)] == [True, True]
    assert {w.spec.queue for w in workloads.values()} == {"team-b"}


# -- backups ----------------------------------------------------------------------------------

async def test_a_backup_carries_the_queues() -> None:
    store = MemoryStore()
    await intents.set_queue(store, KEYS, TEAM_A)
    backup = await take_backup(store, KEYS)
    assert backup.keys[KEYS.queue("team-a")] == codec.encode_queue(TEAM_A)


# -- hafo dev ---------------------------------------------------------------------------------

async def test_hafo_dev_declares_the_default_queue_without_a_quota_once() -> None:
    from types import SimpleNamespace

    from hafo.local.dev_server import DevCluster, DevOptions

    store = MemoryStore()
    dev: Any = SimpleNamespace(cluster=SimpleNamespace(store=store, keys=KEYS),
                               options=DevOptions(nodes=3, gpus=4))
    await DevCluster._declare_default_queue(dev)
    assert dict((await read_snapshot(store, KEYS)).queues) == {
        "default": QueueSpec(name="default")}
    # a kept --dir keeps the queues it has
    await intents.delete_queue(store, KEYS, "default")
    await intents.set_queue(store, KEYS, TEAM_A)
    await DevCluster._declare_default_queue(dev)
    assert set((await read_snapshot(store, KEYS)).queues) == {"team-a"}
    # a workload without a queue runs in it, as before queues
    await intents.delete_queue(store, KEYS, "team-a")
    await DevCluster._declare_default_queue(dev)
    assert (await intents.submit(store, KEYS, spec())).change == "created"
