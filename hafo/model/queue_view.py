"""The JSON view of the declared queues (``GET /v1/queues``, ``hafo queues --json``): each
queue's declaration, every field present (defaults too), and the workloads that name it.

Usage (GPUs used, borrowed, pending, fair share) is the quota decision's
(``hafo.decisions.quota``) and not part of this view yet.
"""

from __future__ import annotations

from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import QueueSpec

__all__ = ["QueueView", "all_queues", "queue_users", "queue_view"]


class QueueView(TypedDict):
    """One queue: its declaration and ``workloads``, the ids of the workloads (not replicas:
    a service counts once) whose ``spec.queue`` names it, sorted."""

    name: str
    gpus: int
    cohort: str | None
    borrowing_limit: int | None
    lending_limit: int | None
    weight: float
    workloads: list[str]


def queue_users(snapshot: ClusterSnapshot, name: str) -> list[str]:
    """The ids of the workloads (a service once, not its replicas) in queue ``name``."""
    return sorted(wid for wid, sub in snapshot.workloads.items()
                  if sub.service is None and sub.spec.queue == name)


def _view(spec: QueueSpec, workloads: list[str]) -> QueueView:
    return QueueView(name=spec.name, gpus=spec.gpus, cohort=spec.cohort,
                     borrowing_limit=spec.borrowing_limit, lending_limit=spec.lending_limit,
                     weight=spec.weight, workloads=workloads)


def queue_view(snapshot: ClusterSnapshot, name: str) -> QueueView:
    """The view of the declared queue ``name`` (KeyError if it is not declared)."""
    return _view(snapshot.queues[name], queue_users(snapshot, name))


def all_queues(snapshot: ClusterSnapshot) -> list[QueueView]:
    """Every declared queue, by name (workloads counted in one pass)."""
    users: dict[str, list[str]] = {name: [] for name in snapshot.queues}
    for wid, sub in snapshot.workloads.items():
        if sub.service is None and sub.spec.queue in users:
            users[sub.spec.queue].append(wid)
    return [_view(snapshot.queues[name], sorted(users[name])) for name in sorted(users)]
