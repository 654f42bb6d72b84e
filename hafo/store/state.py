"""A watched, in-memory copy of the cluster state, and frozen snapshots of it.

``ClusterCache`` loads everything under the state prefix once, then applies watch events
(resuming across endpoint failures, re-reading in full after compaction: ``WatchedPrefix``).
Decoding errors are logged and the key skipped: one bad value never stops the controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from types import MappingProxyType
from typing import cast

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
    StandbyRecord,
    Submission,
    with_standby,
)
from hafo.model.queues import QueueSpec
from hafo.store import codec
from hafo.store.client import KV, TRANSIENT, Resync, StoreError, WatchEvent
from hafo.store.keys import UNKNOWN, KeyKind, Keys, ParsedKey
from hafo.store.protocol import Store
from hafo.store.watched import WatchedPrefix

log = structlog.get_logger("hafo.state")


class ClusterCache:
    """The state prefix of one cluster, kept current by a watch (``WatchedPrefix``)."""

    def __init__(self, store: Store, keys: Keys) -> None:
        self.store = store
        self.keys = keys
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
        self.queues: dict[str, QueueSpec] = {}
        self.standbys: dict[str, StandbyRecord] = {}
        # Liveness keys deleted while their lease may still live (deleted by hand): the node
        # stays alive until etcd confirms that the lease is gone (``confirm_expiries``).
        self.unconfirmed: dict[str, Liveness] = {}
        self._confirm = asyncio.Event()
        self._parsed: tuple[str, ParsedKey] = ("", UNKNOWN)
        self.watched: WatchedPrefix[object] = WatchedPrefix(store, keys.state, self._decode,
                                                            self._changed)
        self.changed = self.watched.changed

    @property
    def revision(self) -> int:
        """The store revision the cache reflects."""
        return self.watched.revision

    async def load(self) -> int:
        """Read the whole state prefix; returns its revision."""
        return await self.watched.load()

    def apply_event(self, event: WatchEvent | Resync) -> None:
        """Apply one watch event (or a full resync)."""
        self.watched.apply(event)

    async def follow(self, on_change: Callable[[], Awaitable[None] | None] | None = None) -> None:
        """Apply watch events forever (from the loaded revision + 1)."""
        await self.watched.follow(on_change)

    def _parse(self, key: str) -> ParsedKey:
        """``Keys.parse``, remembered for the key last parsed: a put is decoded (by its kind),
        then applied at once."""
        if key is not self._parsed[0]:
            self._parsed = (key, self.keys.parse(key))
        return self._parsed[1]

    def _decode(self, kv: KV) -> object:
        """The value of a state key, by its kind."""
        decode = _DECODERS.get(self._parse(kv.key).kind)
        if decode is not None:
            return decode(kv)
        return kv.value  # cordon (present or not), or a key of no known kind

    def _changed(self, key: str, _old: object, value: object) -> None:
        """One state key put (``value``) or deleted (None)."""
        parsed = self._parse(key)
        kind, name = parsed.kind, parsed.node or parsed.workload or parsed.name or ""
        deleted = value is None
        if kind == "leader":
            self.leader = None if deleted else cast(str, value)
        elif kind == "node":
            _set(self.nodes, name, value)
        elif kind == "alive":
            if deleted:
                if name in self.alive:
                    self._liveness_deleted(name, self.alive[name])
            else:
                self.alive[name] = cast(Liveness, value)
                self.unconfirmed.pop(name, None)
        elif kind == "cordon":
            if deleted:
                self.cordoned.discard(name)
            else:
                self.cordoned.add(name)
        elif kind == "workload":
            _set(self.workloads, name, value)
            if deleted:
                self.checkpoints.pop(name, None)
        elif kind == "assignment":
            _set(self.assignments, name, value)
        elif kind == "status":
            workload, node = cast(str, parsed.workload), cast(str, parsed.node)
            status = cast("InstanceStatus | None", value)
            _set(self.statuses, (workload, node), status)
            seen = self.checkpoints.get(workload)
            if status is not None and status.checkpoint is not None and (
                    seen is None or (status.checkpoint.epoch, status.checkpoint.step)
                    > (seen.epoch, seen.step)):
                self.checkpoints[workload] = status.checkpoint
        elif kind == "controller":
            _set(self.controllers, name, value)
        elif kind == "move":
            _set(self.moves, name, value)
        elif kind == "failsafe":
            self.failsafe = FailsafeSet() if deleted else cast(FailsafeSet, value)
        elif kind == "queue":
            _set(self.queues, name, value)
        elif kind == "standby":
            _set(self.standbys, name, value)

    def _liveness_deleted(self, name: str, liveness: Liveness) -> None:
        """A liveness key went: the node stays alive until its lease is confirmed gone."""
        self.alive[name] = liveness
        self.unconfirmed[name] = liveness
        self._confirm.set()

    def snapshot(self) -> ClusterSnapshot:
        """A frozen copy for decisions and views."""
        return ClusterSnapshot(
            revision=self.revision,
            nodes=MappingProxyType(dict(self.nodes)),
            alive=MappingProxyType(dict(self.alive)),
            cordoned=frozenset(self.cordoned),
            workloads=MappingProxyType(dict(self.workloads)),
            assignments=MappingProxyType({
                wid: with_standby(a, self.standbys.get(wid)) if wid in self.standbys else a
                for wid, a in self.assignments.items()}),
            statuses=MappingProxyType(dict(self.statuses)),
            leader=self.leader,
            controllers=tuple(sorted(self.controllers)),
            controller_apis=MappingProxyType(dict(self.controllers)),
            failsafe=self.failsafe,
            moves=MappingProxyType(dict(self.moves)),
            checkpoints=MappingProxyType(dict(self.checkpoints)),
            expiring=frozenset(self.unconfirmed),
            queues=MappingProxyType(dict(self.queues)),
            standbys=MappingProxyType(dict(self.standbys)),
        )

    async def confirm_expiries(self, interval: float = 0.25) -> None:
        """Forever: drop a node whose liveness key was deleted from ``alive`` once etcd no
        longer has its lease. A lease expires only after its holder's guards killed their
        workloads (docs/safety.md, rule 2); a key deleted by hand while the lease lives says
        nothing of the kind, and its agent puts it back within a heartbeat."""
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
            return {lease for lease in leases if await self.store.lease_alive(lease)}


def _set(target: dict, key: object, value: object) -> None:  # type: ignore[type-arg]
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value


def _decode_queue(kv: KV) -> QueueSpec:
    """A queue's value; one whose name is not its key's is not that queue (ValueError: the
    key is skipped, with a warning, as any value that does not decode)."""
    spec = codec.decode_queue(kv.value)
    key_name = kv.key.rsplit("/", 1)[-1]
    if spec.name != key_name:
        raise ValueError(f"queue.name: is {spec.name!r}, but the key names {key_name!r}")
    return spec


_DECODERS: dict[KeyKind, Callable[[KV], object]] = {
    "leader": lambda kv: kv.value.decode(),
    "node": lambda kv: codec.decode_node(kv.value),
    "alive": lambda kv: codec.decode_liveness(kv.value),
    "workload": lambda kv: codec.decode_submission(kv.value),
    "assignment": lambda kv: codec.decode_assignment(kv.value, kv.mod_revision),
    "status": lambda kv: codec.decode_status(kv.value),
    "controller": lambda kv: codec.decode_controller(kv.value),
    "move": lambda kv: codec.decode_move(kv.value),
    "failsafe": lambda kv: codec.decode_failsafe(kv.value),
    "queue": _decode_queue,
    "standby": lambda kv: codec.decode_standby(kv.value),
}


async def read_snapshot(store: Store, keys: Keys) -> ClusterSnapshot:
    """One consistent snapshot (for the CLI): a single range read."""
    cache = ClusterCache(store, keys)
    await cache.load()
    return cache.snapshot()


async def read_events(store: Store, keys: Keys, limit: int = 100) -> list[Event]:
    """The newest ``limit`` events (all when 0), oldest first."""
    if limit:
        kvs = await store.get_newest(keys.events, limit)
    else:
        _revision, kvs = await store.get_prefix(keys.events)
    events, skipped = decode_events(kvs)
    for key in skipped:
        log.warning("skipping undecodable event", key=key)
    return events


def decode_events(kvs: Iterable[KV]) -> tuple[list[Event], list[str]]:
    """The events of ``kvs`` in their order, and the keys of those hafo cannot read (a newer
    writer's), which are left out."""
    events: list[Event] = []
    skipped: list[str] = []
    for kv in kvs:
        try:
            events.append(codec.decode_event(kv.value))
        except (ValueError, KeyError, TypeError):
            skipped.append(kv.key)
    return events, skipped
