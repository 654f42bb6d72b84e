"""What an agent does with its instances in one pass. Pure.

An instance is a (workload, epoch) pair. The agent stops every running instance that is no
longer assigned to it; it starts an assigned instance that it never started, only once no
other instance of that workload still runs on the node, and only while it may start work at
all (registered, fencing deadline far enough). An instance that ran and exited is never
started again: only a new epoch (a new assignment) starts it anew.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hafo.decisions.claim import may_start_epoch

Instance = tuple[str, int]


@dataclass(frozen=True)
class InstancePlan:
    """Instances to stop and to start, in a deterministic order."""

    stop: tuple[Instance, ...]
    start: tuple[Instance, ...]


def plan_instances(desired: Iterable[Instance], running: Mapping[Instance, bool],
                   may_start: bool, claimed: int = 0) -> InstancePlan:
    """``desired``: instances assigned to this node; ``running``: every instance on disk ->
    whether it still runs; ``claimed``: the epoch of this agent's claim of the node
    (``Liveness.claimed``; instances of epochs up to it are an earlier holder's, never
    started here, see ``hafo.decisions.claim``)."""
    wanted = set(desired)
    stop = tuple(sorted(i for i, alive in running.items() if alive and i not in wanted))
    busy = {workload for (workload, _), alive in running.items() if alive}
    start = () if not may_start else tuple(sorted(
        i for i in wanted if i not in running and i[0] not in busy
        and may_start_epoch(i[1], claimed, recorded=False)))
    return InstancePlan(stop, start)
