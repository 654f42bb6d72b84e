"""The output of a reconcile cycle: actions on assignments, and the needs behind them; and
what assessing one workload comes to (``Assessment``: an action, a need for a placement, or
``Settled``, with the reason nothing is to be done for it this cycle)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from hafo.decisions.placement import PlacementRequest
from hafo.decisions.services import ReplicaChange
from hafo.model.cluster import Assignment, CheckpointInfo, MoveCause

ActionKind = Literal["place", "pending", "finish", "forget", "move", "refuse-move", "standby"]
FAILED_NODE_COOLDOWN = 60.0


class Cause(StrEnum):
    """Why an action is taken: carried in the data, so that metrics, events and the API
    never read it back out of a message (``Action.why`` is for people only)."""

    NEW = "new"                        # a workload placed for the first time (or pending)
    """A workload placed for the first time (or pending)."""
    NODE_DOWN = "node-down"            # its node's lease expired
    """Its node's lease expired: the node is down."""
    NODE_UNHEALTHY = "node-unhealthy"  # its agent marked the node unhealthy
    """Its agent marked the node unhealthy."""
    GPU_FAULT = "gpu-fault"            # one of its GPUs is unhealthy
    """One of its GPUs is unhealthy."""
    GPU_DEGRADED = "gpu-degraded"      # one of its GPUs is degrading (still usable)
    """One of its GPUs is degrading (still usable)."""
    APP_FAILED = "app-failed"          # the application failed past its restart limit: move
    """The application failed past its restart limit: it moves."""
    EXITED = "exited"                  # a non-zero exit: restart in place
    """A non-zero exit: restart in place."""
    FAILING = "failing"                # a check past its threshold: stop, restart in place
    """A check failed past its threshold: stop, then restart in place."""
    INFRASTRUCTURE = "infrastructure"  # fenced, guard lost, node claimed anew: not its fault
    """Fenced, guard lost, or node claimed anew: not the workload's fault (the restart is not
    counted)."""
    PLANNED = "planned"                # hafo migrate / hafo drain
    """A planned move: `hafo migrate` or `hafo drain`."""
    PREEMPTED = "preempted"            # room for a higher-priority workload
    """Stopped to make room for a higher-priority workload (or reclaimed by the queue that lent
    the quota)."""
    MOVED = "moved"                    # a move's instance stopped: place it elsewhere
    """A move's instance stopped: place it elsewhere."""
    RESTARTED = "restarted"            # a failing instance stopped: run it again in place
    """A failing instance stopped: run it again in place."""
    COMPLETED = "completed"            # exited 0
    """Exited 0 (a gang: every member)."""
    DELETED = "deleted"                # deleted by the user
    """Deleted by the user."""
    MOVE_REFUSED = "move-refused"      # a move request that cannot be honoured
    """A move request that cannot be honoured."""
    MEMBER_LOST = "member-lost"        # a gang member's node is down: stop the others first
    """A gang member's node is down: the other members are stopped first."""
    HUNG = "hung"                      # no progress for hang_timeout: stop, restart in place
    """No rank made progress for the spec's `hang_timeout`: stopped at once, restarted in place
    (the rank that stalled first is named)."""
    STANDBY = "standby"                # a warm gang's standby on a spare, its epoch unchanged
    """A warm gang gets a standby on a spare node (its assignment, so its epoch, unchanged)."""
    STRAGGLER = "straggler"            # a member slower than straggler_lag: as a hang
    """A gang member's own work per step exceeds the others' by more than `straggler_lag`:
    stopped at once, restarted in place (its rank is named)."""
    PREFLIGHT = "preflight"            # a gang's pre-flight blamed members: replace them
    """A gang's pre-flight blamed members (did not join, failed, much slower): they are
    replaced before the job starts, their nodes excluded for `restart.window` (not counted)."""


#: The event-log kind (a public contract: docs/reference/reasons.md, "Events") of a move's first
#: step, by cause.
_MOVE_EVENTS: Mapping[Cause, str] = {
    Cause.PLANNED: "checkpoint-requested", Cause.NODE_UNHEALTHY: "node-unhealthy",
    Cause.GPU_FAULT: "gpu-unhealthy", Cause.GPU_DEGRADED: "gpu-degraded",
    Cause.PREEMPTED: "preempted", Cause.APP_FAILED: "app-failed", Cause.FAILING: "app-failed",
    Cause.MEMBER_LOST: "member-lost", Cause.EXITED: "member-exited",
    Cause.INFRASTRUCTURE: "gang-restart", Cause.HUNG: "hung", Cause.STRAGGLER: "straggler",
    Cause.PREFLIGHT: "preflight-failed",
}
#: ... and of a placement.
_PLACE_EVENTS: Mapping[Cause, str] = {
    Cause.NEW: "placed", Cause.NODE_DOWN: "failover", Cause.MOVED: "moved",
}


