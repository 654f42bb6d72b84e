"""The event log: time-ordered keys under the events prefix, kept about a day.

Events are bound to a lease of ``retention`` seconds that is replaced every
``retention / 24``, so every event disappears between 23/24 and 1 x ``retention`` after it was
written, with no pruning job.
"""

from __future__ import annotations

import time

import structlog

from hafo.model.cluster import Event
from hafo.store import codec
from hafo.store.client import TRANSIENT, EtcdStore, Put
from hafo.store.keys import Keys

log = structlog.get_logger("hafo.events")


class EventLog:
    """Appends events; failures to record an event are logged, never raised."""

    def __init__(self, store: EtcdStore, keys: Keys, retention: int = 86400) -> None:
        self.store = store
        self.keys = keys
        self.retention = retention
        self._lease: int | None = None
        self._lease_at = 0.0

    async def lease(self) -> int:
        """The current event lease, replaced once it is ``retention/24`` old."""
        now = time.monotonic()
        if self._lease is None or now - self._lease_at > self.retention / 24:
            self._lease, _ttl = await self.store.grant_lease(self.retention)
            self._lease_at = now
        return self._lease

    async def put_op(self, event: Event) -> Put:
        """The txn operation that records ``event`` (to commit it with a decision)."""
        return Put(self.keys.new_event(event.ts), codec.encode(event.to_dict()),
                   lease=await self.lease())

    async def append(self, event: Event) -> None:
        """Record one event on its own."""
        try:
            op = await self.put_op(event)
            await self.store.put(op.key, op.value, lease=op.lease)
        except TRANSIENT as exc:
            log.warning("event not recorded", kind=event.kind, error=type(exc).__name__)
