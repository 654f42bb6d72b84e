"""Plain frozen records of cluster state, and their JSON (dict) forms.

Every record here is what one etcd key holds (see ``hafo.store.keys``), except
``ClusterSnapshot``, which is the whole picture a decision is made from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, Literal

from hafo.model.spec import WorkloadSpec

NodeState = Literal["ready", "cordoned", "unhealthy", "down"]
WorkloadState = Literal["pending", "starting", "running", "stopping", "completed", "failed"]
Phase = Literal["pending", "placed", "moving", "completed", "failed"]
InstanceState = Literal["starting", "running", "stopping", "exited"]
AfterStop = Literal["move", "restart"]
#: Why a workload in phase ``moving`` is being stopped. A planned move or a preemption says
#: nothing against its node, so the node is not avoided afterwards; the others do.
MoveCause = Literal["planned", "preempted", "node-unhealthy", "gpu-unhealthy", "gpu-degraded",
                    "app-failed"]
PLANNED_CAUSES: frozenset[str] = frozenset({"planned", "preempted"})


MIG_INDEX_BASE = 100


class InstanceEnd(StrEnum):
    """How an instance ended, as its guard (or the agent) recorded it. Carried as data, so
    that a reworded message can never change what the controller decides."""

    EXIT = "exit"  # the workload exited by itself; its exit code says how
    STOPPED = "stopped"  # the agent stopped it (planned move, failing check, deletion)
    FENCED = "fenced"  # killed at the fencing deadline or on lease loss: not its fault
    GUARD_LOST = "guard-lost"  # its guard died (or never started); the agent killed it


#: Ends caused by the infrastructure (fencing, lease loss, an etcd outage, a lost guard), not
#: by the workload: the restart that follows does not count toward ``restart.max_restarts``,
#: waits for no backoff and excludes no node (docs: README "Safety", infrastructure restarts).
INFRASTRUCTURE_ENDS = frozenset({InstanceEnd.FENCED, InstanceEnd.GUARD_LOST})


def instance_end(value: object) -> InstanceEnd | None:
    """Parse a recorded end (None when absent or unknown: an older agent's report)."""
    try:
        return InstanceEnd(str(value)) if value is not None else None
    except ValueError:
        return None


def mig_index(parent: int, slot: int) -> int:
    """The index of MIG device ``slot`` of physical GPU ``parent``: ``100 * (parent + 1) +
    slot`` (GPU 0's MIG devices are 100, 101, ...; GPU 1's 200, ...). Whole GPUs keep their
    NVML index 0..n-1, so the two never collide (a node has at most 64 GPUs, a GPU at most 7
    MIG devices)."""
    return MIG_INDEX_BASE * (parent + 1) + slot


def physical_of(index: int) -> int:
    """The physical GPU behind a GPU index (itself for a whole GPU, see ``mig_index``)."""
    return index // MIG_INDEX_BASE - 1 if index >= MIG_INDEX_BASE else index


@dataclass(frozen=True)
class Gpu:
    """One schedulable GPU of a node, as its agent reports it: a whole GPU, or one MIG device
    of a GPU in MIG mode (``profile`` like "1g.10gb", ``parent`` the physical GPU's index,
    ``index`` from ``mig_index``, ``uuid`` "MIG-...", ``memory_mib`` the slice's). A GPU in MIG
    mode is not listed itself: only its MIG devices are. ``utilization``: percent busy (0-100)
    as last measured, None when unknown."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True
    reason: str = ""
    degraded: bool = False
    lost: bool = False
    utilization: float | None = None
    profile: str | None = None
    parent: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form. ``reason`` says why it is unhealthy or degraded; ``degraded``: still
        usable but failing (work is moved off with a fresh checkpoint, nothing new placed);
        ``lost``: it does not answer at all (no checkpoint can be taken from it);
        ``utilization``, ``profile``, ``parent``: see the class (null when not applicable)."""
        return {"index": self.index, "uuid": self.uuid, "model": self.model,
                "memory_mib": self.memory_mib, "healthy": self.healthy, "reason": self.reason,
                "degraded": self.degraded, "lost": self.lost, "utilization": self.utilization,
                "profile": self.profile, "parent": self.parent}

    @property
    def usable(self) -> bool:
        """May new work be placed on it."""
        return self.healthy and not self.degraded

    @property
    def physical(self) -> int:
        """The index of the physical GPU (its own for a whole GPU, the parent's for MIG)."""
        return self.parent if self.parent is not None else physical_of(self.index)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Gpu:
        """Inverse of ``to_dict``."""
        utilization = d.get("utilization")
        profile = d.get("profile")
        parent = d.get("parent")
        return Gpu(index=int(d["index"]), uuid=str(d["uuid"]), model=str(d["model"]),
                   memory_mib=int(d["memory_mib"]), healthy=bool(d.get("healthy", True)),
                   reason=str(d.get("reason", "")), degraded=bool(d.get("degraded", False)),
                   lost=bool(d.get("lost", False)),
                   utilization=None if utilization is None else float(utilization),
                   profile=None if profile is None else str(profile),
                   parent=None if parent is None else int(parent))


@dataclass(frozen=True)
class NodeRecord:
    """A node's inventory and health, written by its agent (outlives the agent)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    healthy: bool = True
    reason: str = ""
    api: str = ""
    failsafe_seen: int = 0
    lease: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form. ``lease``: the lease of the agent that registered the node last (a
        claimant waits while it lives, even if the liveness key was deleted)."""
        return {"name": self.name, "labels": dict(self.labels),
                "gpus": [g.to_dict() for g in self.gpus], "healthy": self.healthy,
                "reason": self.reason, "api": self.api, "failsafe_seen": self.failsafe_seen,
                "lease": self.lease}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> NodeRecord:
        """Inverse of ``to_dict``."""
        return NodeRecord(name=str(d["name"]), labels=dict(d.get("labels") or {}),
                          gpus=tuple(Gpu.from_dict(g) for g in d.get("gpus") or ()),
                          healthy=bool(d.get("healthy", True)), reason=str(d.get("reason", "")),
                          api=str(d.get("api", "")),
                          failsafe_seen=int(d.get("failsafe_seen", 0)),
                          lease=int(d.get("lease", 0)))


@dataclass(frozen=True)
class Liveness:
    """The lease-bound key that says a node's agent is alive.

    ``claimed``: the etcd revision at which this agent verified that the node name was free
    (no live lease held it). Instances of epochs up to it belong to an earlier holder of the
    name: the agent never starts them, and the controller places them again (0: an agent
    that predates the claim rule)."""

    node: str
    lease: int
    since: float
    claimed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"node": self.node, "lease": self.lease, "since": self.since,
                "claimed": self.claimed}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Liveness:
        """Inverse of ``to_dict``."""
        return Liveness(node=str(d["node"]), lease=int(d["lease"]), since=float(d["since"]),
                        claimed=int(d.get("claimed", 0)))


