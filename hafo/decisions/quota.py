"""Queue quotas, borrowing within a cohort and the fair order between queues: stage 2 of
the reconcile pipeline (**admit**). Pure.

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

**Order.** Requests of one queue are taken by priority, then age. Across queues, those that
fit within their queue's nominal quota (counting the queue's earlier requests, but not one
that could never fit: above its borrowing limit or the whole pool) come first;
then those that borrow, by their queue's weighted **dominant share** once admitted (Kueue's
DRS: the GPUs it would use above its nominal quota, divided by its cohort's pool, divided
by its weight), lowest first; ties by priority, then age, then id. The order is decided
once per cycle from the usage at its start (``admission_order``); the quota is then checked
again, request by request, as placements are made (``Quotas.refusal`` before trying one,
``Quotas.charge`` once placed), so the limits hold exactly whatever the order.

**No ping-pong.** Nothing here stops a running workload: a request that does not fit its
quota waits. The only stops are priority preemption within one queue
(``hafo.decisions.preemption_policy.QueueScoped``) and reclaim by a request counted within
its queue's quota (``Quotas.entitled``; ``hafo.decisions.reclaim``); docs/design.md,
"Queues and fair share", argues why no two queues can take GPUs back and forth.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from hafo.decisions.placement_rules import PlacementRequest
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queue_view import QueueUsage
from hafo.model.queues import QueueSpec
from hafo.model.spec import WorkloadSpec
from hafo.model.views import WorkloadView

__all__ = ["MAX_NAMED", "MIG_SLICES", "QueueStanding", "QuotaRefusal", "Quotas", "admission_order",
           "charge", "live_reasons", "ordinal", "standings", "usage", "usage_views",
           "with_live_reasons"]

#: A whole GPU's compute slices in MIG mode (A100, H100, H200: 7).
MIG_SLICES = 7
_SLICES = re.compile(r"([0-9]+)g\.")
_Views = TypeVar("_Views", WorkloadView, list[WorkloadView])

#: The most queues a pending reason names (those using the most of the pool first).
MAX_NAMED = 3
#: Slack for sums of MIG fractions.
_EPSILON = 1e-9


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


def _amount(value: float) -> str:
    """A GPU count for a message: "4", or "2.43" for MIG fractions."""
    return str(round(value)) if abs(value - round(value)) < 1e-6 else f"{value:.2f}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st ..."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class QuotaRefusal:
    """Why a request does not fit its queue's quota now, as data until rendered: the queue,
    what it uses, its quota and what the request needs; for a queue in a cohort the pool,
    what of it is free, and the queues using it (``users``: name, usage, nominal); whether
    the borrowing limit is what stops it."""

    queue: str
    declared: tuple[str, ...] = ()
    known: bool = True
    used: float = 0.0
    nominal: float = 0.0
    needs: float = 0.0
    cohort: str | None = None
    pool: float = 0.0
    pool_free: float = 0.0
    users: tuple[tuple[str, float, float], ...] = ()
    needs_from_pool: float = 0.0
    borrowing_limit: float | None = None
    at_borrowing_limit: bool = False

    @property
    def reclaimable(self) -> bool:
        """Only the cohort's pool stops it, and it would stay within its queue's nominal
        quota: the quota it lent out may be taken back (``hafo.decisions.reclaim``)."""
        return (self.known and self.cohort is not None and not self.at_borrowing_limit
                and self.used + self.needs <= self.nominal + _EPSILON)

    @property
    def pool_short(self) -> float:
        """How much the cohort's pool lacks for the request."""
        return max(self.needs_from_pool - self.pool_free, 0.0)

    def summary(self) -> str:
        """What a pending workload's stored reason says: only what changes when the quotas
        or the request do (no live usage, no place in the queue), so that the controller
        does not rewrite every waiting workload whenever anything of its cohort is placed;
        readers see ``render`` (``live_reasons``)."""
        if not self.known:
            return self.render()
        text = f"queue {self.queue}: needs {_amount(self.needs)}"
        if self.at_borrowing_limit and self.borrowing_limit is not None:
            return f"{text}; at its borrowing limit ({_amount(self.borrowing_limit)})"
        if self.cohort is None:
            return f"{text}, more than its quota of {_amount(self.nominal)} GPUs leaves"
        return f"{text}; cohort {self.cohort} has too little to lend"

    def render(self) -> str:
        """One sentence, in tiers: the queue, then the cohort, then who holds the pool."""
        if not self.known:
            declared = ", ".join(self.declared) or "none"
            return (f"no queue named {self.queue!r} (declared: {declared}); "
                    f"`hafo queue set {self.queue} --gpus N` declares it")
        text = (f"queue {self.queue}: {_amount(self.used)} of {_amount(self.nominal)} GPUs "
                f"used, needs {_amount(self.needs)}")
        if self.at_borrowing_limit and self.borrowing_limit is not None:
            return f"{text}; at its borrowing limit ({_amount(self.borrowing_limit)})"
        if self.cohort is None:
            return text
        text += (f"; cohort {self.cohort} lends {_amount(max(self.pool_free, 0.0))} of "
                 f"{_amount(self.pool)}")
        others = [user for user in self.users if user[0] != self.queue]
        holders = [f"{name} uses {_amount(used)} of its {_amount(nominal)}"
                   for name, used, nominal in others[:MAX_NAMED]]
        if len(others) > MAX_NAMED:
            holders.append(f"{len(others) - MAX_NAMED} more")
        if holders:
            text += f" ({', '.join(holders)})"
        return text


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


