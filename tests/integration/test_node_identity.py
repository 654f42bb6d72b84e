"""One node name, one holder: duplicate agents, agents that lost their records, liveness keys
deleted by hand, and nodes left by a planned move. Real processes, real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import urllib.request
from typing import Any

import pytest

from hafo.local.cluster import demo_workload_spec
from hafo.local.procs import stop_process
from hafo.store import intents, read_events

from .conftest import ClusterFactory
from .helpers import (
    assert_never_two_copies,
    node_process,
    running,
    start_with_workload,
    view,
)

pytestmark = pytest.mark.timeout(120)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``text`` (an agent's log: ``log.format: json``)."""
    lines = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict):
                lines.append(line)
    return lines


def node_status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/node", timeout=1.0) as resp:
        return dict(json.loads(resp.read()))


async def test_a_second_agent_with_the_same_name_waits_and_runs_nothing(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
    process = node_process(cluster, node, pid)
    lease = snapshot.alive[node].lease
    dup, dup_state, dup_port = cluster.start_duplicate_agent(node)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                waiting = (await asyncio.to_thread(node_status, dup_port))["waiting_for_name"]
            except OSError:
                waiting = None
            if waiting == f"{lease:x}":
                break
            assert time.monotonic() < deadline, "the duplicate never said it waits"
            await asyncio.sleep(0.2)
        await asyncio.sleep(3.0)  # long enough to have started anything it would start
        assert not (dup_state / "instances").exists() or not any(
            p.name[0] != "." for p in (dup_state / "instances").iterdir()), "it ran nothing"
        snapshot = await cluster.snapshot()
        assert snapshot.alive[node].lease == lease
        assert (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]) == (node, epoch)
        assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
        events = await read_events(cluster.store, cluster.keys, 100)
        assert any(e.kind == "duplicate-node" and e.node == node for e in events)
        log = (cluster.base / "logs" / f"{node}-dup.log").read_text()
        assert any(line.get("event", "").startswith("node name is in use")
                   and line.get("node") == node for line in json_lines(log)), log
    finally:
        stop_process(dup, grace=3.0)
    await asyncio.sleep(2 * cluster.lease_ttl)  # the duplicate is gone: nothing changes
    snapshot = await cluster.snapshot()
    assert snapshot.node_state(node) == "ready" and snapshot.alive[node].lease == lease
    assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
    assert_never_two_copies(cluster, wid)


@pytest.mark.parametrize("how", ["moved", "wiped"])
async def test_an_agent_restarted_without_its_records_never_runs_an_epoch_twice(
        local_cluster: ClusterFactory, how: str) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=1, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    process = node_process(cluster, node, snapshot.current_status(wid).pid)  # type: ignore[union-attr]
    handle = cluster.node_handles[node]
    old_agent = cluster.kill_agent(node)
    if how == "moved":
        cluster.move_state_dir(node)  # the old guards keep reading the old fence file
    else:
        shutil.rmtree(handle.state_dir / "instances")  # records gone, fence file kept
    cluster.restart_agent(node)
    deadline = time.monotonic() + 10
    while handle.agent_pid() in (None, old_agent):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    snapshot = await cluster.wait_for(
        lambda s: running(wid)(s) and view(s, wid)["epoch"] > epoch, 30,
        what="running again with a new epoch")
    assert not process.alive(), "the old instance is dead"
    assert view(snapshot, wid)["restarts"] == 0, "not the workload's fault"
    new_epoch = view(snapshot, wid)["epoch"]
    deadline = time.monotonic() + 10
    while True:  # the new instance writes its first line a moment after it starts
        starts = [ln["epoch"] for ln in cluster.progress_log(wid) if ln.get("event") == "start"]
        if new_epoch in starts or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert starts == [epoch, new_epoch], "the old epoch was never started again"
    assert_never_two_copies(cluster, wid)


async def test_a_liveness_key_deleted_by_hand_is_put_back_and_nothing_moves(
        local_cluster: ClusterFactory) -> None:
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=2, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
    process = node_process(cluster, node, pid)
    lease = snapshot.alive[node].lease
    for _ in range(3):
        deleted_at = time.monotonic()
        await cluster.store.delete(cluster.keys.alive(node))
        await cluster.wait_for(lambda s: node in s.alive, 5, interval=0.02,
                               what="liveness key back")
        assert time.monotonic() - deleted_at < cluster.heartbeat + 1.0
        await cluster.store.delete(cluster.keys.node(node))
        await cluster.wait_for(lambda s: node in s.nodes, 5, interval=0.02,
                               what="node record back")
        await asyncio.sleep(1.0)
    await asyncio.sleep(cluster.lease_ttl)
    snapshot = await cluster.snapshot()
    assert snapshot.alive[node].lease == lease and snapshot.node_state(node) == "ready"
    assert (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]) == (node, epoch)
    assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
    kinds = {e.kind for e in await read_events(cluster.store, cluster.keys, 100)}
    assert not kinds & {"failover", "fenced", "restarted", "node-reregistered"}, kinds


