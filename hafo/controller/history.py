"""The leader's writer of workload histories (``hafo.decisions.history`` decides them).

Every cycle, after the plan is applied: the histories the snapshot changes are written, in
fenced transactions (only the leader writes), and those of deleted workloads removed. The
histories are read once per term (one range read) and then kept in memory: a write is made
only when a history changes (an epoch placed, started, asked to stop, ended), never per
cycle. A failed write is logged and tried again the next cycle; it never delays a
decision (it runs after the cycle's plan is written).
"""

from __future__ import annotations

import asyncio

import structlog

from hafo.decisions.history import history_changes
from hafo.model.cluster import ClusterSnapshot
from hafo.model.history import HISTORY_KEEP, WorkloadHistory
from hafo.store import TRANSIENT, Election, Keys, StoreError
from hafo.store.history import history_writes, read_histories
from hafo.store.protocol import Store

log = structlog.get_logger("hafo.controller")
_RECOVERABLE: tuple[type[BaseException], ...] = (*TRANSIENT, StoreError)


class HistoryWriter:
    """Keeps the workloads' histories in etcd while this controller leads."""

    def __init__(self, store: Store, keys: Keys, keep: int = HISTORY_KEEP) -> None:
        self.store = store
        self.keys = keys
        self.keep = keep
        self.histories: dict[str, WorkloadHistory] | None = None  # None: not read this term
        self.writes = 0
        self.settled = -1  # the revision whose changes are all written

    def new_term(self) -> None:
        """Leadership (re)gained: read the stored histories again before writing any (another
        leader may have written them meanwhile)."""
        self.histories = None
        self.settled = -1

    async def step(self, election: Election, snapshot: ClusterSnapshot, now: float,
                   quiet: frozenset[str] = frozenset()) -> int:
        """Write what this snapshot changes; returns the number of histories written or
        removed. Raises NotLeader if leadership is lost; etcd errors are logged. A snapshot
        at the revision already written changes nothing (the histories follow etcd's data,
        not the clock). ``quiet``: its dormant workloads (``hafo.decisions.live_view``),
        whose closed histories are not looked at."""
        if snapshot.revision == self.settled:
            return 0
        try:
            if self.histories is None:
                self.histories = await read_histories(self.store, self.keys)
            known = self.histories
            changes = await asyncio.to_thread(history_changes, known, snapshot, now,
                                              self.keep, quiet)
            written = 0
            for batch in history_writes(self.keys, changes.changed, changes.gone):
                await election.fenced([], batch)
                for op in batch:
                    wid = self.keys.parse(op.key).workload
                    if wid is None:
                        continue
                    if wid in changes.changed:
                        known[wid] = changes.changed[wid]
                    else:
                        known.pop(wid, None)
                    written += 1
            self.writes += written
            self.settled = snapshot.revision
            return written
        except _RECOVERABLE as exc:
            log.warning("workload history not written; retried next cycle",
                        error=type(exc).__name__)
            return 0
