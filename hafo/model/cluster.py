"""Plain frozen records of cluster state, and their JSON (dict) forms.

Every record here is what one etcd key holds (see ``hafo.store.keys``), except
``ClusterSnapshot``, which is the whole picture a decision is made from. Each record's
dataclass is the declaration of its JSON form: ``to_dict``, ``from_dict`` and the codec's
decoding (``RECORDS``) come from it (``hafo.model.schema.Record``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

from hafo.model.ends import INFRASTRUCTURE_ENDS as INFRASTRUCTURE_ENDS
from hafo.model.ends import InstanceEnd as InstanceEnd
from hafo.model.ends import instance_end as instance_end
from hafo.model.exits import bounded_tail, stderr_line
from hafo.model.preflight import Preflight
from hafo.model.queues import QueueSpec
from hafo.model.schema import Record, schema_of
from hafo.model.spec import WorkloadSpec

NodeState = Literal["ready", "cordoned", "unhealthy", "down"]
WorkloadState = Literal["pending", "starting", "running", "stopping", "completed", "failed",
                        "degraded", "updating"]
Phase = Literal["pending", "placed", "moving", "completed", "failed"]
InstanceState = Literal["starting", "running", "stopping", "parked", "exited"]
AfterStop = Literal["move", "restart"]
#: Why a workload in phase ``moving`` is being stopped. A planned move or a preemption says
#: nothing against its node, so the node is not avoided afterwards; the others do.
MoveCause = Literal["planned", "preempted", "node-unhealthy", "gpu-unhealthy", "gpu-degraded",
                    "app-failed", "member-lost", "infrastructure", "hung", "straggler",
                    "preflight"]
PLANNED_CAUSES: frozenset[str] = frozenset({"planned", "preempted"})


MIG_INDEX_BASE = 100


def mig_index(parent: int, slot: int) -> int:
    """The index of MIG device ``slot`` of physical GPU ``parent``: ``100 * (parent + 1) +
    slot`` (GPU 0's MIG devices are 100, 101, ...; GPU 1's 200, ...). Whole GPUs keep their
    NVML index 0..n-1, so the two never collide (a node has at most 64 GPUs, a GPU at most 7
    MIG devices)."""
    return MIG_INDEX_BASE * (parent + 1) + slot


def physical_of(index: int) -> int:
    """The physical GPU behind a GPU index (itself for a whole GPU, see ``mig_index``)."""
    return index // MIG_INDEX_BASE - 1 if index >= MIG_INDEX_BASE else index


@dataclass(frozen=True, slots=True)
class Gpu(Record):
    """One schedulable GPU of a node, as its agent reports it: a whole GPU, or one MIG device
    of a GPU in MIG mode (``profile`` like "1g.10gb", ``parent`` the physical GPU's index,
    ``index`` from ``mig_index``, ``uuid`` "MIG-...", ``memory_mib`` the slice's). A GPU in MIG
    mode is not listed itself: only its MIG devices are. ``utilization``: percent busy (0-100)
    as last measured, None when unknown.

    ``reason`` says why it is unhealthy or degraded; ``degraded``: still usable but failing
    (work is moved off with a fresh checkpoint, nothing new placed); ``lost``: it does not
    answer at all (no checkpoint can be taken from it)."""

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

    @property
    def usable(self) -> bool:
        """May new work be placed on it."""
        return self.healthy and not self.degraded

    @property
    def physical(self) -> int:
        """The index of the physical GPU (its own for a whole GPU, the parent's for MIG)."""
        return self.parent if self.parent is not None else physical_of(self.index)


@dataclass(frozen=True, slots=True)
class ResourceFault(Record):
    """A fault an agent found in a resource that other nodes may share (its checkpoint
    filesystem full or not writable): ``kind`` the finding's (``disk_full``,
    ``disk_readonly``), ``resource`` what it is about (``checkpoint root PATH``: the same
    text on every node that uses the same path), ``message`` the finding with its units.
    The agent does not mark its node unhealthy for it: the leader decides whether it is the
    node's own fault or a cluster condition (``hafo.decisions.shared_faults``)."""

    kind: str
    resource: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class NodeRecord(Record):
    """A node's inventory and health, written by its agent (outlives the agent).

    ``lease``: the lease of the agent that registered the node last (a claimant waits while it
    lives, even if the liveness key was deleted). ``address``: where the node's peers reach
    it (``node.address``; a gang's ``MASTER_ADDR``). ``containment``: how the agent holds
    each instance's processes: ``cgroup``, or ``processes (...)`` with why no cgroup could be
    made (docs/safety.md, rule 7; "" from an agent that predates it). ``resource_faults``:
    faults in resources other nodes may share, held like its health (see ``ResourceFault``;
    ``healthy`` does not count them)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    healthy: bool = True
    reason: str = ""
    api: str = ""
    failsafe_seen: int = 0
    lease: int = 0
    address: str = ""
    containment: str = ""
    resource_faults: tuple[ResourceFault, ...] = ()


@dataclass(frozen=True, slots=True)
class Liveness(Record):
    """The lease-bound key that says a node's agent is alive.

    ``claimed``: the epoch of this agent's claim: the etcd revision at which it verified
    that the node name was free (no live lease held it), plus the generation's
    ``epoch_base`` (so it compares with epochs across an operator's restore). Instances of
    epochs up to it belong to an earlier holder of the name: the agent never starts them,
    and the controller places them again (0: an agent that predates the claim rule)."""

    node: str
    lease: int
    since: float
    claimed: int = 0


def _from_context(value: int, info: ValidationInfo) -> int:
    """The key's mod_revision, given as the validation context's ``epoch``, plus the
    assignment's ``epoch_base`` (validated before it)."""
    context = info.context
    if not context or "epoch" not in context:
        return value
    base = info.data.get("epoch_base", 0) if isinstance(info.data, dict) else 0
    return int(context["epoch"]) + int(base)


def _after_stop(value: object) -> AfterStop:
    return "restart" if value == "restart" else "move"


_MOVE_CAUSES: dict[str, MoveCause] = {c: c for c in (
    "planned", "preempted", "node-unhealthy", "gpu-unhealthy", "gpu-degraded", "app-failed",
    "member-lost", "infrastructure", "hung", "straggler", "preflight")}


def _move_cause(value: object) -> MoveCause | None:
    return _MOVE_CAUSES.get(str(value)) if value is not None else None


def _or_empty(value: object) -> object:
    return "" if value is None else value


@dataclass(frozen=True, slots=True)
class Member(Record):
    """One member of a gang's assignment: its rank, node, GPUs there and the node's address
    (rank 0's is the gang's ``MASTER_ADDR``)."""

    rank: int
    node: str
    gpus: tuple[int, ...] = ()
    address: str = ""


Slot = tuple[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Assignment(Record):
    """The controller's decision for one workload.

    ``epoch`` is the etcd revision that wrote this assignment (the key's mod_revision, its
    ``revision``) plus ``epoch_base``, the cluster identity's for the generation it was
    written in (``hafo.decisions.store_trust``): a new instance (a move or a restart) always
    gets a new, larger epoch, also after etcd lost its data and an operator restored it. It
    is not in the JSON form: it comes from the key's revision.

    Phase ``moving``: the instance of epoch ``stopping`` on ``node`` is stopped (after a
    checkpoint, unless ``urgent``), then, not before ``not_before``, the workload is placed
    again: ``after_stop`` ``restart`` prefers the same node, ``move`` another one (or
    ``move_to``). ``failed_on``: nodes where it failed too often, excluded until then.
    ``preempted_for``: the higher-priority workload this move makes room for (its GPUs
    are held for that workload, on this node, until it is placed). ``cause``: why a
    ``moving`` workload is stopped (``MoveCause``; null in other phases).

    A gang (``members`` not empty) has one assignment and one epoch for all its members;
    ``master_port`` is its rendezvous port for this epoch; ``leave``: while ``moving``, the
    nodes whose members are placed elsewhere next (a planned move, a bad node); ``park``:
    while ``moving``, the nodes whose members park instead of stopping (``warm`` gangs: their
    processes are handed the next epoch, docs/safety.md, "Warm survivors keep the epoch
    rule"); ``standby``: a placed ``warm`` gang's standbys, each on a spare node with the
    GPUs a member would take there (``rank`` -1): a process started and parked at once, that
    becomes the member placed on its node next (docs/reference/gangs.md, "Warm spares");
    ``revision_of``: in the per-node copy written for a standby chosen after the gang was
    placed (``StandbyRecord``), the revision of the assignment it copies; the copy's own mod
    revision, later, is the standby instance's epoch (its agent's claim of the node may be
    newer than the gang's epoch: a node that came back).

    ``quick_restarts``: uncounted restarts (the infrastructure's) in a row of instances that
    ran less than a minute, for their backoff (``hafo.decisions.failures.uncounted_backoff``);
    0 once any other restart or a longer run ends the row.

    ``failure``: how its last instance failed (``member 0 exited with code 127 on n1: could
    not start: ...``), from the failure until it is placed again: a pending assignment's
    reason starts with it. ``checkpoint``: the newest checkpoint the controller knew of when
    it placed the workload or put it back to pending (where its next instance resumes, as far
    as known; null: none known): the views show it once the reports that named it are gone.

    ``suspects``: nodes a hang was blamed on (``hang_timeout``), until then (the deciding
    controller's clock): another hang blamed on one of them moves that member elsewhere.

    ``preflight``: a placed gang's members run the spec's pre-flight before their command
    (``hafo.decisions.gang_preflight.needs_preflight``: a new set of nodes).
    """

    workload: str
    phase: Phase
    node: str | None = None
    gpus: tuple[int, ...] = ()
    epoch_base: int = 0
    epoch: Annotated[int, Field(exclude=True, validate_default=True),
                     AfterValidator(_from_context)] = 0
    restarts: int = 0
    restart_times: tuple[float, ...] = ()
    reason: str = ""
    avoid: Mapping[str, float] = field(default_factory=dict)
    stopping: int = 0
    move_to: str | None = None
    urgent: bool = False
    after_stop: Annotated[AfterStop, BeforeValidator(_after_stop)] = "move"
    not_before: float = 0.0
    failed_on: Mapping[str, float] = field(default_factory=dict)
    preempted_for: str | None = None
    cause: Annotated[MoveCause | None, BeforeValidator(_move_cause)] = None
    members: tuple[Member, ...] = ()
    master_port: int = 0
    leave: tuple[str, ...] = ()
    park: tuple[str, ...] = ()
    standby: tuple[Member, ...] = ()
    revision_of: int = 0
    quick_restarts: int = 0
    failure: str = ""
    checkpoint: CheckpointInfo | None = None
    suspects: Mapping[str, float] = field(default_factory=dict)
    preflight: bool = False

    @property
    def revision(self) -> int:
        """The etcd revision that wrote this assignment (its key's mod revision): what a
        compare-and-swap on it names."""
        return self.epoch - self.epoch_base

    @property
    def ended(self) -> bool:
        """Completed or failed: it runs nothing, and nothing restarts it."""
        return self.phase in ("completed", "failed")

    @property
    def holds_node(self) -> bool:
        """Placed, or being moved off its node (its instance still runs there)."""
        return self.phase in ("placed", "moving") and self.node is not None

    @property
    def is_gang(self) -> bool:
        """A gang's assignment (``members`` lists every member; ``node`` and ``gpus`` are rank
        0's)."""
        return bool(self.members)

    @property
    def slots(self) -> tuple[Slot, ...]:
        """(node, GPUs) of every instance this assignment places: one per gang member, else
        the one of ``node``; none unless it is placed or moving (a pending gang may remember
        its previous members, to keep their ranks and nodes when it is placed again)."""
        if self.phase not in ("placed", "moving"):
            return ()
        if self.members:
            return tuple((m.node, m.gpus) for m in self.members)
        return ((self.node, self.gpus),) if self.node is not None else ()

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes of ``slots``."""
        return tuple(node for node, _ in self.slots)

    @property
    def copy_nodes(self) -> tuple[str, ...]:
        """The nodes whose agents get a copy of this assignment: ``nodes``, and while it is
        placed or moving, its standbys' nodes."""
        if self.phase not in ("placed", "moving") or not self.standby:
            return self.nodes
        return self.nodes + tuple(s.node for s in self.standby if s.node not in self.nodes)

    def member_on(self, node: str) -> Member | None:
        """The gang member on ``node`` (None: none, or not a gang)."""
        for member in self.members:
            if member.node == node:
                return member
        return None

    def on_node(self, node: str) -> Assignment | None:
        """The assignment as ``node``'s agent runs it: a gang's with ``node`` and ``gpus`` of
        the member there; None if it places nothing on ``node``."""
        if not self.members:
            return self if self.node == node else None
        member = self.member_on(node)
        if member is None:
            if self.phase == "placed":
                for standby in self.standby:
                    if standby.node == node:  # a warm gang's standby: no rank
                        return dataclasses.replace(self, node=node, gpus=standby.gpus)
            return None
        return dataclasses.replace(self, node=node, gpus=member.gpus)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], epoch: int = 0) -> Assignment:
        """Inverse of ``to_dict``; ``epoch`` comes from the key's mod_revision."""
        return schema_of(cls).validate(data, context={"epoch": epoch})


@dataclass(frozen=True, slots=True)
class StandbyRecord(Record):
    """A warm gang's standby chosen after the gang was placed (``Keys.standby``): for its
    assignment of ``revision``; the views and decisions see it folded into that assignment's
    ``standby`` (``with_standby``)."""

    revision: int
    members: tuple[Member, ...] = ()


def with_standby(assignment: Assignment, record: StandbyRecord | None) -> Assignment:
    """``assignment`` with the standby of ``record`` when it is that assignment's (same
    revision) and the assignment names none of its own."""
    if record is None or assignment.standby or record.revision != assignment.revision \
            or assignment.phase not in ("placed", "moving"):
        return assignment
    return dataclasses.replace(assignment, standby=record.members)


@dataclass(frozen=True, slots=True)
class CheckpointInfo(Record):
    """The newest committed checkpoint of a workload (the contract's ``checkpoint`` object)."""

    step: int
    epoch: int
    path: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CheckpointInfo | None:  # type: ignore[override]
        """Inverse of ``to_dict``; None stays None."""
        return schema_of(cls).validate(data) if data else None


@dataclass(frozen=True, slots=True)
class Stall(Record):
    """A running instance that made no progress for its spec's ``hang_timeout``, as its agent
    saw it (``InstanceStatus.stalled``): the rank of the node whose progress is oldest."""

    rank: int | None
    """The rank (torchrun's ``RANK``) whose heartbeat is oldest; null: no rank on this node has
    reported progress in this instance."""
    step: int | None
    """That rank's last step; null: it reported none."""
    stalled_for: float
    """Seconds without progress when the agent reported it (its own clock)."""
    stopped: bool = False
    """That rank's process is stopped (SIGSTOP, a debugger), as ``/proc`` says."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Stall | None:  # type: ignore[override]
        """Inverse of ``to_dict``; None stays None."""
        return schema_of(cls).validate(data) if data else None

    def describe(self) -> str:
        """``rank 2 made no progress for 10.3s since step 41 (its process is stopped)``."""
        stopped = " (its process is stopped)" if self.stopped else ""
        if self.rank is None:
            return f"no rank reported progress for {self.stalled_for:.1f}s since it started"
        since = f" since step {self.step}" if self.step is not None else ""
        return f"rank {self.rank} made no progress for {self.stalled_for:.1f}s{since}{stopped}"


@dataclass(frozen=True, slots=True)
class Pace(Record):
    """How long the slowest rank of an instance works per step outside its collectives, as
    its agent saw it (``InstanceStatus.pace``, for ``straggler_lag``)."""

    rank: int
    """The rank (torchrun's ``RANK``) whose own time per step is longest on this node."""
    compute: float
    """Its own time per step, seconds: the median of its recent steps, from the SDK's
    ``synced()`` to its next ``heartbeat``."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Pace | None:  # type: ignore[override]
        """Inverse of ``to_dict``; None stays None."""
        return schema_of(cls).validate(data) if data else None


#: Where a rank's state came back from at its start (``TieredCheckpointer``): its node's RAM,
#: a peer node's RAM, the shared disk, or nowhere (a first start).
RestoreTier = Literal["own", "peer", "disk", "none"]


@dataclass(frozen=True, slots=True)
class Restore(Record):
    """How a rank of an instance restored its state at its start, as its SDK wrote it into
    the progress directory (``InstanceStatus.restored``): the slowest rank of the node."""

    rank: int
    """The rank (torchrun's ``RANK``)."""
    tier: RestoreTier
    """Where its state came from: `own` (this node's RAM), `peer` (another member's node's
    RAM), `disk` (the shared checkpoint directory) or `none` (nothing to restore)."""
    step: int | None
    """The step restored; null for `none`."""
    seconds: float
    """How long the restore took, waiting for the other members' records included."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Restore | None:  # type: ignore[override]
        """Inverse of ``to_dict``; None stays None."""
        return schema_of(cls).validate(data) if data else None

    def describe(self) -> str:
        """``step 41 from a peer's RAM in 0.21s``."""
        where = {"own": "its node's RAM", "peer": "a peer's RAM", "disk": "disk",
                 "none": "nothing"}[self.tier]
        if self.tier == "none":
            return f"nothing to restore ({self.seconds:.2f}s)"
        return f"step {self.step} from {where} in {self.seconds:.2f}s"


@dataclass(frozen=True, slots=True)
class InstanceStatus(Record):
    """What a node's agent reports about one instance (workload at an epoch) it runs.

    ``failing``: why the running instance is considered failed (a check past its failure
    threshold, an application XID on its GPU), "" when it is fine. ``ended``: how an exited
    instance ended (``InstanceEnd``), null while it runs (and for an end this version does
    not know). ``ready``: it runs and every readiness check's last probe passed, since
    ``ready_since``; ``ports``: its declared ports by name, as bound on this node.
    ``stderr_tail``: once it exited, the last lines of its stderr (at most 20 lines and 4 KiB,
    longer values are cut to their last 4 KiB; "" while it runs, and from agents before it).
    ``stalled``: the running instance made no progress for its ``hang_timeout`` (``Stall``),
    null otherwise; ``progressed``: a rank of it has reported progress (only reported for a
    workload with ``hang_timeout``: its start-up is over); ``pace``: its slowest rank's own
    time per step (``Pace``; only for a gang with ``straggler_lag``), null until known.
    ``restored``: how its slowest rank restored at its start (``Restore``: a workload using
    ``TieredCheckpointer``), null until it says. ``preflight``: its gang's pre-flight report
    (``hafo.model.preflight``; null: none ran, or not yet)."""

    workload: str
    node: str
    epoch: int
    state: InstanceState
    pid: int | None = None
    exit_code: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    checkpoint: CheckpointInfo | None = None
    failing: Annotated[str, BeforeValidator(_or_empty)] = ""
    ended: Annotated[InstanceEnd | None, BeforeValidator(instance_end)] = None
    ready: bool = False
    ready_since: float | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    stderr_tail: Annotated[str, BeforeValidator(_or_empty), AfterValidator(bounded_tail)] = ""
    stalled: Stall | None = None
    progressed: bool = False
    pace: Pace | None = None
    restored: Restore | None = None
    preflight: Preflight | None = None

    @property
    def stderr_line(self) -> str:
        """The line of ``stderr_tail`` that says most, bounded (``hafo.model.exits``)."""
        return stderr_line(self.stderr_tail)

    @property
    def ended_by_infrastructure(self) -> bool:
        """Exited because of fencing, lease loss or a lost guard (``INFRASTRUCTURE_ENDS``)."""
        return self.ended in INFRASTRUCTURE_ENDS


@dataclass(frozen=True, slots=True)
class Event(Record):
    """Something that happened, for people (``hafo events``)."""

    ts: float
    """When it happened (seconds since the epoch)."""
    kind: str
    """What happened: one of the event kinds."""
    message: str
    """What happened, in one sentence for people."""
    workload: str | None = None
    """The workload's id, for an event about a workload."""
    node: str | None = None
    """The node's name, for an event about a node (or where the workload is)."""
    epoch: int | None = None
    """The instance's epoch, for an event about one instance."""


def replica_serial(replica_id: str) -> int:
    """The number of a replica id (``<service id>.<n>``); -1 for any other id."""
    _, dot, number = replica_id.rpartition(".")
    return int(number) if dot and number.isdigit() else -1


@dataclass(frozen=True, slots=True)
class Submission(Record):
    """A workload as submitted: its id, spec and submit time (key ``workloads/<id>``).

    A replica of a service (written by the controller, docs/reference/services.md, "Services") also
    says whose replica it is (``service``: the service's id), which replica it replaces
    (``replaces``: during a rolling update or a drain) and, once it is replaced, since when
    it is out of rotation (``retiring``)."""

    id: str
    spec: WorkloadSpec
    submitted_at: float
    service: str | None = None
    replaces: str | None = None
    retiring: float | None = None


@dataclass(frozen=True, slots=True)
class FailsafeSet(Record):
    """The controllers agents must all hear from; ``version`` grows with every change."""

    version: int = 0
    members: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> FailsafeSet:
        """Inverse of ``to_dict`` (None -> the empty set, version 0)."""
        return schema_of(cls).validate(data) if data else FailsafeSet()

    def apis(self) -> dict[str, str]:
        """name -> API base URL."""
        return {name: str(m.get("api", "")) for name, m in self.members.items()}


@dataclass(frozen=True, slots=True)
class MoveRequest(Record):
    """An operator's request to move a workload (``hafo migrate``, ``hafo drain``);
    ``node``: for a gang, the node whose member moves; ``restart``: a submit changed the
    spec (a gang then checkpoints, stops and starts again whole, every member in place)."""

    workload: str
    to: str | None = None
    reason: str = ""
    node: str | None = None
    restart: bool = False


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
    #: Nodes whose liveness key is gone while etcd was not yet asked whether their lease is
    #: (still "alive" until it confirms: docs/safety.md, rule 3).
    expiring: frozenset[str] = frozenset()
    #: The declared queues (``Keys.queue``), by name; none: every workload is admitted as
    #: if the pool had no queues (``hafo.decisions.quota``).
    queues: Mapping[str, QueueSpec] = field(default_factory=dict)
    #: Warm gangs' standbys chosen after their placement (``Keys.standby``), by workload;
    #: already folded into ``assignments`` (``with_standby``).
    standbys: Mapping[str, StandbyRecord] = field(default_factory=dict)

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
            if assignment.holds_node:
                for node in assignment.nodes:
                    by_node.setdefault(node, []).append(wid)
        return {node: tuple(sorted(wids)) for node, wids in by_node.items()}

    @cached_property
    def replicas(self) -> Mapping[str, tuple[str, ...]]:
        """service id -> the ids of its replicas, oldest first (``replica_serial``)."""
        by_service: dict[str, list[str]] = {}
        for wid, submission in self.workloads.items():
            if submission.service is not None:
                by_service.setdefault(submission.service, []).append(wid)
        return {s: tuple(sorted(ids, key=replica_serial)) for s, ids in by_service.items()}

    @cached_property
    def by_name(self) -> Mapping[str, tuple[str, ...]]:
        """name -> the ids of the workloads (not replicas) of that name (one, unless they were
        submitted before names were unique)."""
        names: dict[str, list[str]] = {}
        for wid, submission in sorted(self.workloads.items()):
            if submission.service is None:
                names.setdefault(submission.spec.name, []).append(wid)
        return {name: tuple(ids) for name, ids in names.items()}

    def current_status(self, workload: str) -> InstanceStatus | None:
        """The agent's report for the workload's current assignment (same node and epoch)."""
        assignment = self.assignments.get(workload)
        if assignment is None or assignment.node is None:
            return None
        status = self.statuses.get((workload, assignment.node))
        if status is None or status.epoch != assignment.epoch:
            return None
        return status
