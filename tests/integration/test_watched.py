"""The watched-prefix loop against a real etcd: follow, and a full re-read after compaction
that reports the keys that went as deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hafo.store import ClusterCache, EtcdStore, Keys
from hafo.store.watched import WatchedPrefix

pytestmark = pytest.mark.timeout(60)


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def test_follow_and_resync_after_compaction(store: EtcdStore, keys: Keys) -> None:
    changes: list[tuple[str, str | None, str | None]] = []
    prefix = WatchedPrefix(store, keys.state, lambda kv: kv.value.decode(),
                           lambda key, old, new: changes.append((key, old, new)))
    await store.put(keys.workload("a"), b"1")
    await prefix.load()
    follow = asyncio.create_task(prefix.follow())
    try:
        await store.put(keys.workload("b"), b"2")
        await wait_for(lambda: keys.workload("b") in prefix.values)
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        # While nobody watches: a change, a delete, then the history is compacted away.
        await store.put(keys.workload("a"), b"3")
        await store.delete(keys.workload("b"))
        latest = await store.put(keys.workload("c"), b"4")
        await store.call(lambda c: c.compact(latest))
        changes.clear()
        follow = asyncio.create_task(prefix.follow())
        await wait_for(lambda: prefix.revision >= latest)
        assert prefix.values == {keys.workload("a"): "3", keys.workload("c"): "4"}
        assert sorted(changes) == [(keys.workload("a"), "1", "3"),
                                   (keys.workload("b"), "2", None),
                                   (keys.workload("c"), None, "4")]
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)


async def test_cache_follows_the_state_prefix(store: EtcdStore, keys: Keys) -> None:
    cache = ClusterCache(store, keys)
    await cache.load()
    follow = asyncio.create_task(cache.follow())
    try:
        await store.put(keys.cordon("n1"), b"{}")
        written = await store.put(keys.leader, b"ctl-1")
        await wait_for(lambda: cache.revision >= written)
        snapshot = cache.snapshot()
        assert snapshot.cordoned == {"n1"} and snapshot.leader == "ctl-1"
        assert snapshot.revision == written and cache.changed.is_set()
        await store.delete(keys.cordon("n1"))
        await wait_for(lambda: not cache.cordoned)
    finally:
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
