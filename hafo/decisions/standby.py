"""A warm gang's standby on a spare node (``warm: true``; docs/reference/gangs.md, "Warm
spares"). Pure.

When a warm gang is placed, one spare node that would fit a member (labelled spares first,
then by name; a spare holding no other gang's standby first) gets a standby: the gang's
command started there without a rank and parked at once (imports done, model built), which
the agent hands the member placed on that node next, as it hands a parked survivor its next
epoch. The standby takes the GPUs a member would take there (``take_gpus``), so the hand-over
finds the same ones; it takes them out of nothing (a spare runs no other work).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping

from hafo.decisions.gang_placement import is_spare
from hafo.decisions.placement_rules import (
    NodeCapacity,
    PlacementRequest,
    filter_reason,
    take_gpus,
)
from hafo.decisions.plan import Action, Cause
from hafo.model.cluster import Assignment, ClusterSnapshot, Member

#: A standby has no rank until it is handed one.
STANDBY_RANK = -1


def choose_standby(request: PlacementRequest, members: tuple[Member, ...],
                   spares: Mapping[str, NodeCapacity], assignments: Mapping[str, Assignment],
                   now: float) -> tuple[Member, ...]:
    """The standby of a warm gang just placed on ``members`` (none if not warm, or no spare
    fits): one spare node that is no member's and would fit a member."""
    if not request.spec.warm:
        return ()
    taken = {node for node in (m.node for m in members)}
    held: dict[str, int] = {}
    for wid, assignment in assignments.items():
        if wid != request.workload:
            for standby in assignment.standby:
                held[standby.node] = held.get(standby.node, 0) + 1
    for name in sorted(spares, key=lambda n: (held.get(n, 0), not is_spare(spares[n].labels),
                                              n)):
        cap = spares[name]
        if name in taken or filter_reason(request, cap, now) is not None:
            continue
        return (Member(rank=STANDBY_RANK, node=name, gpus=take_gpus(request.spec, cap.free)),)
    return ()


def lacks_standby(snapshot: ClusterSnapshot, assignment: Assignment) -> bool:
    """A placed ``warm`` gang with no standby on a ready node that is no member's."""
    submission = snapshot.workloads.get(assignment.workload)
    if assignment.phase != "placed" or not assignment.is_gang or submission is None \
            or not submission.spec.warm:
        return False
    return not any(snapshot.node_state(s.node) == "ready" and s.node not in assignment.nodes
                   for s in assignment.standby)


def standby_actions(snapshot: ClusterSnapshot, spares: Mapping[str, NodeCapacity],
                    acted: Collection[str], now: float) -> list[Action]:
    """A standby for each placed ``warm`` gang that lacks one (its spare was used, or its
    node is gone) and that no other action of this cycle touches, on a spare of ``spares``
    (one gang per spare per cycle): written with the gang's assignment unchanged (its epoch
    stays), as a ``StandbyRecord`` and a copy for the spare's agent."""
    actions: list[Action] = []
    taken: set[str] = set()
    for wid, assignment in sorted(snapshot.assignments.items()):
        if wid in acted or not lacks_standby(snapshot, assignment):
            continue
        submission = snapshot.workloads[wid]
        request = PlacementRequest(wid, submission.spec, submission.submitted_at)
        free = {name: cap for name, cap in spares.items() if name not in taken}
        chosen = choose_standby(request, assignment.members, free, snapshot.assignments, now)
        if not chosen:
            continue
        taken.add(chosen[0].node)
        actions.append(Action(
            kind="standby", workload=wid, cause=Cause.STANDBY,
            why=f"standby for gang instance {assignment.epoch} on {chosen[0].node}",
            expected_revision=assignment.revision,
            assignment=dataclasses.replace(assignment, standby=chosen)))
    return actions
