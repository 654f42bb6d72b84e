"""Leader election on one etcd key bound to the candidate's lease.

aetcd has no election (and its Lock leaks leases), so: a create-if-absent txn on the leader
key; the winner's fencing token is the key's create_revision, compared by every write it makes
(``fenced``). Losers wait for the key's deletion (lease expiry or resignation) and try again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from hafo.store.client import Compare, Delete, Get, Put, TxnResult, WatchEvent
from hafo.store.protocol import Store

log = structlog.get_logger("hafo.election")


class NotLeader(Exception):
    """A fenced write was refused: this process is no longer the leader."""


class Election:
    """Campaign for, hold and resign one leader key."""

    def __init__(self, store: Store, key: str, name: str) -> None:
        self.store = store
        self.key = key
        self.name = name
        self.token: int | None = None
        self._forgotten = asyncio.Event()

    async def try_acquire(self, lease_id: int) -> tuple[bool, int, str | None]:
        """One attempt: (won, revision, current leader's name)."""
        result = await self.store.txn([Compare(self.key, "create", "==", 0)],
                                      [Put(self.key, self.name.encode(), lease=lease_id)],
                                      [Get(self.key)])
        if result.succeeded:
            self.token = result.revision
            return True, result.revision, self.name
        current = result.reads[0] if result.reads else None
        if current is not None and current.value.decode() == self.name and \
                current.lease == lease_id:
            self.token = current.create_revision  # we already hold it (e.g. a retried txn)
            return True, result.revision, self.name
        return False, result.revision, current.value.decode() if current else None

    async def campaign(self, lease: Callable[[], int | None]) -> int:
        """Block until this candidate is leader; returns the fencing token.

        ``lease`` gives the candidate's current lease id at each attempt (a lost lease is
        replaced by its keeper while we stand by).
        """
        while True:
            lease_id = lease()
            if lease_id is None:
                await asyncio.sleep(0.1)
                continue
            won, revision, leader = await self.try_acquire(lease_id)
            if won:
                assert self.token is not None
                log.info("became leader", controller=self.name, token=self.token)
                return self.token
            log.info("standing by", controller=self.name, leader=leader)
            await self._wait_for_vacancy(revision)

    def forget(self) -> None:
        """The store's history changed under us (an operator accepted another store as the
        cluster: ``hafo restore``): a standby's watch of the leader key waits from a revision
        of the earlier history, which the new one reaches late or never, so it would miss
        the new leader's end. It looks again at once, in the accepted store."""
        self._forgotten.set()

    async def _wait_for_vacancy(self, revision: int) -> None:
        self._forgotten.clear()
        watching = asyncio.ensure_future(self._watch_for_vacancy(revision))
        forgotten = asyncio.ensure_future(self._forgotten.wait())
        try:
            await asyncio.wait({watching, forgotten}, return_when=asyncio.FIRST_COMPLETED)
            if watching.done():
                watching.result()
        finally:
            for task in (watching, forgotten):
                task.cancel()
            await asyncio.gather(watching, forgotten, return_exceptions=True)

    async def _watch_for_vacancy(self, revision: int) -> None:
        async for event in self.store.watch_prefix(self.key, revision + 1):
            if isinstance(event, WatchEvent):
                if event.kind == "delete" and event.kv.key == self.key:
                    return
            else:  # a resync: check whether the key still exists
                if not any(kv.key == self.key for kv in event.kvs):
                    return

    async def fenced(self, compares: Sequence[Compare], success: Sequence[Put | Delete | Get],
                     failure: Sequence[Put | Delete | Get] = ()) -> TxnResult:
        """A txn that applies only while this candidate still holds leadership.

        Raises NotLeader if the leader key's create_revision is no longer our token; returns
        the result (succeeded False) if only the caller's own compares failed.
        """
        if self.token is None:
            raise NotLeader("not the leader")
        guard = Compare(self.key, "create", "==", self.token)
        result = await self.store.txn([guard, *compares], success,
                                      [Get(self.key), *failure])
        if not result.succeeded:
            holder = result.reads[0] if result.reads else None
            if holder is None or holder.create_revision != self.token:
                self.token = None
                raise NotLeader("leadership lost")
        return result

    async def resign(self) -> None:
        """Delete the leader key if we still hold it."""
        if self.token is not None:
            await self.store.txn([Compare(self.key, "create", "==", self.token)],
                                 [Delete(self.key)])
            self.token = None
