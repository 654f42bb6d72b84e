"""How an instance ended (``InstanceEnd``). Plain Python, no schema library: the guard, which
starts before every workload, imports this and little else (its start-up delays every
launch)."""

from __future__ import annotations

from enum import StrEnum


class InstanceEnd(StrEnum):
    """How an instance ended, as its guard (or the agent) recorded it. Carried as data, so
    that a reworded message can never change what the controller decides."""

    EXIT = "exit"  # the workload exited by itself; its exit code says how
    """The workload exited by itself; its exit code says how."""
    STOPPED = "stopped"  # the agent stopped it (planned move, failing check, deletion)
    """The agent stopped it (a planned move, a failing check, a deletion)."""
    FENCED = "fenced"  # killed at the fencing deadline or on lease loss: not its fault
    """Killed at the fencing deadline or on lease loss: not the workload's fault."""
    GUARD_LOST = "guard-lost"  # its guard died (or never started); the agent killed it
    """Its guard died (or never started); the agent killed it."""
    HANDED_OVER = "handed-over"  # parked, then handed the gang's next epoch (warm gangs)
    """Its process parked and became the member of the gang's next epoch (``warm``)."""


#: Ends caused by the infrastructure (fencing, lease loss, an etcd outage, a lost guard), not
#: by the workload: the restart that follows does not count toward ``restart.max_restarts``,
#: waits for no backoff and excludes no node (docs/safety.md, "Infrastructure restarts").
INFRASTRUCTURE_ENDS = frozenset({InstanceEnd.FENCED, InstanceEnd.GUARD_LOST})


def instance_end(value: object) -> InstanceEnd | None:
    """Parse a recorded end (None when absent or unknown: an older agent's report)."""
    try:
        return InstanceEnd(str(value)) if value is not None else None
    except ValueError:
        return None
