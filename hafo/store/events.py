"""The event log: time-ordered keys under the events prefix, kept about a day.

Events are bound to a lease of ``retention`` seconds that is replaced every
``retention / 24``, so every event disappears between 23/24 and 1 x ``retention`` after it was
written, with no pruning job. One such lease serves every event log on a store in a process
(granted when first needed, granted anew when it is gone), not one per writer.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence

import structlog

from hafo.model.cluster import Event
from hafo.store import codec
from hafo.store.client import TRANSIENT, Compare, Delete, Put, StoreError, TxnResult
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.tasks import loop_time

log = structlog.get_logger("hafo.events")

#: Every kind of event hafo writes (docs/contract.md, "Events"; a test keeps both equal).
EVENT_KINDS: tuple[str, ...] = (
    "submitted", "updated", "delete-requested", "cordoned", "uncordoned",
    "placed", "pending", "failover", "restarted", "moved", "checkpoint-requested",
    "move-refused", "node-unhealthy", "gpu-unhealthy", "gpu-degraded", "app-failed",
    "preempted", "completed", "failed", "member-lost", "member-exited", "gang-restart",
    "deleted", "replica-created", "replica-retiring", "replica-deleted", "leader-elected",
    "health", "stopped", "fenced", "node-reregistered", "node-resumed", "duplicate-node",
    "store-untrusted", "store-trusted", "cluster-condition", "api-auth-mismatch",
    "queue-set", "queue-deleted", "node-removed",
)


class _SharedLease:
    """The event lease of one store and retention, shared by every ``EventLog`` on that store
    in this process (the CLI's and the API's writes, a daemon's decisions): each write does not
    grant a lease of its own, which etcd would keep for a whole ``retention``."""

    def __init__(self) -> None:
        self.lease: int | None = None
        self.granted_at = 0.0
        self.lock = asyncio.Lock()


_SHARED: weakref.WeakKeyDictionary[Store, dict[int, _SharedLease]] = weakref.WeakKeyDictionary()


def _shared_lease(store: Store, retention: int) -> _SharedLease:
    try:
        by_retention = _SHARED.setdefault(store, {})
    except TypeError:  # a store that cannot be weakly referenced: a lease of its own
        return _SharedLease()
    return by_retention.setdefault(retention, _SharedLease())


class EventLog:
    """Appends events; failures to record an event are logged, never raised."""

    def __init__(self, store: Store, keys: Keys, retention: int = 86400) -> None:
        self.store = store
        self.keys = keys
        self.retention = retention
        self._shared = _shared_lease(store, retention)

    async def lease(self) -> int:
        """The current event lease (granted on first use), replaced once it is
        ``retention/24`` old or gone."""
        shared = self._shared
        async with shared.lock:
            now = loop_time()
            if shared.lease is None or now - shared.granted_at > self.retention / 24:
                shared.lease, _ttl = await self.store.grant_lease(self.retention)
                shared.granted_at = now
            return shared.lease

    def _forget(self, lease: int | None) -> None:
        """``lease`` is gone (revoked, or etcd restored from an older backup): the next
        event gets a new one."""
        if lease is not None and self._shared.lease == lease:
            self._shared.lease = None

    async def forget_if_gone(self) -> bool:
        """True (and the next event gets a new lease) if the shared event lease is gone:
        revoked by hand, or etcd restored from a backup older than the lease."""
        lease = self._shared.lease
        if lease is None or await self.store.lease_alive(lease):
            return False
        self._forget(lease)
        return True

    async def put_op(self, event: Event) -> Put:
        """The txn operation that records ``event`` (to commit it with a decision)."""
        return Put(self.keys.new_event(event.ts), codec.encode(event.to_dict()),
                   lease=await self.lease())

    async def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete],
                  event: Event) -> TxnResult:
        """Commit ``ops`` (if ``compares`` hold) and record ``event`` in the same
        transaction: anyone who sees the change also finds the event, and an event written
        in reaction to it (stamped later) sorts after it. Granted a new lease, once, if the
        shared one is gone."""
        op = await self.put_op(event)
        try:
            return await self.store.txn(compares, [*ops, op])
        except StoreError:
            if op.lease is None or await self.store.lease_alive(op.lease):
                raise
            self._forget(op.lease)
            return await self.store.txn(compares, [*ops, await self.put_op(event)])

    async def append(self, event: Event) -> None:
        """Record one event on its own (under a new lease if the shared one is gone)."""
        try:
            op = await self.put_op(event)
            try:
                await self.store.put(op.key, op.value, lease=op.lease)
            except StoreError:
                if op.lease is None or await self.store.lease_alive(op.lease):
                    raise
                self._forget(op.lease)
                op = await self.put_op(event)
                await self.store.put(op.key, op.value, lease=op.lease)
        except TRANSIENT as exc:
            log.warning("event not recorded", kind=event.kind, error=type(exc).__name__)
