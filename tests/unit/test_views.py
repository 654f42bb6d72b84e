"""The public JSON shapes (docs/reference/http.md, "JSON shapes") and the derived workload state."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hafo.model.cluster import Assignment, CheckpointInfo, Event
from hafo.model.views import (
    all_nodes,
    all_workloads,
    event_view,
    latest_checkpoint,
    node_view,
    status_view,
    workload_state,
    workload_view,
)

from .conftest import H100, make_node, make_snapshot, placed, sample_cluster, status, submit

WORKLOAD_KEYS = {"id", "name", "state", "node", "epoch", "restarts", "gpus", "checkpoint"}
NODE_KEYS = {"name", "state", "labels", "gpus", "workloads"}
GPU_KEYS = {"index", "uuid", "model", "memory_mib", "healthy", "allocated_to"}
NODE_STATES = {"ready", "cordoned", "unhealthy", "down"}
WORKLOAD_STATES = {"pending", "starting", "running", "stopping", "completed", "failed",
                   "degraded", "updating"}


def test_workload_view_shape_and_values() -> None:
    view = workload_view(sample_cluster(), "run")
    assert set(view) >= WORKLOAD_KEYS
    assert json.loads(json.dumps(view)) == view
    assert {k: view[k] for k in WORKLOAD_KEYS} == {
        "id": "run", "name": "run", "state": "running", "node": "a", "epoch": 20,
        "restarts": 1, "gpus": ["GPU-a-0", "GPU-a-2"],
        "checkpoint": {"step": 40, "epoch": 20, "path": "/ck/ckpt-e20-s40"},
    }


@pytest.mark.parametrize(("wid", "reason"), [("wait", "no room"),
                                             ("new", "waiting for the controller")])
def test_unplaced_workload_view(wid: str, reason: str) -> None:
    view = workload_view(sample_cluster(), wid)
    assert set(view) >= WORKLOAD_KEYS
    assert (view["state"], view["node"], view["epoch"], view["gpus"], view["checkpoint"]) == (
        "pending", None, None, [], None)
    assert view["reason"] == reason


def test_node_view_shape() -> None:
    snap = sample_cluster()
    view = node_view(snap, "a")
    assert set(view) >= NODE_KEYS
    assert json.loads(json.dumps(view)) == view
    assert (view["name"], view["state"], view["labels"], view["workloads"]) == (
        "a", "ready", {"rack": "r1"}, ["run"])
    for gpu in view["gpus"]:
        assert set(gpu) >= GPU_KEYS
    assert view["gpus"][0] == {"index": 0, "uuid": "GPU-a-0", "model": H100,
                               "memory_mib": 81559, "healthy": True, "allocated_to": "run",
                               "degraded": False, "reason": "", "utilization": None,
                               "profile": None, "parent": None}
    assert [g["allocated_to"] for g in view["gpus"]] == ["run", None, "run", None]
    assert [g["healthy"] for g in view["gpus"]] == [True, True, True, False]
    states = {n["name"]: n["state"] for n in all_nodes(snap)}
    assert states == {"a": "ready", "b": "cordoned", "c": "down", "d": "unhealthy"}
    assert [n["name"] for n in all_nodes(snap)] == ["a", "b", "c", "d"]


def test_status_view_shape_and_counts() -> None:
    view = status_view(sample_cluster())
    assert set(view) == {"leader", "controllers", "nodes", "workloads"}
    assert set(view["nodes"]) == NODE_STATES
    assert set(view["workloads"]) == WORKLOAD_STATES
    assert view["leader"] == "ctl-1" and view["controllers"] == ["ctl-1", "ctl-2"]
    assert view["nodes"] == {"ready": 1, "cordoned": 1, "unhealthy": 1, "down": 1}
    assert view["workloads"] == {"pending": 2, "starting": 0, "running": 1, "stopping": 0,
                                 "completed": 0, "failed": 0, "degraded": 0, "updating": 0}
    empty = status_view(make_snapshot())
    assert empty == {"leader": None, "controllers": [],
                     "nodes": dict.fromkeys(NODE_STATES, 0),
                     "workloads": dict.fromkeys(WORKLOAD_STATES, 0)}


def test_all_workloads_oldest_first_and_event_view() -> None:
    assert [w["id"] for w in all_workloads(sample_cluster())] == ["wait", "run", "new"]
    event = Event(ts=1.5, kind="failover", message="moved", workload="run", node="a", epoch=20)
    assert event_view(event) == {"ts": 1.5, "kind": "failover", "message": "moved",
                                 "workload": "run", "node": "a", "epoch": 20}


@pytest.mark.parametrize(("assignment", "statuses", "state"), [
    pytest.param(None, [], "pending", id="no-assignment"),
    pytest.param(Assignment("w", "pending", epoch=3), [], "pending", id="pending"),
    pytest.param(Assignment("w", "completed", epoch=3), [], "completed", id="completed"),
    pytest.param(Assignment("w", "failed", epoch=3), [], "failed", id="failed"),
    pytest.param(placed("w", "a", epoch=5), [], "starting", id="placed-no-report"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 4, "running")], "starting",
                 id="report-of-old-epoch"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "b", 5, "running")], "starting",
                 id="report-from-other-node"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "starting")], "starting",
                 id="starting"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "running")], "running",
                 id="running"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "stopping")], "stopping",
                 id="stopping"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "exited", exit_code=0)],
                 "completed", id="exited-0"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "exited", exit_code=137)],
                 "failed", id="exited-nonzero"),
    pytest.param(placed("w", "a", epoch=5), [status("w", "a", 5, "exited")], "failed",
                 id="exited-no-code"),
])
def test_workload_state(assignment: Assignment | None, statuses: list[Any],
                        state: str) -> None:
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                         assignments=[assignment] if assignment else [], statuses=statuses)
    assert workload_state(snap, "w") == state


def ck(epoch: int, step: int) -> CheckpointInfo:
    return CheckpointInfo(step=step, epoch=epoch, path=f"/ck/e{epoch}-s{step}")


@pytest.mark.parametrize(("reports", "expected"), [
    pytest.param({}, None, id="none"),
    pytest.param({"a": None}, None, id="report-without-checkpoint"),
    pytest.param({"a": ck(5, 10)}, ck(5, 10), id="one"),
    pytest.param({"a": ck(5, 10), "b": ck(6, 1)}, ck(6, 1), id="newer-epoch-beats-step"),
    pytest.param({"a": ck(7, 1), "b": ck(6, 999)}, ck(7, 1), id="stale-epoch-late-step"),
    pytest.param({"a": ck(6, 3), "b": ck(6, 8), "c": None}, ck(6, 8), id="same-epoch-step"),
])
def test_latest_checkpoint(reports: dict[str, CheckpointInfo | None],
                           expected: CheckpointInfo | None) -> None:
    snap = make_snapshot(
        [make_node(n) for n in "abc"], workloads=[submit("w"), submit("x")],
        statuses=[*(status("w", n, 1, checkpoint=c) for n, c in reports.items()),
                  status("x", "a", 1, checkpoint=ck(99, 99))])
    assert latest_checkpoint(snap, "w") == expected
