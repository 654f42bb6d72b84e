"""A backup of one cluster's keys, and putting it back (``hafo backup``, ``hafo restore``).

The backup is every key of the cluster that outlives a lease (specs, assignments, cordons,
moves, node records, histories, the failsafe set, the identity record), read at one
revision, as JSON (``FORMAT``). What is bound to a lease (liveness, leaders, controllers,
events) dies with the store's leases and is left out, and so are the instance reports: they
describe processes of the store that was lost.

Restoring writes the keys into a store that holds nothing of the cluster (or, with
``replace``, over whatever it holds), then the identity record's next generation: every
daemon that knew the cluster takes that as an operator's decision, agents fence what they
ran and claim their nodes afresh, and the controllers place the restored workloads again
(docs/safety.md, "etcd losing its data").
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hafo.decisions.store_trust import (
    IdentityRecord,
    Known,
    accepted_generation,
    next_epoch_base,
)
from hafo.store import codec
from hafo.store.identity import read_identity
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import Delete, Put

FORMAT = "hafo-backup/1"
#: not kept, and not counted as the cluster's state by ``holds_cluster``: bound to a lease,
#: the identity (written anew), the agents' recovery reports (written into a store that is
#: not the cluster: ``hafo recover --from-agents`` reads them), or the name index (a backup
#: keeps no name keys)
_SKIPPED = {"alive", "leader", "controller", "event", "status", "identity", "report",
            "names-indexed", "unknown"}
#: kept in a backup, but written again by the daemons on any store: no sign of a state
#: (the fair-share history: the leader's, rewritten every few seconds while it leads)
_REWRITTEN = {"api-auth", "fair-share"}


class BackupError(ValueError):
    """A backup that cannot be read or restored; the message names what is wrong."""


@dataclass(frozen=True)
class Backup:
    """What a backup holds."""

    cluster: str
    revision: int
    taken_at: float
    identity: IdentityRecord | None
    keys: dict[str, bytes]

    def to_dict(self) -> dict[str, Any]:
        """The backup's JSON form."""
        return {"format": FORMAT, "cluster": self.cluster, "revision": self.revision,
                "taken_at": self.taken_at,
                "identity": None if self.identity is None else self.identity.to_dict(),
                "keys": {k: base64.b64encode(v).decode() for k, v in sorted(self.keys.items())}}

    @classmethod
    def from_dict(cls, data: Any) -> Backup:
        """Parse a backup; BackupError names the first field that is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BackupError(f"format: not a hafo backup (expected {FORMAT!r})")
        cluster, revision, taken = data.get("cluster"), data.get("revision"), data.get(
            "taken_at", 0.0)
        if not isinstance(cluster, str) or not cluster:
            raise BackupError("cluster: must be the cluster's name")
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise BackupError("revision: must be a whole number")
        if not isinstance(taken, int | float):
            raise BackupError("taken_at: must be a time in seconds")
        identity = None
        if data.get("identity") is not None:
            identity = IdentityRecord.from_dict(data["identity"])
            if identity is None:
                raise BackupError("identity: not an identity record")
        raw = data.get("keys")
        if not isinstance(raw, dict):
            raise BackupError("keys: must be an object of key -> base64 value")
        root = Keys(cluster).root
        keys: dict[str, bytes] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not key.startswith(root):
                raise BackupError(f"keys: {str(key)[:80]!r} is not a key of cluster "
                                  f"{cluster!r}")
            if not isinstance(value, str):
                raise BackupError(f"keys.{key}: must be base64 text")
            try:
                keys[key] = base64.b64decode(value, validate=True)
            except ValueError:
                raise BackupError(f"keys.{key}: not base64") from None
        return cls(cluster, revision, float(taken), identity, keys)


async def take_backup(store: Store, keys: Keys) -> Backup:
    """Read every key of the cluster worth keeping, at one revision."""
    record, _ = await read_identity(store, keys)
    revision, kvs = await store.get_prefix(keys.root)
    kept = {kv.key: kv.value for kv in kvs
            if kv.lease == 0 and keys.parse(kv.key).kind not in _SKIPPED}
    return Backup(keys.cluster, revision, time.time(), record, kept)


async def holds_cluster(store: Store, keys: Keys) -> list[str]:
    """The keys of the kinds a backup holds (the cluster's state, not bound to a lease)
    that the store holds: a restore over them would mix two states."""
    _, kvs = await store.get_prefix(keys.root)
    return [kv.key for kv in kvs
            if kv.lease == 0 and keys.parse(kv.key).kind not in _SKIPPED | _REWRITTEN]


def _with_epoch_base(keys: Keys, key: str, value: bytes, epoch_base: int) -> bytes:
    """An assignment (or its per-node copy) as restored: of the new generation's
    ``epoch_base``, so that its epoch is past every epoch of the history it was taken from.
    Any other key, and a value that is not an assignment's JSON, as it is."""
    if keys.parse(key).kind not in ("assignment", "node-assignment"):
        return value
    try:
        data = codec.decode(value)
    except ValueError:
        return value
    return codec.encode({**data, "epoch_base": epoch_base}) if isinstance(data, dict) \
        else value


async def restore_backup(store: Store, keys: Keys, backup: Backup, replace: bool = False,
                         known: Iterable[Known] = ()) -> IdentityRecord:
    """Write ``backup`` into the store (refused by the caller unless it is empty of the
    cluster or ``replace``), then the next generation of the identity record: the backup's
    cluster id, one generation past the backup's and the store's, with an ``epoch_base``
    past every epoch known (the backup's, the store's, and those of ``known``: what the
    agents' reports say they knew; ``hafo.decisions.store_trust``)."""
    knew = list(known)
    if backup.cluster != keys.cluster:
        raise BackupError(f"cluster: the backup is of cluster {backup.cluster!r}, not "
                          f"{keys.cluster!r}")
    # A backup keeps no name keys: no name index until the leader's next look
    # (hafo.store.name_index).
    await store.txn([], [Delete(keys.names_indexed)])
    if replace:
        await store.txn([], [Delete(prefix_, prefix=True) for prefix_ in (
            keys.state, keys.by_node, f"{keys.root}history/")])
    current, revision = await read_identity(store, keys)
    backed_up = backup.revision + (backup.identity.epoch_base if backup.identity else 0)
    epoch_base = next_epoch_base(*(k.highest_epoch for k in knew), backed_up,
                                 revision + (current.epoch_base if current else 0))
    ops: list[Put | Delete] = [Put(k, _with_epoch_base(keys, k, v, epoch_base))
                               for k, v in sorted(backup.keys.items())]
    if ops:
        await store.write_many(ops)
    current, revision = await read_identity(store, keys)
    generation = accepted_generation(backup.identity.generation if backup.identity else 0,
                                     current.generation if current else 0,
                                     *(k.generation for k in knew), now=time.time())
    ident = (backup.identity.id if backup.identity is not None
             else current.id if current is not None else f"restored-{int(time.time())}")
    new = IdentityRecord(ident, generation, revision + 1, time.time(), epoch_base)
    # One write, whatever raced it: the record is the operator's decision.
    await store.txn([], [Put(keys.identity, codec.encode(new.to_dict()))])
    return new
