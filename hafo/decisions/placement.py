"""Placement: filter then score, deterministic, as one global pass over a batch. Pure.

Spread (the default) prefers the node with the fewest allocated GPUs, then the fewest
workloads, then the name; a workload being restarted in place prefers its own node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from hafo.model.cluster import ClusterSnapshot, Gpu
from hafo.model.spec import WorkloadSpec


@dataclass(frozen=True)
class PlacementRequest:
    """One workload to place."""

    workload: str
    spec: WorkloadSpec
    submitted_at: float
    avoid: Mapping[str, float] = field(default_factory=dict)
    prefer: str | None = None
    only: str | None = None
    exclude: Mapping[str, float] = field(default_factory=dict)


@dataclass
class NodeCapacity:
    """Mutable during one placement pass: what is still free on a node."""

    name: str
    labels: Mapping[str, str]
    free: list[Gpu]
    allocated_gpus: int
    workloads: int


@dataclass(frozen=True)
class Placed:
    """A successful placement."""

    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Unplaceable:
    """Why a workload could not be placed now. ``exhausted``: only nodes it failed on (see
    ``PlacementRequest.exclude``) could take it."""

    reason: str
    exhausted: bool = False


def capacity_from(snapshot: ClusterSnapshot,
                  releasing: Iterable[str] = ()) -> dict[str, NodeCapacity]:
    """Free capacity of every ready node; ``releasing`` workloads' GPUs count as free."""
    released = set(releasing)
    capacity: dict[str, NodeCapacity] = {}
    for name, record in snapshot.nodes.items():
        if snapshot.node_state(name) != "ready":
            continue
        capacity[name] = NodeCapacity(name=name, labels=record.labels,
                                      free=[g for g in record.gpus if g.usable],
                                      allocated_gpus=0, workloads=0)
    for wid, assignment in snapshot.assignments.items():
        if not assignment.holds_node or assignment.node not in capacity or wid in released:
            continue
        cap = capacity[assignment.node]
        cap.free = [g for g in cap.free if g.index not in assignment.gpus]
        cap.allocated_gpus += len(assignment.gpus)
        cap.workloads += 1
    return capacity


def _matching_gpus(spec: WorkloadSpec, free: list[Gpu]) -> list[Gpu]:
    return [g for g in free
            if (spec.gpu_model is None or fnmatchcase(g.model, spec.gpu_model))
            and (spec.gpu_memory_mib is None or g.memory_mib >= spec.gpu_memory_mib)]


def _filter(request: PlacementRequest, cap: NodeCapacity, now: float,
            honour_cooldown: bool = True, honour_exclude: bool = True) -> str | None:
    """None if the node fits, else the reason it does not."""
    if request.only is not None and cap.name != request.only:
        return f"not the requested node {request.only}"
    if honour_exclude and request.exclude.get(cap.name, 0.0) > now:
        return "the workload failed there too often"
    if honour_cooldown and request.avoid.get(cap.name, 0.0) > now:
        return "cooling down after a failure"
    for key, value in request.spec.node_selector.items():
        if cap.labels.get(key) != value:
            return f"label {key}={value} not matched"
    if len(_matching_gpus(request.spec, cap.free)) < request.spec.gpus:
        return "not enough free healthy GPUs of the requested model/memory"
    return None


def _score(request: PlacementRequest, cap: NodeCapacity) -> tuple[int, int, int, str]:
    preferred = 0 if request.prefer == cap.name else 1
    return (preferred, cap.allocated_gpus, cap.workloads, cap.name)


def _best(request: PlacementRequest, capacity: Mapping[str, NodeCapacity], now: float,
          honour_cooldown: bool, reasons: dict[str, int],
          honour_exclude: bool = True) -> NodeCapacity | None:
    best: NodeCapacity | None = None
    for cap in capacity.values():
        why = _filter(request, cap, now, honour_cooldown, honour_exclude)
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
            continue
        if best is None or _score(request, cap) < _score(request, best):
            best = cap
    return best


def place_one(request: PlacementRequest, capacity: Mapping[str, NodeCapacity],
              now: float) -> Placed | Unplaceable:
    """Choose a node for one request without changing ``capacity``.

    The failure cool-down (``avoid``, after a node went down) is soft: such a node is used
    only when no other node fits, because running somewhere beats waiting. ``exclude`` (the
    workload itself failed there too often) is hard.
    """
    if not capacity:
        return Unplaceable("no ready nodes")
    reasons: dict[str, int] = {}
    best = _best(request, capacity, now, True, reasons)
    if best is None:
        best = _best(request, capacity, now, False, {})
    if best is None:
        summary = ", ".join(f"{n} node(s): {why}" for why, n in sorted(reasons.items()))
        exhausted = bool(request.exclude) and _best(request, capacity, now, False, {},
                                                    honour_exclude=False) is not None
        return Unplaceable(f"no node fits ({summary})", exhausted)
    gpus = sorted(_matching_gpus(request.spec, best.free), key=lambda g: g.index)
    return Placed(node=best.name, gpus=tuple(g.index for g in gpus[:request.spec.gpus]))


def commit(placed: Placed, capacity: Mapping[str, NodeCapacity]) -> None:
    """Take the placed GPUs out of ``capacity`` (the only mutation, within one pass)."""
    cap = capacity[placed.node]
    cap.free = [g for g in cap.free if g.index not in placed.gpus]
    cap.allocated_gpus += len(placed.gpus)
    cap.workloads += 1


def batch_order(requests: Iterable[PlacementRequest]) -> list[PlacementRequest]:
    """Global order: higher priority first, then older submissions, then id."""
    return sorted(requests, key=lambda r: (-r.spec.priority, r.submitted_at, r.workload))


def place_batch(requests: Iterable[PlacementRequest], capacity: dict[str, NodeCapacity],
                now: float) -> dict[str, Placed | Unplaceable]:
    """Place a batch in one global pass; the result does not depend on the input order."""
    results: dict[str, Placed | Unplaceable] = {}
    for request in batch_order(requests):
        outcome = place_one(request, capacity, now)
        if isinstance(outcome, Placed):
            commit(outcome, capacity)
        results[request.workload] = outcome
    return results
