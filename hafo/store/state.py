"""A watched, in-memory copy of the cluster state, and frozen snapshots of it.

``ClusterCache`` loads everything under the state prefix once, then applies watch events
(resuming across endpoint failures, re-reading in full after compaction). Decoding errors are
logged and the key skipped: one bad value never stops the controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from types import MappingProxyType

import structlog

from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Event,
    FailsafeSet,
    InstanceStatus,
    Liveness,
    MoveRequest,
    NodeRecord,
    Submission,
)
from hafo.store import codec
from hafo.store.client import KV, TRANSIENT, EtcdStore, Resync, StoreError, WatchEvent
from hafo.store.keys import Keys

log = structlog.get_logger("hafo.state")


class ClusterCache:
    """The state prefix of one cluster, kept current by a watch."""

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        self.revision = 0
        self.nodes: dict[str, NodeRecord] = {}
        self.alive: dict[str, Liveness] = {}
        self.cordoned: set[str] = set()
        self.workloads: dict[str, Submission] = {}
        self.assignments: dict[str, Assignment] = {}
        self.statuses: dict[tuple[str, str], InstanceStatus] = {}
        self.leader: str | None = None
        self.controllers: dict[str, str] = {}
        self.failsafe = FailsafeSet()
        self.moves: dict[str, MoveRequest] = {}
        self.checkpoints: dict[str, CheckpointInfo] = {}  # newest seen, outlives the reports
        # Liveness keys deleted while their lease may still live (deleted by hand): the node
        # stays alive until etcd confirms that the lease is gone (``confirm_expiries``).
        self.unconfirmed: dict[str, Liveness] = {}
        self._confirm = asyncio.Event()
        self.changed = asyncio.Event()

    def _clear(self) -> None:
        self.nodes.clear()
        self.alive.clear()
        self.cordoned.clear()
        self.workloads.clear()
        self.assignments.clear()
        self.statuses.clear()
        self.leader = None
        self.controllers.clear()
        self.failsafe = FailsafeSet()
        self.moves.clear()

    async def load(self) -> int:
        """Read the whole state prefix; returns its revision."""
        revision, kvs = await self.store.get_prefix(self.keys.state)
        self._reset(revision, kvs)
        return revision

    def _reset(self, revision: int, kvs: Iterable[KV]) -> None:
        before = {**self.alive}
        self._clear()
        for kv in kvs:
            self._apply(kv.key, kv.value, kv.mod_revision, deleted=False)
        for name, liveness in before.items():  # gone during a resync: confirm like a delete
            if name not in self.alive:
                self._liveness_deleted(name, liveness)
        self.revision = revision
        self.changed.set()

    def _liveness_deleted(self, name: str, liveness: Liveness) -> None:
        self.alive[name] = liveness
        self.unconfirmed[name] = liveness
        self._confirm.set()

    def apply_event(self, event: WatchEvent | Resync) -> None:
        """Apply one watch event (or a full resync)."""
        if isinstance(event, Resync):
            self._reset(event.revision, event.kvs)
            return
        self._apply(event.kv.key, event.kv.value, event.kv.mod_revision,
                    deleted=event.kind == "delete")
        self.revision = max(self.revision, event.kv.mod_revision)
        self.changed.set()

    def _apply(self, key: str, value: bytes, mod_revision: int, deleted: bool) -> None:
        rest = key[len(self.keys.state):]
        kind, _, name = rest.partition("/")
        try:
            self._apply_kind(kind, name, value, mod_revision, deleted)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("skipping undecodable key", key=key, error=str(exc))

    def _apply_kind(self, kind: str, name: str, value: bytes, mod_revision: int,
                    deleted: bool) -> None:
        if kind == "leader":
            self.leader = None if deleted else value.decode()
        elif kind == "nodes":
            _set(self.nodes, name, None if deleted else codec.decode_node(value))
        elif kind == "alive":
            if deleted:
                if name in self.alive:
                    self._liveness_deleted(name, self.alive[name])
            else:
                self.alive[name] = codec.decode_liveness(value)
                self.unconfirmed.pop(name, None)
        elif kind == "cordon":
            if deleted:
                self.cordoned.discard(name)
            else:
                self.cordoned.add(name)
        elif kind == "workloads":
            _set(self.workloads, name, None if deleted else codec.decode_submission(value))
            if deleted:
                self.checkpoints.pop(name, None)
        elif kind == "assign":
            _set(self.assignments, name,
                 None if deleted else codec.decode_assignment(value, mod_revision))
        elif kind == "status":
            workload, _, node = name.partition("/")
            status = None if deleted else codec.decode_status(value)
            _set(self.statuses, (workload, node), status)
            seen = self.checkpoints.get(workload)
            if status is not None and status.checkpoint is not None and (
                    seen is None or (status.checkpoint.epoch, status.checkpoint.step)
                    > (seen.epoch, seen.step)):
                self.checkpoints[workload] = status.checkpoint
        elif kind == "controllers":
            _set(self.controllers, name, None if deleted else codec.decode_controller(value))
        elif kind == "moves":
            _set(self.moves, name, None if deleted else codec.decode_move(value))
        elif kind == "failsafe":
            self.failsafe = FailsafeSet() if deleted else codec.decode_failsafe(value)

    def snapshot(self) -> ClusterSnapshot:
        """A frozen copy for decisions and views."""
        return ClusterSnapshot(
            revision=self.revision,
            nodes=MappingProxyType(dict(self.nodes)),
            alive=MappingProxyType(dict(self.alive)),
            cordoned=frozenset(self.cordoned),
            workloads=MappingProxyType(dict(self.workloads)),
            assignments=MappingProxyType(dict(self.assignments)),
            statuses=MappingProxyType(dict(self.statuses)),
            leader=self.leader,
            controllers=tuple(sorted(self.controllers)),
            controller_apis=MappingProxyType(dict(self.controllers)),
            failsafe=self.failsafe,
            moves=MappingProxyType(dict(self.moves)),
            checkpoints=MappingProxyType(dict(self.checkpoints)),
        )

    async def confirm_expiries(self, interval: float = 0.25) -> None:
        """Forever: drop a node whose liveness key was deleted from ``alive`` once etcd no
        longer has its lease. A lease expires only after its holder's guards killed their
        workloads (README "Safety"); a key deleted by hand while the lease lives says nothing
        of the kind, and its agent puts it back within a heartbeat."""
        while True:
            await self._confirm.wait()
            self._confirm.clear()
            while self.unconfirmed:
                try:
                    live = await self._live({lv.lease for lv in self.unconfirmed.values()})
                except TRANSIENT:
                    live = None  # etcd unreachable: nothing is confirmed, nothing moves
                if live is not None:
                    for name, liveness in list(self.unconfirmed.items()):
                        if liveness.lease not in live:
                            del self.unconfirmed[name]
                            self.alive.pop(name, None)
                            self.changed.set()
                            log.info("liveness lease gone: node down", node=name,
                                     lease=f"{liveness.lease:x}")
                if self.unconfirmed:
                    await asyncio.sleep(interval)

    async def _live(self, leases: set[int]) -> set[int]:
        """Which of ``leases`` etcd still has: one LeaseLeases call, or one LeaseTimeToLive
        per lease where listing leases is not permitted."""
        try:
            return await self.store.live_leases() & leases
        except StoreError:
            return {lease for lease in leases if await self.store.lease_ttl(lease) > 0}

    async def follow(self, on_change: Callable[[], Awaitable[None] | None] | None = None) -> None:
        """Apply watch events forever (from the loaded revision + 1)."""
        async for event in self.store.watch_prefix(self.keys.state, self.revision + 1):
            self.apply_event(event)
            if on_change is not None:
                result = on_change()
                if result is not None:
                    await result


def _set(target: dict, key: object, value: object) -> None:  # type: ignore[type-arg]
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value


async def read_snapshot(store: EtcdStore, keys: Keys) -> ClusterSnapshot:
    """One consistent snapshot (for the CLI): a single range read."""
    cache = ClusterCache(store, keys)
    await cache.load()
    return cache.snapshot()


async def read_events(store: EtcdStore, keys: Keys, limit: int = 100) -> list[Event]:
    """The newest ``limit`` events (all when 0), oldest first."""
    if limit:
        kvs = await store.get_newest(keys.events, limit)
    else:
        _revision, kvs = await store.get_prefix(keys.events)
    events = []
    for kv in kvs:
        try:
            events.append(codec.decode_event(kv.value))
        except (ValueError, KeyError, TypeError):
            log.warning("skipping undecodable event", key=kv.key)
    return events
