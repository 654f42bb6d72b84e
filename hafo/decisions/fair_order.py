"""The fair order between queues: the order in which stage 2 of the reconcile pipeline
(**admit**) has the placement requests tried, by their queues' quotas and usage
(``hafo.decisions.quota``). Pure.

**Order.** Requests of one queue are taken by priority, then age. Across queues, those that
fit within their queue's nominal quota (counting the queue's earlier requests, but not one
that could never fit: above its borrowing limit or the whole pool) come first;
then those that borrow, by their queue's weighted **dominant share** once admitted (Kueue's
DRS: the GPUs it would use above its nominal quota, divided by its cohort's pool, divided
by its weight), lowest first; ties by priority, then age, then id. The order is decided
once per cycle from the usage at its start (``admission_order``); the quota is then checked
again, request by request, as placements are made (``hafo.decisions.quota.Quotas.refusal``
before trying one, ``Quotas.charge`` once placed), so the limits hold exactly whatever the
order.

**No ping-pong.** Nothing here stops a running workload: a request that does not fit its
quota waits. The only stops are priority preemption within one queue
(``hafo.decisions.preemption_policy.QueueScoped``) and reclaim by a request counted within
its queue's quota (``Quotas.entitled``; ``hafo.decisions.reclaim``); docs/design.md,
"Queues and fair share", argues why no two queues can take GPUs back and forth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.quota import EPSILON, Quotas, charge
from hafo.model.queues import QueueSpec

__all__ = ["admission_order", "within_queue_key"]


def within_queue_key(request: PlacementRequest) -> tuple[int, float, str]:
    """The order of the requests of one queue: by priority, then age, then id."""
    return (-request.spec.priority, request.submitted_at, request.workload)


def admission_order(requests: Sequence[PlacementRequest], quotas: Quotas,
                    history: Mapping[str, float] | None = None) -> list[PlacementRequest]:
    """The requests in the order they are tried (see the module docstring): per queue by
    priority and age; those within their queue's nominal quota first, then the borrowers by
    their queue's weighted dominant share once admitted; requests of undeclared queues
    last. ``history``: queue -> its effective usage by decayed history
    (``fair_sharing.usage_half_life``: ``hafo.decisions.usage_history``), which the
    borrowers' shares count instead of the usage now (a queue not in it: its usage now);
    who is within its nominal quota is decided by the usage now either way."""
    by_queue: dict[str, list[PlacementRequest]] = {}
    for request in requests:
        by_queue.setdefault(request.spec.queue, []).append(request)
    keyed: list[tuple[tuple[int, float, int, float, str], PlacementRequest]] = []
    quotas.entitled.clear()
    quotas.entitled_in.clear()
    quotas.counted_in.clear()
    for name, members in by_queue.items():
        members.sort(key=within_queue_key)
        flavored = quotas.queues.get(name)
        if flavored is not None and flavored.models and flavored.gpus is not None:
            # per flavor, by the usage now (the history, one figure per queue, is not
            # split by flavor)
            keyed += _flavored_keys(members, flavored, quotas)
            continue
        used = start = quotas.used.get(name, 0.0)
        basis = start if history is None else history.get(name, start)
        ceiling = quotas.ceiling(name) if name in quotas.queues else 0.0
        for request in members:
            if name not in quotas.queues:
                keyed.append(((2, 0.0, -request.spec.priority, request.submitted_at,
                               request.workload), request))
                continue
            after = used + charge(request.spec)
            if after > ceiling + EPSILON:  # can never fit now: it does not count for those
                tier, share = 1, float("inf")  # after it (nor hold their place)
            else:
                used = after
                borrowing = not quotas.within_nominal(name, used)
                tier, share = (1, quotas.share(name, basis + used - start)) if borrowing \
                    else (0, 0.0)
            if tier == 0:
                quotas.entitled.add(request.workload)
            keyed.append(((tier, share, -request.spec.priority, request.submitted_at,
                           request.workload), request))
    keyed.sort(key=lambda pair: pair[0])
    return [request for _key, request in keyed]


def _flavored_keys(members: Sequence[PlacementRequest], queue: QueueSpec, quotas: Quotas,
                   ) -> list[tuple[tuple[int, float, int, float, str], PlacementRequest]]:
    """``admission_order``'s keys for the requests of a queue with ``models`` (by priority
    and age): each counts in the first flavor it could use where it stays within the
    nominal quota, else in the one with room where its queue's dominant share stays lowest;
    one with room in none can never fit now. One counted within the quota is ``entitled``
    to take back lent quota of that flavor (``Quotas.entitled_in``)."""
    name = queue.name
    used = {f: quotas.used_in(name, f) for f in queue.flavors}
    ceilings = {f: quotas.ceiling(name, f) for f in queue.flavors}
    keyed = []
    for request in members:
        needs = charge(request.spec)
        room = [f for f in quotas.flavors_for(queue, request.spec)
                if used[f] + needs <= ceilings[f] + EPSILON]
        within = [f for f in room if quotas.within_nominal(name, used[f] + needs, f)]
        tier, share = 1, float("inf")
        if within:
            used[within[0]] += needs
            tier, share = 0, 0.0
            quotas.entitled.add(request.workload)
            quotas.entitled_in[request.workload] = quotas.counted_in[request.workload] = \
                within[0]
        elif room:
            best = min(room, key=lambda f: (quotas.dominant_share(
                name, {**used, f: used[f] + needs}), room.index(f)))
            used[best] += needs
            share = quotas.dominant_share(name, used)
            quotas.counted_in[request.workload] = best
        keyed.append(((tier, share, -request.spec.priority, request.submitted_at,
                       request.workload), request))
    return keyed