def move_cause(cause: Cause) -> MoveCause:
    """What a ``moving`` assignment records as its cause (``Assignment.cause``)."""
    names: Mapping[Cause, MoveCause] = {
        Cause.PLANNED: "planned", Cause.PREEMPTED: "preempted",
        Cause.NODE_UNHEALTHY: "node-unhealthy", Cause.GPU_FAULT: "gpu-unhealthy",
        Cause.GPU_DEGRADED: "gpu-degraded", Cause.APP_FAILED: "app-failed",
        Cause.FAILING: "app-failed", Cause.EXITED: "app-failed",
        Cause.MEMBER_LOST: "member-lost", Cause.INFRASTRUCTURE: "infrastructure",
        Cause.HUNG: "hung", Cause.STRAGGLER: "straggler", Cause.PREFLIGHT: "preflight"}
    return names[cause]


def event_kind(kind: ActionKind, cause: Cause) -> str:
    """The event-log kind of an action (the contract's names, unchanged)."""
    if kind == "place":
        return _PLACE_EVENTS.get(cause, "restarted")
    if kind == "move":
        return _MOVE_EVENTS[cause]
    if kind == "finish":
        return "completed" if cause is Cause.COMPLETED else "failed"
    return {"pending": "pending", "forget": "deleted", "refuse-move": "move-refused",
            "standby": "standby"}[kind]


@dataclass(frozen=True, kw_only=True)
class Action:
    """One change to one workload's assignment: what (``kind``), why (``cause``; ``why`` is
    the sentence for people), decided from which revision, and the new assignment.
    ``known_since``: when the failure behind it is known from (when the controller saw an
    exit, plus the backoff taken), None when the action's inputs do not say."""

    kind: ActionKind
    workload: str
    cause: Cause
    why: str
    expected_revision: int
    assignment: Assignment | None
    clear_move: bool = False
    known_since: float | None = None

    @property
    def event(self) -> str:
        """The kind of the event this action writes."""
        return event_kind(self.kind, self.cause)


@dataclass(frozen=True)
class Plan:
    """Everything decided in one cycle: actions on assignments, and changes to the replica
    sets of services (``hafo.decisions.services``)."""

    actions: tuple[Action, ...]
    replicas: tuple[ReplicaChange, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.actions) or bool(self.replicas)


@dataclass(frozen=True, kw_only=True)
class Need:
    """Why a workload needs a (new) placement, and with which history. ``avoid``: the
    cool-downs the new assignment keeps (None: those of the request; a planned move avoids
    its old node for this placement only). ``failure``: how its last instance failed, when
    that is why it needs one ("" otherwise: ``Assignment.failure``); ``checkpoint``: the
    newest checkpoint known, where its next instance resumes (``Assignment.checkpoint``)."""

    request: PlacementRequest
    previous: Assignment | None
    restarts: int
    restart_times: tuple[float, ...]
    cause: Cause
    why: str
    avoid: Mapping[str, float] | None = None
    known_since: float | None = None
    quick_restarts: int = 0  # the new assignment's (``Assignment.quick_restarts``)
    failure: str = ""
    checkpoint: CheckpointInfo | None = None


class SettledReason(StrEnum):
    """Why nothing is decided for a workload this cycle (``Settled.reason``)."""

    RETIRING = "retiring"              # a replica out of rotation, deleted soon (services)
    SERVICE = "service"                # a service is its replicas (hafo.decisions.services)
    ENDED = "ended"                    # completed or failed (or placed nowhere)
    FAILSAFE = "failsafe"              # its node is down but failover is off: decide later
    NO_REPORT = "no-report"            # its instance has not reported yet
    RUNNING = "running"                # it runs and is not failing
    STOPPING = "stopping"              # its instance is being stopped (a move or restart)
    BACKING_OFF = "backing-off"        # waiting out a restart backoff: a later cycle acts
    NODE_EXPIRING = "node-expiring"    # a gang member's node is about to be confirmed down


@dataclass(frozen=True)
class Settled:
    """Nothing to decide for a workload this cycle, and why (``reason``; ``detail``: more
    for people, "" if the reason says it all). Rendered nowhere yet: for tests and for
    "why does my job wait"."""

    reason: SettledReason
    detail: str = ""


#: What assessing one workload comes to (``hafo.decisions.assessment.assess``).
Assessment = Action | Need | Settled
