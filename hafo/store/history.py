"""Workload histories in etcd (``Keys.history``): reading them, and the writes that store
or remove them. Decoding errors are logged and the key skipped (a bad value never stops the
leader or ``hafo show``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import structlog

from hafo.model.cluster import Event
from hafo.model.errors import ValidationError
from hafo.model.history import WorkloadHistory
from hafo.model.schema import schema_of
from hafo.store import codec
from hafo.store.client import Delete, Put
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.state import read_events

log = structlog.get_logger("hafo.history")

_HISTORY = schema_of(WorkloadHistory)

#: At most this many bytes of values per transaction (etcd refuses requests over 1.5 MiB).
TXN_BYTES = 512 * 1024
#: ... and this many writes (etcd's default limit is 128 operations per transaction).
TXN_OPS = 100


def decode_history(value: bytes) -> WorkloadHistory:
    """A stored history; ValidationError names the bad field."""
    return _HISTORY.validate_json(value)


def _decoded(key: str, value: bytes) -> WorkloadHistory | None:
    try:
        return decode_history(value)
    except (ValidationError, ValueError):
        log.warning("skipping undecodable history", key=key)
        return None


async def read_history(store: Store, keys: Keys, workload_id: str) -> WorkloadHistory | None:
    """One workload's history (None: none recorded yet)."""
    kv = await store.get(keys.history(workload_id))
    return _decoded(kv.key, kv.value) if kv is not None else None


async def read_histories(store: Store, keys: Keys) -> dict[str, WorkloadHistory]:
    """Every stored history, by workload id (one range read)."""
    _revision, kvs = await store.get_prefix(keys.histories)
    out: dict[str, WorkloadHistory] = {}
    for kv in kvs:
        parsed = keys.parse(kv.key)
        history = _decoded(kv.key, kv.value) if parsed.kind == "history" else None
        if history is not None and parsed.workload == history.workload:
            out[history.workload] = history
    return out


def history_writes(keys: Keys, changed: Mapping[str, WorkloadHistory],
                   gone: Iterable[str]) -> Iterator[list[Put | Delete]]:
    """The writes that store ``changed`` and remove the histories of ``gone``, in
    transactions of at most ``TXN_OPS`` writes and about ``TXN_BYTES`` of values."""
    batch: list[Put | Delete] = []
    size = 0
    ops: list[Put | Delete] = [Put(keys.history(wid), codec.encode(history.to_dict()))
                               for wid, history in sorted(changed.items())]
    ops += [Delete(keys.history(wid)) for wid in gone]
    for op in ops:
        cost = len(op.value) if isinstance(op, Put) else 0
        if batch and (len(batch) >= TXN_OPS or size + cost > TXN_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(op)
        size += cost
    if batch:
        yield batch


async def read_workload_events(store: Store, keys: Keys, workload_id: str, limit: int = 20,
                               scan: int = 2000) -> list[Event]:
    """The newest ``limit`` events of one workload (oldest first), among the newest ``scan``
    events of the cluster (events are kept about a day, in one time-ordered prefix)."""
    events = [e for e in await read_events(store, keys, scan) if e.workload == workload_id]
    return events[-limit:]
