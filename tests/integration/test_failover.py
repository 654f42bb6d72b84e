"""Failures of real processes on a local cluster: power loss, agent death, leader death,
workload exits. Timings are checked against the lease TTL with the issue's bound (TTL + 2 s)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from hafo.local.cluster import demo_workload_spec
from hafo.local.procs import pid_alive
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import (
    HostProcess,
    assert_never_two_copies,
    node_process,
    running,
    start_with_workload,
    view,
)

pytestmark = pytest.mark.timeout(90)
TTL = 3
BOUND = TTL + 2.0


def get_json(port: int, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


async def leader_sees(cluster: Any, wid: str, check: Callable[[dict[str, Any]], bool],
                      what: str, timeout: float = 15.0) -> None:
    """Until the leading controller's own cache (its read API) shows ``check`` of the
    workload's view: etcd having it is not enough, the leader decides from its cache."""
    deadline = time.monotonic() + timeout
    while True:
        leader = (await cluster.snapshot()).leader
        body = None if leader is None else await asyncio.to_thread(
            get_json, cluster.controller_handles[leader].api_port, f"/v1/workloads/{wid}")
        if body is not None and check(body):
            return
        assert time.monotonic() < deadline, f"the leader never saw {what}: {body}"
        await asyncio.sleep(0.05)


