"""A workload's history: one record per epoch (instance) it had, newest last.

Kept by the leader under ``Keys.history`` (docs/reference/etcd.md, "etcd keys"), written when an
epoch is placed, starts and ends (``hafo.decisions.history`` decides the record, the
controller writes it), bounded to the newest ``HISTORY_KEEP`` epochs. Unlike the event log
it outlives a day and a controller failover; it is deleted with the workload.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator

from hafo.model.cluster import CheckpointInfo
from hafo.model.schema import Record

#: How many epochs a workload's history keeps (the oldest are dropped first).
HISTORY_KEEP = 100

#: How an epoch ended. ``exit``: exited non-zero by itself (``code``: the exit code);
#: ``signal``: killed by a signal (``code``: its number); ``fenced``: killed at the fencing
#: deadline (not its fault); ``guard-lost``: its guard died; ``moved``: a planned move
#: (``hafo migrate``, ``hafo drain``, a spec change); ``preempted``: room for a
#: higher-priority workload; ``node-down``: its node's lease expired; ``node-unhealthy``:
#: moved off a node its agent marked unhealthy; ``gpu-fault``: moved off an unhealthy GPU
#: (``code``: the XID when an XID made it unhealthy); ``gpu-degraded``: moved off a degrading
#: GPU; ``app-failed``: an application check or an application XID failed it (``code``: the
#: XID if any; ``detail``: the check's reason); ``member-lost``: a gang member's node went
#: down, the other members were stopped; ``infrastructure``: its node was registered anew
#: (the instance belonged to an earlier agent); ``deleted``: the workload was deleted;
#: ``unknown``: a newer epoch replaced it and nothing said how it ended.
EndHow = Literal["completed", "exit", "signal", "fenced", "guard-lost", "moved", "preempted",
                 "node-down", "node-unhealthy", "gpu-fault", "gpu-degraded", "app-failed",
                 "member-lost", "infrastructure", "deleted", "hung", "straggler", "preflight",
                 "unknown"]
END_HOWS: tuple[str, ...] = get_args(EndHow)

_XID = re.compile(r"\bxid[ :]*(\d+)", re.IGNORECASE)


def xid_in(text: str) -> int | None:
    """The XID a health finding's text names (``GPU 0: xid 79: fell off the bus``), if any.
    The agent reports GPU faults as text (``Gpu.reason``, ``InstanceStatus.failing``); the
    history keeps the number as data."""
    match = _XID.search(text)
    return int(match.group(1)) if match else None


def _end_how(value: object) -> object:
    """A kind this version does not know (a newer writer's) reads as ``unknown``."""
    return value if value in END_HOWS or not isinstance(value, str) else "unknown"


_PLAIN: dict[str, str] = {
    "completed": "completed", "fenced": "fenced", "guard-lost": "guard lost",
    "moved": "moved (planned)", "preempted": "preempted", "node-down": "node down",
    "node-unhealthy": "node unhealthy", "gpu-degraded": "GPU degraded",
    "member-lost": "gang member lost", "infrastructure": "node registered anew",
    "deleted": "stopped (deleted)", "hung": "hung (no progress)",
    "straggler": "straggler (slower than the others)",
    "preflight": "failed the gang's pre-flight",
    "unknown": "replaced (how it ended is unknown)",
}


@dataclass(frozen=True, slots=True)
class EpochEnd(Record):
    """How an epoch ended (``EndHow``); ``code``: the exit code, signal number or XID;
    ``detail``: more for people (a failing check's reason, the unhealthy GPU)."""

    how: Annotated[EndHow, BeforeValidator(_end_how)]
    code: int | None = None
    detail: str = ""

    def describe(self) -> str:
        """For people: ``exit code 3``, ``signal 9``, ``GPU fault XID 79``, ``node down``."""
        how, code = self.how, self.code
        if how == "exit":
            return f"exit code {code}"
        if how == "signal":
            return f"signal {code}"
        if how == "gpu-fault":
            return f"GPU fault XID {code}" if code is not None else "GPU fault"
        if how == "app-failed":
            return (f"application XID {code}" if code is not None
                    else "application check failed")
        return _PLAIN.get(how, how)


@dataclass(frozen=True, slots=True)
class EpochRecord(Record):
    """One epoch (instance) of a workload: where (``nodes``: one, or a gang's members by
    rank), when it was assigned, started (its instance, every member's, ran) and ended, how
    it ended (``end``: set when the controller stops it, or when it is over; ``ended_at``
    stays null while it is being stopped), the restart count of its assignment, and the
    newest committed checkpoint the workload had when it was placed (``resumed_from``, null
    for none)."""

    epoch: int
    nodes: tuple[str, ...]
    assigned_at: float
    started_at: float | None = None
    ended_at: float | None = None
    end: EpochEnd | None = None
    restarts: int = 0
    resumed_from: CheckpointInfo | None = None

    @property
    def node(self) -> str | None:
        """Its node (rank 0's for a gang)."""
        return self.nodes[0] if self.nodes else None

    @property
    def over(self) -> bool:
        """It ended (not merely being stopped)."""
        return self.ended_at is not None


@dataclass(frozen=True, slots=True)
class WorkloadHistory(Record):
    """Every epoch a workload had, oldest first (the newest ``HISTORY_KEEP``)."""

    workload: str
    epochs: tuple[EpochRecord, ...] = ()

    @property
    def last(self) -> EpochRecord | None:
        """The newest epoch, if any."""
        return self.epochs[-1] if self.epochs else None
