"""The controller's metrics: which decisions are failovers or restarts and why (table-driven,
over plans that ``reconcile`` really makes), from when each failure is known, the leader's
counting and latencies across cycles, and the scrape-time families from a snapshot."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hafo.controller.daemon import Controller
from hafo.controller.metrics import (
    ControllerMetrics,
    classify,
    decisions,
    gpu_counts,
)
from hafo.decisions.observed import Observations
from hafo.decisions.plan import Action, Cause, Plan
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import Assignment, ClusterSnapshot, Gpu, MoveRequest, NodeRecord
from hafo.model.config import parse_config

from .conftest import (
    H100,
    make_node,
    make_snapshot,
    placed,
    sample_cluster,
    status,
    submit,
)

NOW = 10_000.0


def running_on_a(*, nodes: list[NodeRecord] | None = None, down: tuple[str, ...] = (),
                 state: Any = "running", **status_kwargs: Any) -> ClusterSnapshot:
    """Workload ``w`` (1 GPU, default restart policy) placed on ``a`` at epoch 10."""
    return make_snapshot(nodes or [make_node("a"), make_node("b")], down=down,
                         workloads=[submit("w")], assignments=[placed("w", "a", [0])],
                         statuses=[status("w", "a", 10, state, **status_kwargs)])


def degraded_a() -> NodeRecord:
    node = make_node("a")
    gpus = (dataclasses.replace(node.gpus[0], degraded=True, reason="hw slowdown"),
            *node.gpus[1:])
    return dataclasses.replace(node, gpus=gpus)


def seen_at_finish(snapshot: ClusterSnapshot) -> Observations:
    """The controller saw each exit at the time its report says (clocks that agree): the
    backoff and the failure's time are counted from the controller's sighting."""
    return Observations(ended={(s.workload, s.node, s.epoch): s.finished_at
                               for s in snapshot.statuses.values()
                               if s.state == "exited" and s.finished_at is not None})


def with_restarts(snapshot: ClusterSnapshot, count: int) -> ClusterSnapshot:
    """``w`` restarted ``count`` times within its window already."""
    times = tuple(NOW - 10 * (i + 1) for i in range(count))
    assignment = dataclasses.replace(snapshot.assignments["w"], restarts=count,
                                     restart_times=times)
    return dataclasses.replace(snapshot, assignments={"w": assignment})


def preempting() -> ClusterSnapshot:
    """``low`` fills node a; ``x`` (priority 5, may preempt) needs its GPUs."""
    return make_snapshot([make_node("a", 2)],
                         workloads=[submit("low", 2, submitted_at=1.0),
                                    submit("x", 2, priority=5, preempt=True, submitted_at=9.0)],
                         assignments=[placed("low", "a", [0, 1])],
                         statuses=[status("low", "a", 10)])


CASES = [
    pytest.param(running_on_a(down=("a",)), "w", ("failover", "node-down"), id="node-down"),
    pytest.param(running_on_a(nodes=[make_node("a")], down=("a",)), "w",
                 ("failover", "node-down"), id="node-down-nowhere-to-go"),
    pytest.param(running_on_a(nodes=[make_node("a", healthy=False), make_node("b")]), "w",
                 ("failover", "node-unhealthy"), id="node-unhealthy"),
    pytest.param(running_on_a(nodes=[make_node("a", unhealthy_gpus=[0]), make_node("b")]), "w",
                 ("failover", "gpu-fault"), id="gpu-unhealthy"),
    pytest.param(running_on_a(nodes=[degraded_a(), make_node("b")]), "w",
                 ("failover", "gpu-degraded"), id="gpu-degraded"),
    pytest.param(running_on_a(state="exited", exit_code=3, finished_at=NOW - 1), "w",
                 ("restart", "exited"), id="exit-restarts-in-place"),
    pytest.param(with_restarts(running_on_a(state="exited", exit_code=3, finished_at=NOW - 1),
                               3), "w", ("failover", "app-failed"), id="exit-past-the-limit"),
    pytest.param(running_on_a(failing="http check: 3 failures"), "w", ("restart", "failing"),
                 id="failing-restarts-in-place"),
    pytest.param(with_restarts(running_on_a(failing="xid 13"), 3), "w",
                 ("failover", "app-failed"), id="failing-past-the-limit"),
    pytest.param(dataclasses.replace(running_on_a(), moves={"w": MoveRequest("w", "b")}), "w",
                 ("failover", "planned"), id="planned-move"),
    pytest.param(preempting(), "low", ("failover", "preempted"), id="preempted"),
    pytest.param(running_on_a(state="exited", exit_code=0), "w", None, id="completed"),
    pytest.param(make_snapshot([make_node("a")], workloads=[submit("w")]), "w", None,
                 id="new-workload"),
    pytest.param(make_snapshot([make_node("a")], assignments=[placed("w", "a")]), "w", None,
                 id="deleted"),
    pytest.param(make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                               assignments=[Assignment("w", "moving", "a", (0,), epoch=12,
                                                       stopping=10)]), "w", None,
                 id="second-step-of-a-move"),
]


@pytest.mark.parametrize(("snapshot", "workload", "expected"), CASES)
def test_classify_the_actions_reconcile_makes(snapshot: ClusterSnapshot, workload: str,
                                              expected: tuple[str, str] | None) -> None:
    plan = reconcile(snapshot, NOW)
    (action,) = [a for a in plan.actions if a.workload == workload]
    assert classify(action) == expected
    if expected is not None:  # a series of that cause exists (at 0) before anything is counted
        registry = CollectorRegistry()
        ControllerMetrics(Source(snapshot), registry, lease_ttl=3.0, clock=Clock())
        family = "hafo_failovers_total" if expected[0] == "failover" else "hafo_restarts_total"
        assert registry.get_sample_value(family, {"cause": expected[1]}) == 0.0


def test_other_actions_are_not_counted() -> None:
    refuse = Action(kind="refuse-move", workload="w", cause=Cause.MOVE_REFUSED, why="no",
                    expected_revision=0, assignment=None, clear_move=True)
    finish = Action(kind="finish", workload="w", cause=Cause.COMPLETED, why="done",
                    expected_revision=10, assignment=None)
    failed = Action(kind="finish", workload="w", cause=Cause.EXITED, why="failed everywhere",
                    expected_revision=10, assignment=None)
    assert classify(refuse) is None and classify(finish) is None and classify(failed) is None


@pytest.mark.parametrize(("snapshot", "down_since", "reported", "since"), [
    pytest.param(running_on_a(down=("a",)), {"a": NOW - 0.2}, NOW, NOW - 3.2,
                 id="node-down-seen-minus-ttl"),
    pytest.param(running_on_a(down=("a",)), {}, NOW, None, id="node-down-before-the-term"),
    pytest.param(running_on_a(state="exited", exit_code=3, finished_at=NOW - 1), {}, None,
                 NOW - 1, id="exit-time"),
    pytest.param(with_restarts(running_on_a(state="exited", exit_code=3,
                                            finished_at=NOW - 5), 1), {}, None, NOW - 4,
                 id="exit-time-plus-backoff"),
    pytest.param(with_restarts(running_on_a(state="exited", exit_code=3,
                                            finished_at=NOW - 5), 3), {}, None, NOW - 5,
                 id="exit-past-the-limit-no-backoff"),
    pytest.param(running_on_a(nodes=[make_node("a", unhealthy_gpus=[0]), make_node("b")]), {},
                 NOW - 0.5, NOW - 0.5, id="gpu-fault-from-the-cycle-that-saw-it"),
    pytest.param(running_on_a(failing="check"), {}, None, None, id="failing-before-the-term"),
    pytest.param(dataclasses.replace(running_on_a(), moves={"w": MoveRequest("w")}), {}, NOW,
                 None, id="planned-no-failure"),
])
def test_decisions_know_the_failure_from(snapshot: ClusterSnapshot, down_since: dict[str, float],
                                         reported: float | None, since: float | None) -> None:
    plan = reconcile(snapshot, NOW, seen=seen_at_finish(snapshot))
    (decision,) = decisions(snapshot, plan, down_since=down_since,
                            reported_since=reported, lease_ttl=3.0)
    assert decision.workload == "w" and decision.replaces == 10
    assert decision.since == (pytest.approx(since) if since is not None else None)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Failsafe:
    def __init__(self) -> None:
        self.allowed = True

    def failover_allowed(self) -> bool:
        return self.allowed


class Source:
    def __init__(self, snapshot: ClusterSnapshot, leading: bool = True) -> None:
        self.current = snapshot
        self.lead = leading
        self.failsafe = Failsafe()

    def snapshot(self) -> ClusterSnapshot:
        return self.current

    def leading(self) -> bool:
        return self.lead


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_the_leader_counts_a_failover_and_its_detection_and_recovery() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = ControllerMetrics(Source(make_snapshot()), registry, lease_ttl=3.0, clock=clock)
    metrics.new_term()
    before = running_on_a()
    metrics.cycle(before, NOW, None, 0.004)          # the term's first cycle: a is alive
    gone = running_on_a(down=("a",))
    plan = reconcile(gone, NOW + 1)
    clock.now = NOW + 1.25                          # the decision's write acknowledged
    metrics.cycle(gone, NOW + 1, plan, 0.25)
    assert value(registry, "hafo_failovers_total", cause="node-down") == 1
    assert value(registry, "hafo_detection_seconds_count", cause="node-down") == 1
    assert value(registry, "hafo_detection_seconds_sum", cause="node-down") == 3.25
    moved = plan.actions[0].assignment
    assert moved is not None and moved.node == "b"
    starting = make_snapshot([make_node("a"), make_node("b")], down=["a"],
                             workloads=[submit("w")],
                             assignments=[dataclasses.replace(moved, epoch=30)],
                             statuses=[status("w", "b", 30, "starting")])
    metrics.cycle(starting, NOW + 2, None, 0.001)
    assert value(registry, "hafo_recovery_seconds_count", cause="node-down") == 0
    runs = dataclasses.replace(starting, statuses={("w", "b"): status("w", "b", 30)})
    metrics.cycle(runs, NOW + 3.5, None, 0.001)
    assert value(registry, "hafo_recovery_seconds_count", cause="node-down") == 1
    assert value(registry, "hafo_recovery_seconds_sum", cause="node-down") == 2.25
    assert metrics.pending == {}
    assert value(registry, "hafo_controller_reconcile_duration_seconds_count") == 4
    assert value(registry, "hafo_restarts_total", cause="exited") == 0  # present, zero


def test_unapplied_plans_and_new_terms_count_nothing() -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(Source(make_snapshot()), registry, lease_ttl=3.0,
                                clock=Clock())
    metrics.cycle(running_on_a(), NOW, None, 0.001)
    gone = running_on_a(down=("a",))
    metrics.cycle(gone, NOW, None, 0.001)           # the write failed: nothing decided
    assert value(registry, "hafo_failovers_total", cause="node-down") == 0
    metrics.new_term()                              # a new leader's first cycle: a was down
    metrics.cycle(gone, NOW + 5, reconcile(gone, NOW + 5), 0.001)
    assert value(registry, "hafo_failovers_total", cause="node-down") == 1
    assert value(registry, "hafo_detection_seconds_count", cause="node-down") == 0  # unknown
    assert set(metrics.pending) == {"w"}


def test_pending_recoveries_are_dropped_with_their_workload_and_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    metrics = ControllerMetrics(Source(make_snapshot()), registry, lease_ttl=3.0,
                                clock=Clock())
    failing = running_on_a(failing="check")
    metrics.cycle(failing, NOW, reconcile(failing, NOW), 0.001)
    assert set(metrics.pending) == {"w"}
    metrics.cycle(make_snapshot([make_node("a")]), NOW + 1, None, 0.001)  # deleted
    assert metrics.pending == {}
    monkeypatch.setattr("hafo.controller.metrics.MAX_PENDING", 2)
    for i in range(3):
        metrics._count(failing, Plan(reconcile(failing, NOW).actions), NOW, None)
        metrics.pending[f"x{i}"] = metrics.pending.pop("w")
    assert list(metrics.pending) == ["x1", "x2"]


def test_a_second_failure_before_recovery_keeps_the_first_decision_time() -> None:
    registry, clock = CollectorRegistry(), Clock()
    metrics = ControllerMetrics(Source(make_snapshot()), registry, lease_ttl=3.0, clock=clock)
    exited = running_on_a(state="exited", exit_code=1, finished_at=NOW)
    metrics.cycle(exited, NOW, reconcile(exited, NOW), 0.001)
    first = metrics.pending["w"].decided_at
    again = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                          assignments=[placed("w", "a", [0], epoch=20, restarts=1,
                                              restart_times=(NOW,))],
                          statuses=[status("w", "a", 20, "exited", exit_code=1,
                                           finished_at=NOW + 1)])
    clock.now = NOW + 3
    metrics.cycle(again, NOW + 3, reconcile(again, NOW + 3, seen=seen_at_finish(again)), 0.001)
    assert value(registry, "hafo_restarts_total", cause="exited") == 2
    assert metrics.pending["w"].decided_at == first


def scrape(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """Family name -> {state label (or ""): value} for the gauges."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels.get("state", "")] = sample.value
    return out


