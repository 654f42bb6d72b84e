"""Hang detection (``hang_timeout``): which rank stalled first, the gang's and a single
workload's decision, suspect nodes, and the controller's sightings. Pure, table-driven,
injected time (docs/reference/workloads.md, "Hang detection")."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.hangs import (
    HANG_SETTLE,
    after_hang,
    find_hang,
    find_straggler,
    suspect_after,
)
from hafo.decisions.observed import Observations, bounded, observe
from hafo.decisions.plan import Cause
from hafo.model.cluster import Assignment, InstanceStatus, Member, Pace, Stall
from hafo.model.spec import RestartPolicy, parse_spec

from .conftest import make_node, make_snapshot, placed, status, submit
from .test_gangs import by_workload, gang, placed_gang

NOW = 10_000.0


def stalled(node: str, rank: int | None, step: int | None, stalled_for: float = 4.2,
            stopped: bool = False, epoch: int = 50, wid: str = "g",
            state: Any = "running") -> InstanceStatus:
    return dataclasses.replace(status(wid, node, epoch, state), stalled=Stall(
        rank=rank, step=step, stalled_for=stalled_for, stopped=stopped))


def three(*reports: InstanceStatus | None) -> list[tuple[Member, InstanceStatus | None]]:
    return [(Member(rank=r, node=n), s) for r, (n, s) in enumerate(zip("abc", reports,
                                                                      strict=True))]


def seen_at(**when: float) -> dict[tuple[str, str, int], float]:
    return {("g", node, 50): t for node, t in when.items()}


# -- find_hang -----------------------------------------------------------------------------

@pytest.mark.parametrize(("reports", "seen", "blamed"), [
    # the rank that never reached the step's collective is behind the ones waiting in it
    ((stalled("a", 0, 31), stalled("b", 1, 30), stalled("c", 2, 31)), {}, 1),
    # one step everywhere: the stopped process is the cause, the others wait for it
    ((stalled("a", 0, 31), stalled("b", 1, 31), stalled("c", 2, 31, stopped=True)), {}, 2),
    # one step, none stopped: the earliest onset (sighting less stalled_for)
    ((stalled("a", 0, 31, 4.1), stalled("b", 1, 31, 6.0), stalled("c", 2, 31, 4.0)),
     {"a": NOW - 0.1, "b": NOW - 0.1, "c": NOW - 0.1}, 1),
    ((stalled("a", 0, 31, 4.0), stalled("b", 1, 31, 4.0), stalled("c", 2, 31, 4.0)),
     {"a": NOW - 0.3, "b": NOW - 0.2, "c": NOW - 0.9}, 2),
    # all alike: the lowest rank, so every controller decides the same
    ((stalled("a", 0, 31), stalled("b", 1, 31), stalled("c", 2, 31)), {}, 0),
    # a member whose ranks never reported is behind every one that did
    ((stalled("a", 0, 31), stalled("b", None, None), stalled("c", 2, 31)), {}, 1),
    # a rank number of its own (several ranks per member): the member is named with it
    ((stalled("a", 3, 31), stalled("b", 5, 29), stalled("c", 7, 31)), {}, 1),
])
def test_the_rank_that_stalled_first_is_named(reports: tuple[InstanceStatus, ...],
                                              seen: dict[str, float], blamed: int) -> None:
    hang = find_hang(three(*reports), seen_at(**seen), NOW)
    assert hang is not None
    assert hang.member.rank == blamed
    assert (hang.stalled_members, hang.members) == (3, 3)


def test_no_stall_no_hang_and_start_up_is_not_judged() -> None:
    assert find_hang(three(status("g", "a", 50), status("g", "b", 50), None), {}, NOW) is None
    starting = three(stalled("a", None, None), stalled("b", None, None),
                     stalled("c", None, None))
    assert find_hang(starting, {}, NOW + 100) is None


def test_it_waits_for_the_other_members_then_blames_the_one_that_stalled() -> None:
    reports = three(stalled("a", 0, 31), status("g", "b", 50), status("g", "c", 50))
    seen = seen_at(a=NOW)
    assert find_hang(reports, seen, NOW + HANG_SETTLE / 2, started_at=NOW - 60) is None
    hang = find_hang(reports, seen, NOW + HANG_SETTLE, started_at=NOW - 60)
    assert hang is not None and hang.member.rank == 0
    assert (hang.what, hang.detail) == (
        "member 0 hung", "rank 0 made no progress for 4.2s since step 31 (1 of 3 members "
        "stalled)")


def test_every_member_stalled_is_decided_at_once() -> None:
    reports = three(stalled("a", 0, 31), stalled("b", 1, 31, stopped=True),
                    stalled("c", 2, 31))
    hang = find_hang(reports, seen_at(a=NOW, b=NOW, c=NOW), NOW)
    assert hang is not None
    assert hang.what == "member 1 hung"
    assert hang.detail == ("rank 1 made no progress for 4.2s since step 31 (its process is "
                           "stopped) (3 of 3 members stalled)")


def test_only_running_instances_count() -> None:
    reports = three(stalled("a", 0, 31, state="stopping"), status("g", "b", 50), None)
    assert find_hang(reports, {}, NOW + 10) is None


# -- suspects --------------------------------------------------------------------------------

@pytest.mark.parametrize(("suspects", "node", "repeat", "kept"), [
    ({}, "a", False, {"a": NOW + 600}),
    ({"a": NOW + 5}, "a", True, {"a": NOW + 600}),
    ({"a": NOW - 1}, "a", False, {"a": NOW + 600}),  # its time passed
    ({"b": NOW + 5, "c": NOW - 1}, "a", False, {"a": NOW + 600, "b": NOW + 5}),
])
def test_suspect_after(suspects: dict[str, float], node: str, repeat: bool,
                       kept: dict[str, float]) -> None:
    assert suspect_after(suspects, node, NOW, 600.0) == (repeat, kept)


def test_a_first_hang_restarts_in_place_a_second_on_the_node_moves() -> None:
    policy = RestartPolicy()
    current = placed_gang("a", "b", "c")
    hang = find_hang(three(status("g", "a", 50), stalled("b", 1, 30), None), seen_at(b=NOW),
                     NOW + 5, started_at=NOW - 60)
    assert hang is not None
    after, suspects = after_hang(current, policy, "b", hang, NOW)
    assert after.kind == "restart" and after.restarts == 1 and suspects == {"b": NOW + 600}
    again = dataclasses.replace(current, suspects=suspects, restarts=1,
                                restart_times=after.restart_times)
    after2, _ = after_hang(again, policy, "b", hang, NOW + 30)
    assert after2.kind == "move"
    assert after2.failed_on == {"b": NOW + 30 + 600}
    assert "the second hang on b within 600s: moving to another node" in after2.why
    other, _ = after_hang(again, policy, "c", hang, NOW + 30)
    assert other.kind == "restart", "another node's first hang"


# -- the gang's decision ---------------------------------------------------------------------

def hung_gang(reports: tuple[InstanceStatus, ...], assignment: Assignment | None = None,
              hang_timeout: float | None = 4.0) -> Any:
    nodes = [make_node(n) for n in "abcd"] + [make_node("s", labels={"hafo.io/spare": "true"})]
    extra = {} if hang_timeout is None else {"hang_timeout": hang_timeout}
    return make_snapshot(nodes, workloads=[gang(**extra)],
                         assignments=[assignment or placed_gang("a", "b", "c")],
                         statuses=reports)


def test_a_hung_gang_stops_every_member_at_once_and_restarts_in_place() -> None:
    snap = hung_gang((stalled("a", 0, 31), stalled("b", 1, 30), stalled("c", 2, 31)))
    action = by_workload(snap, now=NOW)["g"]
    assert (action.kind, action.cause, action.event) == ("move", Cause.HUNG, "hung")
    moving = action.assignment
    assert moving is not None and moving.urgent and moving.after_stop == "restart"
    assert moving.suspects == {"b": NOW + 600}
    assert moving.restarts == 1 and moving.leave == ()
    assert moving.reason.startswith("member 1 hung on b: rank 1 made no progress for 4.2s "
                                    "since step 30 (3 of 3 members stalled); restart 1/3")
    # placed again in place once stopped, keeping the suspect
    stopped = hung_gang((), assignment=dataclasses.replace(moving, epoch=51))
    again = by_workload(stopped, now=NOW + 5)["g"]
    assert again.kind == "place" and again.assignment is not None
    assert [m.node for m in again.assignment.members] == ["a", "b", "c"]
    assert again.assignment.suspects == {"b": NOW + 600}


def test_a_second_hang_on_the_same_node_replaces_that_member_from_a_spare() -> None:
    suspect = placed_gang("a", "b", "c", suspects={"b": NOW + 500}, restarts=1,
                          restart_times=(NOW - 100,))
    snap = hung_gang((stalled("a", 0, 31), stalled("b", 1, 31, stopped=True),
                      stalled("c", 2, 31)), assignment=suspect)
    action = by_workload(snap, now=NOW)["g"]
    assert (action.kind, action.cause, action.event) == ("move", Cause.APP_FAILED, "app-failed")
    moving = action.assignment
    assert moving is not None and moving.leave == ("b",) and moving.urgent
    assert "the second hang on b" in moving.reason
    stopped = hung_gang((), assignment=dataclasses.replace(moving, epoch=51))
    again = by_workload(stopped, now=NOW + 5)["g"]
    assert again.assignment is not None
    assert [m.node for m in again.assignment.members] == ["a", "s", "c"]


def test_without_hang_timeout_a_stall_report_changes_nothing() -> None:
    snap = hung_gang((stalled("a", 0, 31), stalled("b", 1, 30), stalled("c", 2, 31)),
                     hang_timeout=None)
    assert "g" not in by_workload(snap, now=NOW)


def test_a_gang_with_one_stalled_member_waits_for_the_settle_time() -> None:
    reports = (stalled("a", 0, 31), status("g", "b", 50), status("g", "c", 50))
    snap = hung_gang(reports)
    first = observe(Observations(), snap, NOW)
    assert "g" not in by_workload(snap, now=NOW, seen=first)
    later = observe(first, snap, NOW + HANG_SETTLE)
    action = by_workload(snap, now=NOW + HANG_SETTLE, seen=later)["g"]
    assert action.cause is Cause.HUNG and "member 0 hung" in action.why


# -- a single workload -----------------------------------------------------------------------

def test_a_hung_single_workload_restarts_in_place_then_moves() -> None:
    nodes = [make_node(n) for n in "ab"]
    spec = {"hang_timeout": 5.0}
    snap = make_snapshot(nodes, workloads=[submit("w", **spec)],
                         assignments=[placed("w", "a", epoch=50)],
                         statuses=[stalled("a", 0, 7, wid="w")])
    action = by_workload(snap, now=NOW)["w"]
    assert (action.cause, action.event) == (Cause.HUNG, "hung")
    assert action.assignment is not None and action.assignment.urgent
    assert action.assignment.reason.startswith("hung on a: rank 0 made no progress for 4.2s "
                                               "since step 7; restart 1/3 in place")
    assert action.assignment.suspects == {"a": NOW + 600}
    repeat = placed("w", "a", epoch=50, suspects={"a": NOW + 100})
    snap2 = make_snapshot(nodes, workloads=[submit("w", **spec)], assignments=[repeat],
                          statuses=[stalled("a", 0, 7, wid="w")])
    moved = by_workload(snap2, now=NOW)["w"]
    assert moved.cause is Cause.APP_FAILED and moved.assignment is not None
    assert moved.assignment.after_stop == "move" and "second hang on a" in moved.why


def test_a_single_workload_still_starting_is_not_judged() -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w", hang_timeout=5.0)],
                         assignments=[placed("w", "a", epoch=50)],
                         statuses=[stalled("a", None, None, wid="w")])
    assert "w" not in by_workload(snap, now=NOW)


# -- sightings and bounds ----------------------------------------------------------------------

def test_a_stall_is_seen_once_and_anew_when_it_changes() -> None:
    snap = hung_gang((stalled("a", 0, 31),))
    first = observe(Observations(), snap, NOW)
    assert first.stalled_since == {("g", "a", 50): NOW}
    same = observe(first, snap, NOW + 3)
    assert same.stalled_since == {("g", "a", 50): NOW}
    other = observe(same, hung_gang((stalled("a", 0, 32),)), NOW + 4)
    assert other.stalled_since == {("g", "a", 50): NOW + 4}
    gone = observe(other, hung_gang((status("g", "a", 50),)), NOW + 5)
    assert gone.stalled_since == {}


def test_a_previous_leaders_suspect_times_are_bounded() -> None:
    ahead = placed_gang("a", "b", "c", suspects={"b": NOW + 99_999})
    cut = bounded(ahead, NOW, RestartPolicy(), 60.0)
    assert cut.suspects == {"b": NOW + 600}


# -- the spec ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "error"), [
    (0.5, "spec.hang_timeout: must be >= 1"),
    (86401, "spec.hang_timeout: must be <= 86400"),
    ("10s", "spec.hang_timeout: must be a number"),
    (True, "spec.hang_timeout: must be a number"),
])
def test_hang_timeout_bad_values_name_the_field(value: object, error: str) -> None:
    with pytest.raises(Exception, match=error):
        parse_spec({"name": "w", "command": ["x"], "hang_timeout": value})


def test_hang_timeout_round_trips_and_is_left_out_when_unset() -> None:
    spec = parse_spec({"name": "w", "command": ["x"], "nodes": 2, "hang_timeout": 30})
    assert spec.hang_timeout == 30.0 and spec.to_dict()["hang_timeout"] == 30.0
    assert "hang_timeout" not in parse_spec({"name": "w", "command": ["x"]}).to_dict()


def test_the_views_say_a_running_gang_is_stalled_until_the_leader_acts() -> None:
    from hafo.model.views import workload_view
    snap = hung_gang((status("g", "a", 50), stalled("b", 1, 30, stopped=True),
                      status("g", "c", 50)))
    assert workload_view(snap, "g")["reason"] == (
        "running, but stalled on b: rank 1 made no progress for 4.2s since step 30 (its "
        "process is stopped)")
    starting = hung_gang((stalled("a", None, None), status("g", "b", 50),
                          status("g", "c", 50)))
    assert workload_view(starting, "g")["reason"] == "running"


def test_a_member_frozen_before_its_first_step_is_caught_once_another_progressed() -> None:
    """Chaos found it: a member SIGSTOPped right after its launch never reported a step; the
    other member progresses (so reports no stall): the gang is past its start-up all the
    same, and the silent member is the hung one."""
    other = dataclasses.replace(status("g", "b", 50), progressed=True)
    reports = [(Member(rank=0, node="a"), stalled("a", None, None)),
               (Member(rank=1, node="b"), other)]
    assert find_hang(reports, seen_at(a=NOW), NOW + HANG_SETTLE / 2, NOW - 60) is None
    hang = find_hang(reports, seen_at(a=NOW), NOW + HANG_SETTLE, NOW - 60)
    assert hang is not None and hang.member.rank == 0
    assert hang.detail == ("no rank reported progress for 4.2s since it started (1 of 2 "
                           "members stalled)")
    quiet = [(Member(rank=0, node="a"), stalled("a", None, None)),
             (Member(rank=1, node="b"), status("g", "b", 50))]
    assert find_hang(quiet, seen_at(a=NOW), NOW + 100) is None, "all still starting"



def test_a_member_still_starting_gets_the_settle_time_from_the_others_first_step() -> None:
    """false_positives.py found it: a member's start-up stall (torch imports longer than
    hang_timeout) was seen first; the other member's first step came later, and the member
    still starting was blamed at once, one step before its own first heartbeat."""
    other = dataclasses.replace(status("g", "b", 50), progressed=True)
    reports = [(Member(rank=0, node="a"), other),
               (Member(rank=1, node="b"), stalled("b", None, None))]
    seen = seen_at(b=NOW - 5)  # its start-up stall, seen long ago
    assert find_hang(reports, seen, NOW + 0.1, started_at=NOW) is None
    hang = find_hang(reports, seen, NOW + HANG_SETTLE, started_at=NOW)
    assert hang is not None and hang.member.rank == 1


def test_the_controller_sees_when_an_instance_is_past_its_start_up() -> None:
    starting = hung_gang((stalled("a", None, None), status("g", "b", 50)))
    first = observe(Observations(), starting, NOW)
    assert first.started == {}
    progressed = hung_gang((stalled("a", None, None),
                            dataclasses.replace(status("g", "b", 50), progressed=True)))
    second = observe(first, progressed, NOW + 2)
    assert second.started == {("g", 50): NOW + 2}
    assert observe(second, progressed, NOW + 9).started == {("g", 50): NOW + 2}


# -- stragglers (straggler_lag) -----------------------------------------------------------------

def paced(node: str, rank: int, compute: float, epoch: int = 50) -> InstanceStatus:
    return dataclasses.replace(status("g", node, epoch), pace=Pace(rank=rank, compute=compute))


@pytest.mark.parametrize(("reports", "lag", "blamed"), [
    ((paced("a", 0, 0.10), paced("b", 1, 0.62), paced("c", 2, 0.11)), 0.3, 1),
    ((paced("a", 0, 0.10), paced("b", 1, 0.35), paced("c", 2, 0.11)), 0.3, None),  # within
    ((paced("a", 0, 0.90), paced("b", 1, 0.62), paced("c", 2, 0.11)), 0.3, 0),  # the largest
    ((paced("a", 0, 0.10), paced("b", 1, 0.62), None), 0.3, None),  # not every member yet
    ((paced("a", 0, 0.10), paced("b", 1, 0.62), status("g", "c", 50)), 0.3, None),
    ((paced("a", 0, 1.00), paced("b", 1, 1.00), paced("c", 2, 1.00)), 0.01, None),
])
def test_the_straggler_is_the_member_slower_than_the_others_by_the_lag(
        reports: tuple[InstanceStatus | None, ...], lag: float, blamed: int | None) -> None:
    found = find_straggler(three(*reports), lag)
    assert (found.member.rank if found is not None else None) == blamed


def test_two_members_each_compare_with_the_other() -> None:
    pair = [(Member(rank=0, node="a"), paced("a", 0, 0.12)),
            (Member(rank=1, node="b"), paced("b", 3, 0.70))]
    found = find_straggler(pair, 0.25)
    assert found is not None and found.member.rank == 1
    assert (found.what, found.detail) == (
        "member 1 straggles", "rank 3 works 0.70s per step outside the collectives, 0.58s "
        "more than the other members (median 0.12s; straggler_lag 0.25s)")


def test_a_straggling_gang_restarts_in_place_then_replaces_the_member() -> None:
    nodes = [make_node(n) for n in "abcd"] + [make_node("s", labels={"hafo.io/spare": "true"})]
    reports = (paced("a", 0, 0.10), paced("b", 1, 0.62), paced("c", 2, 0.11))

    def snap(assignment: Assignment) -> Any:
        return make_snapshot(nodes, workloads=[gang(straggler_lag=0.3)],
                             assignments=[assignment], statuses=reports)
    action = by_workload(snap(placed_gang("a", "b", "c")), now=NOW)["g"]
    assert (action.cause, action.event) == (Cause.STRAGGLER, "straggler")
    moving = action.assignment
    assert moving is not None and moving.urgent and moving.cause == "straggler"
    assert moving.suspects == {"b": NOW + 600} and moving.leave == ()
    assert moving.reason.startswith("member 1 straggles on b: rank 1 works 0.62s per step")
    again = by_workload(snap(placed_gang("a", "b", "c", suspects={"b": NOW + 10})),
                        now=NOW)["g"]
    assert again.cause is Cause.APP_FAILED and again.assignment is not None
    assert again.assignment.leave == ("b",)
    assert "b was suspect already (a hang or straggler within 600s): moving" in again.why


def test_without_straggler_lag_paces_change_nothing() -> None:
    snap = hung_gang((paced("a", 0, 0.10), paced("b", 1, 5.0), paced("c", 2, 0.11)),
                     hang_timeout=None)
    assert "g" not in by_workload(snap, now=NOW)


@pytest.mark.parametrize(("spec", "error"), [
    ({"straggler_lag": 0.5}, "spec.straggler_lag: compares a gang's members: needs nodes of "
                             "2 or more"),
    ({"nodes": 2, "straggler_lag": 0.001}, "spec.straggler_lag: must be >= 0.01"),
    ({"nodes": 2, "straggler_lag": "fast"}, "spec.straggler_lag: must be a number"),
])
def test_straggler_lag_bad_values_name_the_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(Exception, match=error):
        parse_spec({"name": "w", "command": ["x"], **spec})


# -- the agent's verdicts, pure ---------------------------------------------------------------

def progress_of(*ranks: tuple[int, int, float]) -> dict[int, Any]:
    from hafo.model.progress import Heartbeat
    return {rank: (Heartbeat(step=step, epoch=50, t=0.0, pid=100 + rank, rank=rank), changed)
            for rank, step, changed in ranks}


@pytest.mark.parametrize(("ranks", "now", "expected"), [
    ({}, 103.9, None),  # still within hang_timeout of the first sighting
    ({}, 104.0, (Stall(rank=None, step=None, stalled_for=4.0), None)),
    (progress_of((0, 12, 101.0), (1, 11, 100.5)), 104.4, None),
    (progress_of((0, 12, 101.0), (1, 11, 100.5)), 104.5,
     (Stall(rank=1, step=11, stalled_for=4.0), 101)),
    # the same last change: the lower step is the oldest
    (progress_of((0, 12, 100.5), (1, 11, 100.5)), 105.0,
     (Stall(rank=1, step=11, stalled_for=4.5), 101)),
])
def test_oldest_stall(ranks: dict[int, Any], now: float, expected: object) -> None:
    from hafo.decisions.hangs import oldest_stall
    assert oldest_stall(ranks, 100.0, now, 4.0) == expected