@dataclass(frozen=True)
class Assignment:
    """The controller's decision for one workload.

    ``epoch`` is the etcd revision that wrote this assignment (the key's mod_revision): a
    new instance (a move or a restart) always gets a new, larger epoch.
    """

    workload: str
    phase: Phase
    node: str | None = None
    gpus: tuple[int, ...] = ()
    epoch: int = 0
    restarts: int = 0
    restart_times: tuple[float, ...] = ()
    reason: str = ""
    avoid: Mapping[str, float] = field(default_factory=dict)
    stopping: int = 0
    move_to: str | None = None
    urgent: bool = False
    after_stop: AfterStop = "move"
    not_before: float = 0.0
    failed_on: Mapping[str, float] = field(default_factory=dict)
    preempted_for: str | None = None
    cause: MoveCause | None = None

    @property
    def holds_node(self) -> bool:
        """Placed, or being moved off its node (its instance still runs there)."""
        return self.phase in ("placed", "moving") and self.node is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the epoch is not stored: it is the key's revision).

        Phase ``moving``: the instance of epoch ``stopping`` on ``node`` is stopped (after a
        checkpoint, unless ``urgent``), then, not before ``not_before``, the workload is placed
        again: ``after_stop`` ``restart`` prefers the same node, ``move`` another one (or
        ``move_to``). ``failed_on``: nodes where it failed too often, excluded until then.
        ``preempted_for``: the higher-priority workload this move makes room for (its GPUs
        are held for that workload, on this node, until it is placed). ``cause``: why a
        ``moving`` workload is stopped (``MoveCause``; null in other phases).
        """
        return {"workload": self.workload, "phase": self.phase, "node": self.node,
                "gpus": list(self.gpus), "restarts": self.restarts,
                "restart_times": list(self.restart_times), "reason": self.reason,
                "avoid": dict(self.avoid), "stopping": self.stopping, "move_to": self.move_to,
                "urgent": self.urgent, "after_stop": self.after_stop,
                "not_before": self.not_before, "failed_on": dict(self.failed_on),
                "preempted_for": self.preempted_for, "cause": self.cause}

    @staticmethod
    def from_dict(d: Mapping[str, Any], epoch: int) -> Assignment:
        """Inverse of ``to_dict``; ``epoch`` comes from the key's mod_revision."""
        return Assignment(workload=str(d["workload"]), phase=d["phase"], node=d.get("node"),
                          gpus=tuple(int(g) for g in d.get("gpus") or ()), epoch=epoch,
                          restarts=int(d.get("restarts", 0)),
                          restart_times=tuple(float(t) for t in d.get("restart_times") or ()),
                          reason=str(d.get("reason", "")),
                          avoid={str(k): float(v) for k, v in (d.get("avoid") or {}).items()},
                          stopping=int(d.get("stopping", 0)), move_to=d.get("move_to"),
                          urgent=bool(d.get("urgent", False)),
                          after_stop="restart" if d.get("after_stop") == "restart" else "move",
                          not_before=float(d.get("not_before", 0.0)),
                          failed_on={str(k): float(v)
                                     for k, v in (d.get("failed_on") or {}).items()},
                          preempted_for=(None if d.get("preempted_for") is None
                                         else str(d["preempted_for"])),
                          cause=_move_cause(d.get("cause")))


