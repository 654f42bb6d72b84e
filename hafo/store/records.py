"""The plain data the store exchanges with its callers (``hafo.store.protocol.Store``): key-value
pairs, watch events, transaction conditions and operations. No I/O, no etcd client types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class KV:
    """One key-value pair as read from etcd."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix. For deletes ``value`` is empty."""

    kind: Literal["put", "delete"]
    kv: KV


@dataclass(frozen=True)
class Resync:
    """The watch could not resume (revision compacted): here is the full state instead."""

    revision: int
    kvs: tuple[KV, ...]


@dataclass(frozen=True)
class Compare:
    """A txn condition: ``target`` of ``key`` ``op`` ``value``."""

    key: str
    target: Literal["create", "mod", "version", "value"]
    op: Literal["==", "!=", "<", ">"]
    value: int | bytes


@dataclass(frozen=True)
class Put:
    """A txn write."""

    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True)
class Delete:
    """A txn delete (of one key, or of a prefix)."""

    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    """A txn read of one key."""

    key: str


@dataclass(frozen=True)
class TxnResult:
    """Outcome of a transaction: whether the compares held, the revision, values read."""

    succeeded: bool
    revision: int
    reads: tuple[KV | None, ...] = ()


async def key_events(stream: AsyncIterator[WatchEvent | Resync],
                     key: str) -> AsyncIterator[WatchEvent]:
    """A prefix watch narrowed to exactly ``key`` (not the keys it is a prefix of); a
    ``Resync`` becomes the key's current state, as a put or a delete."""
    async for event in stream:
        if isinstance(event, WatchEvent):
            if event.kv.key == key:
                yield event
            continue
        current = next((kv for kv in event.kvs if kv.key == key), None)
        yield (WatchEvent("put", current) if current is not None
               else WatchEvent("delete", KV(key, b"", 0, event.revision, 0)))
