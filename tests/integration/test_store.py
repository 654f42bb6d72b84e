"""The store against a real etcd: endpoints failover, resumable watches, leases, fenced txns."""

from __future__ import annotations

import asyncio
import time

import pytest

from hafo.local.etcd import EtcdCluster
from hafo.store import (
    Compare,
    Election,
    EtcdStore,
    Keys,
    LeaseKeeper,
    LeaseLost,
    NotLeader,
    Put,
    Resync,
    WatchEvent,
)

pytestmark = pytest.mark.timeout(60)


async def test_put_get_txn_roundtrip(store: EtcdStore, keys: Keys) -> None:
    key = keys.workload("w1")
    rev = await store.put(key, b"v1")
    kv = await store.get(key)
    assert kv is not None and kv.value == b"v1" and kv.mod_revision == rev
    result = await store.txn([Compare(key, "mod", "==", rev)], [Put(key, b"v2")])
    assert result.succeeded and result.revision > rev
    stale = await store.txn([Compare(key, "mod", "==", rev)], [Put(key, b"v3")])
    assert not stale.succeeded
    assert (await store.get(key)).value == b"v2"  # type: ignore[union-attr]
    revision, kvs = await store.get_prefix(keys.state)
    assert [k.key for k in kvs] == [key] and revision >= result.revision


@pytest.mark.timing  # its bounds are the fencing slack's (1 s): alone, in the timing lane
async def test_after_a_warm_up_a_frozen_member_costs_no_new_connection(
        etcd3: EtcdCluster) -> None:
    """The spare connections to the other members are made before they are needed
    (``warm_spares``, every half minute from a lease holder): when the member in use
    freezes, the keepalive through every endpoint is one RPC on a connection that already
    exists, and the spare that answered becomes the connection in use. No connect (a TLS
    handshake, an Authenticate) at the moment the fencing slack runs out. The member in use
    is a follower: a frozen raft leader would add an election to the wait, which is not
    what is measured here."""
    probe = EtcdStore(etcd3.endpoints)
    try:
        views = [await probe.member_view("127.0.0.1", m.client_port, 2.0)
                 for m in etcd3.members]
    finally:
        await probe.close()
    assert all(views), views
    leader = views[0][1]  # type: ignore[index]
    follower = next(i for i, view in enumerate(views) if view and view[0] != leader)
    endpoints = [etcd3.endpoints[follower],
                 *(e for i, e in enumerate(etcd3.endpoints) if i != follower)]
    client = EtcdStore(endpoints, timeout=1.0)
    made: list[str] = []
    new_client = client._new_client

    def counted(host: str, port: int, timeout: float) -> object:
        made.append(f"{host}:{port}")
        return new_client(host, port, timeout)

    client._new_client = counted  # type: ignore[method-assign,assignment]
    try:
        lease, _ttl = await client.grant_lease(5)
        await client.warm_spares(lease, timeout=1.0)
        assert len(made) == 3, made  # the one in use, and a spare to each other member
        current = client.endpoint
        index = [f"127.0.0.1:{m.client_port}" for m in etcd3.members].index(current)
        etcd3.freeze([index])
        try:
            started = time.monotonic()
            assert await client.keepalive_any(lease, timeout=1.0) == 5
            assert time.monotonic() - started < 1.0
            moved_by = time.monotonic() + 1.0
            while client.endpoint == current:
                assert time.monotonic() < moved_by
                await asyncio.sleep(0.01)
            assert await client.keepalive(lease, timeout=1.0) == 5
            assert len(made) == 3, made  # every call above ran on a connection made before
            # The leader check asks every member: a spare to the frozen one is tried anew.
            assert await client.leaderless_majority(timeout=0.5) is False
            assert set(made[3:]) <= {current}, made
        finally:
            etcd3.thaw([index])
    finally:
        await client.close()


