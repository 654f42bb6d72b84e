"""The JSON of ``hafo show WORKLOAD --json`` and ``GET /v1/workloads/{id}/history``: a
workload's spec, where it runs now, every epoch it had and its recent events. One function
(``show_view``) makes it for both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.cluster import ClusterSnapshot, Event, Phase
from hafo.model.history import EpochEnd, EpochRecord, WorkloadHistory
from hafo.model.schema import JsonOf
from hafo.model.spec import WorkloadSpec
from hafo.model.views import CheckpointJson, RestartWindowView, workload_view

#: The contract's objects, as their records' ``to_dict()``.
EndJson = Annotated[dict[str, Any] | None, JsonOf(EpochEnd | None)]
SpecJson = Annotated[dict[str, Any], JsonOf(WorkloadSpec)]
EventJson = Annotated[dict[str, Any], JsonOf(Event)]


class EpochView(TypedDict):
    """One epoch: its node (rank 0's for a gang) and ``nodes`` (every member's, by rank),
    when it was assigned, started and ended, how it ended (``end``: ``{"how", "code",
    "detail"}``; ``how``: the same for people, "stopping: ..." while it is being stopped,
    null while it runs), the restart count and the checkpoint it resumed from."""

    epoch: int
    node: str | None
    nodes: list[str]
    assigned_at: float
    started_at: float | None
    ended_at: float | None
    end: EndJson
    how: str | None
    restarts: int
    resumed_from: CheckpointJson


class MemberRestoreView(TypedDict):
    """How one gang member restored at its start: its rank, node, the tier (``own``, ``peer``,
    ``disk``, ``none``), the step and the seconds it took."""

    rank: int
    node: str
    tier: str
    step: int | None
    seconds: float


class NowView(TypedDict):
    """Where the workload is now: the assignment's phase (null before the controller placed
    it), the workload's state, node(s), epoch, restart count (ever, and the restart policy's
    count now: ``restart_window``), the reason, the newest checkpoint (as in the workload
    view) and how each gang member restored at its start (``members``' ``restored``: a
    workload using ``TieredCheckpointer``; the members that said, by rank)."""

    phase: Phase | None
    state: str
    node: str | None
    nodes: list[str]
    epoch: int | None
    restarts: int
    restart_window: RestartWindowView | None
    reason: str
    checkpoint: CheckpointJson
    restored: list[MemberRestoreView]


class ShowView(TypedDict):
    """A workload's spec, where it runs now, its epochs (oldest first) and its newest
    events (oldest first). ``service``: the service a replica belongs to (else null)."""

    id: str
    name: str
    service: str | None
    submitted_at: float
    spec: SpecJson
    now: NowView
    history: list[EpochView]
    events: list[EventJson]


def epoch_how(record: EpochRecord) -> str | None:
    """How an epoch ended, for people ("stopping: ..." while it is being stopped; None
    while it runs)."""
    if record.end is None:
        return None
    text = record.end.describe()
    return text if record.over else f"stopping: {text}"


def epoch_view(record: EpochRecord) -> EpochView:
    """One epoch's JSON."""
    return {"epoch": record.epoch, "node": record.node, "nodes": list(record.nodes),
            "assigned_at": record.assigned_at, "started_at": record.started_at,
            "ended_at": record.ended_at,
            "end": record.end.to_dict() if record.end is not None else None,
            "how": epoch_how(record), "restarts": record.restarts,
            "resumed_from": (record.resumed_from.to_dict()
                             if record.resumed_from is not None else None)}


def show_view(snapshot: ClusterSnapshot, workload_id: str, history: WorkloadHistory | None,
              events: Sequence[Event], now: float | None = None) -> ShowView:
    """The view of one workload of ``snapshot`` (the workload must be in it), with its
    stored ``history`` and its recent ``events``."""
    submission = snapshot.workloads[workload_id]
    current = workload_view(snapshot, workload_id, now)
    assignment = snapshot.assignments.get(workload_id)
    nodes = list(assignment.nodes) if assignment is not None else []
    return {
        "id": workload_id,
        "name": submission.spec.name,
        "service": submission.service,
        "submitted_at": submission.submitted_at,
        "spec": submission.spec.to_dict(),
        "now": {"phase": assignment.phase if assignment is not None else None,
                "state": current["state"], "node": current["node"], "nodes": nodes,
                "epoch": current["epoch"], "restarts": current["restarts"],
                "restart_window": current["restart_window"],
                "reason": current["reason"], "checkpoint": current["checkpoint"],
                "restored": [{"rank": m["rank"], "node": m["node"],
                              "tier": m["restored"]["tier"], "step": m["restored"]["step"],
                              "seconds": m["restored"]["seconds"]}
                             for m in current["members"] if m["restored"] is not None]},
        "history": [epoch_view(r) for r in history.epochs] if history is not None else [],
        "events": [e.to_dict() for e in events],
    }
