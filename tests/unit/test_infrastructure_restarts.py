"""Infrastructure is not the workload's fault; a node name has one holder. Pure, table-driven.

- an instance fenced (deadline, lease loss) or lost with its guard restarts in place without
  counting toward ``restart.max_restarts``, without backoff and without excluding its node;
- a node registered again by a new claimant restarts the instances of the previous holder;
- a planned move or preemption leaves no cool-down on the node it left;
- who may hold a node name (``decide_claim``) and which epochs an agent may start.
"""

from __future__ import annotations

import dataclasses

import pytest

from hafo.controller.metrics import classify
from hafo.decisions.claim import ClaimView, decide_claim, may_start_epoch
from hafo.decisions.instances import plan_instances
from hafo.decisions.plan import Cause
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import (
    Assignment,
    ClusterSnapshot,
    InstanceEnd,
    InstanceStatus,
    Liveness,
    instance_end,
)
from hafo.model.spec import RestartPolicy

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 10_000.0
BUDGET_SPENT = (NOW - 3, NOW - 2, NOW - 1)  # three restarts in the window: the next moves


def exited(end: InstanceEnd | None, exit_code: int = -9) -> InstanceStatus:
    return dataclasses.replace(status("w", "a", 10, "exited", exit_code=exit_code,
                                      finished_at=NOW - 0.1), ended=end)


def on_a(*statuses: InstanceStatus, claimed: int = 0, restarts: tuple[float, ...] = (),
         failed_on: dict[str, float] | None = None) -> ClusterSnapshot:
    snapshot = make_snapshot(
        [make_node("a"), make_node("b")],
        workloads=[submit("w", restart=RestartPolicy(max_restarts=3, window=600))],
        assignments=[placed("w", "a", [0], epoch=10, restarts=len(restarts),
                            restart_times=restarts, failed_on=failed_on or {})],
        statuses=statuses)
    alive = dict(snapshot.alive)
    alive["a"] = dataclasses.replace(alive["a"], claimed=claimed)
    return dataclasses.replace(snapshot, alive=alive)


@pytest.mark.parametrize("end", [InstanceEnd.FENCED, InstanceEnd.GUARD_LOST])
def test_infrastructure_end_restarts_in_place_uncounted_even_past_the_budget(
        end: InstanceEnd) -> None:
    snapshot = on_a(exited(end), restarts=BUDGET_SPENT, failed_on={"b": NOW + 5})
    (action,) = reconcile(snapshot, NOW).actions
    new = action.assignment
    assert (action.kind, action.event, action.expected_revision) == ("place", "restarted", 10)
    assert new is not None and new.node == "a"
    assert (new.restarts, new.restart_times) == (3, BUDGET_SPENT), "not counted"
    assert dict(new.failed_on) == {"b": NOW + 5} and not new.avoid, "no exclusion, no cool-down"
    assert new.not_before == 0.0
    assert action.cause is Cause.INFRASTRUCTURE
    assert classify(action) == ("restart", "infrastructure")


@pytest.mark.parametrize(("end", "code"), [(InstanceEnd.EXIT, -9), (None, -9),
                                           (InstanceEnd.EXIT, 3)])
def test_the_workloads_own_failure_still_counts(end: InstanceEnd | None, code: int) -> None:
    (action,) = reconcile(on_a(exited(end, code), restarts=BUDGET_SPENT), NOW).actions
    new = action.assignment
    assert new is not None and new.node == "b" and new.restarts == 4
    assert new.failed_on.get("a", 0) > NOW, "past the budget: moved and excluded"


def test_a_fenced_instance_that_exited_zero_is_complete() -> None:
    (action,) = reconcile(on_a(exited(InstanceEnd.FENCED, 0)), NOW).actions
    assert (action.kind, action.event) == ("finish", "completed")


@pytest.mark.parametrize(("claimed", "restarts"), [
    pytest.param(10, True, id="claimed-at-the-epoch"),
    pytest.param(50, True, id="claimed-after"),
    pytest.param(9, False, id="claimed-before-the-epoch"),
    pytest.param(0, False, id="agent-without-claims"),
])
def test_a_node_claimed_anew_restarts_the_previous_holders_instances(
        claimed: int, restarts: bool) -> None:
    snapshot = on_a(status("w", "a", 10), claimed=claimed, restarts=BUDGET_SPENT)
    actions = reconcile(snapshot, NOW).actions
    if not restarts:
        assert not actions
        return
    (action,) = actions
    assert action.assignment is not None
    assert (action.event, action.assignment.node, action.assignment.restarts) == \
        ("restarted", "a", 3)
    assert "registered again" in action.why


