"""The name index: every workload (not a replica) is the one its name key names.

A submit of a new name must know that no workload holds the name. A workload written with
its name key (every submit does) is found by that key alone; one without (written before
names were unique, restored from a backup, which keeps no name keys, or rebuilt by ``hafo
recover --from-agents``) only by reading every workload, O(N) per submit. The leader, once
elected, gives each such workload its name key and then writes ``Keys.names_indexed``; while
that key is present a submit trusts the name keys and reads nothing else
(``hafo.store.intents``). A restore and a recovery delete it first, as they may write
workloads without their name keys; a name two workloads share (possible only among such
workloads) leaves it unwritten, so a submit keeps finding the oldest of them by reading all.
"""

from __future__ import annotations

from dataclasses import dataclass

from hafo.store import codec
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import Compare, Put

__all__ = ["IndexResult", "ensure_name_index", "is_indexed", "named_workloads", "workload_name"]


@dataclass(frozen=True)
class IndexResult:
    """What ``ensure_name_index`` did: name keys written, and whether the index is complete
    (``shared``: names two or more workloads hold, which keep it incomplete)."""

    written: int
    complete: bool
    shared: tuple[str, ...] = ()


def workload_name(record: object) -> str | None:
    """The spec's name of a workload record (decoded JSON) that is not a replica's; None
    for a replica's or anything else."""
    if not isinstance(record, dict) or record.get("service") is not None:
        return None
    spec = record.get("spec")
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else None


def named_workloads(values: list[tuple[str, bytes]]) -> dict[str, list[tuple[float, str]]]:
    """(submit time, id) of each workload (not a replica) by its spec's name, from
    (key, value) pairs of the workloads prefix; a value that is not a workload record is
    passed over (no submit can match it)."""
    by_name: dict[str, list[tuple[float, str]]] = {}
    for key, value in values:
        try:
            record = codec.decode(value)
        except ValueError:
            continue
        name = workload_name(record)
        wid = record.get("id", key.rsplit("/", 1)[-1]) if name is not None else None
        if name is None or not isinstance(wid, str):
            continue
        at = record.get("submitted_at", 0.0)
        when = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
        by_name.setdefault(name, []).append((when, wid))
    return by_name


async def is_indexed(store: Store, keys: Keys) -> bool:
    """Whether every workload is the one its name key names (``Keys.names_indexed``)."""
    return await store.get(keys.names_indexed) is not None


async def ensure_name_index(store: Store, keys: Keys) -> IndexResult:
    """Give each workload without its name key that key (created where no key holds the
    name, or moved from a key naming a workload that is gone), then, if every name is held
    by one workload, write ``Keys.names_indexed``. Each name key is written in a
    transaction that compares what was read, so a submit racing it wins and is left alone.
    Nothing is read or written when the index is already complete."""
    if await is_indexed(store, keys):
        return IndexResult(0, True)
    _, name_kvs = await store.get_prefix(keys.name(""))
    held = {kv.key: kv for kv in name_kvs}
    _, workload_kvs = await store.get_prefix(keys.workloads)
    existing = {kv.key for kv in workload_kvs}
    by_name = named_workloads([(kv.key, kv.value) for kv in workload_kvs])
    shared = tuple(sorted(name for name, ids in by_name.items() if len(ids) > 1))
    written, complete = 0, not shared
    for name, ids in sorted(by_name.items()):
        if len(ids) > 1:
            continue
        wid = ids[0][1]
        key = keys.name(name)
        kv = held.get(key)
        target = kv.value.decode(errors="replace") if kv is not None else None
        if target == wid:
            continue
        if target is not None and keys.workload(target) in existing:
            complete = False  # the key names another workload of that name: not ours to move
            continue
        guard = (Compare(key, "mod", "==", kv.mod_revision) if kv is not None
                 else Compare(key, "create", "==", 0))
        result = await store.txn([guard, Compare(keys.workload(wid), "create", ">", 0)],
                                 [Put(key, wid.encode())])
        if result.succeeded:
            written += 1
        else:
            complete = False  # raced by a submit or a delete: the next election looks again
    if complete:
        await store.put(keys.names_indexed, b"1")
    return IndexResult(written, complete, shared)