def test_scrape_time_families_from_the_snapshot() -> None:
    registry = CollectorRegistry()
    source = Source(sample_cluster())
    ControllerMetrics(source, registry, lease_ttl=3.0, clock=Clock())
    found = scrape(registry)
    assert found["hafo_leader"] == {"": 1.0}
    assert found["hafo_nodes"] == {"ready": 1, "cordoned": 1, "unhealthy": 1, "down": 1}
    assert found["hafo_workloads"] == {"pending": 2, "starting": 0, "running": 1,
                                       "stopping": 0, "completed": 0, "failed": 0,
                                       "degraded": 0, "updating": 0}
    # a: 4 GPUs (3 unhealthy-free: GPU 3 unhealthy), b: 2, c: 1 (down), d: 1; run holds a/0,2
    assert found["hafo_gpus"] == {"healthy": 6, "degraded": 0, "unhealthy": 1, "down": 1,
                                  "allocated": 2}
    source.lead, source.current = False, make_snapshot()
    found = scrape(registry)
    assert found["hafo_leader"] == {"": 0.0}
    assert found["hafo_nodes"] == {"ready": 0, "cordoned": 0, "unhealthy": 0, "down": 0}
    assert set(found["hafo_workloads"].values()) == {0}


def labelled(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample named ``name``."""
    return [(sample.labels, sample.value)
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples if sample.name == name]


def test_per_node_and_per_workload_series_name_what_alerts_are_about() -> None:
    registry = CollectorRegistry()
    source = Source(sample_cluster())
    ControllerMetrics(source, registry, lease_ttl=3.0, clock=Clock())
    nodes = labelled(registry, "hafo_node_state")
    assert {labels["node"]: labels["state"] for labels, _ in nodes} == {
        "a": "ready", "b": "cordoned", "c": "down", "d": "unhealthy"}
    assert {value for _, value in nodes} == {1.0}
    workloads = labelled(registry, "hafo_workload_state")
    assert sorted((labels["workload"], labels["name"], labels["state"], value)
                  for labels, value in workloads) == [
        ("new", "new", "pending", 1.0), ("run", "run", "running", 1.0),
        ("wait", "wait", "pending", 1.0)]
    # restarts: from each assignment (``new`` has none yet)
    assert sorted((labels["workload"], value) for labels, value in
                  labelled(registry, "hafo_workload_restarts_total")) == [
        ("run", 1.0), ("wait", 0.0)]
    assert value(registry, "hafo_failsafe_active") == 0
    source.failsafe.allowed = False  # it told an agent etcd is unavailable to it too
    assert value(registry, "hafo_failsafe_active") == 1
    source.current = running_on_a(down=("a",))  # a state change: the old series is gone
    assert [(labels["node"], labels["state"]) for labels, _ in
            labelled(registry, "hafo_node_state")] == [("a", "down"), ("b", "ready")]


def test_gpu_counts_partition_by_health() -> None:
    node = NodeRecord("a", gpus=(Gpu(0, "u0", H100, 1), Gpu(1, "u1", H100, 1, degraded=True),
                                 Gpu(2, "u2", H100, 1, healthy=False)))
    snapshot = make_snapshot([node], workloads=[submit("w")],
                             assignments=[placed("w", "a", [1])])
    assert gpu_counts(snapshot) == {"healthy": 1, "degraded": 1, "unhealthy": 1, "down": 0,
                                    "allocated": 1}


async def test_a_real_controller_registry(tmp_path: Path) -> None:
    config = parse_config({"etcd": {"endpoints": ["http://127.0.0.1:1"]},
                           "controller": {"name": "ctl-1"}}, "controller")
    controller = Controller(config)
    try:
        assert controller.store.observer == controller.metrics.observe_etcd
        controller.store.observer(0.01, ConnectionError())
        found = scrape(controller.registry)
        assert found["hafo_leader"] == {"": 0.0}
        assert found["hafo_etcd_request_duration_seconds_count"] == {"": 1.0}
        assert found["hafo_etcd_request_errors_total"] == {"": 1.0}
    finally:
        await controller.store.close()
