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
from enum import StrEnum

import structlog

from hafo.model.cluster import Event
from hafo.store import codec
from hafo.store.client import TRANSIENT, Compare, Delete, Put, StoreError, TxnResult
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.tasks import loop_time

log = structlog.get_logger("hafo.events")


class EventKind(StrEnum):
    """The kinds of event hafo writes. Each member's description starts with who writes it: the
    CLI / API, the leader, a controller or an agent. Events are for people: nothing decides on
    them."""

    SUBMITTED = "submitted"
    """CLI / API: a workload was submitted (written in the submit's own transaction and stamped
    before it: it sorts before whatever the controller then does with it)."""
    UPDATED = "updated"
    """CLI / API: a submit changed the spec of the workload of that name (the message says how it
    rolls out)."""
    DELETE_REQUESTED = "delete-requested"
    """CLI / API: a workload was deleted."""
    CORDONED = "cordoned"
    """CLI / API: a node was cordoned (also by drain)."""
    UNCORDONED = "uncordoned"
    """CLI / API: a node was uncordoned."""
    PLACED = "placed"
    """Leader: a new workload was placed."""
    PENDING = "pending"
    """Leader: a workload cannot be placed (the reason in the message)."""
    FAILOVER = "failover"
    """Leader: its node is down: placed elsewhere."""
    RESTARTED = "restarted"
    """Leader: run again (in place, or wherever it fits) after a failure or an infrastructure
    end."""
    MOVED = "moved"
    """Leader: placed again after a move's instance stopped (with the resume step)."""
    CHECKPOINT_REQUESTED = "checkpoint-requested"
    """Leader: a planned move started: checkpoint and stop."""
    MOVE_REFUSED = "move-refused"
    """Leader: a move request cannot be honoured (the reason in the message)."""
    NODE_UNHEALTHY = "node-unhealthy"
    """Leader: work moves off an unhealthy node."""
    GPU_UNHEALTHY = "gpu-unhealthy"
    """Leader: work moves off an unhealthy GPU."""
    GPU_DEGRADED = "gpu-degraded"
    """Leader: work moves off a degrading GPU."""
    APP_FAILED = "app-failed"
    """Leader: the application failed (check, exit or application XID): stopped to restart or
    move."""
    PREEMPTED = "preempted"
    """Leader: stopped to make room for a higher-priority workload (or reclaimed by the queue
    that lent the quota)."""
    COMPLETED = "completed"
    """Leader: exited 0 (a gang: every member)."""
    FAILED = "failed"
    """Leader: failed on every node that could run it, said in one sentence."""
    MEMBER_LOST = "member-lost"
    """Leader: a gang member's node is down: every other member is stopped (checkpoint first)
    before the gang starts again."""
    MEMBER_EXITED = "member-exited"
    """Leader: a gang member exited non-zero: every member is stopped, then the gang restarts
    (counted)."""
    HUNG = "hung"
    """Leader: no rank made progress for `hang_timeout`: the rank that stalled first is named,
    every member is stopped at once and the workload restarts (counted); a second hang on the
    same node moves that member (`app-failed`)."""
    STANDBY = "standby"
    """Leader: a warm gang got a standby on a spare node, its epoch unchanged (its spare was
    used up, or a node came back)."""
    STRAGGLER = "straggler"
    """Leader: a gang member's own work per step exceeded the others' by more than
    `straggler_lag`: its rank is named, every member is stopped at once and the gang restarts
    (counted); a second time on the same node moves that member (`app-failed`)."""
    PREFLIGHT_FAILED = "preflight-failed"
    """Leader: a gang's pre-flight blamed members (did not join, failed, or much slower than
    the others): every member is stopped, those members are replaced before the job starts,
    their nodes excluded for `restart.window` (not counted)."""
    GANG_RESTART = "gang-restart"
    """Leader: a gang member was ended by the infrastructure (fenced, node claimed anew): the
    gang restarts, not counted."""
    DELETED = "deleted"
    """Leader: a deleted workload's assignment was withdrawn."""
    REPLICA_CREATED = "replica-created"
    """Leader: a service got a new replica (more needed, a rolling update, a drain)."""
    REPLICA_RETIRING = "replica-retiring"
    """Leader: a replica left rotation (its replacement is ready, scaled down, ended)."""
    REPLICA_DELETED = "replica-deleted"
    """Leader: a retired replica is stopped (after `update.drain_delay`), or its service is gone."""
    LEADER_ELECTED = "leader-elected"
    """Controller: it became leader."""
    HEALTH = "health"
    """Agent: a GPU or node health change."""
    STOPPED = "stopped"
    """Agent: an instance was stopped (with or without a checkpoint)."""
    FENCED = "fenced"
    """Agent: an instance was killed by fencing."""
    HANDED_OVER = "handed-over"
    """Agent: a warm gang member's parked process became the member of the gang's next
    epoch (one instance ended, the next began, in the same process)."""
    NODE_REREGISTERED = "node-reregistered"
    """Agent: it lost its hold on the node, fenced its work and registered again."""
    NODE_RESUMED = "node-resumed"
    """Agent: its lease expired in an etcd stall or outage; it holds the node again with a new
    lease and kept its work."""
    DUPLICATE_NODE = "duplicate-node"
    """Agent: it asks for a node name another live lease holds; it waits."""
    STORE_UNTRUSTED = "store-untrusted"
    """Controller, agent: etcd is not the cluster the daemon knew (the reason in the message);
    written into that store, once."""
    STORE_TRUSTED = "store-trusted"
    """Controller: the store is the cluster again (restored, accepted, or its identity back)."""
    CLUSTER_CONDITION = "cluster-condition"
    """Leader: a fault of a resource most live nodes report at once was set, or cleared; once
    each."""
    API_AUTH_MISMATCH = "api-auth-mismatch"
    """Controller: its API auth differs from the cluster's record, so it refuses writes, or
    agrees again; once each."""
    QUEUE_SET = "queue-set"
    """CLI / API: a queue was declared or its declaration changed."""
    QUEUE_DELETED = "queue-deleted"
    """CLI / API: a queue was deleted."""
    NODE_REMOVED = "node-removed"
    """CLI / API: a node was retired (`hafo node remove`): its record, cordon and reports are
    gone."""


#: Every kind of event hafo writes (docs/reference/reasons.md, "Events"; a test keeps both equal).
EVENT_KINDS: tuple[str, ...] = tuple(kind.value for kind in EventKind)


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
