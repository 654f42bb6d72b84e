"""Infrastructure is not the workload's fault; a node name has one holder. Pure, table-driven.

- an instance fenced (deadline, lease loss) or lost with its guard restarts in place without
  counting toward ``restart.max_restarts`` and without excluding its node: the first of a row
  at once, a row of quick ones backing off (1 s doubling to 30 s, from the controller's
  sighting of each end);
- a node registered again by a new claimant restarts the instances of the previous holder;
- a planned move or preemption leaves no cool-down on the node it left;
- who may hold a node name (``decide_claim``) and which epochs an agent may start.
"""

from __future__ import annotations

import dataclasses

import pytest

from hafo.controller.metrics import classify
from hafo.decisions.claim import ClaimView, decide_claim, may_start_epoch
from hafo.decisions.failures import QUICK_RUN, uncounted_backoff
from hafo.decisions.instances import plan_instances
from hafo.decisions.observed import Observations, observe
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
         failed_on: dict[str, float] | None = None, quick: int = 0) -> ClusterSnapshot:
    snapshot = make_snapshot(
        [make_node("a"), make_node("b")],
        workloads=[submit("w", restart=RestartPolicy(max_restarts=3, window=600))],
        assignments=[placed("w", "a", [0], epoch=10, restarts=len(restarts),
                            restart_times=restarts, failed_on=failed_on or {},
                            quick_restarts=quick)],
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


# Issue 28, finding 4: "guard did not start" (uncounted) restarted at once, every time: a
# guard that never starts looped at ten epochs a second. Every restart path backs off.
@pytest.mark.parametrize(("streak", "ran_for", "after"), [
    pytest.param(0, None, (1, 0.0), id="first-of-a-row-at-once"),
    pytest.param(1, None, (2, 1.0), id="second-quick-1s"),
    pytest.param(2, 5.0, (3, 2.0), id="third-quick-2s"),
    pytest.param(5, None, (6, 16.0), id="sixth-16s"),
    pytest.param(9, None, (10, 30.0), id="capped-30s"),
    pytest.param(9, QUICK_RUN, (1, 0.0), id="a-long-run-ends-the-row"),
])
def test_uncounted_backoff(streak: int, ran_for: float | None,
                           after: tuple[int, float]) -> None:
    assert uncounted_backoff(streak, ran_for) == after


@pytest.mark.parametrize("end", [InstanceEnd.GUARD_LOST, InstanceEnd.FENCED])
@pytest.mark.parametrize(("quick", "seen_ago", "waits"), [
    pytest.param(0, 0.0, False, id="first-at-once"),
    pytest.param(1, 0.5, True, id="second-waits-1s"),
    pytest.param(1, 1.0, False, id="second-after-1s"),
    pytest.param(4, 7.9, True, id="fifth-waits-8s"),
    pytest.param(4, 8.0, False, id="fifth-after-8s"),
    pytest.param(20, 29.0, True, id="long-row-waits-30s"),
])
def test_uncounted_restarts_back_off_too(end: InstanceEnd, quick: int, seen_ago: float,
                                         waits: bool) -> None:
    snapshot = on_a(exited(end), quick=quick)
    seen = Observations(ended={("w", "a", 10): NOW - seen_ago})
    actions = reconcile(snapshot, NOW, seen=seen).actions
    assert (not actions) == waits
    if not waits:
        (action,) = actions
        assert action.assignment is not None and action.assignment.quick_restarts == quick + 1
        assert action.assignment.restarts == 0, "still not counted"


def test_a_guard_that_never_starts_restarts_at_a_bounded_rate() -> None:
    """Each epoch's guard never starts (reported exited at once, guard lost): simulated for
    10 minutes of cycles every 0.1 s, the workload is restarted about 25 times, not 6000."""
    now, epoch, quick, restarts = NOW, 10, 0, 0
    seen = Observations()
    while now < NOW + 600:
        snapshot = make_snapshot(
            [make_node("a")], workloads=[submit("w")],
            assignments=[placed("w", "a", [0], epoch=epoch, quick_restarts=quick)],
            statuses=[dataclasses.replace(status("w", "a", epoch, "exited", exit_code=None),
                                          ended=InstanceEnd.GUARD_LOST)])
        seen = observe(seen, snapshot, now)
        actions = reconcile(snapshot, now, seen=seen).actions
        if actions:
            (action,) = actions
            assert action.assignment is not None
            quick, epoch, restarts = action.assignment.quick_restarts, epoch + 1, restarts + 1
        now += 0.1
    assert restarts <= 30


def test_the_registered_again_restart_backs_off_from_its_sighting() -> None:
    snapshot = on_a(status("w", "a", 10), claimed=10, quick=2)
    assert not reconcile(snapshot, NOW, seen=Observations(ended={("w", "a", 10): NOW - 1}))
    (action,) = reconcile(snapshot, NOW, seen=Observations(ended={("w", "a", 10): NOW - 2}))\
        .actions
    assert action.cause is Cause.INFRASTRUCTURE and "after a 2s backoff" in action.why
