"""Watching the store's identity: the I/O of ``hafo.decisions.store_trust``.

Each daemon reads the identity record with the store's revision (one transaction, so both
come from the same moment), judges it against what it knew, and keeps the verdict:
``trusted`` and, when not, ``reason``. The first daemon to find no record, knowing none,
writes one (create-if-absent). ``accept`` is the operator's decision that the store, as it
is, is the cluster from now on (a new generation).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable

import structlog

from hafo.decisions.store_trust import (
    IdentityRecord,
    Known,
    Verdict,
    accepted_generation,
    judge,
    next_epoch_base,
)
from hafo.store import codec
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import KV, Compare, Get, Put

log = structlog.get_logger("hafo.store")


def _record_of(kv: KV | None) -> IdentityRecord | None:
    """The record a read found (None when missing or not of its shape)."""
    if kv is None:
        return None
    try:
        return IdentityRecord.from_dict(codec.decode(kv.value))
    except ValueError:
        return None


async def read_identity(store: Store, keys: Keys) -> tuple[IdentityRecord | None, int]:
    """The identity record (None when missing or not of its shape) and the store's revision
    at the same moment."""
    result = await store.txn([], [Get(keys.identity)])
    return _record_of(result.reads[0] if result.reads else None), result.revision


async def accept_store(store: Store, keys: Keys, known: Iterable[Known] = ()) -> IdentityRecord:
    """The operator's decision: this store, as it is now, is the cluster. Writes the next
    generation of the record (keeping the cluster's id, or a new one where none is left),
    naming the current revision as the new floor, newer than every generation ``known``
    (what the agents' reports say they knew) and with an ``epoch_base`` past every epoch
    known: the store's own and the agents'."""
    knew = list(known)
    while True:
        result = await store.txn([], [Get(keys.identity)])
        kv = result.reads[0] if result.reads else None
        old = _record_of(kv)
        new = IdentityRecord(old.id if old is not None else uuid.uuid4().hex,
                             accepted_generation(old.generation if old else 0,
                                                 *(k.generation for k in knew),
                                                 now=time.time()),
                             result.revision + 1, time.time(),
                             next_epoch_base(*(k.highest_epoch for k in knew), result.revision
                                             + (old.epoch_base if old else 0)))
        guard = (Compare(keys.identity, "create", "==", 0) if kv is None
                 else Compare(keys.identity, "mod", "==", kv.mod_revision))
        written = await store.txn([guard], [Put(keys.identity, codec.encode(new.to_dict()))])
        if written.succeeded:
            return new


class StoreTrust:
    """One daemon's view of whether its store is the cluster it knew."""

    def __init__(self, store: Store, keys: Keys, who: str, known: Known | None = None,
                 on_known: Callable[[Known], None] | None = None) -> None:
        """``who``: the daemon, for logs; ``known``: what an earlier run knew (the agent's
        state directory); ``on_known``: told each new identity or generation trusted, to
        keep it (not every revision: the agent writes it to disk)."""
        self.store = store
        self.keys = keys
        self.who = who
        self.known = known
        self.on_known = on_known
        self.trusted = True  # until a read says otherwise: a daemon starts on its store
        self.reason = ""
        self.accepted = False  # the last check found a generation newer than known

    async def check(self) -> bool:
        """Read and judge the record; True when the store is the cluster. Store errors
        propagate (an unreachable store is not an untrusted one)."""
        record, revision = await read_identity(self.store, self.keys)
        verdict = judge(self.known, record, revision)
        if verdict.create:
            first = IdentityRecord(uuid.uuid4().hex, 1, revision, time.time())
            await self.store.txn([Compare(self.keys.identity, "create", "==", 0)],
                                 [Put(self.keys.identity, codec.encode(first.to_dict()))])
            record, revision = await read_identity(self.store, self.keys)
            verdict = judge(self.known, record, revision)
        self._keep(verdict)
        return self.trusted

    def _keep(self, verdict: Verdict) -> None:
        before = self.known
        self.accepted = verdict.accepted
        if verdict.trusted and verdict.known is not None:
            self.known = verdict.known
            if before is None or (before.id, before.generation) != (
                    verdict.known.id, verdict.known.generation):
                if before is not None:
                    log.warning("store accepted as the cluster by an operator", who=self.who,
                                cluster=verdict.known.id, generation=verdict.known.generation)
                if self.on_known is not None:
                    self.on_known(verdict.known)
        if verdict.trusted != self.trusted or (not verdict.trusted
                                               and verdict.reason != self.reason):
            if verdict.trusted:
                log.warning("store trusted again", who=self.who)
            else:
                log.error("etcd is not the cluster we knew", who=self.who, reason=verdict.reason)
        self.trusted = verdict.trusted
        self.reason = verdict.reason
