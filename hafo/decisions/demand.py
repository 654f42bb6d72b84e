"""What the pool lacks, and what it could give back: the input of an autoscaler (issue 30,
"Elastic capacity"; docs/reference/elastic.md, "Elastic capacity"). Pure.

**Pending demand, as shapes.** A workload that waits is described by what one placement of
it needs, never as loose GPUs: a gang of 4 nodes x 8 GPUs is the shape ``nodes=4,
gpus_per_node=8``, which only four nodes with 8 free GPUs each can take. Workloads of one
shape (queue, GPU model glob, MIG profile, nodes, GPUs per node) are counted together
(``Shape.count``); a service's replicas are each a workload of the shape of its template.

Only work that more nodes would let run counts, judged honestly from what the leader
decided last:

- its assignment is ``pending``: the leader tried to place it and found no room (a workload
  just submitted, not yet tried, is not counted until the leader's next cycle says so);
- it is not a preemptor waiting for its victims to stop (room is being made for it);
- it fits its queue's quota, counting the pending work of its queue before it in the
  queues' fair order (``hafo.decisions.fair_order``): a request its queue cannot take, or cannot
  borrow for, waits on the quota, and more nodes would not run it; one whose queue lent its
  quota out waits for a reclaim, which makes room on the nodes there are. While no queue is
  declared, there is no quota to wait on;
- work that backs off a restart is not ``pending`` (its assignment is still the one that
  ran): it is not counted either.

A pending workload whose constraints (``node_selector``, GPU memory) no node can meet
counts all the same: its shape says what GPUs it needs, a selector is the hook's to read
from the spec if it cares (``hafo show``).

**Removable nodes.** Ready nodes with no work (no assignment holds them, no instance
reported there) for longer than ``autoscale.idle_after`` seconds, timed from when the
deciding controller first saw each idle, on its own clock (``observe_idle``; never another
machine's). Not removable: nodes labelled ``hafo.io/spare: "true"``, the idle nodes kept as
spares (``placement.spares``, the ones ``hafo.decisions.gang_placement.choose_spares``
keeps), and an idle node on which a member of a pending shape would fit (the new nodes and
it will run that work together).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hafo.decisions.admission import admit
from hafo.decisions.gang_placement import choose_spares
from hafo.decisions.placement import capacity_from
from hafo.decisions.placement_rules import PlacementRequest, count_matching
from hafo.decisions.preemption import waiting_preemptors
from hafo.decisions.quota import Quotas
from hafo.model.cluster import ClusterSnapshot
from hafo.model.spec import WorkloadSpec

__all__ = ["Demand", "Removable", "Shape", "demand", "idle_nodes", "observe_idle",
           "pending_shapes", "pending_specs", "removable_nodes"]

#: Node -> when the deciding controller first saw it idle (its clock).
IdleSightings = Mapping[str, float]


@dataclass(frozen=True)
class Shape:
    """``count`` pending workloads that each need ``nodes`` nodes with ``gpus_per_node``
    GPUs of ``gpu_model`` (the spec's glob; None: any) and ``gpu_profile`` (a MIG profile;
    None: whole GPUs), in ``queue``."""

    queue: str
    gpu_model: str | None
    gpu_profile: str | None
    nodes: int
    gpus_per_node: int
    count: int

    def to_dict(self) -> dict[str, Any]:
        """The shape's JSON (docs/reference/elastic.md, "Elastic capacity")."""
        return {"queue": self.queue, "gpu_model": self.gpu_model,
                "gpu_profile": self.gpu_profile, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "count": self.count}


@dataclass(frozen=True)
class Removable:
    """A ready node that has had no work for ``idle_seconds``."""

    node: str
    idle_seconds: float

    def to_dict(self) -> dict[str, Any]:
        """The entry's JSON."""
        return {"node": self.node, "idle_seconds": round(self.idle_seconds, 1)}


@dataclass(frozen=True)
class Demand:
    """The pending shapes and the removable nodes of one snapshot."""

    pending: tuple[Shape, ...] = ()
    removable: tuple[Removable, ...] = ()

    @property
    def key(self) -> tuple[tuple[Shape, ...], tuple[str, ...]]:
        """What an autoscaler is told about, without the times: a change of it is news."""
        return self.pending, tuple(r.node for r in self.removable)

    def to_dict(self, at: float) -> dict[str, Any]:
        """``GET /v1/demand``'s body and the hook's input (``at``: wall-clock seconds)."""
        return {"pending": [s.to_dict() for s in self.pending],
                "removable": [r.to_dict() for r in self.removable], "at": round(at, 3)}


