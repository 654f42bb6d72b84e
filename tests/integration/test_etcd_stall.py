"""etcd frozen (SIGSTOP, as a GC pause, a slow fsync or a VM stall does), then resumed.

A stall of 2.5 s or more expires every lease as etcd resumes (no keepalive was processed
meanwhile). The agents bridge the stall through the failsafe, hold their nodes again with new
leases and keep every instance and epoch (``hafo.agent.claim.NodeClaim.resume``); the
controllers make no failover decision meanwhile (docs/safety.md, "An etcd stall"). Nothing
is fenced, restarted or moved, and no two copies of anything run.
"""

from __future__ import annotations

import asyncio

import pytest

from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, view
from .test_etcd_restart import five_workloads, why_changed


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("members", "frozen", "stall"), [
    pytest.param(1, (0,), 2.5, id="single-member-2.5s"),
    pytest.param(1, (0,), 10.0, id="single-member-10s"),
    pytest.param(3, (0, 1, 2), 5.0, id="all-3-members-5s"),
    pytest.param(3, (0,), 5.0, id="one-of-3-members-5s"),
    pytest.param(1, (0,), 60.0, id="single-member-60s"),
    pytest.param(3, (0, 1, 2), 10.0, id="all-3-members-10s"),
])
async def test_an_etcd_stall_restarts_nothing(local_cluster: ClusterFactory, members: int,
                                              frozen: tuple[int, ...], stall: float) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=members)
    wids, before = await five_workloads(cluster)
    leader = await cluster.etcd_leader_index()
    print(f"raft leader before the stall: member {leader}; frozen: {frozen}")
    cluster.etcd.freeze(frozen)
    try:
        await asyncio.sleep(stall)
    finally:
        cluster.etcd.thaw(frozen)
    await asyncio.sleep(2 * cluster.lease_ttl + 2.0)  # the recovery window, and slack
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 3, 20,
                                      what="cluster whole")
    events = await read_events(cluster.store, cluster.keys, 300)
    for wid in wids:
        node, epoch, process = before[wid]
        now = (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"])
        assert now == (node, epoch) and view(snapshot, wid)["restarts"] == 0 \
            and process.alive(), why_changed(cluster, wid, node, events)
        assert_never_two_copies(cluster, wid)
    kinds = {e.kind for e in events}
    print(f"etcd stall {stall}s of {len(frozen)}/{members} member(s): "
          f"{sum(e.kind == 'node-resumed' for e in events)} node(s) resumed with a new lease")
    assert not kinds & {"fenced", "restarted", "failover", "node-reregistered"}, kinds
