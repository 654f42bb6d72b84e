"""Placement: filter then score, deterministic, as one global pass over a batch. Pure.

The rules (filter, reasons, ``spread`` and ``binpack`` scores) are in
``hafo.decisions.placement_rules``; ``hafo.decisions.placement_index`` answers them in
O(log nodes) per request, so a batch of 10,000 requests over 10,000 nodes takes well under a
second. A workload being restarted in place prefers its own node.

This is stage 3 of the reconcile pipeline, **place**: ``place_in_order`` tries the requests
in the order stage 2 admitted them (``hafo.decisions.admission``), with a fallback for those
that do not fit (preemption: ``hafo.decisions.preemption``, under its policy).
``place_batch`` is the same for a plain collection of requests: admitted first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hafo.decisions.admission import admit, batch_order
from hafo.decisions.gang_placement import GangPlacer
from hafo.decisions.placement_index import PlacementIndex, SignatureKey, signature
from hafo.decisions.placement_rules import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Strategy,
    Unplaceable,
    filter_reason,
    gpu_matches,
    strategy_of,
)
from hafo.decisions.quota import Quotas
from hafo.model.cluster import ClusterSnapshot, NodeRecord

__all__ = ["Fallback", "NodeCapacity", "Placed", "PlacementRequest", "Strategy", "Unplaceable",
           "batch_order", "capacity_from", "commit", "filter_reason", "gpu_matches",
           "node_capacity", "place_batch", "place_in_order", "place_one", "strategy_of"]


def _empty(name: str, record: NodeRecord) -> NodeCapacity:
    gpus = record.gpus
    utilization = (sum(g.utilization or 0.0 for g in gpus) / len(gpus)) if gpus else 0.0
    return NodeCapacity(name=name, labels=record.labels, free=[g for g in gpus if g.usable],
                        allocated_gpus=0, workloads=0, utilization=utilization,
                        inventory=gpus)


def _hold(cap: NodeCapacity, gpus: tuple[int, ...]) -> None:
    if gpus:
        held = set(gpus)
        cap.free = [g for g in cap.free if g.index not in held]
    cap.allocated_gpus += len(gpus)
    cap.workloads += 1


def capacity_from(snapshot: ClusterSnapshot,
                  releasing: Iterable[str] = ()) -> dict[str, NodeCapacity]:
    """Free capacity of every ready node; ``releasing`` workloads' GPUs count as free.
    Linear in nodes + assignments."""
    released = set(releasing)
    capacity: dict[str, NodeCapacity] = {}
    for name, record in snapshot.nodes.items():
        if snapshot.node_state(name) == "ready":
            capacity[name] = _empty(name, record)
    for wid, assignment in snapshot.assignments.items():
        if not assignment.holds_node or wid in released:
            continue
        for node, gpus in assignment.slots:
            cap = capacity.get(node)
            if cap is not None:
                _hold(cap, gpus)
    return capacity


def node_capacity(snapshot: ClusterSnapshot, name: str,
                  releasing: Iterable[str] = ()) -> dict[str, NodeCapacity]:
    """``capacity_from`` restricted to node ``name`` (empty if it is not ready), computed from
    that node's workloads only."""
    record = snapshot.nodes.get(name)
    if record is None or snapshot.node_state(name) != "ready":
        return {}
    released = set(releasing)
    cap = _empty(name, record)
    for wid in snapshot.holders.get(name, ()):
        if wid not in released:
            for node, gpus in snapshot.assignments[wid].slots:
                if node == name:
                    _hold(cap, gpus)
    return {name: cap}


def place_one(request: PlacementRequest, capacity: Mapping[str, NodeCapacity], now: float,
              strategy: Strategy = "spread") -> Placed | Unplaceable:
    """Choose a node for one request without changing ``capacity``.

    The failure cool-down (``avoid``, after a node went down) is soft: such a node is used
    only when no other node fits, because running somewhere beats waiting. ``exclude`` (the
    workload itself failed there too often) is hard.
    """
    return PlacementIndex(capacity, now, strategy).place(request)


def commit(placed: Placed, capacity: Mapping[str, NodeCapacity]) -> None:
    """Take the placed GPUs out of ``capacity`` (outside of a ``place_batch`` pass)."""
    _hold(capacity[placed.node], placed.gpus)