def pending_specs(snapshot: ClusterSnapshot) -> list[tuple[str, WorkloadSpec]]:
    """(workload, spec) of the pending work more nodes would let run (see the module), in
    the order the leader tries it."""
    waiting = waiting_preemptors(snapshot)
    requests = []
    for wid, assignment in snapshot.assignments.items():
        submission = snapshot.workloads.get(wid)
        if assignment.phase != "pending" or submission is None or wid in waiting \
                or submission.retiring is not None or (submission.spec.is_service \
                and submission.service is None):
            continue
        requests.append(PlacementRequest(wid, submission.spec, submission.submitted_at))
    quotas = Quotas.of(snapshot, {r.workload for r in requests})
    out = []
    for request in admit(requests, quotas).requests:
        if quotas is not None:
            if quotas.refusal(request) is not None:
                continue  # waits on its queue's quota, not on nodes
            quotas.charge(request)
        out.append((request.workload, request.spec))
    return out


def _shape_key(spec: WorkloadSpec) -> tuple[str, str | None, str | None, int, int]:
    return spec.queue, spec.gpu_model, spec.gpu_profile, spec.nodes, spec.gpus


def _shapes(pending: list[tuple[str, WorkloadSpec]]) -> tuple[Shape, ...]:
    counts: dict[tuple[str, str | None, str | None, int, int], int] = {}
    for _wid, spec in pending:
        key = _shape_key(spec)
        counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts, key=lambda k: (k[0], k[1] or "", k[2] or "", k[3], k[4]))
    return tuple(Shape(*key, count=counts[key]) for key in ordered)


def pending_shapes(snapshot: ClusterSnapshot) -> tuple[Shape, ...]:
    """The pending work of ``snapshot`` as shapes, sorted by queue, model, profile, nodes and
    GPUs per node."""
    return _shapes(pending_specs(snapshot))


def idle_nodes(snapshot: ClusterSnapshot) -> set[str]:
    """Ready nodes with no work: no assignment holds them and no instance is reported on
    them (a report of any state but ``exited``)."""
    busy = {status.node for status in snapshot.statuses.values() if status.state != "exited"}
    return {name for name in snapshot.nodes if snapshot.node_state(name) == "ready"
            and not snapshot.holders.get(name) and name not in busy}


def observe_idle(previous: IdleSightings, snapshot: ClusterSnapshot,
                 now: float) -> dict[str, float]:
    """``previous`` with the idle nodes of ``snapshot`` first seen at ``now``; a node that is
    not idle any more is forgotten (its next idle period is timed anew)."""
    return {name: previous.get(name, now) for name in idle_nodes(snapshot)}


def removable_nodes(snapshot: ClusterSnapshot, idle_since: IdleSightings, now: float,
                    idle_after: float, spares: int = 0,
                    pending: list[tuple[str, WorkloadSpec]] | None = None,
                    ) -> tuple[Removable, ...]:
    """The nodes idle for longer than ``idle_after`` seconds (``idle_since``: the
    sightings of ``observe_idle``), by name, but not the spares (``spares``: the controller's
    ``placement.spares`` target) nor those where a member of ``pending`` work would fit
    (default: ``pending_specs(snapshot)``)."""
    idle = idle_nodes(snapshot)
    long_idle = {n for n in idle if n in idle_since and now - idle_since[n] > idle_after}
    if not long_idle:
        return ()
    capacity = capacity_from(snapshot)
    kept = set(choose_spares(snapshot, capacity, spares))
    if pending is None:
        pending = pending_specs(snapshot)
    specs = {_shape_key(spec): spec for _wid, spec in pending}.values()
    out = []
    for name in sorted(long_idle - kept):
        free = [g for g in snapshot.nodes[name].gpus if g.healthy and not g.lost]
        if any(spec.gpus and count_matching(spec, free) >= spec.gpus for spec in specs):
            continue  # pending work would use it, with the nodes that are added
        out.append(Removable(name, now - idle_since[name]))
    return tuple(out)


def demand(snapshot: ClusterSnapshot, idle_since: IdleSightings, now: float,
           idle_after: float, spares: int = 0) -> Demand:
    """The pending shapes and the removable nodes of ``snapshot`` at ``now`` (the deciding
    controller's clock)."""
    pending = pending_specs(snapshot)
    return Demand(_shapes(pending), removable_nodes(snapshot, idle_since, now, idle_after,
                                                    spares, pending))