async def test_first_endpoint_dead_uses_the_next(etcd_server: EtcdCluster, keys: Keys) -> None:
    from hafo.local.procs import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdStore([dead, *etcd_server.endpoints])
    try:
        await client.put(keys.node("n"), b"x")
        assert client.endpoint.endswith(str(etcd_server.members[0].client_port))
    finally:
        await client.close()


async def test_keepalive_any_answers_through_a_live_endpoint_when_the_current_hangs(
        etcd_server: EtcdCluster, store: EtcdStore) -> None:
    """The keeper's retry after a failed keepalive: the endpoint in use (a powered-off
    machine: TCP accepted by nobody, so calls only time out) does not answer; another does,
    within one timeout, and the store moves there."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts nothing: a connect "succeeds", then nothing ever answers
    try:
        lease, _ttl = await store.grant_lease(5)
        client = EtcdStore([f"http://127.0.0.1:{silent.getsockname()[1]}",
                            *etcd_server.endpoints], timeout=1.0)
        try:
            started = time.monotonic()
            assert await client.keepalive_any(lease, timeout=1.0) == 5
            assert time.monotonic() - started < 1.5
            moved_by = time.monotonic() + 1.0  # the move happens after the answer counted
            while not client.endpoint.endswith(str(etcd_server.members[0].client_port)):
                assert time.monotonic() < moved_by, client.endpoint
                await asyncio.sleep(0.01)
            assert await client.keepalive(lease, timeout=1.0) == 5  # the moved connection
            assert await client.keepalive_any(123456789, timeout=1.0) == 0  # a gone lease
        finally:
            await client.close()
    finally:
        silent.close()


async def test_lease_expiry_deletes_bound_keys(store: EtcdStore, keys: Keys) -> None:
    keeper = LeaseKeeper(store, ttl=2, heartbeat=0.5, margin=0.3)
    lease = await keeper.grant()
    await store.put(keys.alive("n1"), b"{}", lease=lease)
    assert await keeper.keepalive_once()
    assert keeper.valid()
    started = time.monotonic()
    while await store.get(keys.alive("n1")) is not None:
        assert time.monotonic() - started < 6, "lease never expired"
        await asyncio.sleep(0.1)
    elapsed = time.monotonic() - started
    assert elapsed >= 1.0  # not before the TTL (2 s from the last keepalive)
    with pytest.raises(LeaseLost):
        await keeper.keepalive_once()


async def test_a_lease_in_its_last_second_is_alive_though_its_ttl_reads_zero(
        store: EtcdStore, keys: Keys) -> None:
    """etcd rounds the remaining TTL down: 0 during the last second, -1 once it is gone. A
    claimant that took 0 for "gone" claimed a node name while the old lease (and its guards)
    still lived."""
    lease, _ = await store.grant_lease(2)
    key = keys.alive("last-second")
    await store.put(key, b"x", lease=lease)
    started = time.monotonic()
    while await store.lease_ttl(lease) != 0:
        assert time.monotonic() - started < 2.5, "never read 0 before it expired"
        await asyncio.sleep(0.05)
    assert await store.lease_alive(lease)
    assert await store.get(key) is not None, "0 seconds left, and its keys still exist"
    while await store.lease_alive(lease):
        assert time.monotonic() - started < 6.0
        await asyncio.sleep(0.05)
    assert await store.lease_ttl(lease) == -1 and await store.get(key) is None


async def test_fencing_deadline_precedes_lease_expiry(store: EtcdStore, keys: Keys) -> None:
    keeper = LeaseKeeper(store, ttl=2, heartbeat=0.5, margin=0.3)
    lease = await keeper.grant()
    await keeper.keepalive_once()
    await store.put(keys.alive("n1"), b"{}", lease=lease)
    deadline = keeper.deadline
    while await store.get(keys.alive("n1")) is not None:
        await asyncio.sleep(0.02)
    expired_at = time.monotonic()
    assert deadline < expired_at, "the fencing deadline must come before the expiry"


async def test_election_handover_and_deposed_leader_cannot_write(store: EtcdStore,
                                                                 keys: Keys) -> None:
    a_lease, _ = await store.grant_lease(2)
    b_lease, _ = await store.grant_lease(10)
    a = Election(store, keys.leader, "a")
    b = Election(store, keys.leader, "b")
    token_a = await a.campaign(lambda: a_lease)
    assert token_a > 0
    b_task = asyncio.create_task(b.campaign(lambda: b_lease))
    await asyncio.sleep(0.3)
    assert not b_task.done(), "b must stand by while a leads"
    started = time.monotonic()
    token_b = await asyncio.wait_for(b_task, 6)  # a's lease expires: b takes over
    assert time.monotonic() - started < 4.5
    assert token_b > token_a
    with pytest.raises(NotLeader):
        await a.fenced([], [Put(keys.workload("x"), b"from deposed a")])
    assert await store.get(keys.workload("x")) is None
    result = await b.fenced([], [Put(keys.workload("x"), b"from b")])
    assert result.succeeded
    await store.revoke_lease(b_lease)


async def test_watch_resumes_across_member_death_without_loss_or_duplicates(
        etcd3: EtcdCluster, keys: Keys) -> None:
    client = EtcdStore(etcd3.endpoints)
    writer = EtcdStore(list(reversed(etcd3.endpoints)))
    seen: list[int] = []
    try:
        start = await client.revision() + 1

        async def watch() -> None:
            async for event in client.watch_prefix(keys.state, start):
                assert isinstance(event, WatchEvent)
                seen.append(int(event.kv.value))

        task = asyncio.create_task(watch())
        for i in range(20):
            await writer.put(keys.workload(f"w{i % 3}"), str(i).encode())
        watched_port = client.endpoint.rsplit(":", 1)[1]
        victim = next(i for i, m in enumerate(etcd3.members)
                      if str(m.client_port) == watched_port)
        etcd3.kill_member(victim)
        for i in range(20, 40):
            await writer.put(keys.workload(f"w{i % 3}"), str(i).encode())
        deadline = time.monotonic() + 15
        while len(seen) < 40 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        assert seen == list(range(40)), "every event once, in order"
        assert not client.endpoint.endswith(watched_port)
    finally:
        await client.close()
        await writer.close()


async def test_watch_from_compacted_revision_resyncs(store: EtcdStore, keys: Keys) -> None:
    first = await store.put(keys.workload("a"), b"1")
    await store.put(keys.workload("a"), b"2")
    latest = await store.put(keys.workload("b"), b"3")
    await store.call(lambda c: c.compact(latest))
    events: list[object] = []

    async def watch() -> None:
        async for event in store.watch_prefix(keys.state, first):
            events.append(event)
            return

    await asyncio.wait_for(watch(), 5)
    assert isinstance(events[0], Resync)
    assert sorted(kv.key for kv in events[0].kvs) == [keys.workload("a"), keys.workload("b")]


async def test_newest_events_only_are_read(store: EtcdStore, keys: Keys) -> None:
    from hafo.model.cluster import Event
    from hafo.store import EventLog, read_events

    log = EventLog(store, keys, retention=3600)
    for i in range(12):
        await log.append(Event(ts=1000.0 + i, kind="k", message=f"m{i}"))
    newest = await read_events(store, keys, 5)
    assert [e.message for e in newest] == [f"m{i}" for i in range(7, 12)]
    assert len(await read_events(store, keys, 0)) == 12


async def test_a_state_read_larger_than_grpcs_default_reply_limit(store: EtcdStore,
                                                                  keys: Keys) -> None:
    """A whole-state read of a large cluster (about 2.5 KB per node) exceeds gRPC's 4 MiB
    default reply size: the client accepts it (``MAX_REPLY``)."""
    value = b"x" * 2048
    for start in range(0, 3000, 100):
        await store.txn([], [Put(keys.node(f"n{i:05d}"), value)
                             for i in range(start, start + 100)])
    _revision, kvs = await store.get_prefix(keys.node(""))
    assert len(kvs) == 3000 and sum(len(kv.value) for kv in kvs) > 5 * 1024 * 1024
