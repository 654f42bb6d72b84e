"""Why a request does not fit its queue's quota now (``QuotaRefusal``), as data until
rendered: the short summary a pending workload's stored reason holds, and the sentence in
tiers (the queue, the cohort, who holds the pool) that readers see. Built by
``hafo.decisions.quota.Quotas.refusal``. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from hafo.model.queues import flavor_label

__all__ = ["MAX_NAMED", "QuotaRefusal"]

#: The most queues a pending reason names (those using the most of the pool first).
MAX_NAMED = 3
#: Slack for sums of MIG fractions (``hafo.decisions.quota.EPSILON``, which imports this
#: module).
_EPSILON = 1e-9


def _amount(value: float) -> str:
    """A GPU count for a message: "4", or "2.43" for MIG fractions."""
    return str(round(value)) if abs(value - round(value)) < 1e-6 else f"{value:.2f}"



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
    #: for a queue with ``models``: the flavor these figures are of (its glob, or ``REST``),
    #: and ``others``, the refusals in the other flavors the request could use
    flavor: str | None = None
    others: tuple[QuotaRefusal, ...] = ()
    #: the pool would have room, but it is held this pass for a request ahead of it in the
    #: fair order that waits for the pool (``hafo.decisions.quota.Quotas.hold_pool``); the
    #: words are a short pool's (readers' live reasons are computed without the pass's
    #: holds: ``hafo.decisions.pending_reasons``)
    held: bool = False

    @property
    def reclaimable(self) -> bool:
        """Only the cohort's pool stops it, and it would stay within its queue's nominal
        quota: the quota it lent out may be taken back (``hafo.decisions.reclaim``). With
        ``flavor`` set, of that flavor only (placement asks
        ``hafo.decisions.quota.Quotas.reclaim_need``, which knows the flavor a request may
        reclaim in)."""
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
        readers see ``render`` (``hafo.decisions.pending_reasons.live_reasons``)."""
        if not self.known:
            return self.render()
        parts = [self._summary_part(), *(other._summary_part() for other in self.others)]
        return f"queue {self.queue}: " + "; ".join(parts)

    def _summary_part(self) -> str:
        kind = "" if self.flavor is None else f" {flavor_label(self.flavor)}"
        text = f"needs {_amount(self.needs)}"
        if self.flavor is not None:
            text += f" in{kind}"
        if self.at_borrowing_limit and self.borrowing_limit is not None:
            return f"{text}; at its borrowing limit ({_amount(self.borrowing_limit)})"
        if self.cohort is None:
            return f"{text}, more than its quota of {_amount(self.nominal)}{kind} GPUs leaves"
        what = "" if self.flavor is None else f"{kind} GPUs"
        # The same words whether the room is short or held for a request ahead (``held``):
        # which of the two changes from cycle to cycle, and a stored reason is rewritten
        # only when its words change.
        return f"{text}; cohort {self.cohort} has too little{what} to lend"

    def render(self) -> str:
        """One sentence, in tiers: the queue, then the cohort, then who holds the pool (for
        a queue with ``models``: so for each flavor the request could use)."""
        if not self.known:
            declared = ", ".join(self.declared) or "none"
            return (f"no queue named {self.queue!r} (declared: {declared}); "
                    f"`hafo queue set {self.queue} --gpus N` declares it")
        parts = [self._render_part(), *(other._render_part() for other in self.others)]
        return f"queue {self.queue}: " + "; ".join(parts)

    def _render_part(self) -> str:
        kind = "" if self.flavor is None else f" {flavor_label(self.flavor)}"
        text = (f"{_amount(self.used)} of {_amount(self.nominal)}{kind} GPUs "
                f"used, needs {_amount(self.needs)}")
        if self.at_borrowing_limit and self.borrowing_limit is not None:
            return f"{text}; at its borrowing limit ({_amount(self.borrowing_limit)})"
        if self.cohort is None:
            return text
        text += (f"; cohort {self.cohort} lends {_amount(max(self.pool_free, 0.0))} of "
                 f"{_amount(self.pool)}{kind}")
        others = [user for user in self.users if user[0] != self.queue]
        holders = [f"{name} uses {_amount(used)} of its {_amount(nominal)}"
                   for name, used, nominal in others[:MAX_NAMED]]
        if len(others) > MAX_NAMED:
            holders.append(f"{len(others) - MAX_NAMED} more")
        if holders:
            text += f" ({', '.join(holders)})"
        return text