def moving(cause: str | None, move_to: str | None = None) -> Assignment:
    return Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=12,
                      stopping=10, move_to=move_to, cause=cause)  # type: ignore[arg-type]


@pytest.mark.parametrize(("cause", "keeps_cooldown"), [
    ("planned", False), ("preempted", False), ("node-unhealthy", True),
    ("gpu-unhealthy", True), ("gpu-degraded", True), (None, True),
])
def test_only_a_node_that_went_bad_is_avoided_after_a_move(cause: str | None,
                                                          keeps_cooldown: bool) -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                             assignments=[moving(cause)])
    (action,) = reconcile(snapshot, NOW).actions
    assert action.assignment is not None and action.assignment.node == "b", "left a"
    assert ("a" in action.assignment.avoid) is keeps_cooldown


def test_after_drain_and_uncordon_the_node_is_as_attractive_as_any() -> None:
    """w moved off a (drained, then uncordoned); the next workload goes to the emptiest node,
    which is a again."""
    snapshot = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                             assignments=[moving("planned")])
    (move,) = reconcile(snapshot, NOW).actions
    assert move.assignment is not None
    after = dataclasses.replace(
        snapshot, workloads={**snapshot.workloads, "next": submit("next", submitted_at=9.0)},
        assignments={"w": dataclasses.replace(move.assignment, epoch=13)},
        statuses={("w", "b"): status("w", "b", 13)})
    (place,) = reconcile(after, NOW + 1).actions
    assert place.assignment is not None and place.assignment.node == "a"


def test_move_cause_and_instance_end_round_trip() -> None:
    assert Assignment.from_dict(moving("planned").to_dict(), 12).cause == "planned"
    assert Assignment.from_dict({"workload": "w", "phase": "placed", "cause": "bogus"},
                                1).cause is None
    report = exited(InstanceEnd.FENCED)
    assert InstanceStatus.from_dict(report.to_dict()) == report
    assert instance_end("no-such-end") is None and instance_end(None) is None
    assert Liveness.from_dict({"node": "a", "lease": 1, "since": 0}).claimed == 0


# -- who holds a node name ----------------------------------------------------------------

@pytest.mark.parametrize(("saved", "holder", "recorded", "live", "outcome", "lease"), [
    pytest.param(7, 7, 7, {7}, "adopt", 7, id="hitless-restart"),
    pytest.param(7, None, 7, {7}, "adopt", 7, id="own-key-deleted-adopt-and-put-back"),
    pytest.param(7, None, None, set(), "claim", None, id="own-lease-expired"),
    pytest.param(None, None, None, set(), "claim", None, id="first-start"),
    pytest.param(None, 7, 7, {7}, "wait", 7, id="records-lost-guards-may-run"),
    pytest.param(None, None, 7, {7}, "wait", 7, id="holders-key-deleted-lease-lives"),
    pytest.param(None, None, 7, set(), "claim", None, id="previous-holder-gone"),
    pytest.param(8, 7, 7, {7, 8}, "wait", 7, id="duplicate-name"),
    pytest.param(8, 7, 7, {7}, "wait", 7, id="other-holds-ours-expired"),
    pytest.param(8, None, 7, {8}, "adopt", 8, id="stale-record-of-a-dead-holder"),
])
def test_decide_claim(saved: int | None, holder: int | None, recorded: int | None,
                      live: set[int], outcome: str, lease: int | None) -> None:
    decision = decide_claim(ClaimView(saved, holder, recorded, frozenset(live)))
    assert (decision.outcome, decision.lease) == (outcome, lease)


@pytest.mark.parametrize(("epoch", "claimed", "recorded", "may"), [
    (11, 10, False, True), (10, 10, False, False), (5, 10, True, True), (5, 0, False, True),
])
def test_may_start_epoch(epoch: int, claimed: int, recorded: bool, may: bool) -> None:
    assert may_start_epoch(epoch, claimed, recorded) is may


def test_an_agent_never_starts_an_epoch_of_the_previous_holder() -> None:
    plan = plan_instances([("w", 10), ("x", 12)], {}, may_start=True, claimed=11)
    assert plan.start == (("x", 12),)
