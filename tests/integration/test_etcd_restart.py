"""etcd killed and started again (not frozen): single member and whole 3-member cluster.

Within ``failsafe_max`` nothing is killed, restarted or moved, and every daemon is back on
etcd within about one heartbeat of etcd serving again (the client's reconnect backoff is
bounded); while etcd is away the controllers' answers say they are stale. Beyond
``failsafe_max`` the work is fenced as documented, and restarted in place when etcd returns,
without counting toward the workloads' restart budgets.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import HostProcess, assert_never_two_copies, node_process, running, view

HEARTBEAT = 1.0
BACK_WITHIN = HEARTBEAT + 1.0  # one heartbeat, plus slack for a busy 2-core machine


def get_json(url: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}"), dict(err.headers)


def contact_ages(cluster: LocalCluster) -> dict[str, float | None]:
    """Every daemon's seconds since etcd last answered it (None: it did not answer us)."""
    ages: dict[str, float | None] = {}
    for name, node in cluster.node_handles.items():
        try:
            ages[name] = get_json(f"http://127.0.0.1:{node.api_port}/v1/node")[1][
                "etcd_contact_age"]
        except (OSError, ValueError, KeyError):
            ages[name] = None
    for name, ctl in cluster.controller_handles.items():
        try:
            ages[name] = get_json(f"http://127.0.0.1:{ctl.api_port}/v1/status")[1][
                "etcd_contact_age"]
        except (OSError, ValueError, KeyError):
            ages[name] = None
    return ages


async def back_on_etcd(cluster: LocalCluster, serving_since: float,
                       timeout: float = 15.0) -> dict[str, float]:
    """Per daemon: seconds from etcd serving again to its first acknowledged keepalive."""
    back: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        for name, age in (await asyncio.to_thread(contact_ages, cluster)).items():
            if name not in back and age is not None and now - age >= serving_since:
                back[name] = max(0.0, now - age - serving_since)
        if len(back) == len(cluster.node_handles) + len(cluster.controller_handles):
            return back
        await asyncio.sleep(0.05)
    raise AssertionError(f"daemons not back on etcd: {sorted(back)}")


async def five_workloads(cluster: LocalCluster) -> tuple[
        list[str], dict[str, tuple[str, int, HostProcess]]]:
    """Five 1-GPU workloads running: per workload (node, epoch, its process on the host)."""
    wids = [await cluster.submit(demo_workload_spec(name=f"w{i}", gpus=1)) for i in range(5)]
    snapshot = await cluster.wait_for(lambda s: all(running(w)(s) for w in wids), 30,
                                      what="5 workloads running")
    before = {}
    for w in wids:
        node = view(snapshot, w)["node"]
        before[w] = (node, view(snapshot, w)["epoch"],
                     node_process(cluster, node, snapshot.current_status(w).pid))  # type: ignore[union-attr]
    return wids, before


def why_changed(cluster: LocalCluster, wid: str, node: str, events: list[Any]) -> str:
    """What a failed check needs to be explained: the workload's events, and what its node's
    agent and the controllers logged about it (the last lines)."""
    lines = [f"{wid} changed; its events:"]
    lines += [f"  {e.kind}: {e.message}" for e in events if wid in (e.workload or "")]
    logs = sorted((cluster.base / "logs").glob("*.log"))
    for path in logs:
        if path.stem.startswith(node) or path.stem.startswith("ctl"):
            text = path.read_text(errors="replace").splitlines()
            hits = [line for line in text if wid in line or any(
                word in line for word in ("fence", "failsafe", "etcd", "lease", "resumed"))]
            lines.append(f"{path.name}:")
            lines += [f"  {line[:300]}" for line in hits[-40:]]
    return "\n".join(lines)


async def kill_etcd(cluster: LocalCluster) -> None:
    await cluster.close_store()
    for index in range(len(cluster.etcd.members)):
        cluster.etcd.kill_member(index)


async def start_etcd(cluster: LocalCluster) -> float:
    for index in range(len(cluster.etcd.members)):
        cluster.etcd.restart_member(index)
    await asyncio.to_thread(cluster.etcd.wait_ready, 30.0)
    return time.monotonic()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("members", "outage"), [
    pytest.param(1, 5, id="single-member-5s"),
    pytest.param(3, 20, id="whole-3-member-cluster-20s"),
    pytest.param(3, 60, id="whole-3-member-cluster-60s"),
])
async def test_etcd_killed_and_restarted_within_failsafe_max_kills_nothing(
        local_cluster: ClusterFactory, members: int, outage: float) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=members)
    wids, before = await five_workloads(cluster)
    ctl = next(iter(cluster.controller_handles.values()))
    await kill_etcd(cluster)
    killed = time.monotonic()
    await asyncio.sleep(min(outage, 4.0))
    code, status, headers = await asyncio.to_thread(
        get_json, f"http://127.0.0.1:{ctl.api_port}/v1/status")
    assert code == 200 and status["stale"] is True and status["stale_seconds"] >= 2.0
    assert float(headers["Hafo-Stale-Seconds"]) >= 2.0
    code, ready, _ = await asyncio.to_thread(get_json, f"http://127.0.0.1:{ctl.api_port}/readyz")
    assert code == 503 and "not connected to etcd for" in ready["error"]
    await asyncio.sleep(max(0.0, killed + outage - time.monotonic()))
    serving = await start_etcd(cluster)
    back = await back_on_etcd(cluster, serving)
    print(f"etcd x{members} down {outage}s: back on etcd after serving again: "
          + ", ".join(f"{n} {t:.2f}s" for n, t in sorted(back.items())))
    assert max(back.values()) <= BACK_WITHIN, back
    await asyncio.sleep(3.0)  # past every deadline a late reconnect would have missed
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 3, 15,
                                      what="cluster whole")
    events = await read_events(cluster.store, cluster.keys, 200)
    for wid in wids:
        node, epoch, process = before[wid]
        now = (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"])
        assert now == (node, epoch) and view(snapshot, wid)["restarts"] == 0 \
            and process.alive(), why_changed(cluster, wid, node, events)
    kinds = {e.kind for e in events}
    assert not kinds & {"fenced", "restarted", "failover", "node-reregistered"}, kinds
    _, status, headers = await asyncio.to_thread(
        get_json, f"http://127.0.0.1:{ctl.api_port}/v1/status")
    assert status["stale"] is False and "Hafo-Stale-Seconds" not in headers


@pytest.mark.timeout(120)
async def test_etcd_away_longer_than_failsafe_max_fences_then_restarts_uncounted(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=2, controllers=2, etcd_members=1,
                                        failsafe_max=6)
    wids, before = await five_workloads(cluster)
    await kill_etcd(cluster)
    await asyncio.sleep(6 + 3 + 2)  # failsafe_max, then the last extension, then slack
    assert not any(process.alive() for _n, _e, process in before.values()), "fenced"
    await start_etcd(cluster)
    snapshot = await cluster.wait_for(
        lambda s: all(running(w)(s) and view(s, w)["epoch"] > before[w][1] for w in wids), 30,
        what="every workload running again")
    for wid in wids:
        assert view(snapshot, wid)["restarts"] == 0, "infrastructure: not counted"
        assert view(snapshot, wid)["state"] == "running"
        assert_never_two_copies(cluster, wid)
    restarted = [e for e in await read_events(cluster.store, cluster.keys, 300)
                 if e.kind == "restarted"]
    assert restarted and all("not counted" in e.message for e in restarted)
