"""Warm gangs (``warm: true``): the survivors of a lost member park instead of stopping, a
parked member counts as stopped only once it confirmed its park, and the next epoch keeps
their nodes and ranks. Pure, table-driven, injected time."""

from __future__ import annotations

import dataclasses

import pytest

from hafo.decisions.gangs import all_stopped, warm_park
from hafo.decisions.plan import Action, Cause
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import InstanceEnd, Member, StandbyRecord, with_standby
from hafo.model.spec import parse_spec

from .conftest import make_node, status
from .test_gangs import NOW, by_workload, gang_cluster, nodes_of, placed_gang


def test_a_lost_member_parks_the_survivors_of_a_warm_gang() -> None:
    action = by_workload(gang_cluster(down=("b",), warm=True, statuses=(
        status("g", "a", 50), status("g", "c", 50))))["g"]
    moving = action.assignment
    assert moving is not None and moving.phase == "moving" and moving.stopping == 50
    assert moving.park == ("a", "c")
    assert "park the members on a, c" in action.why


def test_a_gang_that_is_not_warm_parks_nobody() -> None:
    moving = by_workload(gang_cluster(down=("b",), statuses=(
        status("g", "a", 50), status("g", "c", 50))))["g"].assignment
    assert moving is not None and moving.park == ()


@pytest.mark.parametrize(("a", "c", "stopped"), [
    pytest.param("parked", "parked", True, id="both-parked"),
    pytest.param("parked", "stopping", False, id="one-still-parking"),
    pytest.param("parked", "running", False, id="one-not-asked-yet"),
    pytest.param("parked", "exited", True, id="one-parked-one-exited"),
    pytest.param("exited", "exited", True, id="both-exited"),
])
def test_a_parked_member_counts_as_stopped_only_when_asked_to_park(
        a: str, c: str, stopped: bool) -> None:
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         park=("a", "c"))
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        statuses=(status("g", "a", 50, a), status("g", "c", 50, c)))
    assert all_stopped(snap, moving) is stopped


def test_a_parked_report_from_a_member_not_asked_to_park_does_not_count() -> None:
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         park=("a",))
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        statuses=(status("g", "a", 50, "parked"), status("g", "c", 50, "parked")))
    assert not all_stopped(snap, moving)


def test_a_parked_report_of_another_epoch_does_not_count() -> None:
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         park=("a", "c"))
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        statuses=(status("g", "a", 50, "parked"), status("g", "c", 49, "parked"),
                                  ))
    # c's report is of epoch 49: of epoch 50 there is none, so c counts as never launched
    assert all_stopped(snap, moving)
    running = dataclasses.replace(snap, statuses={
        **snap.statuses, ("g", "c"): status("g", "c", 50, "running")})
    assert not all_stopped(running, moving)


def test_once_every_survivor_parked_the_lost_member_goes_to_a_spare_and_ranks_stay() -> None:
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         park=("a", "c"))
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        statuses=(status("g", "a", 50, "parked"), status("g", "c", 50, "parked")))
    action = by_workload(snap)["g"]
    assert (action.kind, nodes_of(action)) == ("place", ["a", "s", "c"])
    assert action.assignment is not None and action.assignment.park == ()
    assert [m.rank for m in action.assignment.members] == [0, 1, 2]


def test_a_member_exit_parks_the_others_and_the_exited_one_restarts() -> None:
    snap = gang_cluster(warm=True, statuses=(
        status("g", "a", 50), status("g", "b", 50, "exited", exit_code=3, finished_at=NOW),
        status("g", "c", 50)))
    moving = by_workload(snap)["g"].assignment
    assert moving is not None and moving.park == ("a", "c")


def test_a_member_ended_by_the_infrastructure_parks_the_others() -> None:
    ended = dataclasses.replace(status("g", "b", 50, "exited", exit_code=-9, finished_at=NOW),
                                ended=InstanceEnd.FENCED)
    snap = gang_cluster(warm=True, statuses=(status("g", "a", 50), ended, status("g", "c", 50)))
    moving = by_workload(snap)["g"].assignment
    assert moving is not None and moving.park == ("a", "c")


