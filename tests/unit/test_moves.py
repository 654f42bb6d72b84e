"""Planned moves (pure): request -> checkpoint-and-stop -> placement elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import Assignment, ClusterSnapshot, MoveRequest

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 1000.0


def cluster(move: MoveRequest | None = None, assignment: Assignment | None = None,
            statuses: tuple | None = None,  # type: ignore[type-arg]
            down: tuple[str, ...] = ()) -> ClusterSnapshot:
    snapshot = make_snapshot(
        [make_node("a", 2), make_node("b", 2), make_node("c", 1)], down=down,
        workloads=[submit("w", 1)],
        assignments=[assignment or placed("w", "a", [0], epoch=10)],
        statuses=(status("w", "a", 10),) if statuses is None else statuses)
    moves = {move.workload: move} if move else {}
    return dataclasses.replace(snapshot, moves=moves)


def moving(stopping: int = 10, to: str | None = None) -> Assignment:
    return Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=12,
                      stopping=stopping, move_to=to)


@pytest.mark.parametrize(("move", "kind", "event", "to"), [
    pytest.param(MoveRequest("w"), "move", "checkpoint-requested", None, id="anywhere"),
    pytest.param(MoveRequest("w", "b"), "move", "checkpoint-requested", "b", id="to-b"),
    pytest.param(MoveRequest("w", "a"), "refuse-move", "move-refused", None, id="already-there"),
    pytest.param(MoveRequest("w", "zz"), "refuse-move", "move-refused", None, id="no-such-node"),
])
def test_move_request(move: MoveRequest, kind: str, event: str, to: str | None) -> None:
    plan = reconcile(cluster(move), NOW)
    (action,) = plan.actions
    assert (action.kind, action.event, action.clear_move) == (kind, event, True)
    if kind == "move":
        assert action.assignment is not None
        assert (action.assignment.phase, action.assignment.node, action.assignment.stopping,
                action.assignment.move_to, action.assignment.gpus) == ("moving", "a", 10, to,
                                                                      (0,))
        assert action.expected_revision == 10


def test_move_refused_when_target_is_full() -> None:
    snapshot = make_snapshot([make_node("a", 2), make_node("c", 1)],
                             workloads=[submit("w", 1), submit("x", 1)],
                             assignments=[placed("w", "a", [0], epoch=10),
                                          placed("x", "c", [0], epoch=11)],
                             statuses=[status("w", "a", 10), status("x", "c", 11)])
    snapshot = dataclasses.replace(snapshot, moves={"w": MoveRequest("w", "c")})
    (action,) = reconcile(snapshot, NOW).actions
    assert action.kind == "refuse-move" and "c cannot take it" in action.why


def test_move_refused_when_not_running() -> None:
    pending = Assignment(workload="w", phase="pending", epoch=3)
    (action,) = reconcile(cluster(MoveRequest("w"), pending, statuses=()), NOW).actions
    assert action.kind == "refuse-move"


@pytest.mark.parametrize(("statuses", "down", "placed_on"), [
    pytest.param((status("w", "a", 10),), (), None, id="still-running-wait"),
    pytest.param((status("w", "a", 10, "stopping"),), (), None, id="stopping-wait"),
    pytest.param((status("w", "a", 10, "exited", exit_code=0),), (), "b", id="exited"),
    pytest.param((), (), "b", id="report-gone"),
    pytest.param((status("w", "a", 10),), ("a",), "b", id="node-died"),
])
def test_moving_places_only_after_the_instance_stopped(statuses: tuple, down: tuple[str, ...],  # type: ignore[type-arg]
                                                      placed_on: str | None) -> None:
    plan = reconcile(cluster(None, moving(), statuses=statuses, down=down), NOW)
    places = [a for a in plan.actions if a.kind == "place"]
    if placed_on is None:
        assert not places
        return
    (action,) = places
    assert action.assignment is not None and action.assignment.node == placed_on
    assert action.event == "moved" and action.assignment.stopping == 0
    assert action.assignment.avoid.get("a", 0) > NOW  # not back onto the drained node


def test_moving_to_a_named_node() -> None:
    plan = reconcile(cluster(None, moving(to="c"), statuses=()), NOW)
    (action,) = [a for a in plan.actions if a.kind == "place"]
    assert action.assignment is not None and action.assignment.node == "c"


def test_moving_gpus_stay_allocated_until_stopped() -> None:
    snapshot = make_snapshot([make_node("a", 1), make_node("b", 1)],
                             workloads=[submit("w", 1), submit("new", 1, submitted_at=5.0)],
                             assignments=[moving()], statuses=[status("w", "a", 10)])
    plan = reconcile(snapshot, NOW)
    (action,) = plan.actions
    assert action.workload == "new" and action.assignment is not None
    assert action.assignment.node == "b"  # a's GPU is still held by the stopping instance


@pytest.mark.parametrize(("assignment", "to", "down", "refusal"), [
    (None, None, (), ""),
    (None, "b", (), ""),
    (None, "a", (), "it already runs on a"),
    (None, "zz", (), "zz cannot take it (no such node)"),
    (None, "b", ("b",), "b cannot take it (it is down)"),
    (None, None, ("a",), "its node a is down (it fails over instead)"),
    (Assignment(workload="w", phase="pending"), None, (), "the workload is not running"),
    (moving(), "b", (), "the workload is not running"),
])
def test_move_refusal_is_what_the_leader_would_answer(assignment: Assignment | None,
                                                      to: str | None, down: tuple[str, ...],
                                                      refusal: str) -> None:
    from hafo.decisions.moves import move_refusal

    snapshot = cluster(assignment=assignment, down=down)
    assert move_refusal(snapshot, "w", to, NOW) == refusal


@pytest.mark.parametrize(("wid", "to", "node", "expected"), [
    ("w", None, None, None),
    ("w", "b", None, None),
    ("w", "a", None, ("it already runs on a", False)),
    ("w", "zz", None, ("no node 'zz'", True)),
    ("w", None, "zz", ("no node 'zz'", True)),
    ("w", None, "b", ("it does not run on b", False)),
    ("nope-000000", None, None, ("no workload 'nope-000000'", True)),
])
def test_requested_move_refusal_is_the_one_rule_of_cli_and_api(
        wid: str, to: str | None, node: str | None,
        expected: tuple[str, bool] | None) -> None:
    """What ``hafo migrate`` (exit 5 / 4) and the API (409 / 404) both answer."""
    from hafo.decisions.moves import MoveRefusal, requested_move_refusal

    found = requested_move_refusal(cluster(), wid, to, node, NOW)
    assert found == (MoveRefusal(*expected) if expected else None)
