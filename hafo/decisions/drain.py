"""What ``hafo drain NODE`` moves: every workload placed on the node, each by a planned move
request (checkpoint, stop, run elsewhere; ``hafo.decisions.moves``). Pure.

Only workloads in phase ``placed`` are asked to move: one already ``moving`` (a move or a
preemption under way) goes on with that. A gang with a member on the node moves that member
(its request names the node). The caller cordons the node first, so nothing new is
placed there meanwhile.
"""

from __future__ import annotations

from hafo.model.cluster import ClusterSnapshot, MoveRequest


def workloads_to_drain(snapshot: ClusterSnapshot, node: str) -> list[MoveRequest]:
    """The move requests that drain ``node``, one per workload placed on it, by workload id."""
    return [MoveRequest(wid, None, f"drain {node}", node=node if assignment.is_gang else None)
            for wid, assignment in sorted(snapshot.assignments.items())
            if assignment.phase == "placed" and node in assignment.nodes]
