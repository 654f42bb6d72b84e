"""``hafo workloads`` with its REASON column and allocated/requested GPUs, and the detail
views ``hafo workloads WORKLOAD`` and ``hafo nodes NODE``, rendered from the views."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.model.cluster import Assignment, Gpu, Member, mig_index
from hafo.model.views import all_workloads, node_view, workload_view
from hafo.render import (
    MAX_REASON,
    MIN_REASON,
    render_node,
    render_workload,
    render_workloads,
    shorten,
)

from .conftest import make_node, make_snapshot, placed, sample_cluster, status, submit

TAIL = ('Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'nosuchmodule'\n")
FAILED = ("failed: exited with code 1 on a (no restarts): ModuleNotFoundError: No module named "
          "'nosuchmodule'; no other node can run it; it asked for the GPU model H100 in rack "
          "r7, which no ready node has")
#: The common failure: whole in the table, its last line of stderr included (the README).
SHORT = ("failed: exited with code 1 on a (no restarts): ModuleNotFoundError: No module named "
         "'nosuchmodule'")


def failed_workload(reason: str = FAILED) -> dict[str, Any]:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[Assignment(workload="w", phase="failed", reason=reason)],
                         statuses=[dataclasses.replace(
                             status("w", "a", 10, "exited", exit_code=1), stderr_tail=TAIL)])
    return dict(workload_view(snap, "w"))


@pytest.mark.parametrize(("text", "width", "shown"), [
    ("abcdef", None, "abcdef"),
    ("abcdef", 6, "abcdef"),
    ("abcdefgh", 6, "abc..."),
    ("ab  cdefgh", 6, "ab..."),
])
def test_shorten(text: str, width: int | None, shown: str) -> None:
    assert shorten(text, width) == shown


def test_the_reason_column_is_cut_without_a_terminal_too() -> None:
    """Piped or redirected, the table still fits a screen: the reason in full is in --json
    and the detail view."""
    lines = render_workloads([failed_workload()]).splitlines()
    assert lines[0].split()[-1] == "REASON"
    reason = lines[1][lines[0].index("REASON"):]
    assert len(reason) <= MAX_REASON and reason == FAILED.split("; ")[0] + "; ..."
    assert lines[1].split()[:6] == ["w", "failed", "-", "-", "0", "0/1"]


def test_a_failure_and_its_last_stderr_line_show_whole() -> None:
    lines = render_workloads([failed_workload(SHORT)]).splitlines()
    assert lines[1][lines[0].index("REASON"):] == SHORT


@pytest.mark.parametrize("width", [100, 120, 160])
def test_the_reason_column_fits_the_terminal(width: int) -> None:
    lines = render_workloads([failed_workload()], width).splitlines()
    assert all(len(line) <= width for line in lines)
    start = lines[0].index("REASON")
    assert lines[1][start:].endswith("...")
    assert FAILED.startswith(lines[1][start:-3])


def test_a_narrow_terminal_still_gets_some_reason() -> None:
    line = render_workloads([failed_workload()], 20).splitlines()[1]
    reason = line[line.index("failed: "):]
    assert len(reason) == MIN_REASON and reason.endswith("...")


def test_a_running_workload_shows_no_stale_failure() -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w", 2)],
                         assignments=[placed("w", "a", [0, 1], epoch=11, restarts=1,
                                             reason="exited with code -9 on a; restart 1/3 in "
                                                    "place")],
                         statuses=[status("w", "a", 11)])
    row = render_workloads(all_workloads(snap)).splitlines()[1]
    assert row.split()[:6] == ["w", "running", "a", "11", "1", "2/2"]
    assert row.endswith("running again after: exited with code -9 on a; restart 1/3 in place")


def test_a_service_row_and_its_replicas_reasons() -> None:
    view: dict[str, Any] = {
            "id": "svc", "state": "degraded", "node": None, "epoch": None, "restarts": 0,
            "gpus": [], "checkpoint": None, "reason": "1 of 2 replicas ready",
            "replicas": {"ready": 1, "desired": 2, "current": 1, "items": [
                {"id": "svc.1", "state": "running", "node": "a", "ready": True,
                 "current": True, "retiring": False, "restarts": 0, "reason": "running"},
                {"id": "svc.2", "state": "pending", "node": None, "ready": False,
                 "current": False, "retiring": False, "restarts": 0, "reason": "no room"}]}}
    lines = render_workloads([view]).splitlines()
    assert lines[1].endswith("1 of 2 replicas ready")
    assert lines[2].endswith("ready: running")
    assert lines[3].endswith("not ready, old spec: no room")


def fields(text: str) -> dict[str, str]:
    """The ``key: value`` lines of a detail view."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and " " not in key and not line.startswith(" "):
            out[key] = value.strip()
    return out


