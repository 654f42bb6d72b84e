"""The reconcile pipeline's stages, one by one (issue 30, item 0): assess's ``Settled``
reasons, admit's order, the default preemption policy (and that another one can be
injected), and the placement-failure counts with the text they render."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.admission import Admitted, admit, batch_order
from hafo.decisions.assessment import assess
from hafo.decisions.moves import latest_checkpoints
from hafo.decisions.observed import Observations, observe
from hafo.decisions.placement import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Unplaceable,
    capacity_from,
    place_batch,
    place_in_order,
    place_one,
)
from hafo.decisions.placement_failure import (
    Filtered,
    GangShortage,
    NodesFiltered,
    NoReadyNodes,
    Rule,
)
from hafo.decisions.plan import FAILED_NODE_COOLDOWN, Settled, SettledReason
from hafo.decisions.preemption_policy import PRIORITY_ONLY, PriorityOnly, Victim
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import Assignment, ClusterSnapshot, Member, Submission
from hafo.model.spec import WorkloadSpec

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit

NOW = 10_000.0


def settled(snapshot: ClusterSnapshot, wid: str = "w", *, allow_failover: bool = True,
            seen: Observations | None = None) -> object:
    seen = seen if seen is not None else observe(Observations(), snapshot, NOW)
    return assess(snapshot, wid, NOW, FAILED_NODE_COOLDOWN, allow_failover,
                  latest_checkpoints(snapshot), seen)


def one(*statuses: Any, assignment: Assignment | None = None, down: tuple[str, ...] = (),
        workload: Submission | None = None, **extra: Any) -> ClusterSnapshot:
    """w, placed on a (epoch 10, GPU 0) unless told otherwise."""
    return make_snapshot([make_node("a"), make_node("b")], down=down,
                         workloads=[workload or submit("w")],
                         assignments=[assignment or placed("w", "a")],
                         statuses=statuses, **extra)


def service() -> Submission:
    spec = WorkloadSpec(name="web", command=("serve",), replicas=2, ports={"http": 0})
    return Submission(id="w", spec=spec, submitted_at=0.0)


def moving(**kwargs: Any) -> Assignment:
    """w being stopped on a (instance 10) for a planned move."""
    return Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=10,
                      stopping=10, cause="planned", **kwargs)


def gang_moving(**kwargs: Any) -> Assignment:
    ms = tuple(Member(rank=r, node=n, gpus=(0,)) for r, n in enumerate("ab"))
    return Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=50,
                      stopping=50, members=ms, cause="member-lost", **kwargs)


# -- 1. assess: Settled -------------------------------------------------------------------

@pytest.mark.parametrize(("snapshot", "kwargs", "expected"), [
    pytest.param(one(workload=dataclasses.replace(submit("w"), service="svc", retiring=NOW)),
                 {}, Settled(SettledReason.RETIRING), id="retiring-replica"),
    pytest.param(one(workload=service(), assignment=placed("x", "a")), {},
                 Settled(SettledReason.SERVICE), id="a-service-is-its-replicas"),
    pytest.param(one(assignment=Assignment(workload="w", phase="completed", node=None)), {},
                 Settled(SettledReason.ENDED, "completed"), id="completed"),
    pytest.param(one(assignment=Assignment(workload="w", phase="failed", node=None)), {},
                 Settled(SettledReason.ENDED, "failed"), id="failed"),
    pytest.param(one(down=("a",)), {"allow_failover": False},
                 Settled(SettledReason.FAILSAFE, "node a is down"), id="failsafe"),
    pytest.param(one(), {}, Settled(SettledReason.NO_REPORT), id="no-report-yet"),
    pytest.param(one(status("w", "a")), {}, Settled(SettledReason.RUNNING), id="running"),
    pytest.param(one(status("w", "a", state="stopping", failing="check x")), {},
                 Settled(SettledReason.STOPPING), id="stopping"),
    pytest.param(one(status("w", "a", state="exited", exit_code=3),
                     assignment=placed("w", "a", restarts=1, restart_times=(NOW - 30,))),
                 {"seen": Observations(ended={("w", "a", 10): NOW})},
                 Settled(SettledReason.BACKING_OFF, "exited with code 3"), id="backing-off"),
    pytest.param(one(status("w", "a", 10, "running"),
                     assignment=moving()), {},
                 Settled(SettledReason.STOPPING, "instance 10 on a"), id="move-not-stopped"),
    pytest.param(one(status("w", "a", 10, "exited", exit_code=1),
                     assignment=moving(not_before=NOW + 5)), {},
                 Settled(SettledReason.BACKING_OFF), id="move-backing-off"),
    pytest.param(one(status("w", "a", 50, "running"), workload=submit("w", nodes=2),
                     assignment=gang_moving()), {},
                 Settled(SettledReason.STOPPING, "gang instance 50"), id="gang-not-stopped"),
    pytest.param(dataclasses.replace(one(workload=submit("w", nodes=2),
                                         assignment=gang_moving()), expiring=frozenset({"b"})),
                 {}, Settled(SettledReason.NODE_EXPIRING), id="gang-member-node-expiring"),
])
def test_settled_reasons(snapshot: ClusterSnapshot, kwargs: dict[str, Any],
                         expected: Settled) -> None:
    assert settled(snapshot, **kwargs) == expected


def test_every_settled_reason_is_covered_above() -> None:
    ids = {"retiring", "service", "ended", "failsafe", "no-report", "running", "stopping",
           "backing-off", "node-expiring"}
    assert {r.value for r in SettledReason} == ids


# -- 2. admit -------------------------------------------------------------------------------

def req(wid: str, priority: int = 0, at: float = 0.0) -> PlacementRequest:
    return PlacementRequest(wid, make_spec(wid, priority=priority), at)


@pytest.mark.parametrize(("requests", "order"), [
    pytest.param([req("a", 0), req("b", 5), req("c", -1)], ["b", "a", "c"], id="priority"),
    pytest.param([req("a", at=3.0), req("b", at=1.0), req("c", at=2.0)], ["b", "c", "a"],
                 id="then-age"),
    pytest.param([req("c"), req("a"), req("b")], ["a", "b", "c"], id="then-id"),
    pytest.param([req("old", 1, 1.0), req("hi", 2, 9.0), req("new", 1, 5.0)],
                 ["hi", "old", "new"], id="priority-before-age"),
    pytest.param([], [], id="nothing"),
])
def test_admission_order(requests: list[PlacementRequest], order: list[str]) -> None:
    admitted = admit(requests)
    assert isinstance(admitted, Admitted)
    assert [r.workload for r in admitted.requests] == order
    assert [r.workload for r in admit(reversed(requests)).requests] == order
    assert batch_order(requests) == list(admitted.requests)


def test_place_in_order_takes_the_order_as_given() -> None:
    """One free GPU, two requests: the first one given gets it, whatever their priorities;
    place_batch admits first (the higher priority wins)."""
    def capacity() -> dict[str, NodeCapacity]:
        return capacity_from(make_snapshot([make_node("a", 1)]))

    low, high = req("low", 0), req("high", 5)
    given = place_in_order([low, high], capacity(), NOW)
    assert given["low"] == Placed("a", (0,))
    assert isinstance(given["high"], Unplaceable)
    admitted = place_batch([low, high], capacity(), NOW)
    assert isinstance(admitted["low"], Unplaceable)
    assert place_in_order(admit([low, high]).requests, capacity(), NOW) == admitted


# -- 3. place: the preemption policy ----------------------------------------------------

@pytest.mark.parametrize(("preempt", "priority", "victim", "preempts", "may_stop"), [
    pytest.param(True, 5, 4, True, True, id="lower-priority"),
    pytest.param(True, 5, 5, True, False, id="equal-priority"),
    pytest.param(True, 5, 6, True, False, id="higher-priority"),
    pytest.param(False, 5, 0, False, True, id="preempt-off"),
    pytest.param(True, -1, -2, True, True, id="negative-priorities"),
])
def test_priority_only(preempt: bool, priority: int, victim: int, preempts: bool,
                       may_stop: bool) -> None:
    request = PlacementRequest("x", make_spec("x", 2, priority=priority, preempt=preempt), 0.0)
    policy = PriorityOnly()
    assert policy.preempts(request) is preempts
    assert policy.may_stop(request, Victim("v", victim, (0,))) is may_stop
    assert policy == PRIORITY_ONLY


def full_cluster() -> ClusterSnapshot:
    """Node a full of low-priority work; x (priority 5, preempt) waits for 2 GPUs."""
    return make_snapshot(
        [make_node("a", 2)],
        workloads=[submit("low", 2, priority=0), submit("x", 2, priority=5, preempt=True,
                                                         submitted_at=9.0)],
        assignments=[placed("low", "a", [0, 1])], statuses=[status("low", "a")])


class Never:
    """A policy under which nobody preempts anybody."""

    def preempts(self, request: PlacementRequest) -> bool:
        return request.spec.preempt

    def may_stop(self, request: PlacementRequest, victim: Victim) -> bool:
        return False


def test_the_preemption_policy_is_injected() -> None:
    by_default = {a.workload: a for a in reconcile(full_cluster(), NOW).actions}
    assert by_default["low"].event == "preempted"
    assert reconcile(full_cluster(), NOW, preemption=PRIORITY_ONLY) == reconcile(
        full_cluster(), NOW)
    never = {a.workload: a for a in reconcile(full_cluster(), NOW, preemption=Never()).actions}
    assert "low" not in never
    assert never["x"].kind == "pending"
    assert never["x"].assignment is not None
    assert never["x"].assignment.reason == (
        "no node fits (1 node(s): not enough free healthy GPUs (needs 2))")


# -- 5. placement-failure counts, rendered at the end -----------------------------------

@pytest.mark.parametrize(("failure", "text"), [
    pytest.param(NoReadyNodes(), "no ready nodes", id="no-ready-nodes"),
    pytest.param(NodesFiltered.tally({(Rule.NOT_ENOUGH, "not enough free healthy GPUs "
                                       "(needs 2)"): 3, (Rule.LABEL, "label r=1 not matched"): 2,
                                      (Rule.COOLING, "cooling down after a failure"): 0}),
                 "no node fits (2 node(s): label r=1 not matched, 3 node(s): not enough free "
                 "healthy GPUs (needs 2))", id="counts-sorted-zero-left-out"),
    pytest.param(GangShortage(members=4, found=2, gpus=8, kind="GPUs"),
                 "gang of 4: only 2 of 4 nodes with 8 free healthy GPUs", id="gang"),
    pytest.param(GangShortage(members=2, found=0, gpus=0, kind="GPUs", topology="rack",
                              held=3, holder="big"),
                 "gang of 2: only 0 of 2 nodes ready in one rack; 3 node(s) held for big",
                 id="gang-cpu-topology-held"),
    pytest.param(GangShortage(members=3, found=1, gpus=1, kind="GPU of model A100*"),
                 "gang of 3: only 1 of 3 nodes with 1 free healthy GPU of model A100*",
                 id="gang-one-gpu"),
])
def test_failure_rendering(failure: Any, text: str) -> None:
    assert failure.render() == text
    assert Unplaceable(failure).reason == text
    assert Unplaceable(failure) == Unplaceable(text)


def test_the_placer_keeps_the_counts_as_data() -> None:
    snapshot = make_snapshot([make_node("a", labels={"rack": "r1"}), make_node("b"),
                              make_node("c", 1)], assignments=[placed("x", "c", [0])])
    request = PlacementRequest("w", make_spec("w", 1, node_selector={"rack": "r1"}), 0.0,
                               avoid={"a": NOW + 5})
    capacity = capacity_from(snapshot)
    capacity["a"].free = []
    outcome = place_one(request, capacity, NOW)
    assert isinstance(outcome, Unplaceable)
    assert outcome.failure == NodesFiltered((
        Filtered(Rule.COOLING, "cooling down after a failure", 1),
        Filtered(Rule.LABEL, "label rack=r1 not matched", 2)))
    assert outcome.reason == ("no node fits (1 node(s): cooling down after a failure, "
                              "2 node(s): label rack=r1 not matched)")


def test_a_gang_s_shortage_is_data() -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b", 2)])
    request = PlacementRequest("g", make_spec("g", 4, nodes=2), 0.0)
    outcome = place_batch([request], capacity_from(snapshot), NOW)["g"]
    assert isinstance(outcome, Unplaceable)
    assert outcome.failure == GangShortage(members=2, found=1, gpus=4, kind="GPUs")
    assert outcome.reason == "gang of 2: only 1 of 2 nodes with 4 free healthy GPUs"
