"""Stage 2 of the reconcile pipeline, **admit**: which placement requests are tried this
cycle, and in which order. Pure.

While no queue is declared, every request is admitted, in the global order: higher priority
first, then older submissions, then the workload id (so the result does not depend on the
order watch events came in). With queues, the order is the fair one of
``hafo.decisions.fair_order.admission_order`` and each request must also fit its queue's quota
(``Admitted.quotas``, checked request by request as placements are made). Stage 3
(``hafo.decisions.placement.place_in_order``) tries them in exactly this order, which is
also the order in which a waiting gang holds nodes and a preemptor picks victims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hafo.decisions.fair_order import admission_order
from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.quota import Quotas

__all__ = ["Admitted", "admission_key", "admit", "batch_order"]


@dataclass(frozen=True)
class Admitted:
    """The requests to place this cycle, in the order to try them; ``quotas``: the queues'
    quota state, which each must also fit (None: no queue is declared)."""

    requests: tuple[PlacementRequest, ...]
    quotas: Quotas | None = None


def admission_key(request: PlacementRequest) -> tuple[int, float, str]:
    """Where a request goes in the order: higher priority, then older, then by id."""
    return (-request.spec.priority, request.submitted_at, request.workload)


def admit(requests: Iterable[PlacementRequest], quotas: Quotas | None = None,
          history: Mapping[str, float] | None = None) -> Admitted:
    """Admit ``requests`` in the global order (``admission_key``), or with ``quotas`` in the
    queues' fair order (``hafo.decisions.fair_order.admission_order``; ``history``: the queues'
    effective usage by decayed history, ``fair_sharing.usage_half_life``)."""
    ordered = sorted(requests, key=admission_key)
    if quotas is None:
        return Admitted(tuple(ordered))
    return Admitted(tuple(admission_order(ordered, quotas, history)), quotas)


def batch_order(requests: Iterable[PlacementRequest]) -> list[PlacementRequest]:
    """Global order: higher priority first, then older submissions, then id."""
    return list(admit(requests).requests)
