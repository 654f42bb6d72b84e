"""All-or-nothing placement of gangs, inside the batch pass of ``place_batch``. Pure.

A gang of N members needs N distinct nodes, each with ``gpus`` free GPUs of its kind. It is
placed whole or not at all: nothing is committed until every member has a node.

- **Re-placement** (a gang whose previous epoch stopped): each previous member keeps its node
  and rank if that node is still ready, fits, is not cooling down or excluded and is not one
  the gang leaves (``PlacementRequest.leave``); the missing ranks go to spare nodes first (see
  ``choose_spares``), then to the best ordinary nodes. A member that moves to a requested
  node (``prefer``) goes there or nowhere.
- **Topology** ``required``: every member in one value of the label (kept members fix the
  value, unless it has no room left: then the whole gang moves to a value that has; a new
  gang tries the values in order); ``preferred``: the same, else anywhere.
- **No starvation.** The first gang in placement order (priority, then age) that cannot be
  placed holds the nodes closest to fitting it: its N nodes with the most free GPUs of its
  kind (in its best topology value). Work after it in that order is not placed on them, so
  they fill up as their work ends, until the gang fits. Work with priority over it still is.
- **Spares.** Nodes labelled ``hafo.io/spare: "true"``, and idle ready nodes up to the
  controller's ``placement.spares`` target, take no ordinary work: they replace failed gang
  members first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hafo.decisions.placement_failure import GangShortage
from hafo.decisions.placement_index import PlacementIndex, SignatureKey, signature
from hafo.decisions.placement_rules import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Unplaceable,
    _qualified,
    filter_reason,
    take_gpus,
)
from hafo.model.cluster import ClusterSnapshot, Member
from hafo.model.spec import WorkloadSpec

SPARE_LABEL = "hafo.io/spare"

_MemoKey = tuple[SignatureKey, int, int, str | None, str | None]


def choose_spares(snapshot: ClusterSnapshot, capacity: dict[str, NodeCapacity],
                  target: int) -> dict[str, NodeCapacity]:
    """Take the spare nodes out of ``capacity`` and return them: every ready node labelled
    ``hafo.io/spare: "true"``, and besides them ``target`` idle ready nodes (nothing placed
    or moving there; ``placement.spares``), most GPUs first, then by name. An idle spare that
    a gang member took is busy, so the next idle node becomes one."""
    labelled = sorted(n for n, cap in capacity.items() if cap.labels.get(SPARE_LABEL) == "true")
    chosen = list(labelled)
    if target > 0:
        idle = sorted((n for n, cap in capacity.items()
                       if n not in labelled and not snapshot.holders.get(n) and cap.free),
                      key=lambda n: (-len(capacity[n].free), n))
        chosen += idle[:target]
    return {name: capacity.pop(name) for name in chosen}


@dataclass
class GangPlacer:
    """Places the gangs of one pass over ``index``'s capacity and ``spares``."""

    index: PlacementIndex
    spares: dict[str, NodeCapacity] = field(default_factory=dict)
    holder: str | None = None  # the waiting gang that holds nodes this pass
    _failed_groups: dict[_MemoKey, set[str]] = field(default_factory=dict)
    _hopeless: dict[_MemoKey, Unplaceable] = field(default_factory=dict)

    @property
    def now(self) -> float:
        """The pass's time."""
        return self.index.now

    def capacity_of(self, name: str) -> NodeCapacity | None:
        """A ready node's capacity record, ordinary or spare."""
        return self.index.capacity.get(name) or self.spares.get(name)

    # -- placing ------------------------------------------------------------------------

    def place(self, request: PlacementRequest) -> Placed | Unplaceable:
        """Nodes for every member of the gang, or why not (nothing is committed)."""
        spec = request.spec
        memo = _memo_key(request, self.now)
        if memo is not None and memo in self._hopeless:
            return self._hopeless[memo]
        kept = self._kept(request)
        topology = spec.topology
        key = topology.key if topology is not None else None
        required = topology is not None and topology.mode == "required"
        if kept and key is not None:
            group = self.capacity_of(next(iter(kept.values())))
            value = group.labels.get(key) if group is not None else None
            found = self._fill(request, kept, value)
            if isinstance(found, int) and required:  # the whole gang to another value
                elsewhere = self._by_group(request, {}, key, None)
                found = elsewhere if isinstance(elsewhere, Placed) else max(found, elsewhere)
            elif isinstance(found, int):
                found = self._fill(request, kept, None)
        elif key is None:
            found = self._fill(request, kept, None)
        else:
            found = self._by_group(request, kept, key, memo)
            if isinstance(found, int) and not required:
                found = self._fill(request, kept, None)
        if isinstance(found, Placed):
            return found
        outcome = Unplaceable(self._shortage(request, found, key if required else None))
        if memo is not None:
            self._hopeless[memo] = outcome
        return outcome

    def _by_group(self, request: PlacementRequest, kept: dict[int, str], key: str,
                  memo: _MemoKey | None) -> Placed | int:
        """Try each value of the topology label in turn (sorted); the first that takes the
        whole gang wins, else the most members any value had room for. A value that failed
        this pass is not tried again (room only shrinks during a pass)."""
        best = 0
        failed = self._failed_groups.setdefault(memo, set()) if memo is not None else set()
        for value in self.index.label_values(key, request.spec):
            if value in failed:
                continue
            found = self._fill(request, kept, value)
            if isinstance(found, Placed):
                return found
            failed.add(value)
            best = max(best, found)
        return best

    def _kept(self, request: PlacementRequest) -> dict[int, str]:
        """rank -> node of the previous members that stay where they are."""
        spec = request.spec
        plain = replace(request, prefer=None, only=None)
        kept: dict[int, str] = {}
        for member in sorted(request.members, key=lambda m: m.rank):
            if member.rank >= spec.nodes or member.node in request.leave:
                continue
            cap = self.capacity_of(member.node)
            if cap is not None and filter_reason(plain, cap, self.now) is None:
                kept[member.rank] = member.node
        topology = spec.topology
        if kept and topology is not None and topology.mode == "required":
            values = Counter(self._label(n, topology.key) for n in kept.values())
            first = self._label(kept[min(kept)], topology.key)
            best = max(values, key=lambda v: (values[v], v == first, v or ""))
            kept = {r: n for r, n in kept.items() if self._label(n, topology.key) == best}
        return kept

    def _label(self, node: str, key: str) -> str | None:
        cap = self.capacity_of(node)
        return cap.labels.get(key) if cap is not None else None

    def _fill(self, request: PlacementRequest, kept: dict[int, str],
              value: str | None) -> Placed | int:
        """Nodes for the ranks ``kept`` lacks (in topology value ``value``, if any), or how
        many members had room."""
        spec = request.spec
        key = spec.topology.key if spec.topology is not None else None
        within = (replace(spec, node_selector={**spec.node_selector, key: value})
                  if key is not None and value is not None else spec)
        missing = [rank for rank in range(spec.nodes) if rank not in kept]
        used = set(kept.values())
        picks: list[str] = []
        plain = replace(request, spec=within, prefer=None, only=None)
        if request.members and request.prefer is not None and missing:
            cap = self.capacity_of(request.prefer)
            if request.prefer in used or cap is None or filter_reason(plain, cap,
                                                                     self.now) is not None:
                return len(kept)  # the member that moves goes to the requested node or waits
            picks.append(request.prefer)
        if request.members and request.spares_first:  # a failed member: spares first
            picks += self._spares(plain, len(missing) - len(picks), used | set(picks))
        if len(picks) < len(missing):
            picks += self.index.choose_distinct(request, within, len(missing) - len(picks),
                                                used | set(picks))
        for honour_cooldown in (True, False):  # a cool-down is soft: a spare cooling down too
            if request.members and len(picks) < len(missing):
                picks += self._spares(plain, len(missing) - len(picks), used | set(picks),
                                      honour_cooldown)
        if len(picks) < len(missing):
            return len(kept) + len(picks)
        nodes = dict(kept)
        nodes.update(zip(missing, picks, strict=True))
        members = []
        for rank in range(spec.nodes):
            cap = self.capacity_of(nodes[rank])
            assert cap is not None
            members.append(Member(rank=rank, node=nodes[rank], gpus=take_gpus(spec, cap.free)))
        return Placed(members[0].node, members[0].gpus, tuple(members))

    def _spares(self, request: PlacementRequest, count: int, skip: set[str],
                honour_cooldown: bool = True) -> list[str]:
        """Up to ``count`` spare nodes that fit one member (labelled spares first, then by
        name), none of ``skip``."""
        picks: list[str] = []
        for name in sorted(self.spares, key=lambda n: (
                n not in request.standby, self.spares[n].labels.get(SPARE_LABEL) != "true", n)):
            if len(picks) >= count:
                break
            if name not in skip and filter_reason(request, self.spares[name], self.now,
                                                  honour_cooldown) is None:
                picks.append(name)
        return picks

    def _shortage(self, request: PlacementRequest, found: int,
                  key: str | None) -> GangShortage:
        spec = request.spec
        held = len(self.index.held) if self.index.held and self.holder != request.workload \
            else 0
        excluded = sum(1 for node, until in request.exclude.items()
                       if until > self.now and self.capacity_of(node) is not None)
        return GangShortage(members=spec.nodes, found=found, gpus=spec.gpus,
                            kind=_qualified(spec, spec.gpus != 1), topology=key, held=held,
                            holder=self.holder, excluded=excluded)

    def commit(self, placed: Placed) -> None:
        """Take every member's GPUs out of its node."""
        for member in placed.members:
            if member.node in self.index.capacity:
                self.index.commit(Placed(member.node, member.gpus))
            else:
                cap = self.spares[member.node]
                taken = set(member.gpus)
                cap.free = [g for g in cap.free if g.index not in taken]
                cap.allocated_gpus += len(member.gpus)
                cap.workloads += 1

    # -- no starvation --------------------------------------------------------------------

    def hold_for(self, request: PlacementRequest) -> None:
        """Hold, for the rest of the pass, the nodes closest to fitting this waiting gang (the
        first one of the pass only; none if it could never fit, even on an empty cluster:
        only nodes whose usable GPUs of its kind would fit a member once they were empty,
        not excluded, not kept apart from it, not of a flavor its queue has no room in)."""
        if self.holder is not None or request.spec.gpus < 1:
            return
        spec = request.spec
        topology = spec.topology
        candidates = [n for n in self.index.could_fit_when_empty(spec)
                      if request.exclude.get(n, 0.0) <= self.now and n not in request.apart
                      and n not in request.flavor_full]
        free = self.index.fitting(spec)
        groups: dict[str | None, list[str]] = {}
        for name in candidates:
            value = (self.index.capacity[name].labels.get(topology.key)
                     if topology is not None and topology.mode == "required" else None)
            groups.setdefault(value, []).append(name)
        best: list[str] | None = None
        best_score = -1
        for value in sorted(groups, key=lambda v: v or ""):
            if topology is not None and topology.mode == "required" and value is None:
                continue
            nodes = sorted(groups[value], key=lambda n: (-free.get(n, 0), n))[:spec.nodes]
            score = sum(free.get(n, 0) for n in nodes)
            if len(nodes) == spec.nodes and score > best_score:
                best, best_score = nodes, score
        if best is None:
            return
        self.holder = self.index.held_by = request.workload
        self.index.held.update(best)


def _memo_key(request: PlacementRequest, now: float) -> _MemoKey | None:
    """What makes two plain gang requests (no history, no cool-downs, no nodes kept off for
    their queue's flavors) equal for this pass."""
    if request.members or request.prefer is not None or request.flavor_full or any(
            t > now for t in (*request.avoid.values(), *request.exclude.values())):
        return None
    spec: WorkloadSpec = request.spec
    topology = spec.topology
    return (signature(spec), spec.gpus, spec.nodes,
            topology.key if topology else None, topology.mode if topology else None)


def is_spare(labels: Mapping[str, str]) -> bool:
    """Is a node labelled as a spare."""
    return labels.get(SPARE_LABEL) == "true"
