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
from hafo.store.client import KV, EtcdStore, Resync, WatchEvent
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
        self._clear()
        for kv in kvs:
            self._apply(kv.key, kv.value, kv.mod_revision, deleted=False)
        self.revision = revision
        self.changed.set()

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
            _set(self.alive, name, None if deleted else codec.decode_liveness(value))
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
