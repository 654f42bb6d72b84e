"""What the agent, the controller, the API and the CLI need from a store: the boundary.

``hafo.store.client.EtcdStore`` is the implementation over etcd (tested against a real etcd:
``tests/integration/test_store.py``); ``hafo.store.memory.MemoryStore`` keeps everything in
one process, with leases that expire on an injected clock, for fast tests of the daemons'
loops (``tests/unit/test_agent_loop_virtual.py``, ``tests/unit/test_controller_loop_virtual.py``,
``tests/unit/test_lease_keeper_virtual.py``). Code above the store layer types its store as
``Store``; the records it exchanges (``KV``, ``WatchEvent``, ``Resync``, ``Compare``, ``Put``,
``Delete``, ``Get``, ``TxnResult``: ``hafo.store.records``) are plain data.

Semantics both implementations keep (etcd's): every write gets the next revision; a key's
``create_revision`` is 0 while it does not exist; a lease's keys are deleted when it expires
or is revoked; a watch from revision R yields every change at R or later, in order, and a
``Resync`` (the whole prefix) when R is no longer available; errors in ``TRANSIENT`` mean
"unavailable, try again", anything else is a ``StoreError``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from hafo.store.records import KV, Compare, Delete, Get, Put, Resync, TxnResult, WatchEvent

Observer = Callable[[float, BaseException | None], None]


class Store(Protocol):
    """The store operations hafo's daemons use (see the module)."""

    observer: Observer | None

    async def get(self, key: str) -> KV | None:
        """Read one key."""

    async def get_prefix(self, prefix: str) -> tuple[int, list[KV]]:
        """Every key under ``prefix`` and the revision read at."""

    async def get_newest(self, prefix: str, limit: int) -> list[KV]:
        """The ``limit`` keys under ``prefix`` that sort last, in ascending key order."""

    async def revision(self) -> int:
        """The current revision."""

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write one key (bound to ``lease``); the revision of the write."""

    async def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""

    async def txn(self, compares: Sequence[Compare], success: Sequence[Put | Delete | Get],
                  failure: Sequence[Put | Delete | Get] = ()) -> TxnResult:
        """Atomic compare-and-write."""

    async def write_many(self, ops: Sequence[Put | Delete], per_txn: int = 100) -> int:
        """Unconditional writes in batches; the last revision written."""

    async def grant_lease(self, ttl: int) -> tuple[int, int]:
        """A new lease: (id, granted TTL)."""

    async def keepalive(self, lease_id: int, timeout: float) -> int:
        """One keepalive: the granted TTL, 0 if the lease is gone."""

    async def keepalive_any(self, lease_id: int, timeout: float) -> int:
        """One keepalive through every endpoint at once (the retry after a failed one): the
        granted TTL from the first that answers, 0 if the lease is gone."""

    async def warm_spares(self, lease_id: int, timeout: float) -> None:
        """Keep the connections ``keepalive_any`` uses ready (a keepalive of ``lease_id``
        through each other endpoint); never raises."""

    async def keepalive_many(self, lease_ids: Sequence[int], timeout: float) -> dict[int, int]:
        """Keepalives for many leases at once: id -> granted TTL (0: gone)."""

    async def lease_ttl(self, lease_id: int) -> int:
        """Whole seconds left, rounded down (0 in the last second); -1: the lease is gone."""

    async def lease_alive(self, lease_id: int) -> bool:
        """True while the lease exists (never decide that from ``lease_ttl() > 0``)."""

    async def live_leases(self) -> set[int]:
        """Every lease the store has now."""

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease; its keys go at once."""

    async def leaderless_majority(self, timeout: float = 0.5) -> bool:
        """True if a majority of members say they have no raft leader now."""

    def watch_prefix(self, prefix: str,
                     start_revision: int) -> AsyncIterator[WatchEvent | Resync]:
        """Every change under ``prefix`` from ``start_revision`` on."""

    def watch_key(self, key: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change of exactly ``key`` from ``start_revision`` on."""

    async def close(self) -> None:
        """Release connections."""
