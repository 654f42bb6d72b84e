"""The history of a workload's epochs (``hafo.decisions.history``): previous history +
snapshot + now -> new history, table-driven, with the clock as an argument."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from hafo.decisions.history import history_changes, running_epoch, update_history
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Gpu,
    InstanceEnd,
    InstanceState,
    InstanceStatus,
    Liveness,
    Member,
)
from hafo.model.history import (
    HISTORY_KEEP,
    EpochEnd,
    EpochRecord,
    WorkloadHistory,
    xid_in,
)
from hafo.model.history_view import epoch_how
from tests.unit.conftest import make_node, make_snapshot, placed, submit

W = "train"
NODES = [make_node("a"), make_node("b"), make_node("c")]


def ck(step: int, epoch: int) -> CheckpointInfo:
    return CheckpointInfo(step=step, epoch=epoch, path=f"/ck/e{epoch}-s{step}")


def report(node: str, epoch: int, state: InstanceState = "running", *,
           started: float | None = 1.0, code: int | None = None, finished: float | None = None,
           ended: InstanceEnd | None = None, checkpoint: CheckpointInfo | None = None,
           failing: str = "") -> InstanceStatus:
    return InstanceStatus(workload=W, node=node, epoch=epoch, state=state, started_at=started,
                          exit_code=code, finished_at=finished, ended=ended,
                          checkpoint=checkpoint, failing=failing)


def exited(node: str, epoch: int, code: int | None, ended: InstanceEnd = InstanceEnd.EXIT,
           finished: float = 9.0) -> InstanceStatus:
    return report(node, epoch, "exited", code=code, finished=finished, ended=ended)


def moving(epoch: int, cause: str, node: str = "a", **kwargs: Any) -> Assignment:
    return Assignment(workload=W, phase="moving", node=node, gpus=(0,), epoch=epoch + 1,
                      stopping=epoch, cause=cause, **kwargs)  # type: ignore[arg-type]


def snap(assignment: Assignment | None, *statuses: InstanceStatus, down: tuple[str, ...] = (),
         nodes: list[Any] | None = None, exists: bool = True,
         checkpoint: CheckpointInfo | None = None) -> ClusterSnapshot:
    snapshot = make_snapshot(nodes or NODES, down=down,
                             workloads=[submit(W)] if exists else [],
                             assignments=[assignment] if assignment is not None else [],
                             statuses=statuses)
    if checkpoint is not None:
        snapshot = dataclasses.replace(snapshot, checkpoints={W: checkpoint})
    return snapshot


def epoch(number: int, node: str = "a", *, started: float | None = 1.0,
          ended_at: float | None = None, end: EpochEnd | None = None, restarts: int = 0,
          resumed: CheckpointInfo | None = None, assigned: float = 0.0) -> EpochRecord:
    return EpochRecord(epoch=number, nodes=(node,), assigned_at=assigned, started_at=started,
                       ended_at=ended_at, end=end, restarts=restarts, resumed_from=resumed)


def history(*epochs: EpochRecord) -> WorkloadHistory:
    return WorkloadHistory(workload=W, epochs=epochs)


RUNNING = history(epoch(10))  # epoch 10 on a, started at 1.0
NOW = 50.0

CASES: list[tuple[str, WorkloadHistory | None, ClusterSnapshot, WorkloadHistory | None]] = [
    ("first placement: assigned now, not started yet, nothing to resume from",
     None, snap(placed(W, "a", epoch=10)),
     history(epoch(10, started=None, assigned=NOW))),
    ("first placement of a workload that resumes an earlier checkpoint",
     None, snap(placed(W, "a", epoch=10), checkpoint=ck(30, 4)),
     history(epoch(10, started=None, assigned=NOW, resumed=ck(30, 4)))),
    ("its instance starts",
     history(epoch(10, started=None)), snap(placed(W, "a", epoch=10), report("a", 10)),
     RUNNING),
    ("a report of an older epoch on the same node says nothing about this one",
     history(epoch(10, started=None)),
     snap(placed(W, "a", epoch=10), exited("a", 9, 1)),
     history(epoch(10, started=None))),
    ("exit code 3",
     RUNNING, snap(placed(W, "a", epoch=10), exited("a", 10, 3)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("exit", code=3)))),
    ("killed by signal 9",
     RUNNING, snap(placed(W, "a", epoch=10), exited("a", 10, -9)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("signal", code=9)))),
    ("exit, then restarted in place: a new epoch with the restart count",
     history(epoch(10, ended_at=9.0, end=EpochEnd("exit", code=3))),
     snap(placed(W, "a", epoch=20, restarts=1), exited("a", 10, 3), checkpoint=ck(40, 10)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("exit", code=3)),
             epoch(20, started=None, restarts=1, assigned=NOW, resumed=ck(40, 10)))),
    ("completed",
     RUNNING, snap(Assignment(workload=W, phase="completed", epoch=11),
                   exited("a", 10, 0)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("completed")))),
    ("fenced",
     RUNNING, snap(placed(W, "a", epoch=10), exited("a", 10, -9, InstanceEnd.FENCED)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("fenced")))),
    ("its guard was lost",
     RUNNING, snap(placed(W, "a", epoch=10), exited("a", 10, -9, InstanceEnd.GUARD_LOST)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("guard-lost")))),
    ("node down, not yet placed elsewhere: nothing is known yet (the failsafe may keep it)",
     RUNNING, snap(placed(W, "a", epoch=10), down=("a",)), RUNNING),
    ("node down and placed elsewhere: 'node down', the new epoch resumes the checkpoint",
     RUNNING, snap(placed(W, "b", epoch=20), down=("a",), checkpoint=ck(40, 10)),
     history(epoch(10, ended_at=NOW, end=EpochEnd("node-down")),
             epoch(20, "b", started=None, assigned=NOW, resumed=ck(40, 10)))),
    ("node down and no room elsewhere: pending ends the epoch",
     RUNNING, snap(Assignment(workload=W, phase="pending", epoch=20, reason="no room"),
                   down=("a",)),
     history(epoch(10, ended_at=NOW, end=EpochEnd("node-down")))),
    ("replaced by a newer epoch with no report and its node alive: unknown",
     RUNNING, snap(placed(W, "a", epoch=20)),
     history(epoch(10, ended_at=NOW, end=EpochEnd("unknown")),
             epoch(20, started=None, assigned=NOW))),
    ("planned move asked: the end is known, the epoch is being stopped",
     RUNNING, snap(moving(10, "planned", reason="migrate to b"), report("a", 10, "stopping")),
     history(epoch(10, end=EpochEnd("moved", detail="migrate to b")))),
    ("the moved instance stopped",
     history(epoch(10, end=EpochEnd("moved", detail="migrate to b"))),
     snap(moving(10, "planned", reason="migrate to b"),
          exited("a", 10, 0, InstanceEnd.STOPPED)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("moved", detail="migrate to b")))),
    ("moved, then placed on b: resumes from the checkpoint its stop wrote",
     history(epoch(10, ended_at=9.0, end=EpochEnd("moved"))),
     snap(placed(W, "b", epoch=30), exited("a", 10, 0, InstanceEnd.STOPPED),
          checkpoint=ck(57, 10)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("moved")),
             epoch(30, "b", started=None, assigned=NOW, resumed=ck(57, 10)))),
    ("preempted",
     RUNNING, snap(moving(10, "preempted", preempted_for="big"),
                   exited("a", 10, -15, InstanceEnd.STOPPED)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("preempted", detail="for big")))),
    ("GPU fault with its XID",
     RUNNING, snap(moving(10, "gpu-unhealthy", urgent=True),
                   nodes=[dataclasses.replace(NODES[0], gpus=(Gpu(
                       index=0, uuid="GPU-a-0", model="H100", memory_mib=1, healthy=False,
                       reason="GPU 0: xid 79: GPU has fallen off the bus", lost=True),)),
                       NODES[1]]),
     history(epoch(10, end=EpochEnd(
         "gpu-fault", code=79, detail="GPU 0 on a is unhealthy (GPU 0: xid 79: GPU has "
                                      "fallen off the bus)")))),
    ("application check failed",
     RUNNING, snap(moving(10, "app-failed", reason="failing"),
                   report("a", 10, failing="check http: 3 consecutive failures")),
     history(epoch(10, end=EpochEnd("app-failed",
                                    detail="check http: 3 consecutive failures")))),
    ("application XID on its GPU",
     RUNNING, snap(moving(10, "app-failed"),
                   report("a", 10, failing="GPU 0: xid 13: graphics engine exception")),
     history(epoch(10, end=EpochEnd("app-failed", code=13,
                                    detail="GPU 0: xid 13: graphics engine exception")))),
    ("an instance that exits by itself while being moved ended by its exit",
     history(epoch(10, end=EpochEnd("moved"))),
     snap(moving(10, "planned"), exited("a", 10, 2)),
     history(epoch(10, ended_at=9.0, end=EpochEnd("exit", code=2)))),
    ("deleted: the history goes with the workload and its assignment",
     RUNNING, snap(None, exists=False), None),
    ("deleted, assignment not yet withdrawn: kept",
     RUNNING, snap(placed(W, "a", epoch=10), report("a", 10), exists=False), RUNNING),
    ("stopped after its deletion",
     RUNNING, snap(placed(W, "a", epoch=10), exited("a", 10, -15, InstanceEnd.STOPPED),
                   exists=False),
     history(epoch(10, ended_at=9.0, end=EpochEnd("deleted")))),
    ("nothing placed yet: no history",
     None, snap(Assignment(workload=W, phase="pending", epoch=3, reason="no room")), None),
]


@pytest.mark.parametrize(("previous", "snapshot", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_update(previous: WorkloadHistory | None, snapshot: ClusterSnapshot,
                expected: WorkloadHistory | None) -> None:
    assert update_history(previous, snapshot, W, NOW) == expected


def test_a_node_registered_anew_ended_it_by_the_infrastructure() -> None:
    snapshot = snap(placed(W, "a", epoch=20))
    alive = dict(snapshot.alive)
    alive["a"] = Liveness(node="a", lease=7, since=0.0, claimed=15)
    snapshot = dataclasses.replace(snapshot, alive=alive)
    new = update_history(RUNNING, snapshot, W, NOW)
    assert new is not None and new.epochs[0].end is not None
    assert new.epochs[0].end.how == "infrastructure"


def test_nothing_changed_is_the_same_object() -> None:
    snapshot = snap(placed(W, "a", epoch=10), report("a", 10))
    assert update_history(RUNNING, snapshot, W, NOW) is RUNNING
    assert update_history(RUNNING, snapshot, W, NOW + 100) is RUNNING
    ended = history(epoch(10, ended_at=9.0, end=EpochEnd("exit", code=3)))
    later = snap(placed(W, "a", epoch=10), exited("a", 10, 3, finished=30.0))
    assert update_history(ended, later, W, NOW) is ended  # an ended epoch is final


def test_the_resume_point_is_refined_by_the_new_instance_report() -> None:
    """The controller may not have seen the last checkpoint of the old epoch when it places
    the new one; the new instance's agent reports it (before any of its own)."""
    first = update_history(RUNNING, snap(placed(W, "b", epoch=20), down=("a",),
                                         checkpoint=ck(30, 10)), W, NOW)
    assert first is not None and first.epochs[-1].resumed_from == ck(30, 10)
    refined = update_history(first, snap(placed(W, "b", epoch=20),
                                         report("b", 20, checkpoint=ck(40, 10)),
                                         down=("a",), checkpoint=ck(30, 10)), W, NOW + 1)
    assert refined is not None and refined.epochs[-1].resumed_from == ck(40, 10)
    assert refined.epochs[-1].started_at == 1.0
    own = update_history(refined, snap(placed(W, "b", epoch=20),
                                       report("b", 20, checkpoint=ck(50, 20)),
                                       down=("a",), checkpoint=ck(50, 20)), W, NOW + 2)
    assert own is refined  # its own checkpoints are not where it resumed from