Fallback = Callable[[PlacementRequest, Unplaceable], Iterable[str]]


def place_batch(requests: Iterable[PlacementRequest], capacity: Mapping[str, NodeCapacity],
                now: float, strategy: Strategy = "spread",
                unplaceable: Fallback | None = None,
                spares: Mapping[str, NodeCapacity] | None = None,
                ) -> dict[str, Placed | Unplaceable]:
    """Place a batch in one global pass; the result does not depend on the input order (the
    requests are admitted first, ``hafo.decisions.admission.admit``, then placed in that
    order: ``place_in_order``, which says what the other arguments mean)."""
    return place_in_order(admit(requests).requests, capacity, now, strategy, unplaceable,
                          spares)


def _place_single(index: PlacementIndex, request: PlacementRequest,
                  quotas: Quotas | None) -> Placed | Unplaceable:
    """One workload's place: for a queue with ``models``, first on the nodes of the flavor
    the order counted it in (``Quotas.in_counted_flavor``), else wherever a flavor has
    room."""
    preferred = quotas.in_counted_flavor(request) if quotas is not None else None
    if preferred is not None and preferred.flavor_full != request.flavor_full:
        found = index.place(preferred)
        if isinstance(found, Placed):
            return found
    return index.place(request)


def place_in_order(requests: Sequence[PlacementRequest],
                   capacity: Mapping[str, NodeCapacity], now: float,
                   strategy: Strategy = "spread", unplaceable: Fallback | None = None,
                   spares: Mapping[str, NodeCapacity] | None = None,
                   quotas: Quotas | None = None,
                   ) -> dict[str, Placed | Unplaceable]:
    """Place ``requests`` in one pass, in the order given (stage 2's,
    ``hafo.decisions.admission``: earlier requests get the room first). ``strategy`` applies
    to requests whose spec does not choose one. Commits to ``capacity``. ``unplaceable``,
    called in turn for each request that cannot be placed, may take room out of
    ``capacity`` (preemption holds it for the request) and returns the nodes it changed.
    Gangs are placed whole or not at all, ``spares`` (out of ``capacity``) replacing their
    failed members first (``hafo.decisions.gang_placement``). ``quotas``: each request must
    fit its queue's quota first (a request that does not is not tried: it holds no node, and
    only takes back quota its queue lent, through ``unplaceable`` with ``reclaim`` set:
    ``hafo.decisions.reclaim``), is kept off the nodes whose GPUs are of a flavor its
    queue has no room in (``Quotas.constrain``), and is charged once placed, in the flavor
    of the GPUs it got (``hafo.decisions.quota``)."""
    index = PlacementIndex(capacity, now, strategy)
    gangs = GangPlacer(index, dict(spares or {}))
    results: dict[str, Placed | Unplaceable] = {}
    groups: dict[str, set[str]] = {}  # service -> nodes its replicas got in this pass
    # A request like an earlier one of the pass that was not placed, with nothing placed,
    # charged, freed or held since, meets the same outcome (``_repeat_key``): thousands of
    # waiting requests of a few shapes cost one try per shape between two placements.
    changes = 0
    repeats: dict[_RepeatKey, tuple[int, Unplaceable]] = {}
    for request in requests:
        key = _repeat_key(request, quotas)
        if key is not None:
            earlier = repeats.get(key)
            if earlier is not None and earlier[0] == changes:
                results[request.workload] = earlier[1]
                continue
        held = (index.held_by, len(index.held))
        outcome = _place_one_request(request, index, gangs, groups, unplaceable, quotas)
        if isinstance(outcome, Placed):
            results[request.workload] = outcome
            changes += 1
            continue
        results[request.workload] = outcome.result
        if outcome.changed or (index.held_by, len(index.held)) != held:
            changes += 1
        elif key is not None:
            repeats[key] = (changes, outcome.result)
    return results


#: What makes two requests meet the same outcome in one state of a pass.
_RepeatKey = tuple[str, SignatureKey, int, int, str | None, bool]


