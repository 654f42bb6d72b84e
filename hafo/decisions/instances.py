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
    """Instances to stop, to start, to park and to hand over, in a deterministic order."""

    stop: tuple[Instance, ...]
    start: tuple[Instance, ...]
    #: warm gang members the controller asked to park (``Assignment.park``)
    park: tuple[Instance, ...] = ()
    #: (a parked warm member, the instance its process becomes)
    hand_over: tuple[tuple[Instance, Instance], ...] = ()


def plan_instances(desired: Iterable[Instance], running: Mapping[Instance, bool],
                   may_start: bool, claimed: int = 0, park: Mapping[str, int] | None = None,
                   parked: Iterable[Instance] = ()) -> InstancePlan:
    """``desired``: instances assigned to this node; ``running``: every instance on disk ->
    whether it still runs; ``claimed``: the epoch of this agent's claim of the node
    (``Liveness.claimed``; instances of epochs up to it are an earlier holder's, never
    started here, see ``hafo.decisions.claim``); ``park``: workload -> the epoch whose
    instances here the controller asked to park instead of stopping (a warm gang's
    survivors; a standby's epoch may be later); ``parked``: those whose process confirmed
    its park.

    A parked instance is handed the workload's assigned instance when that one is not on
    disk yet and the parked one is the workload's only live instance here (the agent
    checks that the two launch alike, else stops the parked one); while the instance it was
    handed to runs, it is neither stopped nor started again (the hand-over is under way)."""
    wanted = set(desired)
    asked = {i for i in running if park and i[0] in park and i[1] >= park[i[0]]}
    confirmed = {i for i in parked if running.get(i)}
    busy = {workload for (workload, _), alive in running.items() if alive}
    handing: set[Instance] = set()
    hand_over: list[tuple[Instance, Instance]] = []
    for new in sorted(wanted):
        older = [i for i in confirmed if i[0] == new[0] and i[1] < new[1]]
        if running.get(new):
            handing.update(older)
        elif new not in running and may_start and may_start_epoch(new[1], claimed,
                                                                  recorded=False):
            alive = [i for i, live in running.items() if live and i[0] == new[0]]
            if len(older) == 1 and alive == older:
                hand_over.append((older[0], new))
                handing.add(older[0])
    leaving = [i for i, alive in running.items() if alive and i not in wanted
               and i not in handing]
    stop, parking = [], []
    for old in sorted(leaving):
        followed = any(n[0] == old[0] and n[1] > old[1] for n in wanted)
        if old in confirmed:
            # parked: kept until handed over (or until it may be: no start now), stopped
            # once the workload goes on without it here
            if (followed and may_start) or (not followed and old not in asked):
                stop.append(old)
        elif old in asked and not followed:
            parking.append(old)
        else:
            stop.append(old)
    start = () if not may_start else tuple(sorted(
        i for i in wanted if i not in running and i[0] not in busy
        and may_start_epoch(i[1], claimed, recorded=False)))
    return InstancePlan(tuple(stop), start, tuple(parking), tuple(hand_over))
