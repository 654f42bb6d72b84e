"""The JSON view of the declared queues (``GET /v1/queues``, ``hafo queues --json``): each
queue's declaration, every field present (defaults too), the workloads that name it, and
its usage as the quota decision counts it (``hafo.decisions.queue_standings.usage_views``, given by
the caller: this layer does not decide).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired

from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import QueueSpec

__all__ = ["FlavorUsage", "QueueUsage", "QueueView", "all_queues", "queue_users", "queue_view"]


class FlavorUsage(TypedDict):
    """A queue's usage of one flavor (a ``models`` glob, or the rest): its ``nominal`` quota
    there, what it ``used`` of it and ``borrowed`` above it."""

    nominal: float
    used: float
    borrowed: float


class QueueUsage(TypedDict):
    """A queue's usage in GPUs: ``used`` by its workloads holding GPUs, ``borrowed`` above
    its quota, ``lent``: of its idle quota, what its cohort's borrowers use, ``pending``:
    asked for by its waiting workloads, and ``share``: its weighted share of borrowed
    capacity (0 while it borrows nothing; the largest over its flavors). For a queue
    declared with ``models`` only: ``models``, glob -> that flavor's usage, and ``other``,
    the usage of GPUs of no named model."""

    used: float
    borrowed: float
    lent: float
    pending: float
    share: float
    models: NotRequired[dict[str, FlavorUsage]]
    other: NotRequired[FlavorUsage]


NO_USAGE = QueueUsage(used=0.0, borrowed=0.0, lent=0.0, pending=0.0, share=0.0)


class QueueView(TypedDict):
    """One queue: its declaration (``models`` only when it names some), ``workloads``, the
    ids of the workloads (not replicas: a service counts once) whose ``spec.queue`` names it,
    sorted, and ``usage``."""

    name: str
    gpus: int | None
    cohort: str | None
    borrowing_limit: int | None
    lending_limit: int | None
    weight: float
    workloads: list[str]
    usage: QueueUsage
    models: NotRequired[dict[str, int]]


def queue_users(snapshot: ClusterSnapshot, name: str) -> list[str]:
    """The ids of the workloads (a service once, not its replicas) in queue ``name``."""
    return sorted(wid for wid, sub in snapshot.workloads.items()
                  if sub.service is None and sub.spec.queue == name)


def _view(spec: QueueSpec, workloads: list[str], usage: QueueUsage | None) -> QueueView:
    view = QueueView(name=spec.name, gpus=spec.gpus, cohort=spec.cohort,
                     borrowing_limit=spec.borrowing_limit, lending_limit=spec.lending_limit,
                     weight=spec.weight, workloads=workloads, usage=usage or NO_USAGE)
    if spec.models:
        view["models"] = dict(spec.models)
    return view


def queue_view(snapshot: ClusterSnapshot, name: str,
               usage: Mapping[str, QueueUsage] | None = None) -> QueueView:
    """The view of the declared queue ``name`` (KeyError if it is not declared); ``usage``:
    per queue (``hafo.decisions.queue_standings.usage_views``)."""
    return _view(snapshot.queues[name], queue_users(snapshot, name), (usage or {}).get(name))


def all_queues(snapshot: ClusterSnapshot,
               usage: Mapping[str, QueueUsage] | None = None) -> list[QueueView]:
    """Every declared queue, by name (workloads counted in one pass); ``usage`` as for
    ``queue_view``."""
    users: dict[str, list[str]] = {name: [] for name in snapshot.queues}
    for wid, sub in snapshot.workloads.items():
        if sub.service is None and sub.spec.queue in users:
            users[sub.spec.queue].append(wid)
    return [_view(snapshot.queues[name], sorted(users[name]), (usage or {}).get(name))
            for name in sorted(users)]
