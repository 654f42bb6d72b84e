"""How a service is doing, for people (``hafo workloads``, the API, the dashboard). Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from hafo.model.cluster import ClusterSnapshot, Submission
from hafo.model.endpoints import instance_ready

__all__ = ["ServiceState", "service_state", "stalled_replacements"]


@dataclass(frozen=True)
class ServiceState:
    """How a service is doing, for people: ``state`` ``running`` (every replica ready, on
    the current spec), ``updating`` (a rollout in progress), ``degraded`` (fewer ready than
    asked for, but some), ``pending`` (none ready); ``reason`` says why not running."""

    state: Literal["running", "updating", "degraded", "pending"]
    ready: int
    desired: int
    current: int
    reason: str


def _pending_reasons(snapshot: ClusterSnapshot, ids: Iterable[str]) -> list[str]:
    reasons = []
    for rid in ids:
        assignment = snapshot.assignments.get(rid)
        if assignment is None or assignment.phase == "pending":
            why = assignment.reason if assignment is not None and assignment.reason else \
                "waiting to be placed"
            reasons.append(f"{rid} pending: {why}")
    return reasons


def stalled_replacements(snapshot: ClusterSnapshot, sid: str,
                         now: float | None) -> list[Submission]:
    """The replacements (of the current spec, for a replica still in rotation) not ready
    ``update.progress_deadline`` after they were created: they stop the rollout (the one
    rule, for the decisions and for people). Ready means in rotation now: how long it has
    been ready (``update.min_ready_seconds``) is the leader's own observation
    (``hafo.decisions.services``), which no one else has, so a ready replacement waiting
    out ``min_ready_seconds`` is in progress, not stopped. None when ``now`` is None."""
    if now is None:
        return []
    service = snapshot.workloads[sid]
    template, update = service.spec.template, service.spec.update
    active = {r: snapshot.workloads[r] for r in snapshot.replicas.get(sid, ())
              if snapshot.workloads[r].retiring is None}
    return [r for r in active.values()
            if r.replaces in active and r.spec == template
            and now - r.submitted_at > update.progress_deadline
            and not instance_ready(snapshot, r.id)]


def service_state(snapshot: ClusterSnapshot, sid: str, now: float | None) -> ServiceState:
    """The ``ServiceState`` of service ``sid`` (``now`` None: a stopped rollout is not told
    apart from one in progress)."""
    service = snapshot.workloads[sid]
    want = service.spec.replicas or 0
    template = service.spec.template
    update = service.spec.update
    active = [snapshot.workloads[r] for r in snapshot.replicas.get(sid, ())
              if snapshot.workloads[r].retiring is None]
    ready = [r for r in active if instance_ready(snapshot, r.id)]
    current = [r for r in ready if r.spec == template]
    outdated = [r for r in active if r.spec != template]
    stalled = stalled_replacements(snapshot, sid, now)
    pending = _pending_reasons(snapshot, (r.id for r in active))
    if stalled:
        reason = (f"rollout stopped: replica {stalled[0].id} not ready within "
                  f"{update.progress_deadline:g}s; the older replicas keep serving (submit "
                  "the previous spec to roll back)")
        return ServiceState("degraded", len(ready), want, len(current), reason)
    ids = {r.id for r in active}
    replacing = [r for r in active if r.replaces in ids and not instance_ready(snapshot, r.id)]
    if replacing and not outdated:
        waiting = "; ".join(_pending_reasons(snapshot, (r.id for r in replacing)))
        return ServiceState("updating", len(ready), want, len(current),
                            f"replacing {', '.join(str(r.replaces) for r in replacing)} (a "
                            f"drain or a move): the replacement starts first"
                            + (f"; {waiting}" if waiting else ""))
    if outdated:
        return ServiceState("updating", len(ready), want, len(current),
                            f"rolling update: {len(current)} of {want} replicas on the new "
                            f"spec and ready")
    if len(ready) >= want:
        return ServiceState("running", len(ready), want, len(current), "")
    reason = f"{len(ready)} of {want} replicas ready" + (f"; {'; '.join(pending)}"
                                                         if pending else "")
    return ServiceState("degraded" if ready else "pending", len(ready), want, len(current),
                        reason)
