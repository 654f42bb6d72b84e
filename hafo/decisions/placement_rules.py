"""What placement means, node by node: the records, the filter and its reasons, the score.
Pure. ``hafo.decisions.placement_index`` gives the same answers as scanning every node with
these functions, only faster.

Filter, in this order (the first failure is the node's reason): the requested node
(``only``), the workload's own failures there (``exclude``, hard), a failure cool-down
(``avoid``, soft: such nodes are used only when nothing else fits), the quota of the
node's GPU flavor (``flavor_full``), the node selector labels,
then enough free usable GPUs of the requested kind: whole GPUs, or MIG devices of
``gpu_profile``, of the ``gpu_model`` glob and with at least ``gpu_memory_mib``.

Score (lowest wins): the preferred node (a restart in place) first, then
- ``spread``: fewest allocated GPUs, then lowest mean measured utilization of the node's GPUs
  (unknown counts as 0), then fewest workloads, then the name;
- ``binpack``: most allocated GPUs (of nodes where it still fits), then the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Literal

from hafo.decisions.placement_failure import NodeReason, PlacementFailure, Rule
from hafo.model.cluster import Gpu, Member
from hafo.model.spec import WorkloadSpec

Strategy = Literal["spread", "binpack"]
EXCLUDED = "the workload failed there too often"
COOLING = "cooling down after a failure"
FLAVOR_FULL = "its queue's quota for these GPUs' model is used"


@dataclass(frozen=True)
class PlacementRequest:
    """One workload to place. ``reserved``: GPUs of the ``only`` node held for this request
    (room made by preemption), invisible to every other request. For a gang (``spec.nodes``
    above 1): ``members``, those of its previous epoch (each keeps its node and rank where it
    still fits), ``leave``, nodes whose members go elsewhere; ``prefer`` is then where a
    member that moves must go; ``spares_first``: a failed member's replacement takes a spare
    node before an ordinary one (a planned move, only when no ordinary node fits). A
    replica of a service: ``apart``, the nodes of its service's other replicas (never used),
    and ``group``, its service (replicas placed in one pass keep apart from each other).
    ``reclaim``: it does not fit its queue's quota because its cohort lent the quota out,
    and may take it back from the borrowers (``hafo.decisions.reclaim``). ``flavor_full``:
    nodes never used, as their GPUs are of a flavor (a GPU model its queue's ``models``
    names, or the rest) in which its queue has no room for it
    (``hafo.decisions.quota.Quotas.constrain``)."""

    workload: str
    spec: WorkloadSpec
    submitted_at: float
    avoid: Mapping[str, float] = field(default_factory=dict)
    prefer: str | None = None
    only: str | None = None
    exclude: Mapping[str, float] = field(default_factory=dict)
    reserved: tuple[Gpu, ...] = ()
    members: tuple[Member, ...] = ()
    leave: tuple[str, ...] = ()
    spares_first: bool = False
    #: the nodes of a warm gang's standbys: its replacements take those spares first
    standby: tuple[str, ...] = ()
    apart: frozenset[str] = frozenset()
    group: str | None = None
    reclaim: bool = False
    flavor_full: frozenset[str] = frozenset()


@dataclass
class NodeCapacity:
    """Mutable during one placement pass: what is still free on a node. ``inventory``: every
    GPU it lists (for reasons); ``utilization``: the mean of its GPUs' utilization."""

    name: str
    labels: Mapping[str, str]
    free: list[Gpu]
    allocated_gpus: int
    workloads: int
    utilization: float = 0.0
    inventory: tuple[Gpu, ...] = ()


@dataclass(frozen=True)
class Placed:
    """A successful placement (a gang's: rank 0's node and GPUs, and every member)."""

    node: str
    gpus: tuple[int, ...]
    members: tuple[Member, ...] = ()


@dataclass(frozen=True, eq=False)
class Unplaceable:
    """Why a workload could not be placed now: ``failure``, as data
    (``hafo.decisions.placement_failure``; or already as text), rendered by ``reason``.
    ``exhausted``: only nodes it failed on (see ``PlacementRequest.exclude``) could take it.
    Two are equal when they say the same (``reason`` and ``exhausted``)."""

    failure: PlacementFailure | str
    exhausted: bool = False

    @property
    def reason(self) -> str:
        """The sentence a pending workload shows."""
        failure = self.failure
        return failure if isinstance(failure, str) else failure.render()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Unplaceable):
            return NotImplemented
        return (self.reason, self.exhausted) == (other.reason, other.exhausted)

    def __hash__(self) -> int:
        return hash((self.reason, self.exhausted))


