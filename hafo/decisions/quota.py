"""Queue quotas and borrowing within a cohort, the arithmetic of stage 2 of the reconcile
pipeline (**admit**): the charge, the usage and ``Quotas``, the quota state during one
placement pass. Pure.

Every workload runs in a queue (``WorkloadSpec.queue``; queues: ``hafo.model.queues``). What
a workload takes of its queue's quota is its **charge**: its GPUs, times its members for a
gang, a MIG device counting by its fraction of a GPU (its compute slices out of 7). A
queue's **usage** is the charge of its workloads that hold GPUs (placed, or moving until
they have stopped).

**Quota.** A queue ``q`` with nominal quota ``n`` lends at most ``l`` (its lending limit,
default ``n``) to its cohort and keeps ``n - l`` for itself. The cohort's **pool** is the sum
of what its queues lend. A queue's usage above what it keeps comes out of the pool, and the
pool is never overdrawn; nor does a queue use more than ``n + b`` (``b``: its borrowing
limit, none: no limit but the pool). A queue without a cohort uses at most ``n``; a queue
without a quota (``gpus`` not given) is never held back by one. While no queue is declared
at all, nothing here applies (``Quotas.of`` returns None): every request is admitted, as
before queues existed. A request whose queue is not declared waits, saying so.

**Flavors.** A queue declared with ``models`` (GPU model glob -> GPUs, the rest of
``gpus`` for the GPUs of no named model) is accounted per flavor: each glob, and ``REST``.
All of the above then holds per flavor (usage by the model of the GPUs held, the cohort's
pool of a flavor, the limits per flavor); the dominant share is the largest over the
flavors. A request passes the gate when a flavor it could use has room; placement is kept
off the nodes of the others (``Quotas.constrain``) and the charge goes to the flavor of the
GPUs it got. A request counted within its quota in a flavor (``Quotas.entitled_in``) is
gated on, placed in and reclaims in that flavor only.

**Around it.** The fair order between queues, and why no two queues take GPUs back and
forth: ``hafo.decisions.fair_order``. Why a request does not fit its quota, as data until
rendered: ``hafo.decisions.quota_refusal``. What readers see: the queues' standings
(``hafo.decisions.queue_standings``) and the live pending reasons
(``hafo.decisions.pending_reasons``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from hafo.decisions.placement_rules import Placed, PlacementRequest
from hafo.decisions.quota_refusal import QuotaRefusal
from hafo.model.cluster import ClusterSnapshot, NodeRecord
from hafo.model.queues import REST, QueueSpec
from hafo.model.spec import WorkloadSpec

__all__ = ["EPSILON", "MIG_SLICES", "FlavorStanding", "QueueStanding", "Quotas", "charge",
           "flavor_usage", "usage"]

#: A whole GPU's compute slices in MIG mode (A100, H100, H200: 7).
MIG_SLICES = 7
_SLICES = re.compile(r"([0-9]+)g\.")

#: Slack for sums of MIG fractions.
EPSILON = 1e-9


def charge(spec: WorkloadSpec) -> float:
    """What ``spec`` takes of its queue's quota: its GPUs times its members, a MIG device
    counting by its compute slices out of ``MIG_SLICES``."""
    each = 1.0
    if spec.gpu_profile is not None:
        found = _SLICES.match(spec.gpu_profile)
        slices = int(found.group(1)) if found else MIG_SLICES
        each = min(slices, MIG_SLICES) / MIG_SLICES
    return spec.gpus * spec.nodes * each


def usage(snapshot: ClusterSnapshot, placing: Collection[str] = ()) -> dict[str, float]:
    """queue name -> the charge of its workloads that hold GPUs (placed or moving), for every
    queue named by such a workload (declared or not). ``placing``: workloads left out, as
    they are placed again this cycle (a failover, a restart: charged once placed)."""
    used: dict[str, float] = {}
    for wid, assignment in snapshot.assignments.items():
        submission = snapshot.workloads.get(wid)
        if submission is None or not assignment.holds_node or wid in placing:
            continue
        spec = submission.spec
        used[spec.queue] = used.get(spec.queue, 0.0) + charge(spec)
    return used


def flavor_usage(snapshot: ClusterSnapshot,
                 placing: Collection[str] = ()) -> dict[tuple[str, str], float]:
    """(queue, flavor) -> the charge of its workloads that hold GPUs of that flavor, for the
    queues declared with ``models`` (``placing`` as for ``usage``). A gang's charge is
    shared among its members, each in the flavor of its node's GPUs."""
    used: dict[tuple[str, str], float] = {}
    if not any(q.models for q in snapshot.queues.values()):
        return used
    flavors = Quotas(snapshot.queues, nodes=snapshot.nodes)
    for wid, assignment in snapshot.assignments.items():
        submission = snapshot.workloads.get(wid)
        if submission is None or not assignment.holds_node or wid in placing:
            continue
        queue = snapshot.queues.get(submission.spec.queue)
        slots = assignment.slots
        if queue is None or not queue.models or not slots:
            continue
        part = charge(submission.spec) / len(slots)
        for node, gpus in slots:
            key = (queue.name, flavors.flavor_at(queue, node, gpus))
            used[key] = used.get(key, 0.0) + part
    return used


