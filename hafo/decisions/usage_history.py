"""Fair share by decayed usage history (``fair_sharing.usage_half_life``). Pure.

With the setting, borrowers are ordered (``hafo.decisions.fair_order.admission_order``) by each
queue's **effective usage** instead of its usage now: a decayed average of what it used,
plus the **entry penalty** of what was admitted since the last sample. This is Kueue's
Admission Fair Sharing (``usageHalfLifeTime``, sampled every cycle here, with an entry
penalty) and Slurm's ``PriorityDecayHalfLife`` on one resource, GPUs.

**Decay.** The history of queue ``q`` is ``a_q``, in GPUs: the usage ``u(s)`` of the queue
weighted by ``2^(-(t - s) / T)`` (``T``: the half-life), normalised so that a queue that
has used ``u`` GPUs forever has ``a_q = u``::

    a_q(t) = ln 2 / T * integral of u(s) * 2^(-(t - s) / T) ds

Sampled once per cycle, with the usage of the sample standing for the whole interval
since the one before (``dt``), this is exactly::

    a' = a * f + u * (1 - f),    f = 2^(-dt / T)

so usage that stopped counts half after ``T``, a quarter after ``2 T``; usage that started
counts half after ``T``. A queue first seen (a new history, a queue declared since) starts
at its usage now, as if it had always used that: a fresh history orders as the
instantaneous rule does.

**Entry penalty.** A workload admitted counts at once in full: its charge ``c`` is added
to the queue's penalty ``p`` (``UsageHistory.penalize``), and the penalty decays at the
same half-life, ``p' = p * f``, while the sampled usage brings the average up by
``c * (1 - f)``: their sum stays ``c`` for as long as it runs. So the effective usage
``a + p`` of a queue is its usage now, with a memory fading at half-life ``T`` of the
usage that ended: a burst of submissions from one queue counts as soon as each is
admitted, not a half-life later. (Within one cycle, ``admission_order`` counts each
request of a queue on top of the ones before it, as the instantaneous rule does.)

**Robustness.** A step of a clock backwards, or a time that is not a number, decays
nothing (the history is re-anchored at the new time); a huge step forgets everything (the
factor underflows to 0, no overflow); usage that is negative or not finite counts as 0.
Only the queues named in ``declared`` are kept: memory is bounded by the queues declared.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hafo.decisions.plan import Plan
from hafo.decisions.quota import charge, usage
from hafo.model.cluster import ClusterSnapshot

__all__ = ["QueueHistory", "UsageHistory", "admitted", "decay_factor",
           "penalized", "sampled"]

#: The stored form's version (``UsageHistory.to_dict``).
FORMAT = 1


def _amount(value: Any) -> float:
    """A GPU amount: finite and not negative, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    number = float(value)
    return number if math.isfinite(number) and number > 0 else 0.0


def decay_factor(dt: float, half_life: float) -> float:
    """``2^(-dt / half_life)``: what is left of a past amount after ``dt`` seconds; 1 for
    a ``dt`` that is negative or not a number (no decay), 0 for a huge one."""
    if not math.isfinite(half_life) or half_life <= 0:
        raise ValueError(f"half_life must be a positive number of seconds, not {half_life!r}")
    if math.isnan(dt) or dt <= 0:
        return 1.0
    return math.exp(-dt / half_life * math.log(2.0)) if math.isfinite(dt) else 0.0


@dataclass(frozen=True)
class QueueHistory:
    """One queue's history: ``average``, its decayed usage in GPUs; ``penalty``, the
    charge of what was admitted, decaying as its usage comes into ``average``."""

    average: float = 0.0
    penalty: float = 0.0

    @property
    def effective(self) -> float:
        """The usage the fair order counts for the queue: ``average + penalty``."""
        return self.average + self.penalty


