"""Choosing whom to preempt, fast: an index of the nodes by a lower bound of what stopping
work there costs. Pure. (Who may preempt whom is the ``PreemptionPolicy``'s:
``hafo.decisions.preemption_policy``; how it is applied, ``hafo.decisions.preemption``.)

The cost of making room for a request on a node is ``(workloads stopped, their total
priority, node name)``, lowest wins. For a request of k GPUs, a node with f free GPUs whose
stoppable workloads hold s1 >= s2 >= ... GPUs must stop at least c workloads, the smallest c
with f + s1 + ... + sc >= k, and their priorities add up to at least the sum of its c lowest
ones (p1 + ... + pc). Nodes are filed by class ``(f, (s1, s2, ...))``; per class and c, a heap
orders them by that sum, then name. A request merges the classes' heaps in the order of
``(c, p1 + ... + pc, name)``, evaluates nodes exactly (labels, cool-down, the GPU kind, the
workloads the policy lets it stop) in that order, and stops once the next bound is above the best
cost found: usually after one node. A node is re-filed when workloads on it are chosen.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hafo.decisions.placement_rules import (
    NodeCapacity,
    PlacementRequest,
    count_matching,
    filter_reason,
    gpu_matches,
)
from hafo.decisions.preemption_policy import PRIORITY_ONLY, PreemptionPolicy, Victim
from hafo.model.cluster import Gpu

__all__ = ["Preemption", "Victim", "VictimIndex", "fewest"]

Class = tuple[int, tuple[int, ...]]   # free GPUs, GPUs of each stoppable workload (desc)
Entry = tuple[int, str, int]          # sum of the c lowest priorities, node, node version
Cost = tuple[int, int, str]           # workloads stopped, their total priority, node


@dataclass(frozen=True)
class Preemption:
    """The decision for one preemptor."""

    preemptor: str
    node: str
    victims: tuple[str, ...]


def fewest(options: list[tuple[str, int, int]],
           deficit: int) -> tuple[int, int, tuple[str, ...]] | None:
    """Among ``(workload, priority, matching GPUs)`` options, the set freeing at least
    ``deficit`` GPUs with the fewest workloads, then the lowest total priority:
    ``(count, total priority, workloads)``, or None if all of them are not enough."""
    best: dict[int, tuple[int, int, tuple[str, ...]]] = {0: (0, 0, ())}
    for wid, priority, gain in options:
        for freed, (count, total, ids) in list(best.items()):
            if freed >= deficit:
                continue
            key = min(deficit, freed + gain)
            candidate = (count + 1, total + priority, (*ids, wid))
            if key not in best or candidate < best[key]:
                best[key] = candidate
    return best.get(deficit)


def _least(cls: Class, gpus: int) -> int | None:
    """The fewest workloads a node of class ``cls`` must stop to free ``gpus`` GPUs."""
    free, sizes = cls
    if free >= gpus:
        return 1  # not of the requested kind, or the request would have been placed
    freed = free
    for count, size in enumerate(sizes, 1):
        freed += size
        if freed >= gpus:
            return count
    return None


class VictimIndex:
    """The stoppable workloads by ready node (``by_node``), for one reconcile pass; which of
    them a request may stop is ``policy``'s."""

    def __init__(self, by_node: Mapping[str, list[Victim]],
                 capacity: Mapping[str, NodeCapacity],
                 policy: PreemptionPolicy = PRIORITY_ONLY) -> None:
        self.by_node = by_node
        self.capacity = capacity
        self.policy = policy
        self.taken: set[str] = set()
        self._version: dict[str, int] = {}
        self._class: dict[str, Class] = {}
        self._priorities: dict[str, list[int]] = {}
        self._members: dict[Class, set[str]] = {}
        self._heaps: dict[Class, dict[int, list[Entry]]] = {}
        for name in by_node:
            self._file(name)

    def _file(self, name: str) -> None:
        """(Re-)file a node from its current free GPUs and the workloads not yet taken."""
        old = self._class.get(name)
        if old is not None:
            self._members[old].discard(name)
        left = [v for v in self.by_node[name] if v.workload not in self.taken]
        version = self._version[name] = self._version.get(name, -1) + 1
        cls = (len(self.capacity[name].free), tuple(sorted((len(v.gpus) for v in left),
                                                           reverse=True)))
        self._class[name] = cls
        self._priorities[name] = sorted(v.priority for v in left)
        self._members.setdefault(cls, set()).add(name)
        for count, heap in self._heaps.get(cls, {}).items():
            heapq.heappush(heap, (sum(self._priorities[name][:count]), name, version))

    def _heap(self, cls: Class, count: int) -> list[Entry]:
        heaps = self._heaps.setdefault(cls, {})
        heap = heaps.get(count)
        if heap is None:
            heap = [(sum(self._priorities[n][:count]), n, self._version[n])
                    for n in self._members[cls]]
            heapq.heapify(heap)
            heaps[count] = heap
        return heap

    def _top(self, heap: list[Entry]) -> Entry | None:
        while heap and heap[0][2] != self._version[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _cost(self, request: PlacementRequest, roomless: PlacementRequest, name: str,
              now: float) -> tuple[Cost, tuple[str, ...]] | None:
        """The exact cost of making room on node ``name``, with the workloads to stop."""
        spec = request.spec
        cap = self.capacity[name]
        if filter_reason(roomless, cap, now) is not None:
            return None
        deficit = spec.gpus - count_matching(spec, cap.free)
        if deficit <= 0:
            return None
        inventory: dict[int, Gpu] = {g.index: g for g in cap.inventory}
        options: list[tuple[str, int, int]] = []
        for victim in self.by_node[name]:
            if victim.workload in self.taken or not self.policy.may_stop(request, victim):
                continue
            gain = sum(1 for i in victim.gpus if (gpu := inventory.get(i)) is not None
                       and gpu.usable and gpu_matches(spec, gpu))
            if gain:
                options.append((victim.workload, victim.priority, gain))
        if sum(gain for *_, gain in options) < deficit:
            return None
        pick = fewest(sorted(options), deficit)
        if pick is None:
            return None
        if not self.policy.accepts(request, self._victims(name, pick[2])):
            return None
        return (pick[0], pick[1], name), pick[2]

    def _victims(self, node: str, workloads: tuple[str, ...]) -> tuple[Victim, ...]:
        wanted = set(workloads)
        return tuple(v for v in self.by_node[node] if v.workload in wanted)

    def choose(self, request: PlacementRequest, now: float) -> Preemption | None:
        """The node and the fewest workloads the policy lets ``request`` stop there.
        The chosen workloads are taken, and the node's free GPUs of the request's kind leave
        its capacity (they are the preemptor's)."""
        spec = request.spec
        if spec.gpus <= 0:
            return None
        roomless = replace(request, spec=replace(spec, gpus=0))
        frontier: list[tuple[Cost, tuple[Class, int]]] = []
        for cls, members in self._members.items():
            count = _least(cls, spec.gpus) if members else None
            if count is None:
                continue
            top = self._top(self._heap(cls, count))
            if top is not None:
                frontier.append(((count, top[0], top[1]), (cls, count)))
        heapq.heapify(frontier)
        best: tuple[Cost, tuple[str, ...]] | None = None
        held: list[tuple[list[Entry], Entry]] = []
        while frontier and (best is None or frontier[0][0] < best[0]):
            _bound, (cls, count) = heapq.heappop(frontier)
            heap = self._heaps[cls][count]
            entry = heapq.heappop(heap)
            held.append((heap, entry))
            found = self._cost(request, roomless, entry[1], now)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
            top = self._top(heap)
            if top is not None:
                heapq.heappush(frontier, ((count, top[0], top[1]), (cls, count)))
        for heap, entry in held:
            heapq.heappush(heap, entry)
        if best is None:
            return None
        (_count, _total, node), chosen = best
        self.taken.update(chosen)
        self.policy.chosen(request, self._victims(node, chosen))
        cap = self.capacity[node]
        cap.free = [g for g in cap.free if not gpu_matches(spec, g)]
        self._file(node)
        return Preemption(request.workload, node, tuple(sorted(chosen)))