GANG = Assignment(workload=W, phase="placed", node="a", gpus=(0,), epoch=10,
                  members=(Member(rank=0, node="a", gpus=(0,)),
                           Member(rank=1, node="b", gpus=(0,))))


def test_a_gang_epoch_has_every_member_node_and_starts_when_all_run() -> None:
    first = update_history(None, snap(GANG, report("a", 10, started=3.0)), W, NOW)
    assert first is not None and first.epochs[0].nodes == ("a", "b")
    assert first.epochs[0].node == "a" and first.epochs[0].started_at is None
    both = update_history(first, snap(GANG, report("a", 10, started=3.0),
                                      report("b", 10, started=4.0)), W, NOW)
    assert both is not None and both.epochs[0].started_at == 4.0


def test_a_gang_epoch_ends_by_its_member_that_tells_most() -> None:
    start = history(EpochRecord(epoch=10, nodes=("a", "b"), assigned_at=0.0, started_at=1.0))
    member_exit = dataclasses.replace(GANG, phase="moving", stopping=10, epoch=11,
                                      cause="app-failed")
    new = update_history(start, snap(member_exit, exited("a", 10, -15, InstanceEnd.STOPPED),
                                     exited("b", 10, 2, finished=8.0)), W, NOW)
    assert new is not None and new.epochs[0].end == EpochEnd("exit", code=2)
    assert new.epochs[0].ended_at == 9.0
    lost = dataclasses.replace(GANG, phase="moving", stopping=10, epoch=11,
                               cause="member-lost", reason="member 1 on b lost")
    new = update_history(start, snap(lost, exited("a", 10, 0, InstanceEnd.STOPPED),
                                     down=("b",)), W, NOW)
    assert new is not None and new.epochs[0].end == EpochEnd("member-lost",
                                                             detail="member 1 on b lost")
    assert new.epochs[0].ended_at is None  # b's member left no report: over when replaced
    again = dataclasses.replace(GANG, epoch=20, members=(Member(rank=0, node="a", gpus=(0,)),
                                                         Member(rank=1, node="c", gpus=(0,))))
    done = update_history(new, snap(again, down=("b",)), W, NOW + 1)
    assert done is not None and done.epochs[0].ended_at == NOW + 1
    assert done.epochs[0].end == EpochEnd("member-lost", detail="member 1 on b lost")
    assert done.epochs[1].nodes == ("a", "c")