async def test_after_drain_and_uncordon_a_node_takes_new_work_again(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=1, gpus_per_node=2)
    wid = await cluster.submit(demo_workload_spec(name="first", gpus=1))
    snapshot = await cluster.wait_for(running(wid), 20, what="running")
    node = view(snapshot, wid)["node"]
    await intents.drain(cluster.store, cluster.keys, node)
    await cluster.wait_for(running(wid, not_on=node), 30, what="drained")
    await intents.set_cordon(cluster.store, cluster.keys, node, False)
    other = await cluster.submit(demo_workload_spec(name="second", gpus=1))
    snapshot = await cluster.wait_for(running(other), 20, what="second running")
    assert view(snapshot, other)["node"] == node, "the emptier, uncordoned node"
    assert not snapshot.assignments[wid].avoid, "a planned move leaves no cool-down"


async def test_a_second_agent_on_the_same_state_directory_waits_then_adopts(
        local_cluster: ClusterFactory) -> None:
    """Two agent processes on one state directory would both adopt the lease and both
    launch guards: the second waits on the directory's lock until the first is gone, then
    renews the saved lease at once and keeps the work (same pid, same epoch)."""
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=1, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
    process = node_process(cluster, node, pid)
    lease = snapshot.alive[node].lease
    dup, _state, dup_port = cluster.start_duplicate_agent(node, tag="same-dir",
                                                          same_state_dir=True)
    log_path = cluster.base / "logs" / f"{node}-same-dir.log"
    try:
        deadline = time.monotonic() + 20
        while "is in use by another agent" not in log_path.read_text():
            assert time.monotonic() < deadline, "the second agent never said it waits"
            assert dup.poll() is None, log_path.read_text()
            await asyncio.sleep(0.1)
        with pytest.raises(OSError):  # it waits before it serves anything
            await asyncio.to_thread(node_status, dup_port)
        await asyncio.sleep(2.0)
        assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
        cluster.kill_agent(node)  # the first one dies (its nodeinit does not restart it)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError):
                if (await asyncio.to_thread(node_status, dup_port))["lease_valid"]:
                    break
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.1)
        await asyncio.sleep(cluster.lease_ttl + 1.0)  # past the old deadline and the TTL
        snapshot = await cluster.snapshot()
        assert snapshot.alive[node].lease == lease
        assert (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]) == (node, epoch)
        assert view(snapshot, wid)["restarts"] == 0
        assert snapshot.current_status(wid).pid == pid and process.alive()  # type: ignore[union-attr]
        assert "saved lease renewed before start-up" in log_path.read_text()
    finally:
        stop_process(dup, grace=3.0)
    assert_never_two_copies(cluster, wid)


async def test_an_agent_crashed_and_restarted_repeatedly_keeps_its_work(
        local_cluster: ClusterFactory) -> None:
    """SIGKILL the agent and start it 0.6 s later, again and again (the chaos fault's longest
    delay; systemd's is 0.1 s): the saved lease is renewed before the guards' deadline every
    time, so the workload keeps its process and epoch."""
    cluster, wid, snapshot = await start_with_workload(local_cluster, nodes=1, controllers=1)
    node, epoch = view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]
    pid = snapshot.current_status(wid).pid  # type: ignore[union-attr]
    process = node_process(cluster, node, pid)
    handle = cluster.node_handles[node]
    for _ in range(5):
        old_agent = cluster.kill_agent(node)
        await asyncio.sleep(0.6)
        cluster.restart_agent(node)
        deadline = time.monotonic() + 10
        while handle.agent_pid() in (None, old_agent):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(cluster.lease_ttl)  # past the old fencing deadline
        assert process.alive(), handle.log_path.read_text()[-3000:]
    snapshot = await cluster.snapshot()
    assert (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"]) == (node, epoch)
    assert view(snapshot, wid)["restarts"] == 0 and view(snapshot, wid)["state"] == "running"
    assert snapshot.current_status(wid).pid == pid
    assert handle.log_path.read_text().count("saved lease renewed before start-up") == 5
    assert_never_two_copies(cluster, wid)
