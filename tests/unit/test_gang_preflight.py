"""A gang's pre-flight, the controller's side (``hafo.decisions.gang_preflight``): when a
placement asks for it, and what a report that blames members decides. Pure, table-driven,
injected time (docs/reference/gangs.md, "Pre-flight")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.gang_preflight import needs_preflight, preflight_blame
from hafo.model.cluster import Assignment, InstanceStatus, Member
from hafo.model.preflight import Preflight, RankFigures
from hafo.model.spec import parse_spec
from hafo.model.views import workload_view
from hafo.render import render_workload

from .conftest import status
from .test_gangs import NOW, by_workload, gang_cluster, members, placed_gang

PREFLIGHT = {"timeout": 30}


def spec(**fields: Any) -> Any:
    return parse_spec({"name": "g", "command": ["train"], "nodes": 3, **fields})


def figures(*computes: float) -> tuple[RankFigures, ...]:
    return tuple(RankFigures(rank=r, node="abc"[r], compute=c, joined=0.5)
                 for r, c in enumerate(computes))


def report(passed: bool = False, blamed: tuple[int, ...] = (1,),
           why: str = "rank 1's probe took 0.412s, 8.2x the other members' median 0.050s "
                      "(slowdown 3)") -> Preflight:
    return Preflight(passed=passed, blamed=() if passed else blamed, why="" if passed else why,
                     backend="gloo", small_latency=0.0004, large_bandwidth=1.2e9,
                     large_bytes=32 << 20, seconds=2.5, ranks=figures(0.05, 0.41, 0.05))


def with_report(node: str, preflight: Preflight | None, state: Any = "exited",
                **kwargs: Any) -> InstanceStatus:
    if state == "exited":
        kwargs.setdefault("exit_code", 86)
    return dataclasses.replace(status("g", node, 50, state, **kwargs), preflight=preflight)


# -- when ---------------------------------------------------------------------------------

def previous(*nodes: str, **kwargs: Any) -> Assignment:
    return placed_gang(*nodes, phase="moving", stopping=50, **kwargs)


@pytest.mark.parametrize(("fields", "before", "now", "expected"), [
    ({"preflight": PREFLIGHT}, None, "abc", True),                      # its first placement
    ({"preflight": PREFLIGHT}, previous("a", "b", "c"), "abc", False),  # in place: same nodes
    ({"preflight": PREFLIGHT}, previous("a", "b", "c"), "asc", True),   # a member replaced
    ({"preflight": PREFLIGHT}, previous("a", "b", "c"), "cba", False),  # same set, any order
    ({"preflight": PREFLIGHT},                                          # pending, forgotten
     Assignment(workload="g", phase="pending"), "abc", True),
    ({}, None, "abc", False),                                            # not asked for
    ({"preflight": PREFLIGHT, "warm": True}, None, "abc", True),        # warm: first only
    ({"preflight": PREFLIGHT, "warm": True}, previous("a", "b", "c"), "asc", False),
])
def test_needs_preflight(fields: dict[str, Any], before: Assignment | None, now: str,
                         expected: bool) -> None:
    assert needs_preflight(spec(**fields), before, members(*now)) is expected


def test_a_placed_gang_is_asked_for_it_on_new_nodes_only() -> None:
    snap = gang_cluster(assignment=Assignment(workload="g", phase="pending"), statuses=(),
                        preflight=PREFLIGHT)
    first = by_workload(snap)["g"]
    assert first.kind == "place" and first.assignment is not None
    assert first.assignment.preflight
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         preflight=True)
    replaced = by_workload(gang_cluster(down=("b",), assignment=moving, statuses=(
        status("g", "a", 50, "exited", exit_code=1),
        status("g", "c", 50, "exited", exit_code=1)), preflight=PREFLIGHT))["g"]
    assert replaced.assignment is not None and replaced.assignment.preflight
    restart = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="app-failed",
                          after_stop="restart", preflight=True)
    again = by_workload(gang_cluster(assignment=restart, statuses=tuple(
        status("g", n, 50, "exited", exit_code=1) for n in "abc"), preflight=PREFLIGHT))["g"]
    assert again.assignment is not None and not again.assignment.preflight


# -- what a report decides -------------------------------------------------------------------

def three(*reports: InstanceStatus | None) -> list[tuple[Member, InstanceStatus | None]]:
    return list(zip(members("a", "b", "c"), reports, strict=True))


@pytest.mark.parametrize(("reports", "blamed"), [
    ((None, None, None), None),
    ((with_report("a", report(passed=True), "running"), None, None), None),
    ((with_report("a", report()), None, None), (1,)),
    # the lowest rank's report decides (they all judged the same figures)
    ((None, with_report("b", report(blamed=(2,))), with_report("c", report(blamed=(0,)))),
     (2,)),
    ((with_report("a", report(blamed=(2, 1))), None, None), (1, 2)),
    # a failure that names no rank (the collective broke): not the pre-flight's to decide
    ((with_report("a", report(blamed=())), None, None), None),
    # a rank this gang does not have is ignored
    ((with_report("a", report(blamed=(7,))), None, None), None),
])
def test_preflight_blame(reports: tuple[InstanceStatus | None, ...],
                         blamed: tuple[int, ...] | None) -> None:
    blame = preflight_blame(three(*reports))
    assert (tuple(m.rank for m in blame.members) if blame else None) == blamed


def test_a_blamed_member_is_replaced_its_node_excluded_not_counted() -> None:
    current = placed_gang("a", "b", "c", preflight=True, restarts=2,
                          restart_times=(NOW - 100, NOW - 50))
    snap = gang_cluster(assignment=current, preflight=PREFLIGHT, statuses=(
        with_report("a", report()), with_report("b", None, "running"),
        with_report("c", report())))
    action = by_workload(snap)["g"]
    assert (action.kind, action.event) == ("move", "preflight-failed")
    moving = action.assignment
    assert moving is not None
    assert (moving.phase, moving.urgent, moving.leave, moving.cause) == (
        "moving", True, ("b",), "preflight")
    assert moving.failed_on == {"b": NOW + 600.0}
    assert (moving.restarts, moving.restart_times) == (2, (NOW - 100, NOW - 50))
    assert action.why.startswith("pre-flight failed: rank 1's probe took 0.412s")
    assert "replacing member 1 (on b), b excluded for 600s; not counted" in action.why
    # once every member stopped: member 1 goes to the spare, with a pre-flight again
    stopped = gang_cluster(assignment=moving, preflight=PREFLIGHT, statuses=tuple(
        with_report(n, report()) for n in "abc"))
    placed = by_workload(stopped)["g"]
    assert placed.assignment is not None
    assert [m.node for m in placed.assignment.members] == ["a", "s", "c"]
    assert placed.assignment.preflight and placed.assignment.restarts == 2


def test_a_report_of_a_gang_not_asked_for_it_decides_nothing() -> None:
    snap = gang_cluster(preflight=PREFLIGHT, statuses=(
        with_report("a", report(), "running"), status("g", "b", 50), status("g", "c", 50)))
    assert "g" not in by_workload(snap)


def test_hafo_show_tells_each_members_pre_flight() -> None:
    current = placed_gang("a", "b", "c", preflight=True)
    passed = report(passed=True)
    snap = gang_cluster(assignment=current, preflight=PREFLIGHT, statuses=tuple(
        with_report(n, passed, "running") for n in "abc"))
    view = workload_view(snap, "g")
    first = view["members"][1]["preflight"]
    assert first is not None
    assert (first["passed"], first["compute"], first["backend"]) == (True, 0.41, "gloo")
    text = render_workload(view, NOW)
    assert "PRE-FLIGHT" in text
    assert "passed in 2.5s, probe 0.410s, all-reduce 1.20 GB/s" in text