def test_a_hung_gang_epoch_ends_hung_naming_the_rank() -> None:
    start = history(EpochRecord(epoch=10, nodes=("a", "b"), assigned_at=0.0, started_at=1.0))
    why = "member 1 hung on b: rank 1 made no progress for 4.1s since step 25"
    hung = dataclasses.replace(GANG, phase="moving", stopping=10, epoch=11, cause="hung",
                               reason=why)
    new = update_history(start, snap(hung, exited("a", 10, -15, InstanceEnd.STOPPED),
                                     exited("b", 10, -9, InstanceEnd.STOPPED)), W, NOW)
    assert new is not None and new.epochs[0].end == EpochEnd("hung", detail=why)


def test_the_history_keeps_the_newest_epochs() -> None:
    full = history(*(epoch(n, ended_at=float(n), end=EpochEnd("exit", code=1))
                     for n in range(1, HISTORY_KEEP + 1)))
    new = update_history(full, snap(placed(W, "a", epoch=500)), W, NOW)
    assert new is not None and len(new.epochs) == HISTORY_KEEP
    assert new.epochs[0].epoch == 2 and new.epochs[-1].epoch == 500
    small = update_history(full, snap(placed(W, "a", epoch=500)), W, NOW, keep=3)
    assert small is not None and [e.epoch for e in small.epochs] == [99, 100, 500]


