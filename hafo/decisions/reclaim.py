"""Reclaim: a queue takes back the quota it lent to its cohort, checkpoint first. Pure.

A request that the cycle's order counted within its queue's nominal quota
(``Quotas.entitled``: so it is tried before any borrower, the victims' own requests
included) may stop borrowed work (``PlacementRequest.reclaim``) when it does not fit either
its quota, only because its cohort's pool is used up (``Quotas.reclaim_need``), or the
GPUs, although its quota has room (its free GPUs scattered over nodes that borrowers fill).
It goes through the preemption path (``hafo.decisions.preemption``: victims on one node, the
fewest, then the lowest total priority; the victims are moved checkpoint first, a planned
stop, and the room on that node is held for the reclaimer until they have stopped), under
``Reclaiming``'s rules:

- a victim is placed work of another queue of the same cohort that uses more than its
  nominal quota, and stopping it (with the other victims of its queue) leaves that queue at
  or above its nominal quota: reclaim never takes a borrower below its own quota;
- a victim that has run less than ``min_runtime`` (``fair_sharing.min_runtime``, from its
  agent's start of the instance, or from when this controller first saw it running) is
  left alone, unless its queue is over its borrowing limit (a limit lowered since);
- the victims together free at least what the pool lacks for the request, besides room on
  the node: no victim is stopped for nothing;
- with per-GPU-model quotas (a queue declared with ``models``), all of this is per flavor:
  a request reclaims only in the flavor the order counted it within quota in
  (``Quotas.entitled_in``), only on nodes whose GPUs are all of that flavor
  (``Quotas.for_reclaim``), and only work whose GPUs all count in that flavor for both
  queues, of a queue above its nominal quota in it, never taking it below that; what the
  pool lacks is the pool of that flavor (``Quotas.reclaim_need``).

Requests that are not reclaiming keep the priority rule of ``inner`` (``QueueScoped``),
which never stops a gang. A reclaim may: a gang is a victim whole (all its members stop,
and its whole charge counts against "never below its quota"). A gang reclaims too
(``gang_reclaim``): victims on the nodes its members would take, then anywhere until the
pool's shortage is covered, checked by placing the gang on the capacity those victims
leave; if it would not fit, nothing is stopped.

No cycle: the reclaimer's queue stays within its nominal quota, so it borrows nothing and
is never a victim of a reclaim; a victim's queue stays at or above its own, so its work
asks again as a borrower, which never reclaims. (docs/design.md, "Queues and fair share".)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from hafo.decisions.gang_placement import GangPlacer
from hafo.decisions.placement_index import PlacementIndex
from hafo.decisions.placement_rules import NodeCapacity, Placed, PlacementRequest, count_matching
from hafo.decisions.preemption_policy import PreemptionPolicy, Victim
from hafo.decisions.quota import Quotas, charge
from hafo.decisions.victims import Preemption, VictimIndex
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import REST, QueueSpec

__all__ = ["DEFAULT_MIN_RUNTIME", "Reclaiming", "gang_reclaim"]

#: ``fair_sharing.min_runtime``'s default: borrowed work runs at least this long (seconds)
#: before a lender may take its quota back.
DEFAULT_MIN_RUNTIME = 300.0
_EPSILON = 1e-9


@dataclass
class Reclaiming:
    """``inner`` for ordinary preemptors; the reclaim rules (module docstring) for requests
    with ``reclaim`` set. ``quotas``: the pass's quota state; ``running_since``: workload ->
    since when its instance runs (``hafo.decisions.reconcile``: the agent's start, or when
    this controller first saw it running); ``now``; ``min_runtime``."""

    inner: PreemptionPolicy
    snapshot: ClusterSnapshot
    quotas: Quotas
    running_since: Mapping[str, float]
    now: float
    min_runtime: float = DEFAULT_MIN_RUNTIME
    #: queue -> GPUs already reclaimed from it in this pass
    taken: dict[str, float] = field(default_factory=dict)
    #: (queue, flavor) -> the same, for the queues with ``models``
    taken_in: dict[tuple[str, str], float] = field(default_factory=dict)
    #: reclaimers that found borrowed work they could stop but for its age (min_runtime)
    held_young: set[str] = field(default_factory=set)

    def preempts(self, request: PlacementRequest) -> bool:
        """A reclaimer always may; others as ``inner`` says."""
        return request.reclaim or self.inner.preempts(request)

    def _charge(self, victim: Victim) -> float:
        submission = self.snapshot.workloads.get(victim.workload)
        return charge(submission.spec) if submission is not None else 0.0

    def _above_nominal(self, queue: str, flavor: str = REST) -> float:
        spec = self.quotas.queues[queue]
        if not spec.models:
            used = self.quotas.used.get(queue, 0.0) - self.taken.get(queue, 0.0)
            return used - float(spec.gpus or 0) if flavor == REST else 0.0
        used = self.quotas.used_in(queue, flavor) - self.taken_in.get((queue, flavor), 0.0)
        return used - float(spec.nominal(flavor))

    def _all_in(self, victim: Victim, flavor: str, *queues: QueueSpec) -> bool:
        """Whether every GPU the victim holds counts in ``flavor`` for each of ``queues``."""
        assignment = self.snapshot.assignments.get(victim.workload)
        if assignment is None:
            return False
        return all(self.quotas.flavor_at(queue, node, gpus) == flavor
                   for node, gpus in assignment.slots for queue in queues)

    def may_stop(self, request: PlacementRequest, victim: Victim) -> bool:
        """For a reclaimer: borrowed work of its cohort, old enough (module docstring)."""
        if not request.reclaim:
            return self.inner.may_stop(request, victim)
        mine = self.quotas.queues.get(request.spec.queue)
        theirs = self.quotas.queues.get(victim.queue)
        flavor = self.quotas.reclaim_flavor(request)
        if mine is None or theirs is None or theirs.gpus is None or mine.cohort is None \
                or theirs.cohort != mine.cohort or victim.queue == request.spec.queue \
                or flavor is None:
            return False
        if (mine.models or theirs.models) and not self._all_in(victim, flavor, mine, theirs):
            return False  # it frees GPUs of another flavor: not the quota taken back
        if self._above_nominal(victim.queue, flavor) < self._charge(victim) - _EPSILON:
            return False
        young = self.now - self.running_since.get(victim.workload, self.now) < self.min_runtime
        if young and not self._over_borrowing_limit(victim.queue, flavor):
            self.held_young.add(request.workload)
            return False
        return True

    def _over_borrowing_limit(self, queue: str, flavor: str = REST) -> bool:
        spec = self.quotas.queues[queue]
        return spec.borrowing_limit is not None \
            and self._above_nominal(queue, flavor) > spec.borrowing_limit + _EPSILON

    def accepts(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> bool:
        """For a reclaimer: no victim's queue goes below its nominal quota (in the flavor
        reclaimed), and together they free what the pool lacks."""
        if not request.reclaim:
            return self.inner.accepts(request, victims)
        flavor = self.quotas.reclaim_flavor(request)
        short = self.quotas.reclaim_need(request)
        if flavor is None or short is None:
            return False
        per_queue: dict[str, float] = {}
        for victim in victims:
            per_queue[victim.queue] = per_queue.get(victim.queue, 0.0) + self._charge(victim)
        if any(self._above_nominal(queue, flavor) < freed - _EPSILON
               for queue, freed in per_queue.items()):
            return False  # together they would take their queue below its quota
        return sum(per_queue.values()) >= short - _EPSILON

    def chosen(self, request: PlacementRequest, victims: tuple[Victim, ...]) -> None:
        """Remember what was taken from each queue (per flavor for a queue with
        ``models``), for the reclaims after it."""
        if not request.reclaim:
            self.inner.chosen(request, victims)
            return
        flavor = self.quotas.reclaim_flavor(request) or REST
        for victim in victims:
            amount = self._charge(victim)
            if self.quotas.queues[victim.queue].models:
                key = (victim.queue, flavor)
                self.taken_in[key] = self.taken_in.get(key, 0.0) + amount
            else:
                self.taken[victim.queue] = self.taken.get(victim.queue, 0.0) + amount


def _placed_without(request: PlacementRequest, capacity: Mapping[str, NodeCapacity],
                    snapshot: ClusterSnapshot, victims: Iterable[str],
                    now: float) -> Placed | None:
    """Where the gang ``request`` would go if ``victims`` were stopped (their GPUs free on
    every node they hold), on a copy of ``capacity``; None if it would not fit."""
    freed: dict[str, set[int]] = {}
    for wid in victims:
        for node, gpus in snapshot.assignments[wid].slots:
            freed.setdefault(node, set()).update(gpus)
    copy: dict[str, NodeCapacity] = {}
    for name, cap in capacity.items():
        extra = [g for g in cap.inventory if g.index in freed.get(name, ()) and g.usable
                 and all(f.index != g.index for f in cap.free)]
        copy[name] = replace(cap, free=[*cap.free, *extra])
    placed = GangPlacer(PlacementIndex(copy, now)).place(request)
    return placed if isinstance(placed, Placed) else None


def gang_reclaim(request: PlacementRequest, policy: Reclaiming, index: VictimIndex,
                 now: float) -> Preemption | None:
    """Victims for a gang that takes back its queue's lent quota (module docstring), taken
    in ``index`` and told to ``policy``; None when no set of them lets it fit."""
    short = policy.quotas.reclaim_need(request)  # 0: room in its quota, not on the nodes
    if short is None:
        return None
    snapshot, capacity = policy.snapshot, index.capacity
    candidates: dict[str, Victim] = {}
    on_node: dict[str, list[Victim]] = {}
    for node, entries in sorted(index.by_node.items()):
        if node in request.flavor_full:
            continue  # GPUs of another flavor than the one it takes back
        for victim in entries:
            if victim.workload in index.taken or not policy.may_stop(request, victim):
                continue
            candidates.setdefault(victim.workload, victim)
            on_node.setdefault(node, []).append(victim)
    if not candidates:
        return None

    def order(victim: Victim) -> tuple[int, float, str]:  # lowest priority, youngest first
        return (victim.priority, -policy.running_since.get(victim.workload, now),
                victim.workload)

    target = _placed_without(request, capacity, snapshot, candidates, now)
    if target is None:
        return None
    chosen: list[str] = []
    for member in target.members:  # room on the nodes the gang would take
        missing = request.spec.gpus - count_matching(request.spec, capacity[member.node].free)
        for victim in sorted(on_node.get(member.node, ()), key=order):
            if missing <= 0:
                break
            if victim.workload not in chosen:
                chosen.append(victim.workload)
            missing -= len(victim.gpus)
    freed = sum(policy._charge(candidates[w]) for w in chosen)
    for victim in sorted(candidates.values(), key=order):  # then the pool's shortage
        if freed >= short:
            break
        if victim.workload not in chosen:
            chosen.append(victim.workload)
            freed += policy._charge(victim)
    picked = tuple(candidates[w] for w in chosen)
    if not policy.accepts(request, picked):
        return None
    placed = _placed_without(request, capacity, snapshot, chosen, now)
    if placed is None:
        return None
    index.taken.update(chosen)
    policy.chosen(request, picked)
    return Preemption(request.workload, placed.node, tuple(sorted(chosen)))
