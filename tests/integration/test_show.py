"""A workload's history on a live cluster: ``hafo show`` (a CLI subprocess) and
``GET /v1/workloads/{id}/history`` after a power loss, a leader change and a planned move."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster, demo_workload_spec
from hafo.model.history import WorkloadHistory
from hafo.store.history import read_history

from .conftest import ClusterFactory
from .helpers import assert_never_two_copies, running, view

pytestmark = pytest.mark.timeout(120)
NAME = "train-demo"


def hafo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_ETCD": ",".join(cluster.etcd.endpoints)}
    return subprocess.run([sys.executable, "-m", "hafo", *args], capture_output=True,
                          text=True, env=env, timeout=30)


def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def history_until(cluster: LocalCluster, wid: str, check: Any, what: str,
                        timeout: float = 20.0) -> WorkloadHistory:
    """Poll the stored history until ``check(history)`` holds."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        history = await read_history(cluster.store, cluster.keys, wid)
        if history is not None and check(history):
            return history
        assert time.monotonic() < deadline, f"the history never showed {what}: {history}"
        await asyncio.sleep(0.1)


def show_json(cluster: LocalCluster, ref: str) -> dict[str, Any]:
    result = hafo(cluster, "show", ref, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


async def test_show_a_failover_a_leader_change_and_a_planned_move(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2)
    wid = await cluster.submit(demo_workload_spec(NAME))
    snapshot = await cluster.wait_for(
        lambda s: running(wid)(s) and (view(s, wid)["checkpoint"] or {}).get("step", 0) >= 10,
        30, what="running and checkpointing")
    first = view(snapshot, wid)["node"]
    first_epoch = view(snapshot, wid)["epoch"]
    await history_until(cluster, wid, lambda h: h.epochs[-1].started_at is not None,
                        "the first epoch started")

    cluster.power_off(first)
    snapshot = await cluster.wait_for(running(wid, not_on=first), 20, what="failover")
    second = view(snapshot, wid)["node"]
    await history_until(cluster, wid, lambda h: len(h.epochs) == 2
                        and h.epochs[1].started_at is not None
                        and (h.epochs[1].resumed_from or None) is not None,
                        "the second epoch started, with its resume point")

    data = show_json(cluster, NAME)  # by name
    assert data["id"] == wid and data["name"] == NAME and data["spec"]["name"] == NAME
    assert data["now"]["node"] == second and data["now"]["state"] == "running"
    assert data["now"]["phase"] == "placed"
    old, new = data["history"]
    assert old["epoch"] == first_epoch and old["nodes"] == [first]
    assert old["end"]["how"] == "node-down" and old["how"] == "node down"
    assert old["ended_at"] is not None and old["started_at"] is not None
    assert new["node"] == second != first and new["epoch"] > first_epoch
    assert new["resumed_from"]["step"] > 0 and new["resumed_from"]["epoch"] == first_epoch
    assert new["end"] is None and new["ended_at"] is None and new["restarts"] == 0
    assert any(e["kind"] == "failover" for e in data["events"])
    assert all(e["workload"] == wid for e in data["events"])

    leader = snapshot.leader
    assert leader is not None
    port = cluster.controller_handles[leader].api_port
    code, body = get(port, f"/v1/workloads/{NAME}/history")
    assert code == 200, body
    assert body["history"] == data["history"] and body["spec"] == data["spec"]
    assert get(port, f"/v1/workloads/{wid}/history")[1]["id"] == wid  # by id too
    code, body = get(port, "/v1/workloads/no-such-thing/history")
    assert code == 404 and "no-such-thing" in body["error"]

    # The history outlives its writer: the other controller leads from here on.
    cluster.kill_controller(leader)
    await cluster.wait_for(lambda s: s.leader not in (None, leader), 15, what="a new leader")
    moved = hafo(cluster, "migrate", NAME)
    assert moved.returncode == 0, moved.stderr
    await cluster.wait_for(running(wid, not_on=second), 30, what="the planned move")
    await history_until(cluster, wid, lambda h: len(h.epochs) == 3 and h.epochs[1].over,
                        "the planned move")

    data = show_json(cluster, wid)  # by id
    assert [e["epoch"] for e in data["history"][:2]] == [old["epoch"], new["epoch"]]
    assert data["history"][0]["how"] == "node down"
    assert data["history"][1]["end"]["how"] == "moved" and data["history"][1]["nodes"] == [second]
    assert data["history"][1]["how"] == "moved (planned)"
    third = data["history"][2]
    assert third["node"] not in (first, second)
    assert third["resumed_from"]["epoch"] == new["epoch"] and third["resumed_from"]["step"] > 0

    text = hafo(cluster, "show", NAME)
    assert text.returncode == 0, text.stderr
    for expected in ("NODE", "EPOCH", "STARTED", "ENDED", "HOW", "RESTARTS", "RESUMED-FROM",
                     "node down", "moved (planned)", f"step {third['resumed_from']['step']}",
                     "recent events:", "failover"):
        assert expected in text.stdout, (expected, text.stdout)

    missing = hafo(cluster, "show", "no-such-thing")
    assert missing.returncode == 4
    assert missing.stderr.strip().count("\n") == 0 and "no-such-thing" in missing.stderr
    assert_never_two_copies(cluster, wid)