def test_history_changes_lists_only_what_changed_and_what_goes() -> None:
    other = dataclasses.replace(RUNNING, workload="old")
    snapshot = snap(placed(W, "a", epoch=10), report("a", 10))
    snapshot = dataclasses.replace(
        snapshot, workloads={**snapshot.workloads, "new": submit("new")},
        assignments={**snapshot.assignments, "new": placed("new", "b", epoch=12)})
    changes = history_changes({W: RUNNING, "old": other}, snapshot, NOW)
    assert set(changes.changed) == {"new"} and changes.gone == ("old",)
    assert changes.changed["new"].epochs[0].nodes == ("b",)
    assert not history_changes({W: RUNNING, "new": changes.changed["new"]}, snapshot, NOW)


@pytest.mark.parametrize(("assignment", "expected"), [
    (placed(W, "a", epoch=10), 10),
    (moving(10, "planned"), 10),
    (Assignment(workload=W, phase="pending", epoch=12), None),
    (Assignment(workload=W, phase="completed", epoch=12), None),
    (None, None),
])
def test_running_epoch(assignment: Assignment | None, expected: int | None) -> None:
    assert running_epoch(assignment) == expected


@pytest.mark.parametrize(("end", "text"), [
    (EpochEnd("completed"), "completed"),
    (EpochEnd("exit", code=3), "exit code 3"),
    (EpochEnd("signal", code=9), "signal 9"),
    (EpochEnd("fenced"), "fenced"),
    (EpochEnd("moved"), "moved (planned)"),
    (EpochEnd("preempted"), "preempted"),
    (EpochEnd("node-down"), "node down"),
    (EpochEnd("gpu-fault", code=79), "GPU fault XID 79"),
    (EpochEnd("gpu-fault"), "GPU fault"),
    (EpochEnd("app-failed"), "application check failed"),
    (EpochEnd("app-failed", code=13), "application XID 13"),
    (EpochEnd("deleted"), "stopped (deleted)"),
    (EpochEnd("hung"), "hung (no progress)"),
])
def test_how_an_end_reads(end: EpochEnd, text: str) -> None:
    assert end.describe() == text
    assert epoch_how(epoch(10, end=end, ended_at=5.0)) == text
    assert epoch_how(epoch(10, end=end)) == f"stopping: {text}"
    assert epoch_how(epoch(10)) is None