def test_workload_detail_of_a_failed_workload() -> None:
    text = render_workload(failed_workload(), now=100.0)
    shown = fields(text)
    assert shown["workload"] == "w (w)"
    assert shown["state"] == "failed"
    assert shown["reason"] == FAILED  # in full
    assert shown["gpus"] == "0 of 1 allocated"
    assert shown["checkpoint"] == "none yet"
    assert "  | ModuleNotFoundError: No module named 'nosuchmodule'" in text.splitlines()
    assert "hafo show w" in text and "hafo logs w" in text


def test_workload_detail_of_a_pending_gang_and_a_running_one() -> None:
    gang = submit("g", 8, nodes=8)
    snap = make_snapshot([make_node("a", 8)], workloads=[gang],
                         assignments=[Assignment(workload="g", phase="pending",
                                                 reason="gang of 8: only 1 of 8 nodes")])
    shown = fields(render_workload(workload_view(snap, "g")))
    assert shown["gpus"] == "0 of 64 allocated"
    assert shown["node"] == "gang of 8"
    members = tuple(Member(rank=r, node=n, gpus=(0, 1)) for r, n in enumerate("ab"))
    two = submit("t", 2, nodes=2)
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[two],
                         assignments=[Assignment(workload="t", phase="placed", node="a",
                                                 gpus=(0, 1), epoch=30, members=members)],
                         statuses=[dataclasses.replace(status("t", "a", 30), ports={"http": 81}),
                                   status("t", "b", 30)])
    text = render_workload(workload_view(snap, "t"))
    shown = fields(text)
    assert shown["gpus"] == ("4 of 4 allocated: GPU 0 of a (GPU-a-0), GPU 1 of a (GPU-a-1), "
                             "GPU 0 of b (GPU-b-0), GPU 1 of b (GPU-b-1)")
    assert shown["node"] == "gang of 2, rank 0 on a"
    assert shown["ports"] == "http=81"
    assert shown["epoch"] == "30"
    assert any(line.split() == ["1", "b", "running", "GPU", "0", "(GPU-b-0),", "GPU", "1",
                                "(GPU-b-1)"] for line in text.splitlines())


def test_node_detail() -> None:
    snap = sample_cluster()
    view = node_view(snap, "a")
    text = render_node(view, [workload_view(snap, "run")])
    shown = fields(text)
    assert shown["node"] == "a (ready)"
    assert shown["labels"] == "rack=r1"
    assert shown["gpus"] == "2 of 4 allocated, 3 of 4 healthy"
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert rows[0][:2] == ["INDEX", "UUID"]
    assert rows[1][0] == "0" and rows[1][-2:] == ["run", "-"]
    assert rows[4][0] == "3" and "unhealthy" in rows[4]
    assert ["run", "run", "running", "2"] in rows


def test_node_detail_with_mig_devices_and_a_reason() -> None:
    node = dataclasses.replace(
        make_node("m", 0), healthy=False, reason="checkpoint filesystem read-only",
        api="http://127.0.0.1:9100", address="10.0.0.5",
        gpus=(Gpu(index=mig_index(0, 0), uuid="MIG-0", model="A100", memory_mib=9728,
                  profile="1g.10gb", parent=0, utilization=37.0),
              Gpu(index=mig_index(0, 1), uuid="MIG-1", model="A100", memory_mib=9728,
                  profile="1g.10gb", parent=0, degraded=True, reason="xid 48")))
    text = render_node(node_view(make_snapshot([node]), "m"))
    shown = fields(text)
    assert shown["node"] == "m (unhealthy)"
    assert shown["reason"] == "checkpoint filesystem read-only"
    assert shown["api"] == "http://127.0.0.1:9100" and shown["address"] == "10.0.0.5"
    assert "100 (1g.10gb of GPU 0)" in text and "37%" in text
    assert any("degraded" in line and line.rstrip().endswith("xid 48")
               for line in text.splitlines())
    assert shown["workloads"] == "0"