@dataclass(frozen=True)
class QueueStanding:
    """One declared queue at the start of a cycle, for ``hafo queues`` and the metrics:
    its usage, what it borrows above its quota, what of its quota others use (``lent``),
    the charge of its pending requests, and its weighted dominant share."""

    spec: QueueSpec
    used: float
    borrowed: float
    lent: float
    pending: float
    share: float
    #: per flavor, for a queue with ``models`` (its globs, then ``REST``)
    flavors: Mapping[str, FlavorStanding] = field(default_factory=dict)


@dataclass(frozen=True)
class FlavorStanding:
    """One flavor of a queue declared with ``models``: its nominal quota, usage and what it
    borrows above that quota."""

    nominal: float
    used: float
    borrowed: float


@dataclass
class Quotas:
    """The quota state during one placement pass (mutable; ``charge`` as requests are
    placed). ``queues``: the declared ones; ``used``: usage per queue name (all its flavors
    together).

    A queue declared with ``models`` is accounted per **flavor** (its ``models`` globs, and
    ``REST``: GPUs of no named model): ``flavor_used`` holds its usage per flavor, the
    cohort's pool of a flavor is what its queues lend of it (flavors are told apart by their
    glob), and its limits apply per flavor. A queue without ``models`` has one flavor,
    ``REST``, whose usage is its ``used``; the arithmetic is then exactly what it was before
    flavors. ``nodes``: the cluster's node records, for the model of the GPUs a workload
    holds (``Quotas.of`` gives them)."""

    queues: Mapping[str, QueueSpec]
    used: dict[str, float] = field(default_factory=dict)
    #: the requests the cycle's order counted within their queue's nominal quota (set by
    #: ``hafo.decisions.fair_order.admission_order``): only they may take back lent quota
    #: (``hafo.decisions.reclaim``)
    entitled: set[str] = field(default_factory=set)
    #: (queue, flavor) -> usage, for the queues declared with ``models``
    flavor_used: dict[tuple[str, str], float] = field(default_factory=dict)
    #: of the ``entitled`` requests of queues with ``models``: the flavor they were counted
    #: within quota in, the one they may take back lent quota of
    entitled_in: dict[str, str] = field(default_factory=dict)
    #: requests of queues with ``models`` -> the flavor the order counted them in (where
    #: placement tries them first)
    counted_in: dict[str, str] = field(default_factory=dict)
    nodes: Mapping[str, NodeRecord] = field(default_factory=dict)
    #: (cohort, flavor) -> the waiting request its pool's room is held for, for the rest of
    #: the pass (``hold_pool``)
    pool_holds: dict[tuple[str, str], str] = field(default_factory=dict)
    _members: dict[str, list[str]] = field(default_factory=dict)
    _pools: dict[tuple[str, str], float] = field(default_factory=dict)
    _pool_used: dict[tuple[str, str], float] = field(default_factory=dict)
    _users: dict[tuple[str, str], tuple[tuple[str, float, float], ...]] = field(
        default_factory=dict)
    _cohort_borrowed: dict[tuple[str, str], float] = field(default_factory=dict)
    _node_flavors: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    _full_nodes: dict[tuple[str, frozenset[str]], frozenset[str]] = field(default_factory=dict)
    _outside: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    _models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for name in sorted(self.queues):
            cohort = self.queues[name].cohort
            if cohort is not None:
                self._members.setdefault(cohort, []).append(name)

    @classmethod
    def of(cls, snapshot: ClusterSnapshot, placing: Collection[str] = ()) -> Quotas | None:
        """The quota state at the snapshot (None while no queue is declared); ``placing``:
        as for ``usage``."""
        if not snapshot.queues:
            return None
        return cls(snapshot.queues, usage(snapshot, placing),
                   flavor_used=flavor_usage(snapshot, placing), nodes=snapshot.nodes)

    # -- the quota arithmetic ------------------------------------------------------------

    def used_in(self, queue: str, flavor: str = REST) -> float:
        """What ``queue`` uses of ``flavor`` (a queue without ``models``: its ``used`` in
        ``REST``, its one flavor)."""
        spec = self.queues.get(queue)
        if spec is not None and spec.models:
            return self.flavor_used.get((queue, flavor), 0.0)
        return self.used.get(queue, 0.0) if flavor == REST else 0.0

    def _kept(self, spec: QueueSpec, flavor: str = REST) -> float:
        """What of its quota in ``flavor`` a queue keeps for itself (does not lend)."""
        return float(spec.nominal(flavor)) - spec.lendable_in(flavor)

    def _from_pool(self, spec: QueueSpec, used: float, flavor: str = REST) -> float:
        return max(used - self._kept(spec, flavor), 0.0)

    def pool(self, cohort: str, flavor: str = REST) -> float:
        """What the queues of ``cohort`` lend of ``flavor`` in all."""
        key = (cohort, flavor)
        if key not in self._pools:
            self._pools[key] = float(sum(self.queues[q].lendable_in(flavor)
                                         for q in self._members.get(cohort, ())))
        return self._pools[key]

    def pool_used(self, cohort: str, flavor: str = REST) -> float:
        """What of ``cohort``'s pool of ``flavor`` its queues use (kept up to date by
        ``charge``: a cohort of a thousand queues costs no more per request than one of
        two)."""
        key = (cohort, flavor)
        if key not in self._pool_used:
            self._pool_used[key] = sum(
                self._from_pool(self.queues[q], self.used_in(q, flavor), flavor)
                for q in self._members.get(cohort, ()))
        return self._pool_used[key]

    def _share_in(self, spec: QueueSpec, used: float, flavor: str) -> float:
        above = used - float(spec.nominal(flavor))
        if spec.cohort is None or spec.gpus is None or above <= EPSILON:
            return 0.0
        pool = self.pool(spec.cohort, flavor)
        return above / pool / spec.weight if pool > 0 else float("inf")

    def share(self, queue: str, used: float, flavor: str = REST) -> float:
        """``queue``'s weighted dominant share with usage ``used`` in ``flavor`` (its other
        flavors as they are): the largest, over its flavors, of what it uses above its
        quota in the flavor over its cohort's pool of the flavor, over its weight (0 when
        it does not borrow)."""
        spec = self.queues[queue]
        if not spec.models:
            return self._share_in(spec, used, REST)
        return self.dominant_share(queue, {flavor: used})

    def dominant_share(self, queue: str, used: Mapping[str, float]) -> float:
        """As ``share``, with the usage of the flavors in ``used`` as given there."""
        spec = self.queues[queue]
        return max(self._share_in(spec, used.get(f, self.used_in(queue, f)), f)
                   for f in spec.flavors)

    def ceiling(self, queue: str, flavor: str = REST) -> float:
        """The most ``queue`` may ever use of ``flavor`` now: its quota there, plus its
        borrowing limit or the cohort's pool beyond what it keeps (infinite without a
        quota)."""
        spec = self.queues[queue]
        if spec.gpus is None:
            return float("inf")
        nominal = float(spec.nominal(flavor))
        if spec.cohort is None:
            return nominal
        pooled = self._kept(spec, flavor) + self.pool(spec.cohort, flavor)
        limit = nominal + spec.borrowing_limit if spec.borrowing_limit is not None \
            else float("inf")
        return min(pooled, limit)

    def within_nominal(self, queue: str, used: float, flavor: str = REST) -> bool:
        """Whether usage ``used`` of ``flavor`` is within ``queue``'s nominal quota there (a
        queue without one, or undeclared, counts as within)."""
        spec = self.queues.get(queue)
        return spec is None or spec.gpus is None or used <= spec.nominal(flavor) + EPSILON

    def borrowed_in(self, queue: str, flavor: str = REST) -> float:
        """What ``queue`` uses of ``flavor`` above its nominal quota there (0 for a queue
        without a quota)."""
        spec = self.queues[queue]
        if spec.gpus is None:
            return 0.0
        return max(self.used_in(queue, flavor) - float(spec.nominal(flavor)), 0.0)

    def cohort_borrowed(self, cohort: str, flavor: str = REST) -> float:
        """What the queues of ``cohort`` use of ``flavor`` above their nominal quotas, in all
        (kept until a placement of the cohort changes it)."""
        key = (cohort, flavor)
        if key not in self._cohort_borrowed:
            self._cohort_borrowed[key] = sum(self.borrowed_in(q, flavor)
                                             for q in self._members.get(cohort, ()))
        return self._cohort_borrowed[key]

    # -- flavors -----------------------------------------------------------------------

    def known_models(self) -> frozenset[str]:
        """The GPU models the nodes list."""
        if self._models is None:
            self._models = frozenset(g.model for r in self.nodes.values() for g in r.gpus)
        return self._models

    def flavors_for(self, queue: QueueSpec, spec: WorkloadSpec) -> tuple[str, ...]:
        """The flavors of ``queue`` that ``spec`` could be placed in, in order: those of the
        GPU models the nodes list (that its ``gpu_model`` selects); all while none does."""
        glob = spec.gpu_model
        fits = {queue.flavor_of(m) for m in self.known_models()
                if glob is None or fnmatchcase(m, glob)}
        return tuple(f for f in queue.flavors if f in fits) or queue.flavors

    def flavor_at(self, queue: QueueSpec, node: str, gpus: Sequence[int] = ()) -> str:
        """The flavor of ``queue`` that GPUs ``gpus`` of ``node`` count in (the model of
        the first of them the node lists, else of its first GPU; ``REST`` if unknown)."""
        record = self.nodes.get(node)
        if record is None or not record.gpus:
            return REST
        models = {g.index: g.model for g in record.gpus}
        for index in gpus:
            if index in models:
                return queue.flavor_of(models[index])
        return queue.flavor_of(record.gpus[0].model)

    def _flavors_of_nodes(self, queue: QueueSpec) -> dict[str, frozenset[str]]:
        """node -> the flavors of ``queue`` its GPUs count in (once per queue and pass)."""
        found = self._node_flavors.get(queue.name)
        if found is None:
            found = self._node_flavors[queue.name] = {
                name: frozenset(queue.flavor_of(g.model) for g in record.gpus)
                for name, record in self.nodes.items()}
        return found

    def _only_in(self, queue: QueueSpec, flavor: str) -> frozenset[str]:
        """The nodes with GPUs of any flavor of ``queue`` but ``flavor``."""
        key = (queue.name, flavor)
        nodes = self._outside.get(key)
        if nodes is None:
            nodes = self._outside[key] = frozenset(
                n for n, flavors in self._flavors_of_nodes(queue).items()
                if flavors != {flavor})
        return nodes

    def in_counted_flavor(self, request: PlacementRequest) -> PlacementRequest | None:
        """``request`` kept to the nodes of the flavor the order counted it in, while that
        flavor has room for it (placement tries it so first); None otherwise."""
        queue = self.queues.get(request.spec.queue)
        flavor = self.counted_in.get(request.workload)
        if queue is None or not queue.models or flavor is None \
                or self._refusal_in(request.spec, queue, flavor, flavor) is not None:
            return None
        return replace(request, flavor_full=request.flavor_full | self._only_in(queue, flavor))

    def constrain(self, request: PlacementRequest) -> PlacementRequest:
        """``request``, kept off the nodes with GPUs of a flavor its queue has no room in
        for it (``PlacementRequest.flavor_full``); unchanged for a queue without
        ``models``. A node with GPUs of several flavors is used only if all have room. A
        request the order counted within its quota in a flavor (``entitled_in``) is kept to
        the nodes of that flavor alone: it never borrows in another (which would let work
        ordered as within quota borrow ahead of the borrowers, and be reclaimed, in turn)."""
        queue = self.queues.get(request.spec.queue)
        if queue is None or not queue.models or queue.gpus is None:
            return request
        counted = self.entitled_in.get(request.workload)
        if counted is not None:  # within its quota there: placed there only, never borrows
            return replace(request, flavor_full=self._only_in(queue, counted))
        full = frozenset(f for f in queue.flavors
                         if self._refusal_in(request.spec, queue, f, f) is not None)
        if not full:
            return request
        key = (queue.name, full)
        nodes = self._full_nodes.get(key)
        if nodes is None:
            nodes = self._full_nodes[key] = frozenset(
                n for n, flavors in self._flavors_of_nodes(queue).items() if flavors & full)
        return replace(request, flavor_full=nodes)

    # -- reclaim -----------------------------------------------------------------------

    def reclaim_flavor(self, request: PlacementRequest) -> str | None:
        """The flavor in which ``request`` may take back lent quota (``REST`` for a queue
        without ``models``); None when it may not (not ``entitled``)."""
        if request.workload not in self.entitled:
            return None
        queue = self.queues.get(request.spec.queue)
        if queue is None or not queue.models:
            return REST
        return self.entitled_in.get(request.workload)

    def reclaim_need(self, request: PlacementRequest) -> float | None:
        """What the cohort's pool lacks for ``request`` in the flavor it may reclaim in (0:
        that flavor has room, the GPUs do not); None when it may not reclaim: not
        ``entitled``, or the quota, not the pool, stops it there (a borrowing limit, or more
        than its nominal quota)."""
        flavor = self.reclaim_flavor(request)
        queue = self.queues.get(request.spec.queue)
        if flavor is None or queue is None or queue.cohort is None:
            return None
        found = self._refusal_in(request.spec, queue, flavor, flavor)
        if found is None:
            return 0.0
        if found.at_borrowing_limit or found.used + found.needs > found.nominal + EPSILON:
            return None
        return found.pool_short

    def for_reclaim(self, request: PlacementRequest) -> PlacementRequest:
        """``request`` as it takes back lent quota (``reclaim`` set): for a queue with
        ``models``, kept to the nodes whose GPUs are all of the flavor it reclaims in."""
        queue = self.queues.get(request.spec.queue)
        flavor = self.reclaim_flavor(request)
        if queue is None or not queue.models or flavor is None:
            return replace(request, reclaim=True)
        return replace(request, reclaim=True, flavor_full=self._only_in(queue, flavor))

    # -- refusals ----------------------------------------------------------------------

    def refusal(self, request: PlacementRequest) -> QuotaRefusal | None:
        """Why ``request`` does not fit its queue's quota now; None when it does (for a
        queue with ``models``: in at least one of the flavors it could be placed in; for
        one the order counted within its quota in a flavor, in that flavor)."""
        counted = self.entitled_in.get(request.workload)
        queue = self.queues.get(request.spec.queue)
        if counted is not None and queue is not None and queue.models:
            return self._refusal_in(request.spec, queue, counted, counted)
        return self.refusal_for(request.spec)

    def refusal_for(self, spec: WorkloadSpec) -> QuotaRefusal | None:
        """As ``refusal``, for a spec."""
        name = spec.queue
        queue = self.queues.get(name)
        if queue is None:
            return QuotaRefusal(name, declared=tuple(sorted(self.queues)), known=False)
        if queue.gpus is None:
            return None
        if not queue.models:
            return self._refusal_in(spec, queue, REST, None)
        refused = []
        for flavor in self.flavors_for(queue, spec):
            found = self._refusal_in(spec, queue, flavor, flavor)
            if found is None:
                return None
            refused.append(found)
        return replace(refused[0], others=tuple(refused[1:]))

    def _refusal_in(self, spec: WorkloadSpec, queue: QueueSpec, flavor: str,
                    label: str | None) -> QuotaRefusal | None:
        """Why ``spec`` does not fit ``queue``'s quota in ``flavor`` (``label``: the flavor
        as the refusal names it, None for a queue without ``models``)."""
        name = queue.name
        needs = charge(spec)
        used = self.used_in(name, flavor)
        after = used + needs
        nominal = float(queue.nominal(flavor))

        def refused(**more: Any) -> QuotaRefusal:  # built only when refusing: called a lot
            return QuotaRefusal(name, used=used, nominal=nominal, needs=needs,
                                cohort=queue.cohort, borrowing_limit=queue.borrowing_limit,
                                flavor=label, **more)

        if queue.cohort is None:
            return None if after <= nominal + EPSILON else refused()
        if queue.borrowing_limit is not None \
                and after > nominal + queue.borrowing_limit + EPSILON:
            return refused(at_borrowing_limit=True)
        extra = self._from_pool(queue, after, flavor) - self._from_pool(queue, used, flavor)
        pool = self.pool(queue.cohort, flavor)
        pool_used = self.pool_used(queue.cohort, flavor)
        held = (extra > EPSILON and after > nominal + EPSILON
                and (queue.cohort, flavor) in self.pool_holds)
        if pool_used + extra <= pool + EPSILON and not held:
            return None
        return refused(pool=pool, pool_free=pool - pool_used,
                       users=self._pool_users(queue.cohort, flavor), needs_from_pool=extra,
                       held=held)

    def hold_pool(self, request: PlacementRequest, refusal: QuotaRefusal) -> bool:
        """Hold the room left in the cohort's pool for ``request``, refused for too little of
        it, for the rest of the pass: later requests that would borrow from that pool wait
        (``QuotaRefusal.held``); those within their queue's nominal quota do not. So a large
        request at the head of the fair order is not kept waiting for ever by a stream of
        smaller borrowers that each fit the room left, as the first waiting gang holds
        nodes (``hafo.decisions.gang_placement``). Only the first such request of a pool per
        pass, and only when the room left and what the cohort's queues borrow together
        would fit it (the borrowed work ending makes room; work within its quota need not
        end). True when it holds."""
        queue = self.queues.get(request.spec.queue)
        if queue is None or queue.cohort is None or not refusal.known \
                or refusal.at_borrowing_limit or refusal.pool_short <= EPSILON:
            return False
        flavor = refusal.flavor if refusal.flavor is not None else REST
        key = (queue.cohort, flavor)
        if key in self.pool_holds:  # one hold per pool (a refusal for a hold: this one)
            return False
        if refusal.pool_free + self.cohort_borrowed(queue.cohort, flavor) + EPSILON \
                < refusal.needs_from_pool:
            return False
        self.pool_holds[key] = request.workload
        return True

    def _pool_users(self, cohort: str, flavor: str = REST,
                    ) -> tuple[tuple[str, float, float], ...]:
        """The queues of ``cohort`` that use its pool of ``flavor``, most first (name, usage,
        quota); kept until a placement of the cohort changes it."""
        key = (cohort, flavor)
        if key not in self._users:
            users = [(q, self.used_in(q, flavor), float(self.queues[q].nominal(flavor)))
                     for q in self._members[cohort]
                     if self._from_pool(self.queues[q], self.used_in(q, flavor),
                                        flavor) > EPSILON]
            users.sort(key=lambda u: (-(u[1] - u[2]), u[0]))
            self._users[key] = tuple(users)
        return self._users[key]

    # -- placements --------------------------------------------------------------------

    def charge(self, request: PlacementRequest, placed: Placed | None = None) -> None:
        """``request`` was placed (at ``placed``): its queue uses its charge from now on,
        for a queue with ``models`` in the flavor of the GPUs it was placed on (a gang's
        members each in their own; without ``placed``: the first flavor with room)."""
        name = request.spec.queue
        amount = charge(request.spec)
        self.used[name] = self.used.get(name, 0.0) + amount
        queue = self.queues.get(name)
        if queue is None:
            return
        if not queue.models:
            self._charge_in(queue, REST, amount, self.used[name] - amount)
            return
        for flavor, part in self._placed_flavors(queue, request, placed, amount):
            key = (name, flavor)
            before = self.flavor_used.get(key, 0.0)
            self.flavor_used[key] = before + part
            self._charge_in(queue, flavor, part, before)

    def _charge_in(self, queue: QueueSpec, flavor: str, amount: float, before: float) -> None:
        """Keep the cohort's pool of ``flavor`` up to date: ``queue`` went from ``before``
        to ``before + amount`` there."""
        if queue.cohort is None:
            return
        key = (queue.cohort, flavor)
        self._users.pop(key, None)
        self._cohort_borrowed.pop(key, None)
        if key in self._pool_used:
            self._pool_used[key] += (self._from_pool(queue, before + amount, flavor)
                                     - self._from_pool(queue, before, flavor))

    def _placed_flavors(self, queue: QueueSpec, request: PlacementRequest,
                        placed: Placed | None, amount: float) -> list[tuple[str, float]]:
        """(flavor, charge) of each instance of ``request`` placed at ``placed``."""
        if placed is None:
            if request.workload in self.counted_in:
                return [(self.counted_in[request.workload], amount)]
            options = self.flavors_for(queue, request.spec)
            room = [f for f in options
                    if self._refusal_in(request.spec, queue, f, f) is None]
            return [((room or list(options))[0], amount)]
        slots = [(m.node, m.gpus) for m in placed.members] or [(placed.node, placed.gpus)]
        part = amount / len(slots)
        return [(self.flavor_at(queue, node, gpus), part) for node, gpus in slots]

    # -- views -------------------------------------------------------------------------

    def standings(self, pending: Iterable[WorkloadSpec]) -> dict[str, QueueStanding]:
        """Every declared queue's standing (usage as it is now)."""
        waiting: dict[str, float] = {}
        for pending_spec in pending:
            name = pending_spec.queue
            waiting[name] = waiting.get(name, 0.0) + charge(pending_spec)
        totals: dict[str, tuple[float, float]] = {}  # cohort -> (borrowed, idle), once
        for cohort, members in self._members.items():
            totals[cohort] = (sum(self._borrowed(q) for q in members),
                              sum(self._idle(q) for q in members))
        out = {}
        for name, queue in sorted(self.queues.items()):
            used = self.used.get(name, 0.0)
            share = self.share(name, self.used_in(name, REST) if queue.models else used)
            out[name] = QueueStanding(queue, used, self._borrowed(name),
                                      self._lent(name, totals), waiting.get(name, 0.0),
                                      share, self._flavor_standings(queue))
        return out

    def _flavor_standings(self, queue: QueueSpec) -> dict[str, FlavorStanding]:
        if not queue.models:
            return {}
        return {flavor: FlavorStanding(float(queue.nominal(flavor)),
                                       self.used_in(queue.name, flavor),
                                       self.borrowed_in(queue.name, flavor))
                for flavor in queue.flavors}

    def _borrowed(self, name: str) -> float:
        """Per flavor: one may borrow while another is idle (one, ``REST``, without
        ``models``)."""
        return sum(self.borrowed_in(name, f) for f in self.queues[name].flavors)

    def _idle(self, name: str) -> float:
        """What ``name`` lends and does not use itself."""
        spec = self.queues[name]
        if spec.models:
            return sum(max(min(float(spec.lendable_in(f)),
                               float(spec.nominal(f)) - self.used_in(name, f)), 0.0)
                       for f in spec.flavors)
        return max(min(float(spec.lendable), float(spec.gpus or 0) - self.used.get(name, 0.0)),
                   0.0)

    def _lent(self, name: str, totals: Mapping[str, tuple[float, float]]) -> float:
        """What of ``name``'s idle quota the cohort's borrowers use: their borrowing shared
        among the lenders in proportion to what each leaves idle (``totals``: per cohort,
        what its queues borrow and leave idle; all flavors together)."""
        cohort = self.queues[name].cohort
        idle = self._idle(name)
        if cohort is None or idle <= 0:
            return 0.0
        borrowed, idle_all = totals[cohort]
        return min(idle, borrowed * idle / idle_all) if idle_all > 0 else 0.0
