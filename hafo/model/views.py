"""The public JSON shapes (docs/reference/http.md, "JSON shapes") computed from a snapshot: used
by the CLI and the API."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, NotRequired, get_args

from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Event,
    InstanceStatus,
    Member,
    NodeState,
    Submission,
    WorkloadState,
)
from hafo.model.endpoints import instance_ready
from hafo.model.exits import failure_subject
from hafo.model.schema import JsonOf
from hafo.model.service_state import service_state

NODE_STATES: tuple[str, ...] = get_args(NodeState)
WORKLOAD_STATES: tuple[str, ...] = get_args(WorkloadState)

#: The contract's ``checkpoint`` object (``CheckpointInfo.to_dict()``), or null.
CheckpointJson = Annotated[dict[str, Any] | None, JsonOf(CheckpointInfo | None)]


class RestoreView(TypedDict):
    """How a member's slowest rank restored at its start (``InstanceStatus.restored``)."""

    rank: int
    tier: str
    step: int | None
    seconds: float


class PreflightView(TypedDict):
    """A member's pre-flight (``InstanceStatus.preflight``): whether the gang passed, why not,
    how long it took, this member's own probe and the gang's collective figures."""

    passed: bool
    why: str
    seconds: float
    backend: str
    compute: float | None
    small_latency: float | None
    large_bandwidth: float | None


class MemberView(TypedDict):
    """One member of a gang: its rank, node, state (of its instance at the gang's epoch), the
    UUIDs of its GPUs and their indexes on its node (in the same order), and how it restored
    (null until its SDK says: a workload using ``TieredCheckpointer``)."""

    rank: int
    node: str
    state: str
    gpus: list[str]
    gpu_indexes: list[int]
    restored: RestoreView | None
    preflight: PreflightView | None


class RestartWindowView(TypedDict):
    """The restart policy's count (``spec.restart``): ``restarts`` counted in place within the
    last ``window`` seconds (since it last moved); one more failure once ``max_restarts``
    are used moves it to another node. A workload's ``restarts`` counts them all, ever."""

    restarts: int
    max_restarts: int
    window: float


class ReplicaView(TypedDict):
    """One replica of a service: its id, node, instance state, whether it is in rotation,
    whether it runs the service's current spec and whether it is being replaced."""

    id: str
    node: str | None
    state: str
    ready: bool
    current: bool
    retiring: bool
    restarts: int
    reason: str


class ServiceView(TypedDict):
    """A service's replicas: how many are wanted, ready, ready on the current spec; each."""

    desired: int
    ready: int
    current: int
    items: list[ReplicaView]


class WorkloadView(TypedDict):
    """A workload as the API and ``hafo status`` show it. ``epoch``: its instance's (the one
    being stopped while it moves); ``gpus``: the UUIDs of its GPUs (rank 0's for a gang);
    ``nodes``: the members wanted (1 for a single-node workload); ``members``: a gang's, by
    rank (empty while it is not placed, and for a single-node workload); ``replicas``: a
    service's (null for any other workload; its ``state`` is then ``running``, ``updating``,
    ``degraded`` or ``pending``, docs/reference/services.md, "Services"). ``gpus_requested``:
    the GPUs it needs in all (``gpus`` x ``nodes``; a service: x its replicas); ``ports``: its
    instance's ports by name (rank 0's for a gang); ``stderr_tail``: the last lines of stderr
    of its newest instance that exited and is still reported ("" if none); ``reason``: why it
    is where it is (``shown_reason``). ``gpu_indexes``: the indexes of ``gpus`` on its node
    (``GPU 0``), in the same order; ``restart_window``: the restart policy's count now (null
    for a service)."""

    id: str
    name: str
    state: WorkloadState
    node: str | None
    epoch: int | None
    restarts: int
    gpus: list[str]
    checkpoint: CheckpointJson
    priority: int
    submitted_at: float
    reason: str
    nodes: int
    members: list[MemberView]
    replicas: ServiceView | None
    gpus_requested: int
    ports: dict[str, int]
    stderr_tail: str
    gpu_indexes: list[int]
    restart_window: RestartWindowView | None


