"""Preemption: make room for a workload that cannot be placed by stopping lower-priority
work on one node, checkpoint first. Pure.

Who may preempt whom is a ``PreemptionPolicy`` (``hafo.decisions.preemption_policy``); the
default, ``PriorityOnly``, is the rule below. A workload whose spec says ``preempt: true``
and that no node can take now may stop placed workloads of strictly lower priority. It
picks ONE ready node that it could use apart from
free room (``only``, ``exclude``, cool-down, labels) where stopping the fewest such workloads
frees enough free usable GPUs of its kind (ties: the lowest total priority stopped, then the
node name). Each victim is moved (phase ``moving``, checkpoint first, ``preempted_for`` the
preemptor); the preemptor stays pending, "waiting for N preempted workload(s) on NODE".

While its victims are moving, a preemptor picks no more victims, and the room on that node
is reserved for it: its request may use only that node, and the free GPUs of its kind there
(up to what it asks for, lowest indices first) are hidden from every other request. Once
the victims have stopped it is placed there; the victims are placed elsewhere (or stay
pending with their reason) like any planned move.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hafo.decisions.placement_index import SignatureKey, signature
from hafo.decisions.placement_rules import (
    NodeCapacity,
    PlacementRequest,
    Unplaceable,
    count_matching,
    gpu_matches,
)
from hafo.decisions.preemption_policy import PRIORITY_ONLY, PreemptionPolicy
from hafo.decisions.reclaim import Reclaiming, gang_reclaim
from hafo.decisions.victims import Preemption, Victim, VictimIndex
from hafo.model.cluster import ClusterSnapshot

__all__ = ["Preempting", "Preemption", "Victim", "VictimIndex", "WaitingPreemptor",
           "choose_victims", "reserve", "victims_by_node", "waiting_preemptors"]


@dataclass(frozen=True)
class WaitingPreemptor:
    """A preemptor whose victims are still being stopped on ``node``. ``candidates``: every
    node all its victims hold GPUs on (a gang victim holds several; which of them the room
    was made on is the one where the preemptor fits: ``room_for``)."""

    node: str
    victims: tuple[str, ...]
    candidates: tuple[str, ...] = ()

    def room_for(self, request: PlacementRequest,
                 capacity: Mapping[str, NodeCapacity]) -> str:
        """The candidate with the most free GPUs of ``request``'s kind (then by name):
        where its victims' stop made the room; ``node`` when there is no choice."""
        ready = [n for n in self.candidates if n in capacity]
        if len(ready) <= 1:
            return ready[0] if ready else self.node
        return min(ready, key=lambda n: (-count_matching(request.spec, capacity[n].free), n))


def waiting_preemptors(snapshot: ClusterSnapshot) -> dict[str, WaitingPreemptor]:
    """preemptor -> the node and victims (phase ``moving`` for it) it waits for. The node is
    the one every victim holds GPUs on (victims are chosen on one node; a gang victim holds
    several, so its rank 0's node is not enough), the lowest-named if several; for a gang
    reclaimer's victims, which may share none, the first victim's node."""
    found: dict[str, list[tuple[str, frozenset[str], str]]] = {}
    for wid, assignment in sorted(snapshot.assignments.items()):
        owner = assignment.preempted_for
        if owner is None or assignment.phase != "moving" or assignment.node is None:
            continue
        found.setdefault(owner, []).append((wid, frozenset(assignment.nodes), assignment.node))
    out = {}
    for owner, victims in found.items():
        common = frozenset.intersection(*(nodes for _w, nodes, _n in victims))
        node = min(common) if common else victims[0][2]
        out[owner] = WaitingPreemptor(node, tuple(w for w, _nodes, _n in victims),
                                      tuple(sorted(common)))
    return out


