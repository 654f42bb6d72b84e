"""Is the store the cluster we knew? The pure rule (table-driven), the identity record's
I/O on the memory store, a backup put back, and the controllers' failsafe answer for a
store that is not the agents' cluster (issue 28, finding 2)."""

from __future__ import annotations

import pytest

from hafo.controller.apply import with_epoch_base
from hafo.controller.failsafe import ControllerFailsafe
from hafo.decisions.plan import Action
from hafo.decisions.store_trust import EPOCH_BUMP, IdentityRecord, Known, judge, next_epoch_base
from hafo.model.cluster import Assignment
from hafo.store import Keys, codec
from hafo.store.backup import Backup, BackupError, restore_backup, take_backup
from hafo.store.identity import StoreTrust, accept_store, read_identity
from hafo.store.memory import MemoryStore

KNOWN = Known("abc", 1, 100)
REC = IdentityRecord("abc", 1, 0)


@pytest.mark.parametrize(("known", "record", "revision", "trusted", "words"), [
    (None, None, 5, False, "no cluster identity yet"),
    (None, REC, 5, True, ""),
    (KNOWN, REC, 100, True, ""),
    (KNOWN, REC, 150, True, ""),
    (KNOWN, None, 3, False, "lost its data"),
    (KNOWN, IdentityRecord("xyz", 1), 500, False, "holds cluster xyz"),
    (KNOWN, IdentityRecord("xyz", 2), 500, True, ""),
    (KNOWN, REC, 99, False, "went backwards from 100 to 99"),
    (Known("abc", 2, 100), REC, 200, False, "older than generation 2"),
    (KNOWN, IdentityRecord("abc", 2, 7), 9, True, ""),
])
def test_judge(known: Known | None, record: IdentityRecord | None, revision: int,
               trusted: bool, words: str) -> None:
    verdict = judge(known, record, revision)
    assert verdict.trusted is trusted
    assert words in verdict.reason
    if trusted:  # known from now on: the record's, at the highest revision seen
        assert record is not None and verdict.known is not None
        floor = known.revision if known is not None and not verdict.accepted else 0
        assert verdict.known == Known(record.id, record.generation,
                                      max(revision, record.accepted_revision, floor))


def test_an_accepted_generation_starts_the_floor_again() -> None:
    verdict = judge(KNOWN, IdentityRecord("abc", 2, 7), 9)
    assert verdict.accepted and verdict.known == Known("abc", 2, 9)
    assert judge(verdict.known, IdentityRecord("abc", 2, 7), 8).trusted is False


@pytest.mark.parametrize("data", [None, [], {"id": ""}, {"id": "a", "generation": -1},
                                  {"id": "a", "generation": True}, {"id": 3}])
def test_records_of_the_wrong_shape_count_as_missing(data: object) -> None:
    assert IdentityRecord.from_dict(data) is None
    assert Known.from_dict(data) is None


async def test_the_first_daemon_writes_the_identity_and_the_others_adopt_it() -> None:
    store, keys = MemoryStore(), Keys("c")
    first, second = StoreTrust(store, keys, "a"), StoreTrust(store, keys, "b")
    assert await first.check() and await second.check()
    assert first.known is not None and second.known is not None
    assert first.known.id == second.known.id


async def test_an_etcd_that_lost_its_data_is_not_the_cluster_and_nobody_writes_a_new_id() -> None:
    store, keys = MemoryStore(), Keys("c")
    trust = StoreTrust(store, keys, "agent")
    assert await trust.check()
    await store.put("/hafo/c/s/workloads/w", b"{}")
    store.lose_data()
    assert not await trust.check()
    assert "no cluster identity" in trust.reason
    record, _ = await read_identity(store, keys)
    assert record is None, "a daemon that knew the cluster must not make the empty store it"
    accepted = await accept_store(store, keys)
    assert await trust.check() and trust.accepted
    assert trust.known is not None and trust.known.id == accepted.id != ""


