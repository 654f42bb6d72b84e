"""The part of a snapshot a reconcile cycle can change: without the dormant workloads. Pure.

A cluster keeps the records of every workload that ended (completed or failed) until they are
deleted: thousands of them, read by every cycle, for nothing. A workload is **dormant** when
its assignment ended (``completed`` or ``failed``), no agent reports an instance of it any
more, no move is asked for it, it is not being retired, and it is not a service or a
service's replica (a service decides about its ended replicas: ``hafo.decisions.services``).
Nothing in a cycle acts on a dormant workload (``hafo.decisions.assessment`` settles it as
``ended``) nor counts it (it holds no GPU, no quota, no port, no node): the plan of
``reconcile`` on ``live_view(snapshot)`` is the plan on ``snapshot``
(``tests/unit/test_live_view.py`` checks it on random clusters). A deleted workload whose
assignment is left is not dormant: the cycle forgets that assignment.

Linear in workloads + reports, once per cycle: a few milliseconds at 50,000 workloads, against
the stages after it, linear in what is left.
"""

from __future__ import annotations

from dataclasses import replace

from hafo.model.cluster import ClusterSnapshot

__all__ = ["dormant", "live_view"]

def dormant(snapshot: ClusterSnapshot) -> frozenset[str]:
    """The ids of the workloads no cycle acts on (the module's docstring)."""
    reported = {wid for wid, _node in snapshot.statuses}
    moves = snapshot.moves
    out: list[str] = []
    for wid, assignment in snapshot.assignments.items():
        if not assignment.ended or wid in reported or wid in moves:
            continue
        submission = snapshot.workloads.get(wid)
        if (submission is None or submission.retiring is not None
                or submission.service is not None or submission.spec.replicas is not None):
            continue
        out.append(wid)
    return frozenset(out)


def live_view(snapshot: ClusterSnapshot,
              quiet: frozenset[str] | None = None) -> ClusterSnapshot:
    """``snapshot`` less its dormant workloads' submissions and assignments (the same object
    when there are none); ``quiet``: ``dormant(snapshot)``, if computed already."""
    if quiet is None:
        quiet = dormant(snapshot)
    if not quiet:
        return snapshot
    return replace(
        snapshot,
        workloads={w: s for w, s in snapshot.workloads.items() if w not in quiet},
        assignments={w: a for w, a in snapshot.assignments.items() if w not in quiet})