@dataclass
class Quotas:
    """The quota state during one placement pass (mutable; ``charge`` as requests are
    placed). ``queues``: the declared ones; ``used``: usage per queue name."""

    queues: Mapping[str, QueueSpec]
    used: dict[str, float] = field(default_factory=dict)
    #: the requests the cycle's order counted within their queue's nominal quota (set by
    #: ``admission_order``): only they may take back lent quota (``hafo.decisions.reclaim``)
    entitled: set[str] = field(default_factory=set)
    _members: dict[str, list[str]] = field(default_factory=dict)
    _pools: dict[str, float] = field(default_factory=dict)
    _pool_used: dict[str, float] = field(default_factory=dict)
    _users: dict[str, tuple[tuple[str, float, float], ...]] = field(default_factory=dict)

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
        return cls(snapshot.queues, usage(snapshot, placing))

    # -- the quota arithmetic ------------------------------------------------------------

    def _kept(self, spec: QueueSpec) -> float:
        """What of its quota a queue keeps for itself (does not lend)."""
        return float(spec.gpus or 0) - spec.lendable

    def _from_pool(self, spec: QueueSpec, used: float) -> float:
        return max(used - self._kept(spec), 0.0)

    def pool(self, cohort: str) -> float:
        """What the queues of ``cohort`` lend in all."""
        if cohort not in self._pools:
            self._pools[cohort] = float(sum(self.queues[q].lendable
                                            for q in self._members.get(cohort, ())))
        return self._pools[cohort]

    def pool_used(self, cohort: str) -> float:
        """What of ``cohort``'s pool its queues use (kept up to date by ``charge``: a
        cohort of a thousand queues costs no more per request than one of two)."""
        if cohort not in self._pool_used:
            self._pool_used[cohort] = sum(self._from_pool(self.queues[q], self.used.get(q, 0.0))
                                          for q in self._members.get(cohort, ()))
        return self._pool_used[cohort]

    def share(self, queue: str, used: float) -> float:
        """``queue``'s weighted dominant share at usage ``used``: what it uses above its
        quota over its cohort's pool, over its weight (0 when it does not borrow)."""
        spec = self.queues[queue]
        above = used - float(spec.gpus or 0)
        if spec.cohort is None or spec.gpus is None or above <= _EPSILON:
            return 0.0
        pool = self.pool(spec.cohort)
        return above / pool / spec.weight if pool > 0 else float("inf")

    def ceiling(self, queue: str) -> float:
        """The most ``queue`` may ever use now: its quota, plus its borrowing limit or the
        cohort's pool beyond what it keeps (infinite without a quota)."""
        spec = self.queues[queue]
        if spec.gpus is None:
            return float("inf")
        if spec.cohort is None:
            return float(spec.gpus)
        pooled = self._kept(spec) + self.pool(spec.cohort)
        limit = spec.gpus + spec.borrowing_limit if spec.borrowing_limit is not None \
            else float("inf")
        return min(pooled, limit)

    def within_nominal(self, queue: str, used: float) -> bool:
        """Whether usage ``used`` is within ``queue``'s nominal quota (a queue without one,
        or undeclared, counts as within)."""
        spec = self.queues.get(queue)
        return spec is None or spec.gpus is None or used <= spec.gpus + _EPSILON

    def refusal(self, request: PlacementRequest) -> QuotaRefusal | None:
        """Why ``request`` does not fit its queue's quota now; None when it does."""
        return self.refusal_for(request.spec)

    def refusal_for(self, spec: WorkloadSpec) -> QuotaRefusal | None:
        """As ``refusal``, for a spec."""
        name = spec.queue
        queue = self.queues.get(name)
        if queue is None:
            return QuotaRefusal(name, declared=tuple(sorted(self.queues)), known=False)
        if queue.gpus is None:
            return None
        needs = charge(spec)
        used = self.used.get(name, 0.0)
        after = used + needs
        nominal = float(queue.gpus)
        refused = QuotaRefusal(name, used=used, nominal=nominal, needs=needs,
                               cohort=queue.cohort, borrowing_limit=queue.borrowing_limit)
        if queue.cohort is None:
            return None if after <= nominal + _EPSILON else refused
        if queue.borrowing_limit is not None \
                and after > nominal + queue.borrowing_limit + _EPSILON:
            return replace(refused, at_borrowing_limit=True)
        extra = self._from_pool(queue, after) - self._from_pool(queue, used)
        pool, pool_used = self.pool(queue.cohort), self.pool_used(queue.cohort)
        if pool_used + extra <= pool + _EPSILON:
            return None
        return replace(refused, pool=pool, pool_free=pool - pool_used,
                       users=self._pool_users(queue.cohort), needs_from_pool=extra)

    def _pool_users(self, cohort: str) -> tuple[tuple[str, float, float], ...]:
        """The queues of ``cohort`` that use its pool, most first (name, usage, quota);
        kept until a placement of the cohort changes it."""
        if cohort not in self._users:
            users = [(q, self.used.get(q, 0.0), float(self.queues[q].gpus or 0))
                     for q in self._members[cohort]
                     if self._from_pool(self.queues[q], self.used.get(q, 0.0)) > _EPSILON]
            users.sort(key=lambda u: (-(u[1] - u[2]), u[0]))
            self._users[cohort] = tuple(users)
        return self._users[cohort]

    def charge(self, request: PlacementRequest) -> None:
        """``request`` was placed: its queue uses its charge from now on."""
        name = request.spec.queue
        before = self.used.get(name, 0.0)
        self.used[name] = before + charge(request.spec)
        queue = self.queues.get(name)
        if queue is not None and queue.cohort is not None:
            self._users.pop(queue.cohort, None)
            if queue.cohort in self._pool_used:
                self._pool_used[queue.cohort] += (self._from_pool(queue, self.used[name])
                                                  - self._from_pool(queue, before))

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
            out[name] = QueueStanding(queue, used, self._borrowed(name),
                                      self._lent(name, totals), waiting.get(name, 0.0),
                                      self.share(name, used))
        return out

    def _borrowed(self, name: str) -> float:
        spec = self.queues[name]
        return max(self.used.get(name, 0.0) - spec.gpus, 0.0) if spec.gpus is not None else 0.0

    def _idle(self, name: str) -> float:
        """What ``name`` lends and does not use itself."""
        spec = self.queues[name]
        return max(min(float(spec.lendable), float(spec.gpus or 0) - self.used.get(name, 0.0)),
                   0.0)

    def _lent(self, name: str, totals: Mapping[str, tuple[float, float]]) -> float:
        """What of ``name``'s idle quota the cohort's borrowers use: their borrowing shared
        among the lenders in proportion to what each leaves idle (``totals``: per cohort,
        what its queues borrow and leave idle)."""
        cohort = self.queues[name].cohort
        idle = self._idle(name)
        if cohort is None or idle <= 0:
            return 0.0
        borrowed, idle_all = totals[cohort]
        return min(idle, borrowed * idle / idle_all) if idle_all > 0 else 0.0