async def test_an_older_snapshot_is_not_the_cluster_until_accepted() -> None:
    store, keys = MemoryStore(), Keys("c")
    trust = StoreTrust(store, keys, "ctl")
    assert await trust.check()
    for i in range(5):
        await store.put(f"/hafo/c/s/workloads/w{i}", b"{}")
    assert await trust.check()
    ident = store._kvs[keys.identity]
    store.lose_data()  # then the old snapshot comes back: the same identity, fewer writes
    await store.put(keys.identity, ident.value)
    assert not await trust.check()
    assert "went backwards" in trust.reason
    await accept_store(store, keys)
    assert await trust.check() and trust.accepted


async def test_a_backup_put_back_into_an_empty_store_is_the_cluster_again() -> None:
    store, keys = MemoryStore(), Keys("c")
    trust = StoreTrust(store, keys, "agent")
    assert await trust.check()
    await store.put("/hafo/c/s/workloads/w", b'{"spec": 1}')
    await store.put("/hafo/c/byn/n1/w", b'{"node": "n1"}')
    lease, _ = await store.grant_lease(3)
    await store.put("/hafo/c/s/alive/n1", b"{}", lease=lease)
    await store.put("/hafo/c/s/status/w/n1", b"{}")
    backup = Backup.from_dict(codec.decode(codec.encode(
        (await take_backup(store, keys)).to_dict())))
    assert set(backup.keys) == {"/hafo/c/s/workloads/w", "/hafo/c/byn/n1/w"}, \
        "leased keys and instance reports are not backed up"
    store.lose_data()
    assert not await trust.check()
    record = await restore_backup(store, keys, backup)
    assert record.generation > 1_700_000_000
    assert await store.get("/hafo/c/s/workloads/w") is not None
    assert await trust.check() and trust.accepted


@pytest.mark.parametrize(("data", "field"), [
    ({}, "format"),
    ({"format": "hafo-backup/1", "cluster": "", "revision": 1, "keys": {}}, "cluster"),
    ({"format": "hafo-backup/1", "cluster": "c", "revision": "x", "keys": {}}, "revision"),
    ({"format": "hafo-backup/1", "cluster": "c", "revision": 1, "keys": []}, "keys"),
    ({"format": "hafo-backup/1", "cluster": "c", "revision": 1,
      "keys": {"/hafo/other/s/x": ""}}, "keys"),
    ({"format": "hafo-backup/1", "cluster": "c", "revision": 1,
      "keys": {"/hafo/c/s/x": "%%%"}}, "keys./hafo/c/s/x"),
])
def test_a_bad_backup_names_its_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(BackupError) as err:
        Backup.from_dict(data)
    assert str(err.value).startswith(field)


async def test_a_controller_on_a_store_that_is_not_the_cluster_answers_unavailable() -> None:
    store, keys = MemoryStore(), Keys("c")
    problem = ""
    failsafe = ControllerFailsafe("ctl", store, keys, 3, 0.5, 300,
                                  store_problem=lambda: problem)
    assert await failsafe.probe() == "available"
    problem = "the store has no cluster identity"
    assert await failsafe.probe() == "unavailable"
    assert not failsafe.failover_allowed()


async def test_agents_of_another_cluster_contest_a_controllers_new_store() -> None:
    """A controller started again on an emptied etcd wrote a new identity there; agents
    asking with the old one make it hold every decision (it answers unavailable)."""
    store, keys = MemoryStore(), Keys("c")
    failsafe = ControllerFailsafe("ctl", store, keys, 3, 0.5, 300)
    assert await failsafe.probe("new/1", ("new", 1)) == "available"
    assert await failsafe.probe("old/0", ("new", 1)) == "available", "an older generation"
    assert await failsafe.probe("junk", ("new", 1)) == "available"
    assert failsafe.contested == ""
    await failsafe.probe("old/1", ("new", 1))
    assert "agents know cluster old" in failsafe.contested


