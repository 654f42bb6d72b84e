"""Tables for people, rendered from the contract's JSON views."""

from __future__ import annotations

import time
from typing import Any

import pytest

from hafo.model.views import all_nodes, all_workloads, status_view
from hafo.render import ago, render_events, render_nodes, render_status, render_workloads, table

from .conftest import sample_cluster


def test_table_aligns_and_dashes_none() -> None:
    out = table(["A", "LONGER"], [["xx", None], ["y", 3]])
    assert out.splitlines() == ["A   LONGER", "xx  -", "y   3"]


def test_table_with_no_rows_is_the_header() -> None:
    assert table(["NAME", "STATE"], []) == "NAME  STATE"


@pytest.mark.parametrize(("age", "text"), [
    (0.0, "0s ago"), (119.0, "119s ago"), (120.0, "2m ago"), (7199.0, "120m ago"),
    (7200.0, "2.0h ago"), (-5.0, "0s ago"),
])
def test_ago(age: float, text: str) -> None:
    assert ago(1_000_000.0 - age, now=1_000_000.0) == text


def test_ago_none() -> None:
    assert ago(None) == "-"


def test_render_status() -> None:
    out = render_status(status_view(sample_cluster()))
    assert out.splitlines() == [
        "leader:      ctl-1",
        "controllers: ctl-1, ctl-2",
        "nodes:       ready 1, cordoned 1, unhealthy 1, down 1",
        "workloads:   pending 2, running 1",
    ]


def test_render_status_empty() -> None:
    view: dict[str, Any] = {"leader": None, "controllers": [], "nodes": {"ready": 0},
                            "workloads": {"pending": 0}}
    assert render_status(view).splitlines() == [
        "leader:      (none)", "controllers: (none)", "nodes:       none",
        "workloads:   none"]


def test_render_nodes() -> None:
    lines = render_nodes(all_nodes(sample_cluster())).splitlines()
    assert lines[0].split() == ["NAME", "STATE", "ADDRESS", "GPUS", "USED", "GPUS", "HEALTHY",
                                "WORKLOADS", "LABELS", "REASON"]
    rows = [line.split() for line in lines[1:]]
    assert rows == [["a", "ready", "-", "2/4", "3/4", "1", "rack=r1", "-"],
                    ["b", "cordoned", "-", "0/2", "2/2", "0", "-", "-"],
                    ["c", "down", "-", "0/1", "1/1", "0", "-", "-"],
                    ["d", "unhealthy", "-", "0/1", "1/1", "0", "-", "checkpoint", "filesystem",
                     "read-only"]]


def test_render_workloads_lists_gang_members() -> None:
    gang = {"id": "g-1", "state": "running", "node": "a", "epoch": 9, "restarts": 0,
            "gpus": ["GPU-a-0"], "checkpoint": {"step": 20, "epoch": 9, "path": "/ck"},
            "nodes": 2, "gpus_requested": 2, "reason": "running", "members": [
                {"rank": 0, "node": "a", "state": "running", "gpus": ["GPU-a-0"]},
                {"rank": 1, "node": "b", "state": "starting", "gpus": ["GPU-b-0"]}]}
    waiting = {"id": "w-1", "state": "pending", "node": None, "epoch": None, "restarts": 0,
               "gpus": [], "checkpoint": None, "nodes": 4, "members": [], "gpus_requested": 32,
               "reason": "gang of 4: only 2 of 4 nodes"}
    rows = [line.split() for line in render_workloads([gang, waiting]).splitlines()[1:]]
    assert rows[0] == ["g-1", "running", "0:a(running)", "1:b(starting)", "9", "0", "2/2",
                       "step", "20", "running"]
    assert rows[1][:9] == ["w-1", "pending", "(gang", "of", "4)", "-", "0", "0/32", "-"]


def test_render_nodes_says_why_a_node_or_gpu_is_bad() -> None:
    node = {"name": "n", "state": "unhealthy", "labels": {}, "workloads": [],
            "reason": "GPU 0: xid 79: GPU has fallen off the bus",
            "gpus": [{"healthy": False, "allocated_to": None, "reason": "GPU 0: xid 79"}]}
    gpu_only = {**node, "state": "ready", "reason": "",
                "gpus": [{"healthy": False, "allocated_to": None, "reason": "GPU 0: xid 48"}]}
    lines = render_nodes([node, gpu_only]).splitlines()
    assert lines[1].endswith("GPU 0: xid 79: GPU has fallen off the bus")
    assert lines[2].rstrip().endswith("GPU 0: xid 48")


def test_render_workloads() -> None:
    lines = render_workloads(all_workloads(sample_cluster())).splitlines()
    assert lines[0].split() == ["ID", "STATE", "NODE", "EPOCH", "RESTARTS", "GPUS",
                                "CHECKPOINT", "REASON"]
    assert [line.split() for line in lines[1:]] == [
        ["wait", "pending", "-", "-", "0", "0/1", "-", "no", "room"],
        ["run", "running", "a", "20", "1", "2/2", "step", "40", "running"],
        ["new", "pending", "-", "-", "0", "0/1", "-", "waiting", "for", "the", "controller"],
    ]


def test_render_events() -> None:
    ts = 1_700_000_000.25
    events = [{"ts": ts, "kind": "failover", "workload": "run", "node": None,
               "message": "node a is down -> b"}]
    lines = render_events(events).splitlines()
    assert lines[0].split() == ["TIME", "KIND", "WORKLOAD", "NODE", "MESSAGE"]
    clock = time.strftime("%H:%M:%S", time.localtime(ts)) + ".250"
    assert lines[1].split() == [clock, "failover", "run", "-", "node", "a", "is", "down", "->",
                                "b"]