_MOVE_CAUSES: dict[str, MoveCause] = {c: c for c in (
    "planned", "preempted", "node-unhealthy", "gpu-unhealthy", "gpu-degraded", "app-failed")}


def _move_cause(value: object) -> MoveCause | None:
    return _MOVE_CAUSES.get(str(value)) if value is not None else None


@dataclass(frozen=True)
class CheckpointInfo:
    """The newest committed checkpoint of a workload."""

    step: int
    epoch: int
    path: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the contract's ``checkpoint`` object)."""
        return {"step": self.step, "epoch": self.epoch, "path": self.path}

    @staticmethod
    def from_dict(d: Mapping[str, Any] | None) -> CheckpointInfo | None:
        """Inverse of ``to_dict``; None stays None."""
        if not d:
            return None
        return CheckpointInfo(step=int(d["step"]), epoch=int(d["epoch"]), path=str(d["path"]))


@dataclass(frozen=True)
class InstanceStatus:
    """What a node's agent reports about one instance (workload at an epoch) it runs."""

    workload: str
    node: str
    epoch: int
    state: InstanceState
    pid: int | None = None
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    checkpoint: CheckpointInfo | None = None
    failing: str = ""
    ended: InstanceEnd | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form. ``failing``: why the running instance is considered failed (a check
        past its failure threshold, an application XID on its GPU), "" when it is fine.
        ``ended``: how an exited instance ended (``InstanceEnd``), null while it runs."""
        return {"workload": self.workload, "node": self.node, "epoch": self.epoch,
                "state": self.state, "pid": self.pid, "exit_code": self.exit_code,
                "started_at": self.started_at, "finished_at": self.finished_at,
                "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
                "failing": self.failing,
                "ended": self.ended.value if self.ended is not None else None}

    @property
    def ended_by_infrastructure(self) -> bool:
        """Exited because of fencing, lease loss or a lost guard (``INFRASTRUCTURE_ENDS``)."""
        return self.ended in INFRASTRUCTURE_ENDS

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> InstanceStatus:
        """Inverse of ``to_dict``."""
        return InstanceStatus(workload=str(d["workload"]), node=str(d["node"]),
                              epoch=int(d["epoch"]), state=d["state"], pid=d.get("pid"),
                              exit_code=d.get("exit_code"), started_at=d.get("started_at"),
                              finished_at=d.get("finished_at"),
                              checkpoint=CheckpointInfo.from_dict(d.get("checkpoint")),
                              failing=str(d.get("failing") or ""),
                              ended=instance_end(d.get("ended")))


@dataclass(frozen=True)
class Event:
    """Something that happened, for people (``hafo events``)."""

    ts: float
    kind: str
    message: str
    workload: str | None = None
    node: str | None = None
    epoch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"ts": self.ts, "kind": self.kind, "message": self.message,
                "workload": self.workload, "node": self.node, "epoch": self.epoch}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Event:
        """Inverse of ``to_dict``."""
        return Event(ts=float(d["ts"]), kind=str(d["kind"]), message=str(d["message"]),
                     workload=d.get("workload"), node=d.get("node"), epoch=d.get("epoch"))


@dataclass(frozen=True)
class Submission:
    """A workload as submitted: its id, spec and submit time (key ``workloads/<id>``)."""

    id: str
    spec: WorkloadSpec
    submitted_at: float


@dataclass(frozen=True)
class FailsafeSet:
    """The controllers agents must all hear from; ``version`` grows with every change."""

    version: int = 0
    members: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"version": self.version, "members": {k: dict(v) for k, v in
                                                     self.members.items()}}

    @staticmethod
    def from_dict(data: Mapping[str, Any] | None) -> FailsafeSet:
        """Inverse of ``to_dict`` (None -> the empty set, version 0)."""
        if not data:
            return FailsafeSet()
        return FailsafeSet(int(data.get("version", 0)),
                           {str(k): dict(v) for k, v in (data.get("members") or {}).items()})

    def apis(self) -> dict[str, str]:
        """name -> API base URL."""
        return {name: str(m.get("api", "")) for name, m in self.members.items()}


@dataclass(frozen=True)
class MoveRequest:
    """An operator's request to move a workload (``hafo migrate``, ``hafo drain``)."""

    workload: str
    to: str | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"workload": self.workload, "to": self.to, "reason": self.reason}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MoveRequest:
        """Inverse of ``to_dict``."""
        return MoveRequest(str(d["workload"]), d.get("to"), str(d.get("reason", "")))


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a decision needs, read at one etcd revision."""

    revision: int
    nodes: Mapping[str, NodeRecord]
    alive: Mapping[str, Liveness]
    cordoned: frozenset[str]
    workloads: Mapping[str, Submission]
    assignments: Mapping[str, Assignment]
    statuses: Mapping[tuple[str, str], InstanceStatus]
    leader: str | None = None
    controllers: tuple[str, ...] = ()
    controller_apis: Mapping[str, str] = field(default_factory=dict)
    failsafe: FailsafeSet = FailsafeSet()
    moves: Mapping[str, MoveRequest] = field(default_factory=dict)
    checkpoints: Mapping[str, CheckpointInfo] = field(default_factory=dict)

    def node_state(self, name: str) -> NodeState:
        """Derived node state: down > unhealthy > cordoned > ready."""
        if name not in self.alive:
            return "down"
        record = self.nodes.get(name)
        if record is None or not record.healthy:
            return "unhealthy"
        if name in self.cordoned:
            return "cordoned"
        return "ready"

    @cached_property
    def holders(self) -> Mapping[str, tuple[str, ...]]:
        """node -> the workloads whose assignments hold it (placed or moving there), sorted;
        computed once per snapshot."""
        by_node: dict[str, list[str]] = {}
        for wid, assignment in self.assignments.items():
            if assignment.holds_node and assignment.node is not None:
                by_node.setdefault(assignment.node, []).append(wid)
        return {node: tuple(sorted(wids)) for node, wids in by_node.items()}

    def current_status(self, workload: str) -> InstanceStatus | None:
        """The agent's report for the workload's current assignment (same node and epoch)."""
        assignment = self.assignments.get(workload)
        if assignment is None or assignment.node is None:
            return None
        status = self.statuses.get((workload, assignment.node))
        if status is None or status.epoch != assignment.epoch:
            return None
        return status