def reserve(request: PlacementRequest, node: str,
            capacity: Mapping[str, NodeCapacity]) -> PlacementRequest:
    """Hold the free GPUs of the request's kind on ``node`` (up to what it asks for, lowest
    indices first) for the waiting preemptor: they leave ``capacity`` and travel with the
    request, which may now use only ``node``. A node that is not ready reserves nothing."""
    cap = capacity.get(node)
    if cap is None:
        return request
    spec = request.spec
    held = sorted((g for g in cap.free if gpu_matches(spec, g)), key=lambda g: g.index)
    held = held[:spec.gpus]
    taken = {g.index for g in held}
    cap.free = [g for g in cap.free if g.index not in taken]
    return replace(request, only=node, prefer=node, reserved=(*request.reserved, *held))


def victims_by_node(snapshot: ClusterSnapshot, settled: Iterable[str],
                    capacity: Mapping[str, NodeCapacity],
                    policy: PreemptionPolicy = PRIORITY_ONLY) -> VictimIndex:
    """The ``settled`` workloads (nothing else decided for them this cycle) placed with GPUs
    on a ready node, indexed: the only ones preemption may stop (those of them ``policy``
    lets a request stop)."""
    out: dict[str, list[Victim]] = {}
    for wid in sorted(settled):
        assignment = snapshot.assignments.get(wid)
        submission = snapshot.workloads.get(wid)
        if assignment is None or submission is None or assignment.phase != "placed":
            continue
        spec = submission.spec
        for node, gpus in assignment.slots:  # a gang: one entry per member (policy decides)
            if node in capacity and gpus:
                out.setdefault(node, []).append(Victim(wid, spec.priority, gpus, spec.queue,
                                                       gang=assignment.is_gang))
    return VictimIndex(out, capacity, policy)


def choose_victims(request: PlacementRequest, victims: VictimIndex,
                   now: float) -> Preemption | None:
    """The node and the fewest workloads the index's policy lets ``request`` stop there (see
    ``hafo.decisions.victims``). The chosen workloads are no longer available to others this
    cycle, and the node's free GPUs of the request's kind are held for the preemptor."""
    return victims.choose(request, now)


class Preempting:
    """The ``place_in_order`` fallback that picks victims for each unplaceable request that
    ``policy`` lets preempt and that is not already waiting, in the order of the pass (stage
    2's), so a preemptor gets the room it makes before work after it is placed. ``chosen``:
    preemptor -> its preemption, for this pass."""

    def __init__(self, snapshot: ClusterSnapshot, settled: Iterable[str],
                 capacity: Mapping[str, NodeCapacity], waiting: Mapping[str, WaitingPreemptor],
                 now: float, policy: PreemptionPolicy = PRIORITY_ONLY) -> None:
        self.waiting = waiting
        self.now = now
        self.policy = policy
        self.victims = victims_by_node(snapshot, settled, capacity, policy)
        self.chosen: dict[str, Preemption] = {}
        self.hopeless: set[tuple[SignatureKey, int, int, str, bool, frozenset[str]]] = set()

    def __call__(self, request: PlacementRequest, result: Unplaceable) -> tuple[str, ...]:
        """Choose victims for ``request``; the nodes whose room changed."""
        if result.exhausted or request.workload in self.waiting \
                or not self.policy.preempts(request):
            return ()
        if request.spec.is_gang:  # only a reclaim: victims anywhere, whole gangs too
            if request.reclaim and isinstance(self.policy, Reclaiming):
                found = gang_reclaim(request, self.policy, self.victims, self.now)
                if found is not None:
                    self.chosen[request.workload] = found
            return ()
        # Room only shrinks during a pass: a request like one that found no victims (and
        # no more restricted than it was) finds none either.
        plain = request.only is None and not any(
            t > self.now for t in (*request.avoid.values(), *request.exclude.values()))
        key = (signature(request.spec), request.spec.gpus, request.spec.priority,
               request.spec.queue, request.reclaim, request.flavor_full)
        if key in self.hopeless:
            return ()
        preemption = choose_victims(request, self.victims, self.now)
        if preemption is None:
            if plain:
                self.hopeless.add(key)
            return ()
        self.chosen[request.workload] = preemption
        return (preemption.node,)