class GpuView(TypedDict):
    """One GPU of a node view: its record's fields and the workload it is allocated to."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool
    allocated_to: str | None
    degraded: bool
    reason: str
    utilization: float | None
    profile: str | None
    parent: int | None


class NodeView(TypedDict):
    """A node as the API and ``hafo nodes`` show it; ``api``: its agent's API URL ("" when it
    has none)."""

    name: str
    state: NodeState
    labels: dict[str, str]
    gpus: list[GpuView]
    workloads: list[str]
    reason: str
    address: str
    api: str
    containment: str


class StatusView(TypedDict):
    """The cluster summary: counts by state. The API adds how fresh its cache is: ``stale``,
    ``stale_seconds`` (null when fresh) and ``etcd_contact_age``."""

    leader: str | None
    controllers: list[str]
    nodes: dict[str, int]  # by NODE_STATES
    workloads: dict[str, int]  # by WORKLOAD_STATES
    stale: NotRequired[bool]
    stale_seconds: NotRequired[float | None]
    etcd_contact_age: NotRequired[float]


def workload_state(snapshot: ClusterSnapshot, workload_id: str) -> WorkloadState:
    """The contract's workload state, derived from assignment and the agent's report."""
    assignment = snapshot.assignments.get(workload_id)
    if assignment is None or assignment.phase == "pending":
        return "pending"
    if assignment.phase in ("completed", "failed"):
        return assignment.phase
    if assignment.phase == "moving":
        return "stopping"
    if assignment.is_gang:
        states = [_member_state(snapshot, workload_id, assignment.epoch, m.node)
                  for m in assignment.members]
        if any(s == "failed" for s in states):
            return "failed"
        if all(s == "completed" for s in states):
            return "completed"
        return "running" if all(s in ("running", "completed") for s in states) else "starting"
    status = snapshot.current_status(workload_id)
    if status is None:
        return "starting"
    if status.state == "exited":
        return "completed" if status.exit_code == 0 else "failed"
    return "stopping" if status.state == "parked" else status.state


def _member_state(snapshot: ClusterSnapshot, workload_id: str, epoch: int, node: str) -> str:
    """The state of a gang member's instance of ``epoch``: its report's, ``starting`` before
    there is one, ``completed``/``failed`` once it exited."""
    status = snapshot.statuses.get((workload_id, node))
    if status is None or status.epoch != epoch:
        return "starting"
    if status.state == "exited":
        return "completed" if status.exit_code == 0 else "failed"
    return status.state


#: The reason shown before the controller has decided anything for a workload.
NOT_DECIDED = "waiting for the controller"


def current_statuses(snapshot: ClusterSnapshot, workload_id: str) -> list[InstanceStatus]:
    """The agents' reports for the workload's current instance (each gang member's), those
    there are."""
    assignment = snapshot.assignments.get(workload_id)
    if assignment is None or not assignment.holds_node:
        return []
    out = []
    for node in assignment.nodes:
        status = snapshot.statuses.get((workload_id, node))
        if status is not None and status.epoch == assignment.epoch:
            out.append(status)
    return out


def shown_reason(state: str, assignment: Assignment | None,
                 statuses: list[InstanceStatus]) -> str:
    """Why a workload is where it is, as the views show it: its assignment's reason, except
    that it never shows a failure that is over. ``statuses``: the reports of its current
    instance (``current_statuses``).

    - running: "running" while it has never failed (no restart counted, no node to avoid),
      else "running again after: <why it was placed again>" (a restart's, a failover's
      reason); "running, but failing: <why>" while a check or an application XID fails it;
      "running, but stalled on <node>: <which rank, since when>" while an agent reports no
      progress for ``hang_timeout`` (until the leader acts on it);
    - failed or completed by its instance's report while the controller has not acted yet
      (e.g. during a restart's backoff): how it exited ("exited with code 1 on n1: <the last
      line of its stderr>");
    - no assignment yet: "waiting for the controller"."""
    if assignment is None:
        return NOT_DECIDED
    if assignment.phase != "placed":
        return assignment.reason
    if state == "running":
        failing = next((s for s in statuses if s.failing and s.state == "running"), None)
        if failing is not None:
            return f"running, but failing: {failing.failing}"
        stalled = next((s for s in statuses if s.stalled is not None and s.state == "running"
                        and s.stalled.step is not None), None)
        if stalled is not None and stalled.stalled is not None:
            return f"running, but stalled on {stalled.node}: {stalled.stalled.describe()}"
        if (assignment.restarts == 0 and not assignment.avoid) or not assignment.reason:
            return "running"
        return f"running again after: {assignment.reason}"
    if state in ("failed", "completed"):
        exited = [s for s in statuses if s.state == "exited"]
        ended = next((s for s in exited if s.exit_code != 0), exited[0] if exited else None)
        if ended is not None:
            return failure_subject(f"exited with code {ended.exit_code}", ended.node,
                                   ended.stderr_line)
    return assignment.reason


def newest_stderr_tail(snapshot: ClusterSnapshot, workload_id: str) -> str:
    """The stderr tail of the workload's newest instance that exited with one and is still
    reported (of a gang's members, one that failed first); "" if none."""
    best: tuple[int, bool, float] | None = None
    tail = ""
    for (wid, _node), status in snapshot.statuses.items():
        if wid != workload_id or status.state != "exited" or not status.stderr_tail:
            continue
        key = (status.epoch, status.exit_code != 0, -(status.finished_at or 0.0))
        if best is None or key > best:
            best, tail = key, status.stderr_tail
    return tail


def gpus_requested(submission: Submission) -> int:
    """The GPUs a workload needs in all: per node x nodes (a service: x its replicas)."""
    spec = submission.spec
    if spec.is_service and submission.service is None:
        return spec.template.gpus * spec.template.nodes * (spec.replicas or 0)
    return spec.gpus * spec.nodes


def _uuids(snapshot: ClusterSnapshot, node: str, gpus: tuple[int, ...]) -> list[str]:
    record = snapshot.nodes.get(node)
    by_index = {g.index: g.uuid for g in record.gpus} if record else {}
    return [by_index.get(i, str(i)) for i in gpus]


def members_view(snapshot: ClusterSnapshot, workload_id: str) -> list[MemberView]:
    """A placed (or stopping) gang's members, by rank."""
    assignment = snapshot.assignments.get(workload_id)
    if assignment is None or not assignment.holds_node or not assignment.is_gang:
        return []
    epoch = assignment.stopping if assignment.phase == "moving" else assignment.epoch
    return [{"rank": m.rank, "node": m.node,
             "state": ("stopping" if assignment.phase == "moving"
                       and _member_state(snapshot, workload_id, epoch, m.node) != "completed"
                       else _member_state(snapshot, workload_id, epoch, m.node)),
             "gpus": _uuids(snapshot, m.node, m.gpus), "gpu_indexes": list(m.gpus),
             "restored": _member_restored(snapshot, workload_id, epoch, m.node),
             "preflight": _member_preflight(snapshot, workload_id, epoch, m)}
            for m in assignment.members]


def _member_preflight(snapshot: ClusterSnapshot, workload_id: str, epoch: int,
                      member: Member) -> PreflightView | None:
    """The member's pre-flight at ``epoch``, as its agent reported (null: none ran, or not
    yet)."""
    status = snapshot.statuses.get((workload_id, member.node))
    if status is None or status.epoch != epoch or status.preflight is None:
        return None
    p = status.preflight
    own = next((r.compute for r in p.ranks if r.rank == member.rank), None)
    return {"passed": p.passed, "why": p.why, "seconds": p.seconds, "backend": p.backend,
            "compute": own, "small_latency": p.small_latency,
            "large_bandwidth": p.large_bandwidth}


def _member_restored(snapshot: ClusterSnapshot, workload_id: str, epoch: int,
                     node: str) -> RestoreView | None:
    """How the member's instance of ``epoch`` restored, as its agent reported."""
    status = snapshot.statuses.get((workload_id, node))
    if status is None or status.epoch != epoch or status.restored is None:
        return None
    r = status.restored
    return {"rank": r.rank, "tier": r.tier, "step": r.step, "seconds": r.seconds}


def restart_window(submission: Submission, assignment: Assignment | None,
                   now: float | None) -> RestartWindowView:
    """The restart policy's count: the restarts counted within the window before ``now`` (all
    those the assignment keeps when ``now`` is None: it drops the older ones at each
    failure), of the most the policy allows there."""
    policy = submission.spec.restart
    times = assignment.restart_times if assignment is not None else ()
    recent = [t for t in times if now is None or now - t < policy.window]
    return {"restarts": len(recent), "max_restarts": policy.max_restarts,
            "window": policy.window}


def latest_checkpoint(snapshot: ClusterSnapshot, workload_id: str) -> CheckpointInfo | None:
    """The newest checkpoint any agent reported for the workload (newest epoch, then step),
    or that its assignment remembers (``Assignment.checkpoint``: what the controller knew
    when it placed it or put it back to pending, once the reports are gone)."""
    best: CheckpointInfo | None = snapshot.checkpoints.get(workload_id)
    assignment = snapshot.assignments.get(workload_id)
    found = [assignment.checkpoint] if assignment is not None else []
    found += [status.checkpoint for (wid, _node), status in snapshot.statuses.items()
              if wid == workload_id]
    for ck in found:
        if ck is None:
            continue
        if best is None or (ck.epoch, ck.step) > (best.epoch, best.step):
            best = ck
    return best


def replicas_view(snapshot: ClusterSnapshot, service_id: str) -> ServiceView:
    """A service's replicas (oldest first) and counts (those of ``service_state``: ready
    replicas, and ready ones on the current spec; a retiring replica is never ready)."""
    service = snapshot.workloads[service_id]
    template = service.spec.template
    items: list[ReplicaView] = []
    for rid in snapshot.replicas.get(service_id, ()):
        replica = snapshot.workloads[rid]
        assignment = snapshot.assignments.get(rid)
        node = assignment.node if assignment is not None and assignment.holds_node else None
        state = workload_state(snapshot, rid)
        items.append({"id": rid, "node": node, "state": state,
                      "ready": instance_ready(snapshot, rid),
                      "current": replica.spec == template,
                      "retiring": replica.retiring is not None,
                      "restarts": assignment.restarts if assignment is not None else 0,
                      "reason": shown_reason(state, assignment,
                                             current_statuses(snapshot, rid))})
    return {"desired": service.spec.replicas or 0, "ready": sum(r["ready"] for r in items),
            "current": sum(r["ready"] and r["current"] for r in items), "items": items}


def _service_view(snapshot: ClusterSnapshot, submission: Submission,
                  now: float | None) -> WorkloadView:
    state = service_state(snapshot, submission.id, now)
    replicas = replicas_view(snapshot, submission.id)
    nodes = [r["node"] for r in replicas["items"] if r["node"] is not None]
    return {"id": submission.id, "name": submission.spec.name, "state": state.state,
            "node": None, "epoch": None,
            "restarts": sum(r["restarts"] for r in replicas["items"]), "gpus": [],
            "checkpoint": None, "priority": submission.spec.priority,
            "submitted_at": submission.submitted_at,
            "reason": state.reason or f"{state.ready} of {state.desired} replicas ready on "
                      f"{', '.join(nodes) or 'no node'}",
            "nodes": submission.spec.nodes, "members": [], "replicas": replicas,
            "gpus_requested": gpus_requested(submission), "ports": {},
            "stderr_tail": "", "gpu_indexes": [], "restart_window": None}


def workload_view(snapshot: ClusterSnapshot, workload_id: str,
                  now: float | None = None) -> WorkloadView:
    """``{"id", "name", "state", "node", "epoch", "restarts", "gpus", "checkpoint", ...}``;
    a service's with its replicas."""
    submission = snapshot.workloads[workload_id]
    if submission.spec.is_service and submission.service is None:
        return _service_view(snapshot, submission, now)
    assignment = snapshot.assignments.get(workload_id)
    placed = assignment is not None and assignment.holds_node
    node = assignment.node if placed and assignment is not None else None
    gpu_uuids: list[str] = []
    if placed and assignment is not None and node is not None:
        gpu_uuids = _uuids(snapshot, node, assignment.gpus)
    checkpoint = latest_checkpoint(snapshot, workload_id)
    state = workload_state(snapshot, workload_id)
    statuses = current_statuses(snapshot, workload_id)
    ports = next((dict(s.ports) for s in statuses if s.node == node), {})
    view: WorkloadView = {
        "id": workload_id,
        "name": submission.spec.name,
        "state": state,
        "node": node,
        "epoch": (assignment.stopping or assignment.epoch) if placed and assignment is not None
        else None,
        "restarts": assignment.restarts if assignment is not None else 0,
        "gpus": gpu_uuids,
        "checkpoint": checkpoint.to_dict() if checkpoint else None,
        "priority": submission.spec.priority,
        "submitted_at": submission.submitted_at,
        "reason": shown_reason(state, assignment, statuses),
        "nodes": submission.spec.nodes,
        "members": members_view(snapshot, workload_id),
        "replicas": None,
        "gpus_requested": gpus_requested(submission),
        "ports": ports,
        "stderr_tail": newest_stderr_tail(snapshot, workload_id),
        "gpu_indexes": list(assignment.gpus) if gpu_uuids and assignment is not None else [],
        "restart_window": restart_window(submission, assignment, now),
    }
    return view


def submitted_view(submission: Submission) -> WorkloadView:
    """The view of a workload just submitted (not placed yet)."""
    return {"id": submission.id, "name": submission.spec.name, "state": "pending",
            "node": None, "epoch": None, "restarts": 0, "gpus": [], "checkpoint": None,
            "priority": submission.spec.priority, "submitted_at": submission.submitted_at,
            "reason": NOT_DECIDED, "nodes": submission.spec.nodes,
            "members": [],
            "replicas": {"desired": submission.spec.replicas or 0, "ready": 0, "current": 0,
                         "items": []} if submission.spec.is_service else None,
            "gpus_requested": gpus_requested(submission), "ports": {}, "stderr_tail": "",
            "gpu_indexes": [],
            "restart_window": None if submission.spec.is_service
            else restart_window(submission, None, None)}


def allocations(snapshot: ClusterSnapshot, node: str) -> dict[int, str]:
    """GPU index -> workload id for the placed workloads of ``node``."""
    out: dict[int, str] = {}
    for wid in snapshot.holders.get(node, ()):
        for where, gpus in snapshot.assignments[wid].slots:
            if where == node:
                for index in gpus:
                    out[index] = wid
    return out


def node_view(snapshot: ClusterSnapshot, name: str) -> NodeView:
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
        "address": record.address,
        "api": record.api,
        "containment": record.containment,
    }


def status_view(snapshot: ClusterSnapshot) -> StatusView:
    """``{"leader", "controllers", "nodes": {state: n}, "workloads": {state: n}}``."""
    node_counts: Counter[str] = Counter(snapshot.node_state(n) for n in snapshot.nodes)
    wl_counts: Counter[str] = Counter(
        service_state(snapshot, w, None).state if s.spec.is_service and s.service is None
        else workload_state(snapshot, w)
        for w, s in snapshot.workloads.items() if s.service is None)
    return {
        "leader": snapshot.leader,
        "controllers": list(snapshot.controllers),
        "nodes": {s: node_counts.get(s, 0) for s in NODE_STATES},
        "workloads": {s: wl_counts.get(s, 0) for s in WORKLOAD_STATES},
    }


def all_nodes(snapshot: ClusterSnapshot) -> list[NodeView]:
    """Every node's view, sorted by name."""
    return [node_view(snapshot, n) for n in sorted(snapshot.nodes)]


def all_workloads(snapshot: ClusterSnapshot, now: float | None = None) -> list[WorkloadView]:
    """Every workload's view, oldest submission first (a service's replicas inside its
    view, not on their own)."""
    order = sorted((s for s in snapshot.workloads.values() if s.service is None),
                   key=lambda s: (s.submitted_at, s.id))
    return [workload_view(snapshot, s.id, now) for s in order]


def empty_cluster(snapshot: ClusterSnapshot) -> bool:
    """No node and no controller has ever registered in the cluster (or none is left): most
    likely the wrong cluster name."""
    return not snapshot.nodes and not snapshot.controllers and snapshot.leader is None


def event_view(event: Event) -> dict[str, Any]:
    """An event's JSON form."""
    return event.to_dict()