@dataclass(frozen=True)
class UsageHistory:
    """Every declared queue's history at ``at`` (the deciding controller's clock; None: no
    sample yet). Immutable: each method returns a new one."""

    at: float | None = None
    queues: Mapping[str, QueueHistory] = field(default_factory=dict)

    def advance(self, now: float, usage: Mapping[str, float], half_life: float,
                declared: Collection[str] | None = None) -> UsageHistory:
        """The history at ``now``, ``usage`` (queue -> GPUs used now) standing for the
        interval since ``at``. ``declared``: the queues to keep (None: those known and
        those in ``usage``); any other is forgotten. ``now`` not a number: unchanged."""
        if math.isnan(now):
            return self
        names = set(declared) if declared is not None else set(self.queues) | set(usage)
        factor = 1.0 if self.at is None else decay_factor(now - self.at, half_life)
        out: dict[str, QueueHistory] = {}
        for name in sorted(names):
            used = _amount(usage.get(name, 0.0))
            old = self.queues.get(name)
            if old is None or self.at is None:
                out[name] = QueueHistory(average=used)
                continue
            out[name] = QueueHistory(average=old.average * factor + used * (1.0 - factor),
                                     penalty=old.penalty * factor)
        return UsageHistory(at=now, queues=out)

    def penalize(self, queue: str, charge: float) -> UsageHistory:
        """``queue`` was admitted work of ``charge`` GPUs: it counts in full at once (the
        entry penalty). A queue not known (not declared at the last sample) is left out."""
        old = self.queues.get(queue)
        amount = _amount(charge)
        if old is None or amount == 0.0:
            return self
        queues = dict(self.queues)
        queues[queue] = QueueHistory(average=old.average, penalty=old.penalty + amount)
        return UsageHistory(at=self.at, queues=queues)

    def effective(self) -> dict[str, float]:
        """queue -> its effective usage in GPUs (``QueueHistory.effective``), what
        ``admission_order`` takes as ``history``."""
        return {name: q.effective for name, q in self.queues.items()}

    def to_dict(self) -> dict[str, Any]:
        """The stored form (JSON)."""
        return {"format": FORMAT, "at": self.at,
                "queues": {name: {"average": q.average, "penalty": q.penalty}
                           for name, q in sorted(self.queues.items())}}

    @classmethod
    def from_dict(cls, data: Any) -> UsageHistory:
        """Parse the stored form; ValueError says what is wrong with it."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"format: not a usage history (expected format {FORMAT})")
        at, raw = data.get("at"), data.get("queues")
        if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)
                               or not math.isfinite(at)):
            raise ValueError("at: must be a time in seconds")
        if not isinstance(raw, dict):
            raise ValueError("queues: must be an object of queue -> history")
        queues: dict[str, QueueHistory] = {}
        for name, entry in raw.items():
            if not isinstance(name, str) or not isinstance(entry, dict):
                raise ValueError(f"queues.{str(name)[:60]}: must be an object")
            values = []
            for part in ("average", "penalty"):
                value = entry.get(part, 0.0)
                if isinstance(value, bool) or not isinstance(value, int | float) \
                        or not math.isfinite(value) or value < 0:
                    raise ValueError(f"queues.{name}.{part}: must be a number of GPUs")
                values.append(float(value))
            queues[name] = QueueHistory(*values)
        return cls(at=None if at is None else float(at), queues=queues)


def sampled(history: UsageHistory, snapshot: ClusterSnapshot, now: float,
            half_life: float) -> UsageHistory:
    """``history`` advanced to ``now`` with the usage of ``snapshot``
    (``hafo.decisions.quota.usage``), keeping its declared queues only."""
    return history.advance(now, usage(snapshot), half_life, declared=snapshot.queues.keys())


def admitted(plan: Plan, snapshot: ClusterSnapshot) -> dict[str, float]:
    """queue -> the charge of the work ``plan`` places that held no GPUs in ``snapshot``
    (new admissions: their entry penalty; a failover or a move is in the usage already)."""
    out: dict[str, float] = {}
    for action in plan.actions:
        if action.kind != "place":
            continue
        submission = snapshot.workloads.get(action.workload)
        before = snapshot.assignments.get(action.workload)
        if submission is None or (before is not None and before.holds_node):
            continue
        queue = submission.spec.queue
        out[queue] = out.get(queue, 0.0) + charge(submission.spec)
    return out


def penalized(history: UsageHistory, charges: Mapping[str, float]) -> UsageHistory:
    """``history`` with the entry penalty of every queue's ``charges`` (``admitted``)."""
    for queue, amount in sorted(charges.items()):
        history = history.penalize(queue, amount)
    return history
