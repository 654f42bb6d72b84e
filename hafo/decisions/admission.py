"""Stage 2 of the reconcile pipeline, **admit**: which placement requests are tried this
cycle, and in which order. Pure.

Today every request is admitted, in the global order: higher priority first, then older
submissions, then the workload id (so the result does not depend on the order watch events
came in). Stage 3 (``hafo.decisions.placement.place_in_order``) tries them in exactly this
order, which is also the order in which a waiting gang holds nodes and a preemptor picks
victims. Queue quotas and a fair order between queues will go here (issue 30).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hafo.decisions.placement_rules import PlacementRequest

__all__ = ["Admitted", "admission_key", "admit", "batch_order"]


@dataclass(frozen=True)
class Admitted:
    """The requests to place this cycle, in the order to try them."""

    requests: tuple[PlacementRequest, ...]


def admission_key(request: PlacementRequest) -> tuple[int, float, str]:
    """Where a request goes in the order: higher priority, then older, then by id."""
    return (-request.spec.priority, request.submitted_at, request.workload)


def admit(requests: Iterable[PlacementRequest]) -> Admitted:
    """Admit ``requests`` (all of them, today) in the global order (``admission_key``)."""
    return Admitted(tuple(sorted(requests, key=admission_key)))


def batch_order(requests: Iterable[PlacementRequest]) -> list[PlacementRequest]:
    """Global order: higher priority first, then older submissions, then id."""
    return list(admit(requests).requests)