def test_the_epoch_base_is_past_every_epoch_known() -> None:
    assert next_epoch_base() == EPOCH_BUMP
    assert next_epoch_base(5, 70, 3) == 70 + EPOCH_BUMP
    assert Known("a", 2, 40, 1000).highest_epoch == 1040
    record = IdentityRecord("a", 3, 9, 1.0, 2000)
    assert IdentityRecord.from_dict(record.to_dict()) == record
    assert IdentityRecord.from_dict({**record.to_dict(), "epoch_base": -1}) is None
    assert Known.from_dict(Known("a", 2, 40, 1000).to_dict()) == Known("a", 2, 40, 1000)
    # What a daemon knows carries the generation's base, for the assignments it writes.
    assert judge(None, record, 12).known == Known("a", 3, 12, 2000)
    assert judge(Known("a", 3, 12, 2000), record, 15).known == Known("a", 3, 15, 2000)


def test_an_assignment_s_epoch_is_its_revision_plus_its_generation_s_base() -> None:
    value = codec.encode(Assignment("w", "placed", "n1", (0,), epoch_base=5000).to_dict())
    decoded = codec.decode_assignment(value, 7)
    assert (decoded.epoch, decoded.revision, decoded.epoch_base) == (5007, 7, 5000)
    old = codec.decode_assignment(codec.encode(Assignment("w", "placed").to_dict()), 7)
    assert (old.epoch, old.revision) == (7, 7), "an assignment of before the field"
    action = Action(kind="place", workload="w", cause="new", why="w", expected_revision=0,
                    assignment=Assignment("w", "placed", "n1"))
    stamped = with_epoch_base(action, 5000)
    assert stamped.assignment is not None and stamped.assignment.epoch_base == 5000
    assert with_epoch_base(dataclasses_replace_none(action), 5000).assignment is None


def dataclasses_replace_none(action: Action) -> Action:
    """The action deleting its assignment."""
    import dataclasses
    return dataclasses.replace(action, kind="forget", assignment=None)


async def _assign(store: MemoryStore, keys: Keys, workload: str, base: int) -> int:
    """Write an assignment as a controller of that generation does; its epoch."""
    value = codec.encode(Assignment(workload, "placed", "n1", (0,), epoch_base=base).to_dict())
    await store.put(keys.assignment(workload), value)
    await store.put(keys.node_assignment("n1", workload), value)
    kv = await store.get(keys.assignment(workload))
    assert kv is not None
    return codec.decode_assignment(kv.value, kv.mod_revision).epoch


async def test_epochs_never_go_backwards_across_a_restore_or_an_accept() -> None:
    """The new store's revisions start again near 1: without the generation's epoch base a
    restored workload's epochs would be lower than its checkpoints', which sort by epoch
    (its next checkpoints shadowed by its old ones, and pruned first)."""
    store, keys = MemoryStore(), Keys("c")
    trust = StoreTrust(store, keys, "agent")
    assert await trust.check()
    for i in range(40):
        await store.put(f"/hafo/c/s/workloads/x{i}", b"{}")
    old = await _assign(store, keys, "w", 0)
    backup = await take_backup(store, keys)
    for _ in range(30):  # writes after the backup: epochs nobody backed up
        later = await _assign(store, keys, "w", 0)
    assert await trust.check() and trust.known is not None
    store.lose_data()
    record = await restore_backup(store, keys, backup,
                                  known=[trust.known])
    assert record.epoch_base >= later + EPOCH_BUMP
    kv = await store.get(keys.assignment("w"))
    assert kv is not None
    restored = codec.decode_assignment(kv.value, kv.mod_revision)
    assert restored.epoch > later > old, "the restored assignment: past every old epoch"
    assert await trust.check() and trust.accepted and trust.known is not None
    assert trust.known.epoch_base == record.epoch_base
    placed = await _assign(store, keys, "w", trust.known.epoch_base)
    assert placed > restored.epoch
    assert await trust.check()  # it saw that revision
    # Lost again, no backup, the store accepted as it is: past the agents' epochs still.
    store.lose_data()
    assert not await trust.check()
    accepted = await accept_store(store, keys, known=[trust.known])
    assert accepted.epoch_base >= placed + EPOCH_BUMP
    assert await trust.check() and trust.known.epoch_base == accepted.epoch_base
    assert await _assign(store, keys, "w", accepted.epoch_base) > placed