def _repeat_key(request: PlacementRequest, quotas: Quotas | None) -> _RepeatKey | None:
    """For a plain request (one node, no history, no cool-downs, no service, not one that
    may reclaim, not of a queue with ``models``: its refusals and the fallback's answers
    depend only on this and on the room and quotas left), what two such requests share;
    None for any other."""
    spec = request.spec
    if spec.is_gang or request.members or request.prefer is not None \
            or request.only is not None or request.exclude or request.avoid \
            or request.apart or request.group is not None or request.reclaim:
        return None
    if quotas is not None:
        queue = quotas.queues.get(spec.queue)
        if request.workload in quotas.entitled or (queue is not None and queue.models):
            return None
    return (spec.queue, signature(spec), spec.gpus, spec.priority, spec.placement,
            quotas is not None)


@dataclass(frozen=True)
class _Tried:
    """A request's outcome in ``place_in_order``, and whether trying it changed the room
    (the fallback freed some: preemption)."""

    result: Unplaceable
    changed: bool


def _past_holds(request: PlacementRequest, index: PlacementIndex) -> PlacementRequest:
    """``request`` for a victim search: victims only where it would fit once they stop, so
    not on the nodes held for a waiting gang ahead of it (it would not get them: its
    victims' room would go back to others, and it would stop them again, every other cycle:
    loops the property test found, for a gang refused a node and for one refused its
    cohort's pool)."""
    if not index.held or index.held_by == request.workload:
        return request
    return replace(request, exclude={**request.exclude, **dict.fromkeys(index.held, math.inf)})


def _place_one_request(request: PlacementRequest, index: PlacementIndex, gangs: GangPlacer,
                       groups: dict[str, set[str]], unplaceable: Fallback | None,
                       quotas: Quotas | None) -> Placed | _Tried:
    """One request of ``place_in_order``'s pass: placed (and committed, charged), or why
    not, after its fallback (preemption, reclaim) and the hold."""
    refusal = quotas.refusal(request) if quotas is not None else None
    if quotas is not None and refusal is not None:
        waits = Unplaceable(refusal.summary())
        changed: tuple[str, ...] = ()
        if unplaceable is not None and request.workload in quotas.entitled \
                and quotas.reclaim_need(request) is not None:
            changed = tuple(unplaceable(_past_holds(quotas.for_reclaim(request), index),
                                        waits))
            for name in changed:
                index.refresh(name)
        # Reclaiming or not, it holds the pool's room against the borrowers after it: else
        # they take, in this very pass, the room its victims are about to free, and it
        # reclaims again every other cycle (a loop the property test found).
        held = quotas.hold_pool(request, refusal)
        return _Tried(waits, bool(changed) or held)  # held: those after it meet another
    if quotas is not None:
        request = quotas.constrain(request)  # only nodes of flavors with room
    if request.group is not None and groups.get(request.group):
        request = replace(request, apart=request.apart | groups[request.group])
    if request.spec.is_gang:
        gang = gangs.place(request)
        if isinstance(gang, Placed):
            gangs.commit(gang)
            if quotas is not None:
                quotas.charge(request, gang)
            if request.group is not None:
                groups.setdefault(request.group, set()).update(m.node for m in gang.members)
            return gang
        gangs.hold_for(request)
        if unplaceable is not None and quotas is not None \
                and request.workload in quotas.entitled:  # its lent quota, in use
            unplaceable(_past_holds(quotas.for_reclaim(request), index), gang)
        return _Tried(gang, True)  # a gang is never repeated
    outcome = _place_single(index, request, quotas)
    if isinstance(outcome, Placed):
        index.commit(outcome)
        if quotas is not None:
            quotas.charge(request, outcome)
        if request.group is not None:
            groups.setdefault(request.group, set()).add(outcome.node)
        return outcome
    changed = ()
    if unplaceable is not None:
        changed = tuple(unplaceable(_past_holds(request, index), outcome))
        if not changed and quotas is not None and request.workload in quotas.entitled:
            # Within its quota, but the room it needs is held by borrowers (free GPUs
            # scattered over nodes they fill): it takes it back as when the quota is.
            changed = tuple(unplaceable(_past_holds(quotas.for_reclaim(request), index),
                                        outcome))
        for name in changed:
            index.refresh(name)
    return _Tried(outcome, bool(changed))
