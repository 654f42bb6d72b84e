"""A workload's history, one record per epoch: previous history + snapshot + now -> new
history. Pure and deterministic (the clock is the ``now`` argument).

The leader runs ``history_changes`` every cycle and writes the histories that changed
(``hafo.controller.history``): an epoch is recorded when it is first seen placed, again when
its instance starts, when the controller asks it to stop (the cause of the move), and when
it is over. How it ended comes from the data, never from a message: the instance reports
(exit code, signal, fenced, guard lost, stopped), the ``moving`` assignment's cause
(planned, preempted, unhealthy node or GPU, failing application, lost gang member) and,
when the epoch was replaced without a report (the node's lease expired with its reports),
the node's state. A newer epoch, a ``pending`` or a finished assignment ends the open one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hafo.decisions.hardware import hardware_fault
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceEnd,
    InstanceStatus,
)
from hafo.model.history import (
    HISTORY_KEEP,
    EndHow,
    EpochEnd,
    EpochRecord,
    WorkloadHistory,
    xid_in,
)

__all__ = ["HistoryChanges", "history_changes", "running_epoch", "update_history"]


def running_epoch(assignment: Assignment | None) -> int | None:
    """The epoch whose instance the assignment runs: its own while placed, the one being
    stopped while moving; None when it runs none (pending, completed, failed)."""
    if assignment is None:
        return None
    if assignment.phase == "placed":
        return assignment.epoch
    if assignment.phase == "moving":
        return assignment.stopping or None
    return None


def _newer(a: CheckpointInfo, b: CheckpointInfo | None) -> bool:
    return b is None or (a.epoch, a.step) > (b.epoch, b.step)


def _resume_point(snapshot: ClusterSnapshot, wid: str, epoch: int,
                  nodes: Sequence[str]) -> CheckpointInfo | None:
    """The newest committed checkpoint written before ``epoch``: the controller's newest
    seen one, and what the agents of ``nodes`` report (a new instance's agent reports the
    checkpoint it found, before it commits one of its own)."""
    best: CheckpointInfo | None = None
    seen = snapshot.checkpoints.get(wid)
    if seen is not None and seen.epoch < epoch:
        best = seen
    for node in nodes:
        status = snapshot.statuses.get((wid, node))
        ck = status.checkpoint if status is not None else None
        if ck is not None and ck.epoch < epoch and _newer(ck, best):
            best = ck
    return best


def _stop_end(assignment: Assignment, snapshot: ClusterSnapshot,
              reports: Sequence[InstanceStatus | None]) -> EpochEnd:
    """How an epoch that the controller stops (phase ``moving``) ends, by the move's cause."""
    cause = assignment.cause
    if cause == "planned":
        return EpochEnd("moved", detail=assignment.reason)
    if cause == "preempted":
        return EpochEnd("preempted", detail=f"for {assignment.preempted_for}"
                        if assignment.preempted_for else "")
    if cause in ("node-unhealthy", "gpu-unhealthy", "gpu-degraded"):
        for node, gpus in assignment.slots:
            fault = hardware_fault(snapshot, node, gpus)
            if fault is not None:
                how: EndHow = ("node-unhealthy" if cause == "node-unhealthy" else
                               "gpu-fault" if cause == "gpu-unhealthy" else "gpu-degraded")
                code = xid_in(fault.subject) if how == "gpu-fault" else None
                return EpochEnd(how, code=code, detail=fault.subject)
        return EpochEnd("gpu-fault" if cause == "gpu-unhealthy" else
                        "node-unhealthy" if cause == "node-unhealthy" else "gpu-degraded",
                        detail=assignment.reason)
    if cause == "app-failed":
        failing = next((r.failing for r in reports if r is not None and r.failing), "")
        return EpochEnd("app-failed", code=xid_in(failing) if failing else None,
                        detail=failing or assignment.reason)
    if cause in ("hung", "straggler"):
        return EpochEnd("hung" if cause == "hung" else "straggler", detail=assignment.reason)
    if cause == "preflight":
        return EpochEnd("preflight", detail=assignment.reason)
    if cause == "member-lost":
        return EpochEnd("member-lost", detail=assignment.reason)
    if cause == "infrastructure":
        return EpochEnd("infrastructure", detail=assignment.reason)
    return EpochEnd("unknown", detail=assignment.reason)


#: Which end of a gang's members tells most (lower first).
_RANK: Mapping[str, int] = {"exit": 0, "signal": 0, "fenced": 1, "guard-lost": 2}


def _report_end(report: InstanceStatus, stop: EpochEnd | None, exists: bool) -> EpochEnd:
    """How one exited instance ended, from its report (``stop``: the cause the controller
    stopped it for, if it did)."""
    ended, code = report.ended, report.exit_code
    if ended is InstanceEnd.FENCED:
        return EpochEnd("fenced")
    if ended is InstanceEnd.GUARD_LOST:
        return EpochEnd("guard-lost")
    if ended is InstanceEnd.STOPPED:
        if stop is not None:
            return stop
        return EpochEnd("deleted") if not exists else EpochEnd("unknown", detail="stopped")
    if code == 0:
        return EpochEnd("completed")
    if code is None:
        return EpochEnd("unknown")
    if code < 0:
        return EpochEnd("signal", code=-code, detail=report.stderr_line)
    return EpochEnd("exit", code=code, detail=report.stderr_line)


def _exited_end(reports: Sequence[InstanceStatus], stop: EpochEnd | None,
                exists: bool) -> EpochEnd:
    """The end of an epoch every instance of which exited: the member whose end tells most
    (an exit or a signal, then fencing, then a lost guard, then the stop's cause)."""
    ends = [_report_end(r, stop, exists) for r in reports]
    return min(ends, key=lambda e: _RANK.get(e.how, 3 if e.how != "completed" else 4))


