"""The leader's decayed usage history of the queues (``fair_sharing.usage_half_life``;
``hafo.decisions.usage_history`` decides it).

Kept in memory across cycles while this controller leads: advanced every cycle with the
cycle's usage, given the entry penalty of what the cycle's plan admitted, passed to
``reconcile``. Written to one etcd key (``Keys.fair_share``), fenced by the election, at
most every ``SAVE_EVERY`` seconds, and read once when this controller takes office, so that
a new leader goes on from its predecessor's history (at most ``SAVE_EVERY`` of it lost)
instead of starting afresh. A stored value that does not decode is logged once and ignored
(the history starts afresh); until the stored value is read (etcd unavailable) the order is
by usage now, as without the setting. Nothing here ever delays or fails a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hafo.decisions.plan import Plan
from hafo.decisions.usage_history import UsageHistory, admitted, penalized, sampled
from hafo.model.cluster import ClusterSnapshot
from hafo.store import TRANSIENT, Election, Keys, StoreError
from hafo.store.fair_share import read_usage_history, usage_history_put
from hafo.store.protocol import Store

log = structlog.get_logger("hafo.controller")
_RECOVERABLE: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)

#: The most seconds between two writes of the history.
SAVE_EVERY = 10.0


class FairShareHistory:
    """The queues' usage history while this controller leads (``half_life`` None: off,
    every method does nothing)."""

    def __init__(self, store: Store, keys: Keys, half_life: float | None,
                 save_every: float = SAVE_EVERY) -> None:
        self.store = store
        self.keys = keys
        self.half_life = half_life
        self.save_every = save_every
        self.history: UsageHistory | None = None  # None: not read this term
        self.saved_at: float | None = None
        self.writes = 0

    def new_term(self) -> None:
        """Leadership (re)gained: read the stored history again (another leader may have
        gone on with it meanwhile)."""
        self.history = None
        self.saved_at = None

    async def before_cycle(self, snapshot: ClusterSnapshot, now: float
                           ) -> Mapping[str, float] | None:
        """The history advanced to ``now`` with ``snapshot``'s usage: queue -> effective
        usage, for ``reconcile``'s ``usage_history``. None: off, or not read yet."""
        if self.half_life is None:
            return None
        if self.history is None:
            try:
                stored = await read_usage_history(self.store, self.keys)
            except _RECOVERABLE as exc:
                log.warning("fair-share history not read; ordering by usage now until it is",
                            error=type(exc).__name__)
                return None
            except ValueError as exc:
                log.warning("stored fair-share history ignored: it does not decode; "
                            "starting afresh", key=self.keys.fair_share, error=str(exc))
                stored = None
            self.history = stored if stored is not None else UsageHistory()
        self.history = sampled(self.history, snapshot, now, self.half_life)
        return self.history.effective()

    def after_plan(self, plan: Plan | None, snapshot: ClusterSnapshot) -> None:
        """The entry penalty of what ``plan`` (applied; None: nothing was) admitted."""
        if self.history is not None and plan is not None:
            self.history = penalized(self.history, admitted(plan, snapshot))

    async def save(self, election: Election, now: float) -> bool:
        """Write the history when the last write is ``save_every`` old (or none was made
        this term); True if written. Raises NotLeader if leadership is lost; etcd errors
        are logged and the write tried again the next cycle."""
        if self.history is None or (self.saved_at is not None
                                    and 0 <= now - self.saved_at < self.save_every):
            return False
        try:
            await election.fenced([], [usage_history_put(self.keys, self.history)])
        except _RECOVERABLE as exc:
            log.warning("fair-share history not written; retried next cycle",
                        error=type(exc).__name__)
            return False
        self.saved_at = now
        self.writes += 1
        return True


class _HistoryCollector(Collector):
    """``hafo_queue_usage_history_gpus{queue}``: each queue's effective usage by decayed
    history, the leader's (no samples on a standby, or with the setting off)."""

    def __init__(self, source: FairShareHistory, leading: Callable[[], bool]) -> None:
        self.source = source
        self.leading = leading

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "hafo_queue_usage_history_gpus", "Each queue's effective usage by decayed "
            "history (fair_sharing.usage_half_life): decayed average GPUs plus the entry "
            "penalty of recent admissions; the leader's", labels=["queue"])
        history = self.source.history
        if history is not None and self.leading():
            for name, value in sorted(history.effective().items()):
                family.add_metric([name], round(value, 4))
        yield family


def register_history_metrics(registry: CollectorRegistry, source: FairShareHistory,
                             leading: Callable[[], bool]) -> None:
    """Serve ``hafo_queue_usage_history_gpus`` on ``registry`` (``leading``: read at each
    scrape)."""
    registry.register(_HistoryCollector(source, leading))