@pytest.mark.parametrize(("text", "xid"), [
    ("GPU 0: xid 79: GPU has fallen off the bus", 79),
    ("GPU 3: XID 48 (double-bit ECC)", 48),
    ("Xid: 13", 13),
    ("check http: 3 consecutive failures", None),
    ("", None),
])
def test_xid_in(text: str, xid: int | None) -> None:
    assert xid_in(text) == xid


def test_the_record_round_trips_and_reads_a_newer_writer() -> None:
    record = history(epoch(10, ended_at=9.0, end=EpochEnd("gpu-fault", code=79, detail="x"),
                           resumed=ck(4, 2)), epoch(20, "b", started=None))
    assert WorkloadHistory.from_dict(record.to_dict()) == record
    data = record.to_dict()
    data["epochs"][0]["end"]["how"] = "struck-by-lightning"
    data["epochs"][0]["extra"] = 1
    again = WorkloadHistory.from_dict(data)
    assert again.epochs[0].end == EpochEnd("unknown", code=79, detail="x")


# --- the leader's writer and the API route, on an in-memory store ---------------------------

async def leading(store: Any, keys: Any) -> Any:
    from hafo.store import Election

    lease, _ttl = await store.grant_lease(30)
    election = Election(store, keys.leader, "ctl-1")
    await election.campaign(lambda: lease)
    return election


async def test_the_writer_writes_on_change_only_and_removes_a_deleted_workload() -> None:
    from hafo.controller.history import HistoryWriter
    from hafo.store import Keys
    from hafo.store.history import read_history
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    writer = HistoryWriter(store, keys)
    placed_snap = dataclasses.replace(snap(placed(W, "a", epoch=10)), revision=5)
    assert await writer.step(election, placed_snap, NOW) == 1
    stored = await read_history(store, keys, W)
    assert stored == history(epoch(10, started=None, assigned=NOW))
    revision = await store.revision()
    assert await writer.step(election, placed_snap, NOW + 1) == 0  # same revision: nothing
    later = dataclasses.replace(placed_snap, revision=6)
    assert await writer.step(election, later, NOW + 2) == 0  # nothing changed: no write
    assert await store.revision() == revision
    started = dataclasses.replace(snap(placed(W, "a", epoch=10), report("a", 10)), revision=7)
    assert await writer.step(election, started, NOW + 3) == 1
    fresh = HistoryWriter(store, keys)  # a new leader reads what the last one wrote
    assert await fresh.step(election, started, NOW + 4) == 0
    gone = dataclasses.replace(snap(None, exists=False), revision=8)
    assert await fresh.step(election, gone, NOW + 5) == 1
    assert await read_history(store, keys, W) is None


async def test_a_write_that_fails_is_tried_again_the_next_cycle() -> None:
    from hafo.controller.history import HistoryWriter
    from hafo.store import Keys, StoreUnavailable
    from hafo.store.history import read_history
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    writer = HistoryWriter(store, keys)
    real_txn = store.txn
    failing = True

    async def txn(*args: Any, **kwargs: Any) -> Any:
        if failing:
            raise StoreUnavailable("etcd down")
        return await real_txn(*args, **kwargs)

    store.txn = txn  # type: ignore[method-assign]
    placed_snap = dataclasses.replace(snap(placed(W, "a", epoch=10)), revision=5)
    assert await writer.step(election, placed_snap, NOW) == 0
    failing = False
    assert await writer.step(election, placed_snap, NOW + 1) == 1
    stored = await read_history(store, keys, W)
    assert stored is not None and stored.epochs[0].assigned_at == NOW + 1


