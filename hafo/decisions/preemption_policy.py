"""Who may preempt whom: the policy that stage 3 (place) applies when a request does not fit.
Pure.

The placer and the victim index (``hafo.decisions.victims``) ask a ``PreemptionPolicy``
two questions: may this request preempt at all, and may it stop this placed workload. How
victims are then chosen among those it may stop (one node, the fewest, then the lowest total
priority) is the index's. ``PriorityOnly``, the default, is hafo's rule: a spec with
``preempt: true`` may stop work of strictly lower priority; while queues are declared,
``reconcile`` wraps it in ``QueueScoped`` (only work of the preemptor's own queue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hafo.decisions.placement_rules import PlacementRequest
from hafo.model.queues import DEFAULT_QUEUE

__all__ = ["PRIORITY_ONLY", "PreemptionPolicy", "PriorityOnly", "QueueScoped", "Victim"]


@dataclass(frozen=True)
class Victim:
    """A placed workload that could be stopped, on one node: its priority, its GPUs there
    and its queue."""

    workload: str
    priority: int
    gpus: tuple[int, ...]
    queue: str = DEFAULT_QUEUE
    #: a gang's member on this node: stopping it stops the whole gang (every member)
    gang: bool = False


class PreemptionPolicy(Protocol):
    """Who may preempt whom. Both answers must not change during a reconcile pass. ``may_stop``
    only narrows the placed workloads the victim index knows (it prunes by bounds computed
    over all of them), and depends on the request only through its spec's signature, GPUs,
    priority and queue (a request like one that found no victims finds none either:
    ``hafo.decisions.preemption.Preempting``)."""

    def preempts(self, request: PlacementRequest) -> bool:
        """May ``request``, which does not fit, stop other work to make room?"""
        ...

    def may_stop(self, request: PlacementRequest, victim: Victim) -> bool:
        """May ``request`` stop ``victim``?"""
        ...

    def accepts(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> bool:
        """Is stopping all of ``victims`` (each one it may stop, chosen to make room on one
        node) enough, and allowed, together?"""
        ...

    def chosen(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> None:
        """``victims`` are stopped for ``request`` (the pass goes on knowing it)."""
        ...


@dataclass(frozen=True)
class PriorityOnly:
    """The default: a spec with ``preempt: true`` may stop strictly lower-priority work."""

    def preempts(self, request: PlacementRequest) -> bool:
        """The spec says ``preempt: true``."""
        return request.spec.preempt

    def may_stop(self, request: PlacementRequest, victim: Victim) -> bool:
        """The victim's priority is strictly below the request's, and it is not a gang
        (stopping one member for room on one node would stop them all)."""
        return not victim.gang and victim.priority < request.spec.priority

    def accepts(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> bool:
        """Room on the node is all it needs."""
        return True

    def chosen(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> None:
        """Nothing to remember."""


@dataclass(frozen=True)
class QueueScoped:
    """``inner``, within one queue: a request may stop only work of its own queue (the
    rule while queues are declared, ``hafo.decisions.fair_order``: one team's priorities say
    nothing about another team's work)."""

    inner: PreemptionPolicy

    def preempts(self, request: PlacementRequest) -> bool:
        """As ``inner``."""
        return self.inner.preempts(request)

    def may_stop(self, request: PlacementRequest, victim: Victim) -> bool:
        """The victim is in the request's queue and ``inner`` lets it stop it."""
        return victim.queue == request.spec.queue and self.inner.may_stop(request, victim)

    def accepts(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> bool:
        """As ``inner``."""
        return self.inner.accepts(request, victims)

    def chosen(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> None:
        """As ``inner``."""
        self.inner.chosen(request, victims)


#: The policy ``reconcile`` uses unless told otherwise.
PRIORITY_ONLY: PreemptionPolicy = PriorityOnly()
