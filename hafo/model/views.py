"""The public JSON shapes (DESIGN.md part B) computed from a snapshot: used by CLI and API."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hafo.model.cluster import (
    CheckpointInfo,
    ClusterSnapshot,
    Event,
    Submission,
    WorkloadState,
)

NODE_STATES = ("ready", "cordoned", "unhealthy", "down")
WORKLOAD_STATES = ("pending", "starting", "running", "stopping", "completed", "failed")


def workload_state(snapshot: ClusterSnapshot, workload_id: str) -> WorkloadState:
    """The contract's workload state, derived from assignment and the agent's report."""
    assignment = snapshot.assignments.get(workload_id)
    if assignment is None or assignment.phase == "pending":
        return "pending"
    if assignment.phase in ("completed", "failed"):
        return assignment.phase
    if assignment.phase == "moving":
        return "stopping"
    status = snapshot.current_status(workload_id)
    if status is None:
        return "starting"
    if status.state == "exited":
        return "completed" if status.exit_code == 0 else "failed"
    return status.state


def latest_checkpoint(snapshot: ClusterSnapshot, workload_id: str) -> CheckpointInfo | None:
    """The newest checkpoint any agent reported for the workload (newest epoch, then step)."""
    best: CheckpointInfo | None = snapshot.checkpoints.get(workload_id)
    for (wid, _node), status in snapshot.statuses.items():
        ck = status.checkpoint
        if wid != workload_id or ck is None:
            continue
        if best is None or (ck.epoch, ck.step) > (best.epoch, best.step):
            best = ck
    return best


def workload_view(snapshot: ClusterSnapshot, workload_id: str) -> dict[str, Any]:
    """``{"id", "name", "state", "node", "epoch", "restarts", "gpus", "checkpoint"}``."""
    submission = snapshot.workloads[workload_id]
    assignment = snapshot.assignments.get(workload_id)
    placed = assignment is not None and assignment.holds_node
    node = assignment.node if placed and assignment is not None else None
    gpu_uuids: list[str] = []
    if placed and assignment is not None and node is not None:
        record = snapshot.nodes.get(node)
        by_index = {g.index: g.uuid for g in record.gpus} if record else {}
        gpu_uuids = [by_index.get(i, str(i)) for i in assignment.gpus]
    checkpoint = latest_checkpoint(snapshot, workload_id)
    view: dict[str, Any] = {
        "id": workload_id,
        "name": submission.spec.name,
        "state": workload_state(snapshot, workload_id),
        "node": node,
        "epoch": (assignment.stopping or assignment.epoch) if placed and assignment is not None
        else None,
        "restarts": assignment.restarts if assignment is not None else 0,
        "gpus": gpu_uuids,
        "checkpoint": checkpoint.to_dict() if checkpoint else None,
        "priority": submission.spec.priority,
        "submitted_at": submission.submitted_at,
        "reason": assignment.reason if assignment is not None else "waiting for the controller",
    }
    return view


def submitted_view(submission: Submission) -> dict[str, Any]:
    """The view of a workload just submitted (not placed yet)."""
    return {"id": submission.id, "name": submission.spec.name, "state": "pending",
            "node": None, "epoch": None, "restarts": 0, "gpus": [], "checkpoint": None,
            "priority": submission.spec.priority, "submitted_at": submission.submitted_at,
            "reason": "waiting for the controller"}


def allocations(snapshot: ClusterSnapshot, node: str) -> dict[int, str]:
    """GPU index -> workload id for the placed workloads of ``node``."""
    out: dict[int, str] = {}
    for wid in snapshot.holders.get(node, ()):
        for index in snapshot.assignments[wid].gpus:
            out[index] = wid
    return out


def node_view(snapshot: ClusterSnapshot, name: str) -> dict[str, Any]:
    """``{"name", "state", "labels", "gpus": [...], "workloads": [...]}``."""
    record = snapshot.nodes[name]
    alloc = allocations(snapshot, name)
    return {
        "name": name,
        "state": snapshot.node_state(name),
        "labels": dict(record.labels),
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib,
             "healthy": g.healthy, "allocated_to": alloc.get(g.index),
             "degraded": g.degraded, "reason": g.reason, "utilization": g.utilization,
             "profile": g.profile, "parent": g.parent}
            for g in record.gpus
        ],
        "workloads": sorted(snapshot.holders.get(name, ())),
        "reason": record.reason,
    }


def status_view(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """``{"leader", "controllers", "nodes": {state: n}, "workloads": {state: n}}``."""
    node_counts: Counter[str] = Counter(snapshot.node_state(n) for n in snapshot.nodes)
    wl_counts: Counter[str] = Counter(workload_state(snapshot, w) for w in snapshot.workloads)
    return {
        "leader": snapshot.leader,
        "controllers": list(snapshot.controllers),
        "nodes": {s: node_counts.get(s, 0) for s in NODE_STATES},
        "workloads": {s: wl_counts.get(s, 0) for s in WORKLOAD_STATES},
    }


def all_nodes(snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """Every node's view, sorted by name."""
    return [node_view(snapshot, n) for n in sorted(snapshot.nodes)]


def all_workloads(snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """Every workload's view, oldest submission first."""
    order = sorted(snapshot.workloads.values(), key=lambda s: (s.submitted_at, s.id))
    return [workload_view(snapshot, s.id) for s in order]


def event_view(event: Event) -> dict[str, Any]:
    """An event's JSON form."""
    return event.to_dict()