def standings(snapshot: ClusterSnapshot) -> dict[str, QueueStanding]:
    """Every declared queue's standing in ``snapshot`` (``hafo queues``, the metrics)."""
    quotas = Quotas.of(snapshot)
    if quotas is None:
        return {}
    pending = [snapshot.workloads[wid].spec for wid, a in snapshot.assignments.items()
               if a.phase == "pending" and wid in snapshot.workloads]
    pending += [s.spec for wid, s in snapshot.workloads.items()  # not a service: its replicas
                if wid not in snapshot.assignments and not s.spec.is_service]
    return quotas.standings(pending)


def usage_views(snapshot: ClusterSnapshot) -> dict[str, QueueUsage]:
    """Every declared queue's usage, as the queues' JSON view shows it
    (``hafo.model.queue_view``), rounded to 1/1000 GPU."""
    return {name: QueueUsage(used=round(st.used, 3), borrowed=round(st.borrowed, 3),
                             lent=round(st.lent, 3), pending=round(st.pending, 3),
                             share=round(st.share, 4) if st.share != float("inf") else 0.0)
            for name, st in standings(snapshot).items()}


def _within_queue_key(request: PlacementRequest) -> tuple[int, float, str]:
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
    for name, members in by_queue.items():
        members.sort(key=_within_queue_key)
        used = start = quotas.used.get(name, 0.0)
        basis = start if history is None else history.get(name, start)
        ceiling = quotas.ceiling(name) if name in quotas.queues else 0.0
        for request in members:
            if name not in quotas.queues:
                keyed.append(((2, 0.0, -request.spec.priority, request.submitted_at,
                               request.workload), request))
                continue
            after = used + charge(request.spec)
            if after > ceiling + _EPSILON:  # can never fit now: it does not count for those
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