def strategy_of(spec: WorkloadSpec, default: Strategy) -> Strategy:
    """The workload's own strategy, else the cluster's."""
    if spec.placement == "binpack":
        return "binpack"
    if spec.placement == "spread":
        return "spread"
    return default


def gpu_matches(spec: WorkloadSpec, gpu: Gpu) -> bool:
    """Is ``gpu`` of the kind, model and memory ``spec`` asks for (health aside)."""
    return (gpu.profile == spec.gpu_profile
            and (spec.gpu_model is None or fnmatchcase(gpu.model, spec.gpu_model))
            and (spec.gpu_memory_mib is None or gpu.memory_mib >= spec.gpu_memory_mib))


def count_matching(spec: WorkloadSpec, gpus: list[Gpu] | tuple[Gpu, ...]) -> int:
    """How many of ``gpus`` match ``spec``."""
    if spec.gpu_model is None and spec.gpu_memory_mib is None:
        profile = spec.gpu_profile
        return sum(1 for g in gpus if g.profile == profile)
    return sum(1 for g in gpus if gpu_matches(spec, g))


def take_gpus(spec: WorkloadSpec, free: list[Gpu]) -> tuple[int, ...]:
    """The lowest ``spec.gpus`` indices of the matching ``free`` GPUs."""
    indices = sorted(g.index for g in free if gpu_matches(spec, g))
    return tuple(indices[:spec.gpus])


def _noun(spec: WorkloadSpec, plural: bool) -> str:
    s = "s" if plural else ""
    return f"{spec.gpu_profile} MIG device{s}" if spec.gpu_profile else f"GPU{s}"


def _qualified(spec: WorkloadSpec, plural: bool) -> str:
    out = _noun(spec, plural)
    if spec.gpu_model is not None:
        out += f" of model {spec.gpu_model}"
    if spec.gpu_memory_mib is not None:
        out += f" with at least {spec.gpu_memory_mib} MiB"
    return out


def missing_kind(spec: WorkloadSpec, inventory: tuple[Gpu, ...]) -> str | None:
    """Why no GPU the node lists, healthy or not, free or not, can ever serve ``spec`` (None
    if some can). Depends only on the node's inventory."""
    kind = [g for g in inventory if g.profile == spec.gpu_profile]
    if not kind:
        if spec.gpu_profile is not None:
            return f"no {spec.gpu_profile} MIG device"
        return "no whole GPU (only MIG devices)" if inventory else None
    if spec.gpu_model is not None:
        kind = [g for g in kind if fnmatchcase(g.model, spec.gpu_model)]
        if not kind:
            return f"no {_noun(spec, False)} of model {spec.gpu_model}"
    if spec.gpu_memory_mib is not None and not any(g.memory_mib >= spec.gpu_memory_mib
                                                   for g in kind):
        return f"no {_qualified(spec, False)}"
    return None


def not_enough(spec: WorkloadSpec) -> str:
    """The reason of a node that has such GPUs, just not enough of them free and healthy."""
    return f"not enough free healthy {_qualified(spec, True)} (needs {spec.gpus})"


def label_reason(selector: Mapping[str, str], labels: Mapping[str, str]) -> str | None:
    """The first selector label the node lacks, as a reason."""
    for key, value in selector.items():
        if labels.get(key) != value:
            return f"label {key}={value} not matched"
    return None


def filter_rule(request: PlacementRequest, cap: NodeCapacity, now: float,
                honour_cooldown: bool = True, honour_exclude: bool = True) -> NodeReason | None:
    """None if the node fits, else the first failing rule and its reason."""
    if request.only is not None and cap.name != request.only:
        return Rule.NOT_REQUESTED, f"not the requested node {request.only}"
    if honour_exclude and request.exclude.get(cap.name, 0.0) > now:
        return Rule.EXCLUDED, EXCLUDED
    if honour_cooldown and request.avoid.get(cap.name, 0.0) > now:
        return Rule.COOLING, COOLING
    if cap.name in request.flavor_full:
        return Rule.FLAVOR_FULL, FLAVOR_FULL
    why = label_reason(request.spec.node_selector, cap.labels)
    if why is not None:
        return Rule.LABEL, why
    if count_matching(request.spec, cap.free) < request.spec.gpus:
        kind = missing_kind(request.spec, cap.inventory)
        if kind is not None:
            return Rule.NO_KIND, kind
        return Rule.NOT_ENOUGH, not_enough(request.spec)
    return None


def filter_reason(request: PlacementRequest, cap: NodeCapacity, now: float,
                  honour_cooldown: bool = True, honour_exclude: bool = True) -> str | None:
    """None if the node fits, else the reason it does not (the first failing rule)."""
    found = filter_rule(request, cap, now, honour_cooldown, honour_exclude)
    return found[1] if found is not None else None
