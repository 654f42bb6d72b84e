"""The controller's per-queue metrics (``hafo.controller.queue_metrics``): computed from a
snapshot with queues at scrape time, one label set per declared queue and none without
queues; the oldest pending workload's wait on the controller's own clock, from its first
sighting (a scrape or a leader cycle), never from a submit time."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hafo.controller.metrics import ControllerMetrics
from hafo.controller.queue_metrics import PendingSince, pending_workloads, queue_workload_states
from hafo.model.cluster import Assignment, ClusterSnapshot
from hafo.model.queues import QueueSpec
from hafo.model.views import WORKLOAD_STATES

from .conftest import make_node, make_snapshot, placed, status, submit
from .test_metrics_controller import Clock, Source

NOW = 10_000.0
FAMILIES = ("hafo_queue_gpus", "hafo_queue_share", "hafo_queue_workloads",
            "hafo_queue_pending_seconds")


def with_queues(snapshot: ClusterSnapshot, *queues: QueueSpec) -> ClusterSnapshot:
    return dataclasses.replace(snapshot, queues={q.name: q for q in queues})


def teams() -> ClusterSnapshot:
    """Two nodes of 4 GPUs; team-a (4, cohort pool) idle but for a waiting 2-GPU job and a
    gang of 2x4 (8 waiting), team-b (4, cohort pool) runs 6 (borrowing 2 of team-a's idle
    quota), ``free`` has no quota and runs 1 and a completed job."""
    b_jobs = [submit(f"b{i}", 1, queue="team-b", submitted_at=float(i)) for i in range(6)]
    work = [*b_jobs, submit("a-wait", 2, queue="team-a", submitted_at=50.0),
            submit("a-gang", 4, queue="team-a", nodes=2, submitted_at=60.0),
            submit("f-run", 1, queue="free"), submit("f-done", 1, queue="free")]
    assignments = [placed(f"b{i}", "n1" if i < 4 else "n2", [i % 4]) for i in range(6)]
    assignments += [placed("f-run", "n2", [2]),
                    Assignment("f-done", "completed"),
                    Assignment("a-gang", "pending", reason="queue team-a: ...")]
    statuses = [status(f"b{i}", "n1" if i < 4 else "n2") for i in range(6)]
    statuses.append(status("f-run", "n2"))
    snapshot = make_snapshot([make_node("n1"), make_node("n2")], workloads=work,
                             assignments=assignments, statuses=statuses)
    return with_queues(snapshot, QueueSpec(name="team-a", gpus=4, cohort="pool"),
                       QueueSpec(name="team-b", gpus=4, cohort="pool", weight=2.0),
                       QueueSpec(name="free"))


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    """(queue, then kind or state where the family has it) -> value of each sample named
    ``name``."""
    return {tuple(sample.labels[k] for k in ("queue", "kind", "state") if k in sample.labels):
            sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples if sample.name == name}


def metrics(snapshot: ClusterSnapshot) -> tuple[CollectorRegistry, Source, Clock,
                                                ControllerMetrics]:
    registry, source, clock = CollectorRegistry(), Source(snapshot), Clock()
    return registry, source, clock, ControllerMetrics(source, registry, lease_ttl=3.0,
                                                      clock=clock)


def test_no_queue_declared_no_series_but_the_families_are_there() -> None:
    registry, *_ = metrics(make_snapshot([make_node("n1")], workloads=[submit("w")]))
    text = generate_latest(registry).decode()
    for name in FAMILIES:
        assert f"# TYPE {name} gauge" in text
        assert samples(registry, name) == {}


def test_gpus_share_and_workloads_per_declared_queue() -> None:
    registry, *_ = metrics(teams())
    assert samples(registry, "hafo_queue_gpus") == {
        ("team-a", "nominal"): 4.0, ("team-a", "used"): 0.0, ("team-a", "borrowed"): 0.0,
        ("team-a", "lent"): 2.0, ("team-a", "pending"): 10.0,
        ("team-b", "nominal"): 4.0, ("team-b", "used"): 6.0, ("team-b", "borrowed"): 2.0,
        ("team-b", "lent"): 0.0, ("team-b", "pending"): 0.0,
        # no quota: no nominal series
        ("free", "used"): 1.0, ("free", "borrowed"): 0.0, ("free", "lent"): 0.0,
        ("free", "pending"): 0.0,
    }
    # team-b: 2 above its quota, over the pool of 8, over its weight of 2
    assert samples(registry, "hafo_queue_share") == {("team-a",): 0.0, ("team-b",): 2 / 8 / 2,
                                                     ("free",): 0.0}
    states = samples(registry, "hafo_queue_workloads")
    assert len(states) == 3 * len(WORKLOAD_STATES)  # every state of every declared queue
    assert {k: v for k, v in states.items() if v} == {
        ("team-a", "pending"): 2.0, ("team-b", "running"): 6.0, ("free", "running"): 1.0,
        ("free", "completed"): 1.0}


def test_a_workload_of_an_undeclared_queue_has_no_series() -> None:
    snapshot = with_queues(make_snapshot([make_node("n1")],
                                         workloads=[submit("w", queue="nobody")]),
                           QueueSpec(name="team-a", gpus=4))
    assert set(queue_workload_states(snapshot)) == {"team-a"}
    assert pending_workloads(snapshot) == {"nobody": [("w", 0.0)]}
    registry, *_ = metrics(snapshot)
    assert set(samples(registry, "hafo_queue_pending_seconds")) == {("team-a",)}


def test_the_oldest_wait_is_timed_on_the_controllers_clock_from_its_first_sighting() -> None:
    snapshot = teams()
    registry, source, clock, controller_metrics = metrics(snapshot)
    # the first scrape sees team-a's two waiting: 0 s (their submit times, another
    # machine's clock, are never compared with this one)
    assert samples(registry, "hafo_queue_pending_seconds") == {
        ("team-a",): 0.0, ("team-b",): 0.0, ("free",): 0.0}
    clock.now = NOW + 30
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 30.0
    # a-wait is placed: the oldest is now a-gang, first seen at the same scrape
    placed_a = dataclasses.replace(snapshot, assignments={
        **snapshot.assignments, "a-wait": placed("a-wait", "n2", [0, 1])})
    source.current = placed_a
    clock.now = NOW + 40
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 40.0
    # a-gang is placed too: nothing waits, 0, and nothing is tracked
    gang = Assignment("a-gang", "placed", "n1", (0, 1, 2, 3), epoch=20)
    source.current = dataclasses.replace(placed_a, assignments={**placed_a.assignments,
                                                                "a-gang": gang})
    clock.now = NOW + 50
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 0.0
    assert len(controller_metrics.pending_since) == 0
    # a-gang fails over and waits again: timed anew from that sighting, not from the first
    source.current = placed_a
    clock.now = NOW + 70
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 0.0
    clock.now = NOW + 75
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 5.0


def test_the_leaders_cycles_sight_pending_work_between_scrapes() -> None:
    snapshot = teams()
    registry, _source, _clock, controller_metrics = metrics(snapshot)
    controller_metrics.cycle(snapshot, NOW - 100, None, 0.001)  # seen by a cycle first
    assert samples(registry, "hafo_queue_pending_seconds")[("team-a",)] == 100.0


def test_a_workload_submitted_again_under_its_id_is_seen_anew() -> None:
    since = PendingSince()
    first = with_queues(make_snapshot([make_node("n1")],
                                      workloads=[submit("w", 8, queue="q", submitted_at=1.0)]),
                        QueueSpec(name="q", gpus=4))
    assert since.observe(first, NOW) == {"q": 0.0}
    assert since.observe(first, NOW + 10) == {"q": 10.0}
    again = dataclasses.replace(first, workloads={"w": submit("w", 8, queue="q",
                                                              submitted_at=2.0)})
    assert since.observe(again, NOW + 20) == {"q": 0.0}
    # a service is not pending itself: its replicas are (each its own workload)
    service = with_queues(make_snapshot([make_node("n1")]), QueueSpec(name="q", gpus=4))
    assert since.observe(service, NOW + 30) == {} and len(since) == 0


def test_a_failure_here_leaves_the_other_metrics_scraped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_snapshot: ClusterSnapshot) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("hafo.controller.queue_metrics.standings", broken)
    registry, *_ = metrics(teams())
    assert samples(registry, "hafo_queue_gpus") == {}
    assert registry.get_sample_value("hafo_leader") == 1.0