def live_reasons(snapshot: ClusterSnapshot) -> dict[str, str]:
    """workload -> why it waits, with the live figures, for every pending workload of a queue
    with a quota: its queue's usage now, the cohort's pool and who holds it, then its place
    among its queue's waiting workloads in the order they are tried (``admission_order``).
    The stored reason holds only ``QuotaRefusal.summary``; the API and the CLI show this.
    Read-only and pure (the same snapshot, the same text)."""
    quotas = Quotas.of(snapshot)
    if quotas is None:
        return {}
    requests = []
    for wid, submission in snapshot.workloads.items():
        if submission.spec.is_service and submission.service is None:
            continue  # a service: its replicas wait, each on its own
        assignment = snapshot.assignments.get(wid)
        if assignment is not None and assignment.phase != "pending":
            continue
        queue = quotas.queues.get(submission.spec.queue)
        if queue is None or queue.gpus is None:
            continue
        requests.append(PlacementRequest(workload=wid, spec=submission.spec,
                                         submitted_at=submission.submitted_at))
    ordered = admission_order(sorted(requests, key=_within_queue_key), quotas)
    by_queue: dict[str, list[str]] = {}
    for request in ordered:
        by_queue.setdefault(request.spec.queue, []).append(request.workload)
    out: dict[str, str] = {}
    for request in ordered:
        wid, name = request.workload, request.spec.queue
        assignment = snapshot.assignments.get(wid)
        stored = assignment.reason if assignment is not None else ""
        refusal = quotas.refusal(request)
        if refusal is not None and stored.startswith(refusal.summary()):
            stored = refusal.render() + stored[len(refusal.summary()):]
        waiting = by_queue[name]
        place = f"{ordinal(waiting.index(wid) + 1)} of {len(waiting)} waiting in queue {name}"
        out[wid] = f"{stored}; {place}" if stored else place
    return out


def with_live_reasons(views: _Views, snapshot: ClusterSnapshot) -> _Views:
    """Workload views (``hafo.model.views``: one, or a list) with each waiting workload's
    ``reason`` as ``live_reasons`` says it (the same object, changed in place)."""
    live = live_reasons(snapshot)
    if live:
        for view in views if isinstance(views, list) else [views]:
            if view["id"] in live:
                view["reason"] = live[view["id"]]
    return views