def test_a_planned_move_and_a_hang_park_nobody() -> None:
    # a planned move checkpoints every member (no lost work); a hang may be in any member
    assert warm_park(placed_gang("a", "b", "c"), False, "b") == ()
    assert warm_park(placed_gang("a", "b", "c"), True, "b") == ("a", "c")


@pytest.mark.parametrize(("spec", "error"), [
    ({"warm": True}, "spec.warm: keeps a gang's survivors: needs nodes of 2 or more"),
    ({"nodes": 2, "warm": "yes"}, "spec.warm: "),
])
def test_warm_bad_values_name_the_field(spec: dict[str, object], error: str) -> None:
    with pytest.raises(Exception, match=error):
        parse_spec({"name": "w", "command": ["x"], **spec})


def test_warm_is_off_unless_asked() -> None:
    assert not parse_spec({"name": "w", "command": ["x"], "nodes": 2}).warm
    assert parse_spec({"name": "w", "command": ["x"], "nodes": 2, "warm": True}).warm


# -- warm spares ----------------------------------------------------------------------------

def test_a_warm_gang_placed_gets_a_standby_on_the_spare() -> None:
    snap = gang_cluster(warm=True, assignment=placed_gang("a", "b", "c", phase="pending"),
                        statuses=())
    action = by_workload(snap)["g"]
    assert action.kind == "place" and action.assignment is not None
    assert [(s.rank, s.node) for s in action.assignment.standby] == [(-1, "s")]
    assert action.assignment.standby[0].gpus == (0, 1, 2, 3)  # what a member would take
    assert action.assignment.copy_nodes == (*action.assignment.nodes, "s")
    standby = action.assignment.on_node("s")
    assert standby is not None and standby.node == "s" and standby.member_on("s") is None


def test_a_gang_that_is_not_warm_gets_no_standby() -> None:
    snap = gang_cluster(assignment=placed_gang("a", "b", "c", phase="pending"), statuses=())
    action = by_workload(snap)["g"]
    assert action.assignment is not None and action.assignment.standby == ()
    assert action.assignment.on_node("s") is None


def test_the_standby_s_node_takes_the_lost_member_and_no_other_spare_is_left() -> None:
    moving = placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                         park=("a", "c"))
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        statuses=(status("g", "a", 50, "parked"), status("g", "c", 50, "parked")))
    action = by_workload(snap)["g"]
    assert nodes_of(action) == ["a", "s", "c"]
    assert action.assignment is not None and action.assignment.standby == ()


def test_no_standby_without_a_spare() -> None:
    snap = gang_cluster(warm=True, spare=False,
                        assignment=placed_gang("a", "b", "c", phase="pending"), statuses=())
    action = by_workload(snap)["g"]
    assert action.assignment is not None and action.assignment.standby == ()


def test_the_standby_stays_parked_while_the_gang_moves() -> None:
    standby = (Member(rank=-1, node="s", gpus=(0, 1, 2, 3)),)
    placed = dataclasses.replace(placed_gang("a", "b", "c"), standby=standby)
    snap = gang_cluster(down=("b",), warm=True, assignment=placed, statuses=(
        status("g", "a", 50), status("g", "c", 50)))
    moving = by_workload(snap)["g"].assignment
    assert moving is not None and moving.park == ("a", "c", "s")
    assert moving.copy_nodes == ("a", "b", "c", "s")  # its agent keeps its copy
    assert dataclasses.replace(moving, phase="pending").copy_nodes == ()


def test_the_lost_member_goes_to_its_standby_s_spare_first() -> None:
    standby = (Member(rank=-1, node="t", gpus=(0, 1, 2, 3)),)
    moving = dataclasses.replace(
        placed_gang("a", "b", "c", phase="moving", stopping=50, cause="member-lost",
                    park=("a", "c", "t")), standby=standby)
    snap = gang_cluster(down=("b",), assignment=moving, warm=True,
                        extra_nodes=(make_node("t", labels={"hafo.io/spare": "true"}),),
                        statuses=(status("g", "a", 50, "parked"), status("g", "c", 50, "parked")))
    action = by_workload(snap)["g"]
    assert nodes_of(action) == ["a", "t", "c"]  # not s, the first spare by name
    assert action.assignment is not None
    assert [s.node for s in action.assignment.standby] == ["s"]  # the other spare next


