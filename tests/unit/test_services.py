"""The pure rules of services (hafo.decisions.services) and their readiness
(hafo.model.endpoints), table-driven with an injected clock."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.observed import Observations, observe
from hafo.decisions.reconcile import reconcile
from hafo.decisions.services import apart_from, decide_services
from hafo.model.cluster import ClusterSnapshot, InstanceStatus, MoveRequest, Submission
from hafo.model.endpoints import endpoints_of, instance_ready, prometheus_targets, resolve
from hafo.model.service_state import service_state
from hafo.model.spec import UpdatePolicy, WorkloadSpec
from hafo.model.views import all_workloads
from tests.unit.conftest import make_node, make_snapshot, placed, status

NOW = 1000.0
SID = "web-abcdef"


def service_spec(**kwargs: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {"name": "web", "command": ("serve",), "replicas": 3,
                              "ports": {"http": 0}}
    fields.update(kwargs)
    return WorkloadSpec(**fields)


def replica(n: int, spec: WorkloadSpec | None = None, *, at: float = 0.0,
            replaces: str | None = None, retiring: float | None = None) -> Submission:
    return Submission(id=f"{SID}.{n}", spec=(spec or service_spec()).template, submitted_at=at,
                      service=SID, replaces=replaces, retiring=retiring)


def ready(n: int, node: str, epoch: int = 10, since: float = 0.0) -> InstanceStatus:
    return dataclasses.replace(status(f"{SID}.{n}", node, epoch), ready=True, ready_since=since,
                               ports={"http": 31000 + n})


def cluster(spec: WorkloadSpec, replicas: list[Submission], ready_on: dict[int, str],
            placed_on: dict[int, str] | None = None, nodes: int = 4,
            **kwargs: Any) -> ClusterSnapshot:
    where = {**ready_on, **(placed_on or {})}
    return make_snapshot(
        [make_node(f"n{i}") for i in range(1, nodes + 1)],
        workloads=[Submission(id=SID, spec=spec, submitted_at=0.0), *replicas],
        assignments=[placed(f"{SID}.{n}", node, ()) for n, node in where.items()],
        statuses=[ready(n, node) for n, node in ready_on.items()], **kwargs)


def kinds(snapshot: ClusterSnapshot, now: float = NOW) -> list[tuple[str, str]]:
    return [(c.kind, c.replica) for c in decide_services(snapshot, now)]


def test_a_new_service_gets_its_replicas() -> None:
    snapshot = cluster(service_spec(), [], {})
    assert kinds(snapshot) == [("create", f"{SID}.0"), ("create", f"{SID}.1"),
                               ("create", f"{SID}.2")]


def test_a_service_with_every_replica_ready_is_left_alone() -> None:
    snapshot = cluster(service_spec(), [replica(0), replica(1), replica(2)],
                       {0: "n1", 1: "n2", 2: "n3"})
    assert kinds(snapshot) == []
    state = service_state(snapshot, SID, NOW)
    assert (state.state, state.ready, state.desired) == ("running", 3, 3)


@pytest.mark.parametrize(("want", "expected"), [
    (5, [("create", f"{SID}.3"), ("create", f"{SID}.4")]),
    (2, [("retire", f"{SID}.2")]),  # the newest goes
    (0, [("retire", f"{SID}.0"), ("retire", f"{SID}.1"), ("retire", f"{SID}.2")]),
])
def test_scaling(want: int, expected: list[tuple[str, str]]) -> None:
    snapshot = cluster(service_spec(replicas=want), [replica(0), replica(1), replica(2)],
                       {0: "n1", 1: "n2", 2: "n3"})
    assert sorted(kinds(snapshot)) == sorted(expected)


def test_scaling_down_retires_a_replica_that_is_not_ready_first() -> None:
    snapshot = cluster(service_spec(replicas=2), [replica(0), replica(1), replica(2)],
                       {0: "n1", 2: "n3"}, placed_on={1: "n2"})
    assert kinds(snapshot) == [("retire", f"{SID}.1")]


def test_a_changed_spec_replaces_one_replica_at_a_time_new_before_old() -> None:
    old = service_spec()
    new = service_spec(env={"MODEL": "v2"})
    replicas = [replica(0, old), replica(1, old), replica(2, old)]
    step1 = cluster(new, replicas, {0: "n1", 1: "n2", 2: "n3"})
    changes = decide_services(step1, NOW)
    assert [(c.kind, c.replica) for c in changes] == [("create", f"{SID}.3")]
    assert changes[0].submission is not None
    assert changes[0].submission.replaces == f"{SID}.0"
    assert changes[0].submission.spec == new.template
    assert service_state(step1, SID, NOW).state == "updating"
    # the replacement runs but is not ready yet: nothing more (max_unavailable 1)
    starting = cluster(new, [*replicas, replica(3, new, at=NOW, replaces=f"{SID}.0")],
                       {0: "n1", 1: "n2", 2: "n3"}, placed_on={3: "n4"})
    assert kinds(starting) == []
    # ready: the old one leaves rotation, and the next replacement starts
    done = cluster(new, [*replicas, replica(3, new, at=NOW, replaces=f"{SID}.0")],
                   {0: "n1", 1: "n2", 2: "n3", 3: "n4"})
    assert kinds(done) == [("retire", f"{SID}.0"), ("create", f"{SID}.4")]


MIN_READY = 30.0
NEW_SPEC = service_spec(env={"V": "2"}, update=UpdatePolicy(min_ready_seconds=MIN_READY,
                                                              progress_deadline=60))
OLD_REPLICAS = [replica(0), replica(1), replica(2)]
REPLACEMENT = replica(3, NEW_SPEC, at=NOW - 100, replaces=f"{SID}.0")
RETIRES = [("retire", f"{SID}.0"), ("create", f"{SID}.4")]


def replacing(agent_since: float | None) -> ClusterSnapshot:
    """Replica 3 replaces replica 0; ready (its agent says since ``agent_since``, its own
    clock) or, with None, placed and not ready."""
    ready_on = {0: "n1", 1: "n2", 2: "n3"}
    snapshot = cluster(NEW_SPEC, [*OLD_REPLICAS, REPLACEMENT],
                       {**ready_on, **({3: "n4"} if agent_since is not None else {})},
                       placed_on={3: "n4"} if agent_since is None else None)
    if agent_since is None:
        return snapshot
    statuses = dict(snapshot.statuses)
    statuses[(f"{SID}.3", "n4")] = ready(3, "n4", since=agent_since)
    return dataclasses.replace(snapshot, statuses=statuses)


# (controller's time, the agent's ready_since or None: not ready) per cycle, then the
# cycles at which the leader retires the old replica. SKEW is the agent's clock minus the
# controller's: min_ready_seconds is timed by the leader's own sightings, so an agent clock
# an hour ahead or behind changes nothing (its ready_since used to: an hour behind retired
# the old replica at once, an hour ahead held it for an hour).
@pytest.mark.parametrize("skew", [0.0, 3600.0, -3600.0], ids=["same", "1h-ahead", "1h-behind"])
@pytest.mark.parametrize(("cycles", "retires_at"), [
    pytest.param([(NOW, NOW), (NOW + 29.9, NOW), (NOW + 30, NOW)], [2], id="after-30s"),
    pytest.param([(NOW, NOW - 500), (NOW + 30, NOW - 500)], [1],
                 id="ready-long-before-first-seen"),
    pytest.param([(NOW, NOW), (NOW + 10, None), (NOW + 15, NOW + 15), (NOW + 30, NOW + 15),
                  (NOW + 45, NOW + 15)], [4], id="not-ready-between-starts-again"),
    pytest.param([(NOW, NOW), (NOW + 20, NOW + 19), (NOW + 30, NOW + 19),
                  (NOW + 50, NOW + 19)], [3], id="agent-saw-a-flap-between-snapshots"),
])
def test_min_ready_seconds_is_timed_by_the_leader_s_sightings(
        skew: float, cycles: list[tuple[float, float | None]], retires_at: list[int]) -> None:
    seen = Observations()
    retired = []
    for i, (now, agent_since) in enumerate(cycles):
        snapshot = replacing(None if agent_since is None else agent_since + skew)
        seen = observe(seen, snapshot, now)
        changes = [(c.kind, c.replica) for c in decide_services(snapshot, now, seen.ready)]
        assert changes in ([], RETIRES), (i, changes)
        if changes:
            retired.append(i)
        plan = reconcile(snapshot, now, seen=seen)
        assert [(c.kind, c.replica) for c in plan.replicas] == changes
    assert retired == retires_at


@pytest.mark.parametrize("skew", [0.0, 3600.0, -3600.0], ids=["same", "1h-ahead", "1h-behind"])
def test_a_new_leader_waits_min_ready_seconds_from_its_own_first_sighting(skew: float) -> None:
    snapshot = replacing(NOW - 1000 + skew)  # ready for long, by its agent's clock
    assert kinds(snapshot) == []  # no sightings: seen first now
    seen = observe(Observations(), snapshot, NOW)
    assert decide_services(snapshot, NOW + 29, seen.ready) == []
    assert [(c.kind, c.replica) for c in decide_services(snapshot, NOW + 30, seen.ready)] \
        == RETIRES


@pytest.mark.parametrize("skew", [0.0, 3600.0, -3600.0], ids=["same", "1h-ahead", "1h-behind"])
def test_a_ready_replacement_waiting_out_min_ready_seconds_is_not_a_stopped_rollout(
        skew: float) -> None:
    snapshot = replacing(NOW + skew)  # 100 s after it was created, past the deadline
    state = service_state(snapshot, SID, NOW)
    assert state.state == "updating" and "rollout stopped" not in state.reason
    stalled = service_state(replacing(None), SID, NOW)  # not ready past the deadline
    assert stalled.state == "degraded" and "rollout stopped" in stalled.reason


def test_a_replacement_never_ready_stops_the_rollout_and_a_rollback_withdraws_it() -> None:
    old = service_spec()
    new = service_spec(env={"V": "bad"}, update=UpdatePolicy(progress_deadline=60))
    replicas = [replica(0, old), replica(1, old), replica(2, old),
                replica(3, new, at=NOW - 61, replaces=f"{SID}.0")]
    stalled = cluster(new, replicas, {0: "n1", 1: "n2", 2: "n3"}, placed_on={3: "n4"})
    assert kinds(stalled) == []
    state = service_state(stalled, SID, NOW)
    assert state.state == "degraded" and "rollout stopped" in state.reason
    assert state.ready == 3
    rollback = cluster(old, replicas, {0: "n1", 1: "n2", 2: "n3"}, placed_on={3: "n4"})
    assert kinds(rollback) == [("retire", f"{SID}.3")]


def test_a_retiring_replica_is_deleted_after_the_drain_delay() -> None:
    spec = service_spec(update=UpdatePolicy(drain_delay=2))
    replicas = [replica(0, retiring=NOW - 1), replica(1), replica(2), replica(3)]
    snapshot = cluster(spec, replicas, {0: "n1", 1: "n2", 2: "n3", 3: "n4"})
    assert kinds(snapshot) == []
    assert not instance_ready(snapshot, f"{SID}.0")  # out of rotation at once
    assert kinds(snapshot, NOW + 1) == [("delete", f"{SID}.0")]


def test_a_drained_replica_is_replaced_before_it_stops() -> None:
    replicas = [replica(0), replica(1), replica(2)]
    snapshot = cluster(service_spec(), replicas, {0: "n1", 1: "n2", 2: "n3"})
    snapshot = dataclasses.replace(snapshot, moves={f"{SID}.1": MoveRequest(f"{SID}.1")})
    changes = decide_services(snapshot, NOW)
    assert [(c.kind, c.replica) for c in changes] == [("create", f"{SID}.3")]
    assert changes[0].submission is not None and changes[0].submission.replaces == f"{SID}.1"
    # the controller leaves the replica's move to its service (no checkpoint-and-stop)
    assert not [a for a in reconcile(snapshot, NOW).actions if a.workload == f"{SID}.1"]
    replacement = replica(3, at=NOW, replaces=f"{SID}.1")
    done = dataclasses.replace(cluster(service_spec(), [*replicas, replacement],
                                       {0: "n1", 1: "n2", 2: "n3", 3: "n4"}),
                               moves=snapshot.moves)
    assert kinds(done) == [("retire", f"{SID}.1")]


def test_replicas_of_a_deleted_service_are_stopped_and_finished_ones_replaced() -> None:
    gone = make_snapshot([make_node("n1")], workloads=[replica(0)])
    assert kinds(gone) == [("delete", f"{SID}.0")]
    failed = cluster(service_spec(replicas=1), [replica(0)], {})
    failed = dataclasses.replace(failed, assignments={f"{SID}.0": dataclasses.replace(
        placed(f"{SID}.0", "n1", ()), phase="failed", node=None)})
    assert kinds(failed) == [("retire", f"{SID}.0"), ("create", f"{SID}.1")]


def test_replicas_are_placed_on_distinct_nodes_and_wait_when_none_is_left() -> None:
    snapshot = cluster(service_spec(), [replica(0), replica(1), replica(2)], {}, nodes=2)
    plan = reconcile(snapshot, NOW)
    places = {a.workload: a.assignment.node for a in plan.actions
              if a.kind == "place" and a.assignment is not None}
    pending = [a for a in plan.actions if a.kind == "pending"]
    assert sorted(places.values()) == ["n1", "n2"]
    assert len(pending) == 1 and "runs another replica of web-abcdef" in pending[0].why


def test_a_replacement_may_share_the_node_of_the_replica_it_replaces_only_with_chosen_ports(
        ) -> None:
    dynamic = cluster(service_spec(), [replica(0), replica(1),
                                       replica(2, replaces=f"{SID}.0")], {0: "n1", 1: "n2"})
    assert apart_from(dynamic, dynamic.workloads[f"{SID}.2"]) == frozenset({"n2"})
    fixed_spec = service_spec(ports={"http": 8000})
    fixed = cluster(fixed_spec, [replica(0, fixed_spec), replica(1, fixed_spec),
                                 replica(2, fixed_spec, replaces=f"{SID}.0")],
                    {0: "n1", 1: "n2"})
    assert apart_from(fixed, fixed.workloads[f"{SID}.2"]) == frozenset({"n1", "n2"})
    shared = service_spec(distinct_nodes=False)
    free = cluster(shared, [replica(0, shared), replica(1, shared)], {0: "n1"})
    assert apart_from(free, free.workloads[f"{SID}.1"]) == frozenset()


def test_readiness_needs_a_live_node_a_ready_report_and_no_retirement() -> None:
    snapshot = cluster(service_spec(), [replica(0), replica(1), replica(2)],
                       {0: "n1", 1: "n2", 2: "n3"}, down=["n3"])
    found = endpoints_of(snapshot, SID)
    assert [(e.replica, e.ready, e.state) for e in found.endpoints] == [
        (f"{SID}.0", True, "running"), (f"{SID}.1", True, "running"),
        (f"{SID}.2", False, "lost")]
    assert found.endpoints[0].ports == {"http": 31000}
    expiring = dataclasses.replace(snapshot, expiring=frozenset({"n1"}))
    assert not instance_ready(expiring, f"{SID}.0")
    targets = prometheus_targets(snapshot, [SID])
    assert [t["targets"] for t in targets] == [["n1:31000"], ["n2:31001"]]
    assert service_state(snapshot, SID, NOW).state == "degraded"


def test_names_resolve_to_ids_and_replicas_hide_inside_their_service() -> None:
    snapshot = cluster(service_spec(), [replica(0)], {0: "n1"})
    assert resolve(snapshot, "web") == (SID, "")
    assert resolve(snapshot, f"{SID}.0") == (f"{SID}.0", "")
    assert resolve(snapshot, "nope")[0] is None
    views = all_workloads(snapshot, NOW)
    assert [v["id"] for v in views] == [SID]
    service = views[0]["replicas"]
    assert service is not None and [r["id"] for r in service["items"]] == [f"{SID}.0"]
    twice = dataclasses.replace(snapshot, workloads={
        **snapshot.workloads, "web-123456": Submission("web-123456", service_spec(), 1.0)})
    wid, why = resolve(twice, "web")
    assert wid is None and "2 workloads are named 'web'" in why