async def test_node_power_loss_moves_workload_within_ttl_plus_2(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=3, controllers=2)
    victim, old_epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    old = node_process(cluster, victim, snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    await leader_sees(cluster, wid, lambda v: v["checkpoint"] is not None,
                      "a reported checkpoint", 20)
    killed_at = time.time()
    pids = cluster.power_off(victim)
    assert not any(pid_alive(p) for p in pids)
    snapshot = await cluster.wait_for(running(wid, not_on=victim), 15, what="failover")
    status = snapshot.current_status(wid)
    assert status is not None and status.started_at is not None
    assert status.started_at - killed_at < BOUND
    assert cluster.host_pid(status.node, status.pid) not in (None, old.host)
    assert view(snapshot, wid)["epoch"] > old_epoch
    assert_never_two_copies(cluster, wid)
    failover = [e for e in await read_events(cluster.store, cluster.keys, 0)
                if e.kind == "failover" and e.workload == wid]
    # its node died: the step last reported, of which the restored one is newer or the same
    assert failover and re.search(r"resumes from its latest checkpoint \(step \d+ or newer\)",
                                  failover[0].message)


async def test_agent_killed_alone_its_guard_kills_the_workload_before_lease_expiry(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=1)
    victim = view(snapshot, wid)["node"]
    workload = node_process(cluster, victim,
                            snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    assert workload.alive()
    # The watch replays from that revision whenever it starts, and the lease cannot expire
    # sooner than TTL - heartbeat (2 s) after the kill: no need to wait for it to start.
    expiry = cluster.watch_expiry(victim, snapshot.revision + 1)
    cluster.kill_agent(victim)
    died_at = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (died_at is None or not expiry.done()):
        if died_at is None and not workload.alive():
            died_at = time.time()
        await asyncio.sleep(0.005)
    assert died_at is not None, "the guard never killed the workload"
    assert expiry.done(), "the lease never expired"
    assert died_at < expiry.result(), "workload must be dead before the lease expires"
    await cluster.wait_for(running(wid, not_on=victim), 15, what="failover")
    assert_never_two_copies(cluster, wid)


async def test_leader_killed_standby_takes_over_and_fails_work_over(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=2)
    leader = snapshot.leader
    assert leader is not None
    victim = view(snapshot, wid)["node"]
    killed_at = time.time()
    cluster.kill_controller(leader)
    cluster.power_off(victim)
    snapshot = await cluster.wait_for(
        lambda s: s.leader not in (None, leader) and running(wid, not_on=victim)(s), 15,
        what="new leader and failover")
    status = snapshot.current_status(wid)
    assert status is not None and status.started_at is not None
    assert status.started_at - killed_at < BOUND + 0.5
    assert_never_two_copies(cluster, wid)


async def test_leader_loss_alone_is_answered_within_ttl_plus_2(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=2)
    leader = (await cluster.snapshot()).leader
    assert leader is not None
    killed_at = time.monotonic()
    cluster.kill_controller(leader)
    await cluster.wait_for(lambda s: s.leader not in (None, leader), 15, what="new leader")
    assert time.monotonic() - killed_at < BOUND
    wid = await cluster.submit(demo_workload_spec(gpus=0))
    await cluster.wait_for(running(wid), 15, what="new leader places new work")


async def test_failed_workload_restarts_in_place_and_resumes(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1)
    wid = await cluster.submit(demo_workload_spec(fail_at=15, every=5, steps=40))
    snapshot = await cluster.wait_for(lambda s: view(s, wid)["restarts"] == 1
                                      and view(s, wid)["state"] == "running", 30,
                                      what="restart")
    first_node = next(ln for ln in cluster.progress_log(wid) if ln.get("event") == "start")["node"]
    assert view(snapshot, wid)["node"] == first_node, "restarted in place"
    await cluster.wait_for(lambda s: view(s, wid)["state"] == "completed", 30,
                           what="completion")
    starts = [ln for ln in cluster.progress_log(wid) if ln.get("event") == "start"]
    assert [s["resumed_from"] for s in starts] == [0, 15]
    assert_never_two_copies(cluster, wid)


async def test_deleted_workload_is_stopped(local_cluster: ClusterFactory) -> None:
    from hafo.store import intents

    cluster = await local_cluster.start(nodes=1, controllers=1)
    wid = await cluster.submit(demo_workload_spec(gpus=2))
    snapshot = await cluster.wait_for(running(wid), 20, what="running")
    process = node_process(cluster, view(snapshot, wid)["node"],
                           snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    await intents.delete(cluster.store, cluster.keys, wid)
    await cluster.wait_for(lambda s: wid not in s.assignments and not any(
        w == wid for w, _ in s.statuses), 15, what="forgotten")
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not process.alive()


async def test_agent_restarted_before_lease_expiry_readopts_its_workload(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
    process = node_process(cluster, node, pid)
    old_agent = cluster.kill_agent(node)
    cluster.restart_agent(node)
    deadline = time.monotonic() + 10
    while cluster.node_handles[node].agent_pid() in (None, old_agent):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await asyncio.sleep(TTL + 1.0)  # past the old fencing deadline and the lease TTL
    snapshot = await cluster.snapshot()
    assert view(snapshot, wid)["node"] == node and view(snapshot, wid)["epoch"] == epoch
    assert view(snapshot, wid)["state"] == "running"
    assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
    assert view(snapshot, wid)["restarts"] == 0


def assert_unmoved(snapshot: Any, wid: str, before: dict[str, Any],
                   process: HostProcess) -> None:
    """Same node, same epoch, no restart, same live process."""
    after = view(snapshot, wid)
    assert (after["node"], after["epoch"], after["restarts"]) == \
        (before["node"], before["epoch"], 0), "no failover, no restart"
    assert snapshot.current_status(wid).pid == process.pid and process.alive()


@pytest.mark.parametrize("which", ["raft-leader", "follower"])
async def test_etcd_member_crash_causes_no_failover(local_cluster: ClusterFactory,
                                                    which: str) -> None:
    cluster, wid, snapshot = await start_with_workload(
        local_cluster, nodes=2, controllers=2, etcd_members=3)
    before = view(snapshot, wid)
    process = node_process(cluster, before["node"],
                           snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    leader = await cluster.etcd_leader_index()
    assert leader is not None
    victim = leader if which == "raft-leader" else (leader + 1) % 3
    await cluster.close_store()  # the test's own client must not sit on the victim
    cluster.etcd.kill_member(victim)
    await asyncio.sleep(TTL * 2 + 1)  # on purpose: two lease TTLs in which nothing may move
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 2, 10,
                                      what="cluster still whole")
    assert_unmoved(snapshot, wid, before, process)
    events = [e.kind for e in await read_events(cluster.store, cluster.keys, 100)]
    assert "failover" not in events and "node-reregistered" not in events


@pytest.mark.parametrize("fault", ["freeze", "partition"])
async def test_frozen_or_cut_off_agent_is_fenced_then_rejoins_cleanly(
        local_cluster: ClusterFactory, fault: str) -> None:
    cluster, wid, snapshot = await start_with_workload(
        local_cluster, nodes=2, controllers=1, partitionable=True)
    victim, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    old_lease = snapshot.alive[victim].lease
    process = node_process(cluster, victim,
                           snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    if fault == "freeze":
        cluster.freeze_agent(victim)
    else:
        cluster.partition(victim)
    snapshot = await cluster.wait_for(running(wid, not_on=victim), 15, what="failover")
    assert not process.alive()
    await asyncio.sleep(1.0)  # on purpose: the fault lasts a while past the failover
    if fault == "freeze":
        cluster.thaw_agent(victim)
    else:
        cluster.heal(victim)
    snapshot = await cluster.wait_for(
        lambda s: s.node_state(victim) == "ready" and s.alive[victim].lease != old_lease, 15,
        what="re-registered with a new lease")
    await asyncio.sleep(2.0)  # on purpose: time for a stale instance to come back, if it would
    snapshot = await cluster.snapshot()
    assert view(snapshot, wid)["node"] != victim and view(snapshot, wid)["epoch"] > epoch
    assert snapshot.statuses.get((wid, victim)) is None, "stale instance must not come back"
    starts = [ln for ln in cluster.progress_log(wid) if ln.get("event") == "start"]
    assert [s["epoch"] for s in starts] == [epoch, view(snapshot, wid)["epoch"]]
    assert_never_two_copies(cluster, wid)
    other = await cluster.submit(demo_workload_spec(name="after", gpus=4))
    snapshot = await cluster.wait_for(running(other), 20, what="rejoined node takes work")
    assert view(snapshot, other)["node"] == victim  # the only node with 4 free GPUs


async def test_deposed_leader_frozen_then_resumed_writes_nothing(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=1, controllers=2)
    old = (await cluster.snapshot()).leader
    assert old is not None
    cluster.freeze_controller(old)
    await cluster.wait_for(lambda s: s.leader not in (None, old), 15, what="new leader")
    await asyncio.sleep(1.0)  # on purpose: the old leader stays frozen past its deposition
    cluster.thaw_controller(old)
    wid = await cluster.submit(demo_workload_spec(gpus=0))
    await cluster.wait_for(running(wid), 15, what="placed by the new leader")
    await asyncio.sleep(2.0)  # on purpose: time for the thawed old leader to write, if it would
    events = await read_events(cluster.store, cluster.keys, 0)
    assert sum(1 for e in events if e.kind == "placed" and e.workload == wid) == 1
    log = cluster.controller_handles[old].log_path.read_text()
    assert "leadership lost" in log or "standing by" in log.split("became leader")[-1]


async def test_all_of_etcd_down_past_the_ttl_kills_nothing_failsafe(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(
        local_cluster, nodes=2, controllers=2, etcd_members=3)
    before = view(snapshot, wid)
    process = node_process(cluster, before["node"],
                           snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    await cluster.close_store()
    for index in range(3):
        cluster.etcd.kill_member(index)
    await asyncio.sleep(TTL * 3)  # well past the TTL and every fencing deadline
    assert process.alive(), "failsafe: the workload must survive an etcd outage"
    for index in range(3):
        cluster.etcd.restart_member(index)
    await asyncio.to_thread(cluster.etcd.wait_ready, 30.0)
    await asyncio.sleep(TTL + 2)  # past every controller's failsafe hold
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 2, 20,
                                      what="cluster whole again")
    assert_unmoved(snapshot, wid, before, process)


async def test_failsafe_does_not_cover_an_agent_cut_off_alone(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(
        local_cluster, nodes=2, controllers=2, partitionable=True)
    victim = view(snapshot, wid)["node"]
    process = node_process(cluster, victim,
                           snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    cluster.partition(victim)  # controllers still reach etcd: they say so, no failsafe
    await cluster.wait_for(running(wid, not_on=victim), 15, what="failover")
    assert not process.alive()
    cluster.heal(victim)
    assert_never_two_copies(cluster, wid)