def _replaced_end(record: EpochRecord, snapshot: ClusterSnapshot,
                  assignment: Assignment | None, exists: bool) -> EpochEnd:
    """How an epoch that no longer runs and left no report ended."""
    if record.end is not None:
        return record.end
    if not exists:
        return EpochEnd("deleted")
    down = [n for n in record.nodes if snapshot.node_state(n) == "down"]
    if down:
        return EpochEnd("node-down", detail=", ".join(down) if len(record.nodes) > 1 else "")
    for node in record.nodes:
        alive = snapshot.alive.get(node)
        if alive is not None and record.epoch <= alive.claimed:
            return EpochEnd("infrastructure", detail=f"{node} was registered again by an "
                                                     "agent with a new lease")
    if assignment is not None and assignment.phase == "completed":
        return EpochEnd("completed")
    return EpochEnd("unknown")


def _follow(record: EpochRecord, snapshot: ClusterSnapshot, wid: str,
            assignment: Assignment | None, exists: bool, current: int | None,
            now: float) -> EpochRecord:
    """An open epoch, brought up to date: its resume point, its start, the stop the
    controller asked for, its end. The same record when nothing changed."""
    reports = [snapshot.statuses.get((wid, node)) for node in record.nodes]
    mine = [r if r is not None and r.epoch == record.epoch else None for r in reports]
    changes: dict[str, object] = {}
    resume = _resume_point(snapshot, wid, record.epoch, record.nodes)
    if resume is not None and _newer(resume, record.resumed_from):
        changes["resumed_from"] = resume
    starts = [r.started_at for r in mine if r is not None and r.started_at is not None]
    if record.started_at is None and mine and len(starts) == len(mine):
        changes["started_at"] = max(starts)
    end = record.end
    if (end is None and assignment is not None and assignment.phase == "moving"
            and assignment.stopping == record.epoch):
        end = _stop_end(assignment, snapshot, mine)
    exited = [r for r in mine if r is not None and r.state == "exited"]
    if mine and len(exited) == len(mine):
        end = _exited_end(exited, end, exists)
        changes["ended_at"] = max(r.finished_at if r.finished_at is not None else now
                                  for r in exited)
    elif current != record.epoch:  # replaced (or finished) without a report of its end
        end = _replaced_end(replace(record, end=end), snapshot, assignment, exists)
        changes["ended_at"] = now
    if end != record.end:
        changes["end"] = end
    return replace(record, **changes) if changes else record  # type: ignore[arg-type]


def _closed(history: WorkloadHistory | None) -> bool:
    """No epoch of it can change any more: it has none, or its last one ended (for a
    workload whose assignment ended)."""
    return history is None or not history.epochs or history.epochs[-1].over


def update_history(previous: WorkloadHistory | None, snapshot: ClusterSnapshot, wid: str,
                   now: float, keep: int = HISTORY_KEEP) -> WorkloadHistory | None:
    """The history workload ``wid`` has after this snapshot: ``previous`` (the same object
    when nothing changed), with its open epoch brought up to date or ended and a newly
    placed epoch appended (the newest ``keep``). None: it has none (nothing placed yet, or
    the workload and its assignment are gone: its history goes with them)."""
    exists = wid in snapshot.workloads
    assignment = snapshot.assignments.get(wid)
    if not exists and assignment is None:
        return None
    epochs = previous.epochs if previous is not None else ()
    if exists and assignment is not None and assignment.ended and _closed(previous):
        return previous  # nothing below changes it (and a cluster keeps thousands of these,
        # read every cycle)
    current = running_epoch(assignment)
    last = epochs[-1] if epochs else None
    updated = epochs
    if last is not None and not last.over:
        followed = _follow(last, snapshot, wid, assignment, exists, current, now)
        if followed is not last:
            updated = (*epochs[:-1], followed)
    if assignment is not None and current is not None and (last is None
                                                           or current > last.epoch):
        fresh = EpochRecord(epoch=current, nodes=assignment.nodes, assigned_at=now,
                            restarts=assignment.restarts,
                            resumed_from=_resume_point(snapshot, wid, current,
                                                       assignment.nodes))
        updated = (*updated, _follow(fresh, snapshot, wid, assignment, exists, current, now))
        updated = updated[-keep:]
    if updated is epochs:
        return previous
    return WorkloadHistory(workload=wid, epochs=updated)


@dataclass(frozen=True)
class HistoryChanges:
    """What to write after a cycle: the histories that changed, and the workloads whose
    history goes (the workload and its assignment are gone)."""

    changed: Mapping[str, WorkloadHistory]
    gone: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.changed) or bool(self.gone)


def history_changes(histories: Mapping[str, WorkloadHistory], snapshot: ClusterSnapshot,
                    now: float, keep: int = HISTORY_KEEP,
                    quiet: frozenset[str] = frozenset()) -> HistoryChanges:
    """``update_history`` for every workload the snapshot or ``histories`` knows.
    ``quiet``: workloads of the snapshot that ended (``hafo.decisions.live_view.dormant``):
    passed over where their history's last epoch is closed (it cannot change)."""
    changed: dict[str, WorkloadHistory] = {}
    gone: list[str] = []
    closed = {wid for wid in quiet if _closed(histories.get(wid))}
    for wid in {*snapshot.workloads, *snapshot.assignments, *histories} - closed:
        previous = histories.get(wid)
        new = update_history(previous, snapshot, wid, now, keep)
        if new is None:
            if previous is not None:
                gone.append(wid)
        elif new is not previous:
            changed[wid] = new
    return HistoryChanges(dict(sorted(changed.items())), tuple(sorted(gone)))
