"""What ``hafo logs`` and the agent API say about a workload's output: the listing record
of one instance's kept output, and which instance is a workload's current one. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from hafo.model.cluster import ClusterSnapshot
from hafo.model.schema import Record


@dataclass(frozen=True, slots=True)
class OutputLog(Record):
    """One instance's output kept on one node: its workload, node and epoch; ``start`` and
    ``end`` are the logical offsets of the first kept byte and of the end (``size`` = kept
    bytes, ``end - start``; ``start`` > 0 once rotation dropped the oldest); ``running``
    while its guard still runs (more may come)."""

    workload: str
    node: str
    epoch: int
    start: int
    end: int
    size: int
    running: bool


@dataclass(frozen=True, slots=True)
class Instance:
    """Where a workload's output comes from now: its instance's ``node`` and ``epoch``, or
    (``node`` None) ``why`` none runs; ``final``: it completed, failed or was deleted (no
    more output will come)."""

    workload: str
    node: str | None
    epoch: int = 0
    why: str = ""
    final: bool = False


def current_instance(snapshot: ClusterSnapshot, wid: str, rank: int = 0) -> Instance:
    """The instance whose output is the workload's now: the placed one (for a gang, rank
    ``rank``'s member), or, while it is moved, the one being stopped."""
    if wid not in snapshot.workloads:
        return Instance(wid, None, why=f"{wid} was deleted", final=True)
    assignment = snapshot.assignments.get(wid)
    if assignment is None:
        return Instance(wid, None, why=f"{wid} is pending: not placed yet")
    reason = f" ({assignment.reason})" if assignment.reason else ""
    if assignment.phase in ("completed", "failed"):
        return Instance(wid, None, why=f"{wid} {assignment.phase}{reason}", final=True)
    if assignment.phase == "pending" or assignment.node is None:
        return Instance(wid, None, why=f"{wid} is pending{reason}")
    epoch = assignment.epoch if assignment.phase == "placed" else assignment.stopping
    if epoch <= 0:
        return Instance(wid, None, why=f"{wid} is being placed again{reason}")
    node = assignment.node
    if assignment.is_gang:
        members = {m.rank: m.node for m in assignment.members}
        if rank not in members:
            return Instance(wid, None, why=f"{wid} has no rank {rank} (ranks "
                                           f"{', '.join(str(r) for r in sorted(members))})")
        node = members[rank]
    return Instance(wid, node, epoch)
