"""Why each pending workload of a queue with a quota waits, with the live figures: the
stored reason (``QuotaRefusal.summary``) rendered with the usage now, and the workload's
place among its queue's waiting workloads in the fair order. What the API and the CLI
show. Pure.
"""

from __future__ import annotations

from typing import TypeVar

from hafo.decisions.fair_order import admission_order, within_queue_key
from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.quota import Quotas
from hafo.model.cluster import ClusterSnapshot
from hafo.model.views import WorkloadView

__all__ = ["live_reasons", "ordinal", "waiting_after", "with_live_reasons"]

_Views = TypeVar("_Views", WorkloadView, list[WorkloadView])


def waiting_after(failure: str) -> str:
    """What the stored reason of a workload pending after a failure starts with (its
    ``Assignment.failure``; "" for none), before why it waits: its last instance's failure
    comes first, so that a gang whose member could not start says so, not only that too few
    nodes are left."""
    return f"{failure}; waiting to run again: " if failure else ""


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def live_reasons(snapshot: ClusterSnapshot) -> dict[str, str]:
    """workload -> why it waits, with the live figures, for every pending workload of a queue
    with a quota: its queue's usage now, the cohort's pool and who holds it, then its place
    among its queue's waiting workloads in the order they are tried (``admission_order``).
    The stored reason holds only ``QuotaRefusal.summary``; the API and the CLI show this.
    Read-only and pure (the same snapshot, the same text)."""
    quotas = Quotas.of(snapshot)
    if quotas is None:
        return {}
    requests = []
    for wid, submission in snapshot.workloads.items():
        if submission.spec.is_service and submission.service is None:
            continue  # a service: its replicas wait, each on its own
        assignment = snapshot.assignments.get(wid)
        if assignment is not None and assignment.phase != "pending":
            continue
        queue = quotas.queues.get(submission.spec.queue)
        if queue is None or queue.gpus is None:
            continue
        requests.append(PlacementRequest(workload=wid, spec=submission.spec,
                                         submitted_at=submission.submitted_at))
    ordered = admission_order(sorted(requests, key=within_queue_key), quotas)
    by_queue: dict[str, list[str]] = {}
    for request in ordered:
        by_queue.setdefault(request.spec.queue, []).append(request.workload)
    out: dict[str, str] = {}
    for request in ordered:
        wid, name = request.workload, request.spec.queue
        assignment = snapshot.assignments.get(wid)
        stored = assignment.reason if assignment is not None else ""
        lead = waiting_after(assignment.failure) if assignment is not None else ""
        if not stored.startswith(lead):
            lead = ""
        body = stored[len(lead):]
        refusal = quotas.refusal(request)
        if refusal is not None and body.startswith(refusal.summary()):
            stored = lead + refusal.render() + body[len(refusal.summary()):]
        waiting = by_queue[name]
        place = f"{ordinal(waiting.index(wid) + 1)} of {len(waiting)} waiting in queue {name}"
        out[wid] = f"{stored}; {place}" if stored else place
    return out


def with_live_reasons(views: _Views, snapshot: ClusterSnapshot) -> _Views:
    """Workload views (``hafo.model.views``: one, or a list) with each waiting workload's
    ``reason`` as ``live_reasons`` says it (the same object, changed in place)."""
    live = live_reasons(snapshot)
    if live:
        for view in views if isinstance(views, list) else [views]:
            if view["id"] in live:
                view["reason"] = live[view["id"]]
    return views
