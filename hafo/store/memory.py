"""An in-memory store with etcd's semantics, on the event loop's clock (``hafo.store.
protocol.Store``): for tests of the daemons' loops that run in virtual time, without etcd,
without sleeps.

What is kept of etcd: one revision per write (a txn is one write), ``create_revision`` /
``mod_revision`` / version, compares on them and on values, leases that expire TTL after
their last keepalive (their keys deleted, with delete events), revoke, ordered watches from
any revision not compacted (``compact``), ``Resync`` below it. Faults a test can inject:
``outage()`` (etcd down: no lease expires, each gets its TTL again on ``restore()``) and
``cut_off()`` (etcd unreachable but running: leases keep expiring); meanwhile every call
raises ``StoreUnavailable`` (a ``TRANSIENT`` error) and watches wait, then resume without
losing events, as a reconnecting etcd watch does;
``leaderless`` (what ``leaderless_majority`` answers), ``latency`` (seconds per call) and
``slow`` (seconds more for calls by name, e.g. ``{"keepalive": 0.7}``).

Time is ``asyncio.get_running_loop().time()``: on a virtual-time loop leases expire in
virtual time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from hafo.store.client import (
    KV,
    Compare,
    Delete,
    Get,
    LeaseNotFound,
    Put,
    Resync,
    TxnResult,
    WatchEvent,
)
from hafo.store.protocol import Observer
from hafo.store.records import key_events
from hafo.store.retry import StoreUnavailable


@dataclass
class _Lease:
    ttl: int
    expires: float
    timer: asyncio.TimerHandle | None = None


class MemoryStore:
    """One process's etcd (see the module)."""

    def __init__(self, latency: float = 0.0) -> None:
        self.observer: Observer | None = None
        self.latency = latency
        self.slow: dict[str, float] = {}
        self.leaderless = False
        self.available = True
        self._frozen = False
        self.calls = 0  # every call made, for tests that count round trips
        self._kvs: dict[str, KV] = {}
        self._versions: dict[str, int] = {}
        self._revision = 1
        self._history: list[WatchEvent] = []  # every change, in revision order
        self._compacted = 0  # history below this revision is gone
        self._leases: dict[int, _Lease] = {}
        self._lease_ids = itertools.count(0x1000)
        self._changed = asyncio.Event()
        self._back = asyncio.Event()
        self._back.set()

    # -- faults ---------------------------------------------------------------------------

    def lose_data(self) -> None:
        """etcd started again on an empty data directory: every key and lease is gone and
        the revision starts again at 1 (watches see no event for what was lost)."""
        self._kvs.clear()
        self._versions.clear()
        self._leases.clear()
        self._history.clear()
        self._revision = 1
        self._compacted = 0

    def outage(self) -> None:
        """etcd is down: every call fails with ``StoreUnavailable`` until ``restore``, and no
        lease expires meanwhile (nothing runs to expire it); on ``restore`` every lease gets
        its full TTL again, as a restarted etcd (or a new raft leader) gives it."""
        self._unavailable(frozen=True)

    def cut_off(self) -> None:
        """etcd runs but cannot be reached: calls fail as in ``outage``, and leases keep
        expiring on etcd's side."""
        self._unavailable(frozen=False)

    def _unavailable(self, frozen: bool) -> None:
        self.available = False
        self._frozen = frozen
        self._back.clear()
        if frozen:
            for lease in self._leases.values():
                if lease.timer is not None:
                    lease.timer.cancel()
                    lease.timer = None

    def restore(self) -> None:
        """Serve again (see ``outage`` and ``cut_off``)."""
        if self._frozen:
            now = self._now()
            for lease_id, lease in self._leases.items():
                self._schedule(lease_id, lease, now + lease.ttl)
        self.available, self._frozen = True, False
        self._back.set()

    def compact(self, revision: int | None = None) -> None:
        """Forget history below ``revision`` (default: all of it)."""
        self._compacted = self._revision if revision is None else revision
        self._history = [e for e in self._history if e.kv.mod_revision >= self._compacted]

    # -- plumbing -------------------------------------------------------------------------

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    async def _enter(self, name: str) -> None:
        self.calls += 1
        delay = self.latency + self.slow.get(name, 0.0)
        if delay:
            await asyncio.sleep(delay)
        if not self.available:
            if self.observer is not None:
                self.observer(self.latency, StoreUnavailable("store outage"))
            raise StoreUnavailable("the in-memory store is in an outage")
        if self.observer is not None:
            self.observer(self.latency, None)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _write(self, key: str, value: bytes | None, lease: int, revision: int) -> None:
        """Apply one put (``value``) or delete (None) at ``revision``."""
        if value is None:
            del self._kvs[key]
            self._versions.pop(key, None)
            self._history.append(WatchEvent("delete", KV(key, b"", 0, revision, 0)))
            return
        old_kv = self._kvs.get(key)
        kv = KV(key, value, old_kv.create_revision if old_kv else revision, revision, lease)
        self._kvs[key] = kv
        self._versions[key] = self._versions.get(key, 0) + 1
        self._history.append(WatchEvent("put", kv))

    def _schedule(self, lease_id: int, lease: _Lease, expires: float) -> None:
        if lease.timer is not None:
            lease.timer.cancel()
        lease.expires = expires
        loop = asyncio.get_running_loop()
        lease.timer = loop.call_at(expires, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        lease = self._leases.get(lease_id)
        if lease is None:
            return
        if self._now() < lease.expires - 1e-6:  # a loop may run a timer a little early
            self._schedule(lease_id, lease, lease.expires)
            return
        self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        if lease.timer is not None:
            lease.timer.cancel()
        doomed = sorted(k for k, kv in self._kvs.items() if kv.lease == lease_id)
        if doomed:
            self._revision += 1
            for key in doomed:
                self._write(key, None, 0, self._revision)
            self._notify()

    # -- key-value ------------------------------------------------------------------------

    async def get(self, key: str) -> KV | None:
        await self._enter("get")
        return self._kvs.get(key)

    async def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        await self._enter("get_prefix")
        return self._revision, [self._kvs[k] for k in sorted(self._kvs) if k.startswith(prefix)]

    async def get_newest(self, prefix: str, limit: int) -> list[KV]:
        await self._enter("get_newest")
        keys = sorted(k for k in self._kvs if k.startswith(prefix))
        return [self._kvs[k] for k in keys[-limit:]] if limit > 0 else []

    async def revision(self) -> int:
        await self._enter("revision")
        return self._revision

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        result = await self.txn([], [Put(key, value, lease)])
        return result.revision

    async def delete(self, key: str) -> bool:
        await self._enter("delete")
        if key not in self._kvs:
            return False
        self._revision += 1
        self._write(key, None, 0, self._revision)
        self._notify()
        return True

    def _holds(self, compare: Compare) -> bool:
        kv = self._kvs.get(compare.key)
        if compare.target == "value":
            if kv is None:
                return False
            actual: int | bytes = kv.value
        else:
            actual = {"create": kv.create_revision if kv else 0,
                      "mod": kv.mod_revision if kv else 0,
                      "version": self._versions.get(compare.key, 0)}[compare.target]
        wanted = compare.value
        if compare.op == "==":
            return actual == wanted
        if compare.op == "!=":
            return actual != wanted
        if compare.op == "<":
            return actual < wanted  # type: ignore[operator]
        return actual > wanted  # type: ignore[operator]

    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete | Get],
                  failure: Sequence[Put | Delete | Get] = ()) -> TxnResult:
        await self._enter("txn")
        succeeded = all(self._holds(c) for c in compares)
        ops = success if succeeded else failure
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseNotFound(f"etcdserver: requested lease not found ({op.lease:x})")
        writes = any(isinstance(op, Put) or (isinstance(op, Delete) and self._matches(op))
                     for op in ops)
        revision = self._revision + 1 if writes else self._revision
        reads: list[KV | None] = []
        for op in ops:
            if isinstance(op, Get):
                reads.append(self._kvs.get(op.key))
            elif isinstance(op, Put):
                self._write(op.key, op.value, op.lease or 0, revision)
            else:
                for key in self._matches(op):
                    self._write(key, None, 0, revision)
        if writes:
            self._revision = revision
            self._notify()
        return TxnResult(succeeded, self._revision, tuple(reads))

    def _matches(self, op: Delete) -> list[str]:
        if op.prefix:
            return sorted(k for k in self._kvs if k.startswith(op.key))
        return [op.key] if op.key in self._kvs else []

    async def write_many(self, ops: Sequence[Put | Delete], per_txn: int = 100) -> int:
        revision = 0
        for start in range(0, len(ops), per_txn):
            revision = (await self.txn([], ops[start:start + per_txn])).revision
        return revision

    # -- leases ---------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> tuple[int, int]:
        await self._enter("grant_lease")
        lease_id = next(self._lease_ids)
        lease = _Lease(ttl, 0.0)
        self._leases[lease_id] = lease
        self._schedule(lease_id, lease, self._now() + ttl)
        return lease_id, ttl

    async def keepalive(self, lease_id: int, timeout: float) -> int:
        await asyncio.wait_for(self._enter("keepalive"), timeout)
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        self._schedule(lease_id, lease, self._now() + lease.ttl)
        return lease.ttl

    async def keepalive_any(self, lease_id: int, timeout: float) -> int:
        return await self.keepalive(lease_id, timeout)  # one "endpoint"

    async def warm_spares(self, lease_id: int, timeout: float) -> None:
        return None  # one "endpoint": no other connection to keep

    async def keepalive_many(self, lease_ids: Sequence[int], timeout: float) -> dict[int, int]:
        await asyncio.wait_for(self._enter("keepalive_many"), timeout + 0.5)
        out = {}
        for lease_id in lease_ids:
            lease = self._leases.get(lease_id)
            if lease is not None:
                self._schedule(lease_id, lease, self._now() + lease.ttl)
            out[lease_id] = lease.ttl if lease is not None else 0
        return out

    async def lease_ttl(self, lease_id: int) -> int:
        await self._enter("lease_ttl")
        lease = self._leases.get(lease_id)
        return -1 if lease is None else max(0, int(lease.expires - self._now()))

    async def lease_alive(self, lease_id: int) -> bool:
        return await self.lease_ttl(lease_id) >= 0

    async def live_leases(self) -> set[int]:
        await self._enter("live_leases")
        return set(self._leases)

    async def revoke_lease(self, lease_id: int) -> None:
        await self._enter("revoke_lease")
        if lease_id in self._leases:
            self._drop_lease(lease_id)

    async def leaderless_majority(self, timeout: float = 0.5) -> bool:
        try:  # as etcd's: members that do not answer in time say nothing
            await asyncio.wait_for(self._enter("leaderless_majority"), timeout)
        except (TimeoutError, StoreUnavailable):
            return False
        return self.leaderless

    # -- watches --------------------------------------------------------------------------

    async def watch_prefix(self, prefix: str,
                           start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        """Every change under ``prefix`` from ``start_revision`` on (see the module)."""
        position = start_revision
        while True:
            await self._back.wait()
            if position < self._compacted:
                revision = self._revision
                kvs = tuple(self._kvs[k] for k in sorted(self._kvs) if k.startswith(prefix))
                position = revision + 1
                yield Resync(revision, kvs)
                continue
            pending = [e for e in self._history
                       if e.kv.mod_revision >= position and e.kv.key.startswith(prefix)]
            if not pending:
                changed = self._changed
                await changed.wait()
                continue
            for event in pending:
                position = event.kv.mod_revision + 1
                yield replace(event)

    async def watch_key(self, key: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change of exactly ``key`` from ``start_revision`` on."""
        async for event in key_events(self.watch_prefix(key, start_revision), key):
            yield event

    async def close(self) -> None:
        """Nothing to release."""
