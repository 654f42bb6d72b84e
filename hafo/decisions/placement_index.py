"""An index over a placement pass's capacity: the best fitting node in O(log N). Pure.

Requests are grouped by what makes a node fit them apart from free room: the node selector,
the GPU model glob, the memory minimum and the MIG profile (a "signature"; most requests
share the one with none of these). For each signature in use the index keeps the nodes whose
labels match, how many free GPUs of the requested kind each has, and, per strategy, one heap
per such count keyed by the score (see ``placement_rules``; the preferred node aside). A
request for k GPUs looks at the top of every heap whose count is at least k; committing a
placement re-files only that node (stale heap entries are dropped when they surface). Nodes
a request must skip (``exclude``, and ``avoid`` while cooling down) are popped past and
pushed back. The preferred node and ``only`` are checked directly.

The reason an unplaceable request gets is counted from per-signature tallies (labels and the
kinds of GPU a node has do not change during a pass), not by a scan, and kept as counts
(``hafo.decisions.placement_failure.NodesFiltered``) until it is rendered. The answers are exactly
those of filtering and scoring every node with ``placement_rules``: tests check it.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from hafo.decisions.placement_failure import NodeReason, NodesFiltered, NoReadyNodes, Rule
from hafo.decisions.placement_rules import (
    COOLING,
    EXCLUDED,
    FLAVOR_FULL,
    NodeCapacity,
    Placed,
    PlacementRequest,
    Strategy,
    Unplaceable,
    count_matching,
    filter_reason,
    filter_rule,
    label_reason,
    missing_kind,
    not_enough,
    strategy_of,
    take_gpus,
)
from hafo.model.spec import WorkloadSpec

SignatureKey = tuple[tuple[tuple[str, str], ...], str | None, int | None, str | None]
Entry = tuple[int, float, int, str, int]  # score..., node name, node version


def signature(spec: WorkloadSpec) -> SignatureKey:
    """What, apart from free room, decides whether a node fits ``spec``."""
    return (tuple(spec.node_selector.items()), spec.gpu_model, spec.gpu_memory_mib,
            spec.gpu_profile)


class _Signature:
    """The nodes one signature can use (``members``, their labels match), with their free
    matching GPU counts, and why the others cannot (computed when first asked)."""

    def __init__(self, spec: WorkloadSpec, capacity: Mapping[str, NodeCapacity],
                 members: Iterable[str]) -> None:
        self.spec = spec
        self.capacity = capacity
        self.count: dict[str, int] = {}
        self.missing: dict[str, str] = {}
        for name in members:
            cap = capacity[name]
            self.count[name] = count_matching(spec, cap.free)
            kind = missing_kind(spec, cap.inventory)
            if kind is not None:
                self.missing[name] = kind
        self.missing_tally = Counter(self.missing.values())
        self.heaps: dict[Strategy, dict[int, list[Entry]]] = {}
        self._label_reasons: dict[str, str] | None = None
        self.label_tally: Counter[str] = Counter()

    def label_reasons(self) -> dict[str, str]:
        """node -> the first selector label it lacks, for every node that is not a member."""
        if self._label_reasons is None:
            selector = self.spec.node_selector
            self._label_reasons = {}
            for name, cap in self.capacity.items():
                if name not in self.count:
                    self._label_reasons[name] = label_reason(selector, cap.labels) or ""
            self.label_tally = Counter(self._label_reasons.values())
        return self._label_reasons


def _entry(cap: NodeCapacity, strategy: Strategy, version: int) -> Entry:
    if strategy == "binpack":
        return (-cap.allocated_gpus, 0.0, 0, cap.name, version)
    return (cap.allocated_gpus, cap.utilization, cap.workloads, cap.name, version)


class PlacementIndex:
    """Answers ``place`` for one pass over ``capacity``; ``commit`` is the only mutation (of
    the index and of ``capacity``'s records)."""

    def __init__(self, capacity: Mapping[str, NodeCapacity], now: float,
                 strategy: Strategy = "spread") -> None:
        self.capacity = capacity
        self.now = now
        self.strategy: Strategy = strategy
        self._signatures: dict[SignatureKey, _Signature] = {}
        self._signatures_of: dict[str, list[_Signature]] = {}
        self._labelled: dict[tuple[str, str], set[str]] | None = None
        self._version: dict[str, int] = dict.fromkeys(capacity, 0)
        #: Nodes held for a waiting gang (``hafo.decisions.gang_placement``): skipped by every
        #: later request of the pass.
        self.held: set[str] = set()
        self.held_by = ""  # the gang they are held for
        self._label_values: dict[tuple[str, SignatureKey], list[str]] = {}
        self._fit_when_empty: dict[tuple[SignatureKey, int], list[str]] = {}

    # -- queries ---------------------------------------------------------------------------

    def place(self, request: PlacementRequest) -> Placed | Unplaceable:
        """The node (and GPUs) for one request, without changing anything."""
        if not self.capacity:
            return Unplaceable(NoReadyNodes())
        if request.only is not None:
            return self._place_only(request)
        strategy = strategy_of(request.spec, self.strategy)
        for honour_cooldown in (True, False):
            name = self._choose(request, strategy, honour_cooldown)
            if name is not None:
                cap = self.capacity[name]
                return Placed(name, take_gpus(request.spec, cap.free))
        return self._unplaceable(request)

    def choose_distinct(self, request: PlacementRequest, spec: WorkloadSpec, count: int,
                        skip: set[str]) -> list[str]:
        """Up to ``count`` distinct nodes that each fit one member of ``spec`` (best first,
        nodes cooling down only when nothing else fits), none of ``skip``; nothing is
        committed. Fewer than ``count`` means no more fit."""
        strategy = strategy_of(spec, self.strategy)
        plain = replace(request, spec=spec, prefer=None, only=None)
        picks: list[str] = []
        for honour_cooldown in (True, False):
            while len(picks) < count:
                name = self._choose(plain, strategy, honour_cooldown, skip | set(picks))
                if name is None:
                    break
                picks.append(name)
        return picks

    def label_values(self, key: str, spec: WorkloadSpec) -> list[str]:
        """The values of label ``key`` among the nodes whose labels match ``spec``, sorted
        (labels do not change during a pass: computed once per label and signature)."""
        cache_key = (key, signature(spec))
        values = self._label_values.get(cache_key)
        if values is None:
            sig = self._signature(spec)
            values = self._label_values[cache_key] = sorted(
                {v for n in sig.count if (v := self.capacity[n].labels.get(key)) is not None})
        return values

    def fitting(self, spec: WorkloadSpec) -> dict[str, int]:
        """node -> free GPUs of ``spec``'s kind, for every node whose labels match ``spec``."""
        return dict(self._signature(spec).count)

    def could_ever_fit(self, spec: WorkloadSpec) -> list[str]:
        """The nodes whose labels match ``spec`` and that have GPUs of its kind at all."""
        sig = self._signature(spec)
        return [n for n in sig.count if n not in sig.missing]

    def could_fit_when_empty(self, spec: WorkloadSpec) -> list[str]:
        """The nodes whose labels match ``spec`` and whose usable GPUs of its kind, free or
        not, are at least ``spec.gpus``: where it would fit once their work ended (computed
        once per signature and size in a pass)."""
        key = (signature(spec), spec.gpus)
        nodes = self._fit_when_empty.get(key)
        if nodes is None:
            nodes = self._fit_when_empty[key] = [
                n for n in self.could_ever_fit(spec)
                if count_matching(spec, [g for g in self.capacity[n].inventory if g.usable])
                >= spec.gpus]
        return nodes

    def _choose(self, request: PlacementRequest, strategy: Strategy,
                honour_cooldown: bool, also_skip: set[str] | None = None) -> str | None:
        now = self.now
        preferred = self.capacity.get(request.prefer) if request.prefer is not None else None
        if preferred is not None and preferred.name not in self.held \
                and preferred.name not in request.apart and filter_reason(
                request, preferred, now, honour_cooldown) is None:
            return preferred.name
        skip = {n for n, until in request.exclude.items() if until > now}
        if honour_cooldown:
            skip.update(n for n, until in request.avoid.items() if until > now)
        skip |= self.held
        skip |= request.apart
        skip |= request.flavor_full
        if also_skip:
            skip |= also_skip
        sig = self._signature(request.spec)
        best: Entry | None = None
        for count, heap in self._heaps(sig, strategy).items():
            if count < request.spec.gpus:
                continue
            top = self._top(heap, skip)
            if top is not None and (best is None or top < best):
                best = top
        return best[3] if best is not None else None

    def _top(self, heap: list[Entry], skip: set[str]) -> Entry | None:
        """The best current entry of ``heap`` not in ``skip``; stale entries are dropped."""
        held: list[Entry] = []
        found: Entry | None = None
        version = self._version
        while heap:
            entry = heap[0]
            if entry[4] != version[entry[3]]:
                heapq.heappop(heap)
            elif entry[3] in skip:
                held.append(heapq.heappop(heap))
            else:
                found = entry
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return found

    def _place_only(self, request: PlacementRequest) -> Placed | Unplaceable:
        assert request.only is not None
        cap = self.capacity.get(request.only)
        others = len(self.capacity) - (cap is not None)
        reasons: Counter[NodeReason] = Counter()
        if others:
            reasons[Rule.NOT_REQUESTED, f"not the requested node {request.only}"] = others
        if cap is None:
            return Unplaceable(NodesFiltered.tally(reasons))
        view = self._with_reserved(cap, request)
        why = filter_rule(request, view, self.now)
        if why is None or filter_reason(request, view, self.now, False) is None:
            return Placed(view.name, take_gpus(request.spec, view.free))
        reasons[why] += 1
        exhausted = bool(request.exclude) and filter_reason(request, view, self.now, False,
                                                            False) is None
        return Unplaceable(NodesFiltered.tally(reasons), exhausted)

    def _unplaceable(self, request: PlacementRequest) -> Unplaceable:
        """Why nothing fits: every node's first failing rule, counted. Each node neither
        excluded nor cooling down fails on its labels or, if they match, on its GPUs."""
        now, capacity = self.now, self.capacity
        special: dict[str, NodeReason] = {n: (Rule.EXCLUDED, EXCLUDED)
                                          for n, until in request.exclude.items()
                                          if until > now and n in capacity}
        for name, until in request.avoid.items():
            if until > now and name in capacity and name not in special:
                special[name] = (Rule.COOLING, COOLING)
        for name in self.held:
            if name not in special:
                special[name] = (Rule.HELD, f"held for waiting gang {self.held_by}")
        for name in request.apart:
            if name in capacity and name not in special:
                special[name] = (Rule.APART,
                                 f"runs another replica of {request.group or 'its service'}")
        for name in request.flavor_full:
            if name in capacity and name not in special:
                special[name] = (Rule.FLAVOR_FULL, FLAVOR_FULL)
        sig = self._signature(request.spec)
        label_reasons = sig.label_reasons()
        reasons: Counter[NodeReason] = Counter(special.values())
        for why, n in sig.label_tally.items():
            reasons[Rule.LABEL, why] += n
        for why, n in sig.missing_tally.items():
            reasons[Rule.NO_KIND, why] += n
        short = len(sig.count) - sum(sig.missing_tally.values())
        for name in special:
            if name in label_reasons:
                reasons[Rule.LABEL, label_reasons[name]] -= 1
            elif name in sig.missing:
                reasons[Rule.NO_KIND, sig.missing[name]] -= 1
            else:
                short -= 1
        reasons[Rule.NOT_ENOUGH, not_enough(request.spec)] += short
        exhausted = any(name in capacity and filter_reason(request, capacity[name], now,
                                                           False, False) is None
                        for name in request.exclude)
        return Unplaceable(NodesFiltered.tally(reasons), exhausted)

    # -- the index -------------------------------------------------------------------------

    def _signature(self, spec: WorkloadSpec) -> _Signature:
        key = signature(spec)
        sig = self._signatures.get(key)
        if sig is None:
            sig = self._signatures[key] = _Signature(spec, self.capacity,
                                                     self._members(spec.node_selector))
            for name in sig.count:
                self._signatures_of.setdefault(name, []).append(sig)
        return sig

    def _members(self, selector: Mapping[str, str]) -> Iterable[str]:
        """The nodes carrying every label of ``selector``, from a label index."""
        if not selector:
            return self.capacity
        if self._labelled is None:
            self._labelled = {}
            for name, cap in self.capacity.items():
                for pair in cap.labels.items():
                    self._labelled.setdefault(pair, set()).add(name)
        sets = sorted((self._labelled.get(pair, set()) for pair in selector.items()), key=len)
        return sets[0].intersection(*sets[1:])

    def _heaps(self, sig: _Signature, strategy: Strategy) -> dict[int, list[Entry]]:
        heaps = sig.heaps.get(strategy)
        if heaps is None:
            heaps = {}
            version = self._version
            for name, count in sig.count.items():
                heaps.setdefault(count, []).append(
                    _entry(self.capacity[name], strategy, version[name]))
            for heap in heaps.values():
                heapq.heapify(heap)
            sig.heaps[strategy] = heaps
        return heaps

    def _with_reserved(self, cap: NodeCapacity, request: PlacementRequest) -> NodeCapacity:
        if not request.reserved:
            return cap
        return replace(cap, free=sorted([*cap.free, *request.reserved], key=lambda g: g.index))

    def commit(self, placed: Placed) -> None:
        """Take the placed GPUs out of the node (the reserved ones were already out of it)
        and re-file the node in every signature that uses it."""
        name = placed.node
        cap = self.capacity[name]
        taken = set(placed.gpus)
        cap.free = [g for g in cap.free if g.index not in taken]
        cap.allocated_gpus += len(placed.gpus)
        cap.workloads += 1
        self.refresh(name)

    def refresh(self, name: str) -> None:
        """Re-file node ``name`` after its capacity record changed."""
        cap = self.capacity[name]
        version = self._version[name] = self._version[name] + 1
        for sig in self._signatures_of.get(name, ()):
            count = sig.count[name] = count_matching(sig.spec, cap.free)
            for strategy, heaps in sig.heaps.items():
                heapq.heappush(heaps.setdefault(count, []), _entry(cap, strategy, version))