async def test_a_deposed_leader_writes_nothing() -> None:
    from hafo.controller.history import HistoryWriter
    from hafo.store import Keys, NotLeader
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    election = await leading(store, keys)
    await store.delete(keys.leader)
    with pytest.raises(NotLeader):
        await HistoryWriter(store, keys).step(election, snap(placed(W, "a", epoch=10)), NOW)
    assert (await store.get_prefix(keys.histories))[1] == []


def test_batches_stay_under_the_transaction_limits() -> None:
    from hafo.store import Keys
    from hafo.store.history import TXN_BYTES, TXN_OPS, history_writes

    keys = Keys("unit")
    big = history(*(epoch(n, ended_at=1.0, end=EpochEnd("app-failed", detail="x" * 2000))
                    for n in range(1, 50)))
    changed = {f"w{i}": dataclasses.replace(big, workload=f"w{i}") for i in range(30)}
    batches = list(history_writes(keys, changed, [f"gone{i}" for i in range(250)]))
    assert sum(len(b) for b in batches) == 280
    for batch in batches:
        assert len(batch) <= TXN_OPS
        size = sum(len(op.value) for op in batch if hasattr(op, "value"))
        assert size <= TXN_BYTES or len(batch) == 1


class HistorySource:
    """What the controller API reads, over an in-memory store."""

    name = "ctl-1"

    def __init__(self, store: Any, keys: Any, snapshot: ClusterSnapshot) -> None:
        from prometheus_client import CollectorRegistry

        self.store, self.keys, self._snapshot = store, keys, snapshot
        self.registry = CollectorRegistry()

    def snapshot(self) -> ClusterSnapshot:
        return self._snapshot

    def ready(self) -> bool:
        return True

    def stale_seconds(self) -> float | None:
        return None

    def not_ready_reason(self) -> str:
        return ""

    def etcd_contact_age(self) -> float:
        return 0.0

    def leading(self) -> bool:
        return True

    async def recent_events(self, limit: int = 100) -> list[Any]:
        return []

    failsafe_hold = 3.5

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        return "available"


async def test_the_route_answers_the_view_of_show() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from hafo.api import make_controller_app
    from hafo.model.cluster import Event
    from hafo.model.history_view import show_view
    from hafo.store import EventLog, Keys
    from hafo.store.history import history_writes
    from hafo.store.memory import MemoryStore

    store, keys = MemoryStore(), Keys("unit")
    stored = history(epoch(10, ended_at=9.0, end=EpochEnd("node-down")),
                     epoch(20, "b", resumed=ck(40, 10)))
    for batch in history_writes(keys, {W: stored}, ()):
        await store.txn([], batch)
    log = EventLog(store, keys)
    await log.append(Event(ts=5.0, kind="failover", message="node a is down", workload=W,
                           node="b"))
    await log.append(Event(ts=6.0, kind="placed", message="another", workload="other"))
    snapshot = snap(placed(W, "b", epoch=20), report("b", 20), down=("a",))
    app = make_controller_app(HistorySource(store, keys, snapshot))
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        response = await client.get(f"/v1/workloads/{W}/history")
        assert response.status == 200
        body = await response.json()
        assert [e["kind"] for e in body["events"]] == ["failover"]
        events = [Event(ts=5.0, kind="failover", message="node a is down", workload=W,
                        node="b")]
        expected = show_view(snapshot, W, stored, events, 0.0)
        assert body == json.loads(json.dumps(expected))
        assert body["history"][0]["how"] == "node down"
        assert body["history"][1]["resumed_from"]["step"] == 40
        assert body["now"] == {"phase": "placed", "state": "running", "node": "b",
                               "nodes": ["b"], "epoch": 20, "restarts": 0, "reason": "running",
                               "checkpoint": None, "restart_window": {
                                   "restarts": 0, "max_restarts": 3, "window": 600.0},
                               "restored": []}
        missing = await client.get("/v1/workloads/nope/history")
        assert missing.status == 404 and "nope" in (await missing.json())["error"]
        bad = await client.get("/v1/workloads/..%2F/history")
        assert bad.status == 404


def test_the_history_key_parses_back() -> None:
    from hafo.store.keys import Keys, ParsedKey

    keys = Keys("c")
    assert keys.parse(keys.history("train-x.y-0a1b2c")) == ParsedKey(
        "history", workload="train-x.y-0a1b2c")
    assert keys.parse(f"{keys.histories}a/b").kind == "unknown"
    assert not keys.history("w").startswith(keys.state)  # the controllers' watch skips it