# -- a standby chosen after the placement (its spare was used up, a node came back) ----------

def test_a_placed_warm_gang_without_a_standby_gets_one_when_a_spare_is_free() -> None:
    snap = gang_cluster(warm=True)  # placed on a, b, c; the spare s idle; nothing to place
    actions = [a for a in reconcile(snap, NOW).actions if a.workload == "g"]
    assert [(a.kind, a.cause, a.event) for a in actions] == [
        ("standby", Cause.STANDBY, "standby")]
    action = actions[0]
    assert action.expected_revision == placed_gang("a", "b", "c").revision
    assert action.assignment is not None
    assert [(s.rank, s.node) for s in action.assignment.standby] == [(-1, "s")]
    # the gang's epoch stays: the assignment is the same but for its standby
    assert dataclasses.replace(action.assignment, standby=()) == placed_gang("a", "b", "c")


def test_no_standby_action_for_a_gang_that_has_one_or_is_not_warm() -> None:
    standby = (Member(rank=-1, node="s", gpus=(0, 1, 2, 3)),)
    has_one = gang_cluster(warm=True, assignment=dataclasses.replace(
        placed_gang("a", "b", "c"), standby=standby))
    assert not [a for a in reconcile(has_one, NOW).actions if a.kind == "standby"]
    cold = gang_cluster()
    assert not [a for a in reconcile(cold, NOW).actions if a.kind == "standby"]


def test_a_standby_whose_node_is_down_is_replaced_on_another_spare() -> None:
    standby = (Member(rank=-1, node="s", gpus=(0, 1, 2, 3)),)
    snap = gang_cluster(warm=True, down=("s",),
                        extra_nodes=(make_node("t", labels={"hafo.io/spare": "true"}),),
                        assignment=dataclasses.replace(placed_gang("a", "b", "c"),
                                                       standby=standby))
    actions = [a for a in reconcile(snap, NOW).actions if a.kind == "standby"]
    assert [[s.node for s in a.assignment.standby] for a in actions  # type: ignore[union-attr]
            ] == [["t"]]


def test_a_standby_record_is_folded_into_its_own_assignment_only() -> None:
    current = placed_gang("a", "b", "c")
    standby = (Member(rank=-1, node="s", gpus=(0,)),)
    record = StandbyRecord(revision=current.revision, members=standby)
    assert with_standby(current, record).standby == standby
    assert with_standby(current, dataclasses.replace(record, revision=1)) == current
    assert with_standby(dataclasses.replace(current, phase="pending"), record).standby == ()
    assert StandbyRecord.from_dict(record.to_dict()) == record


def test_a_standby_record_s_ops_leave_the_members_copies_alone() -> None:
    from hafo.controller.apply import _standby_ops
    from hafo.store import Delete, Keys, Put, codec

    keys = Keys("c")
    current = placed_gang("a", "b", "c")
    standby = (Member(rank=-1, node="t", gpus=(0,)),)
    action = Action(kind="standby", workload="g", cause=Cause.STANDBY, why="",
                    expected_revision=current.revision,
                    assignment=dataclasses.replace(current, standby=standby))
    ops = _standby_ops(keys, action, previous_nodes=("a", "b", "c", "s"))
    puts = {op.key: op.value for op in ops if isinstance(op, Put)}
    deletes = [op.key for op in ops if isinstance(op, Delete)]
    assert sorted(puts) == sorted([keys.standby("g"), keys.node_assignment("t", "g")])
    assert deletes == [keys.node_assignment("s", "g")]  # the old standby's copy only
    copy = codec.decode_assignment(puts[keys.node_assignment("t", "g")], 99)
    assert copy.revision_of == current.revision and copy.on_node("t") is not None


def test_the_standby_key_parses_back() -> None:
    from hafo.store import Keys

    keys = Keys("c")
    parsed = keys.parse(keys.standby("g-1"))
    assert (parsed.kind, parsed.workload) == ("standby", "g-1")
