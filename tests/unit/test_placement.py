"""Table-driven tests of placement: filter, score, global batch pass (no etcd)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from hafo.decisions.placement import (
    Placed,
    PlacementRequest,
    Unplaceable,
    batch_order,
    capacity_from,
    place_batch,
    place_one,
)
from hafo.model.cluster import Assignment, ClusterSnapshot, NodeRecord

from .conftest import A100, A100_MIB, make_node, make_snapshot, make_spec, placed

NOW = 1_000.0


def request(wid: str = "w", gpus: int = 1, *, submitted_at: float = 0.0,
            avoid: dict[str, float] | None = None, prefer: str | None = None,
            **spec_kwargs: Any) -> PlacementRequest:
    return PlacementRequest(workload=wid, spec=make_spec(wid, gpus, **spec_kwargs),
                            submitted_at=submitted_at, avoid=avoid or {}, prefer=prefer)


def loaded(allocations: dict[str, list[int]], gpus: int = 4) -> ClusterSnapshot:
    """Nodes named after the keys; each list item is one placed workload's GPU count."""
    assignments: list[Assignment] = []
    for node, sizes in allocations.items():
        first = 0
        for i, size in enumerate(sizes):
            assignments.append(placed(f"{node}-x{i}", node, range(first, first + size)))
            first += size
    return make_snapshot([make_node(n, gpus) for n in allocations], assignments=assignments)


def choose(snapshot: ClusterSnapshot, req: PlacementRequest, now: float = NOW) -> str | None:
    outcome = place_one(req, capacity_from(snapshot), now)
    return outcome.node if isinstance(outcome, Placed) else None


def test_capacity_from_counts_only_ready_nodes_and_healthy_free_gpus() -> None:
    snapshot = make_snapshot(
        [make_node("a", unhealthy_gpus=[3]), make_node("b"), make_node("c"), make_node("d"),
         make_node("e", healthy=False)],
        down=["c"], cordoned=["d"],
        assignments=[placed("w1", "a", [0, 1]), placed("w2", "a", []), placed("w3", "b", [2]),
                     Assignment(workload="w4", phase="pending"),
                     Assignment(workload="w5", phase="completed", node="b", gpus=(0,))],
    )
    capacity = capacity_from(snapshot)
    assert sorted(capacity) == ["a", "b"]
    assert [g.index for g in capacity["a"].free] == [2]
    assert (capacity["a"].allocated_gpus, capacity["a"].workloads) == (2, 2)
    assert [g.index for g in capacity["b"].free] == [0, 1, 3]
    assert (capacity["b"].allocated_gpus, capacity["b"].workloads) == (1, 1)
    released = capacity_from(snapshot, releasing=["w1"])
    assert [g.index for g in released["a"].free] == [0, 1, 2]
    assert (released["a"].allocated_gpus, released["a"].workloads) == (0, 1)


@pytest.mark.parametrize(("allocations", "expected"), [
    pytest.param({"a": [2], "b": [1], "c": [3]}, "b", id="fewest-gpus"),
    pytest.param({"a": [1, 1], "b": [2]}, "b", id="then-fewest-workloads"),
    pytest.param({"c": [1], "a": [1], "b": [1]}, "a", id="then-name"),
    pytest.param({"b": [], "a": [], "c": []}, "a", id="empty-cluster-name"),
    pytest.param({"a": [0, 0, 0], "b": [1]}, "a", id="gpus-before-workloads"),
    pytest.param({"a": [4], "b": [3]}, "b", id="full-node-filtered"),
])
def test_spread_choice(allocations: dict[str, list[int]], expected: str) -> None:
    assert choose(loaded(allocations), request(gpus=1)) == expected


@pytest.mark.parametrize(("nodes", "kwargs", "extra", "expected"), [
    pytest.param([make_node("a", unhealthy_gpus=[0, 1, 2]), make_node("b")], {"gpus": 2},
                 {"assignments": [placed("x", "b", [0])]}, "b", id="unhealthy-gpus"),
    pytest.param([make_node("a"), make_node("b")], {}, {"down": ["a"]}, "b", id="down"),
    pytest.param([make_node("a"), make_node("b")], {}, {"cordoned": ["a"]}, "b",
                 id="cordoned"),
    pytest.param([make_node("a", healthy=False), make_node("b")], {}, {}, "b",
                 id="unhealthy-node"),
    pytest.param([make_node("a"), make_node("b", model=A100, memory_mib=A100_MIB)],
                 {"gpu_model": "*A100*"}, {}, "b", id="model-glob"),
    pytest.param([make_node("a"), make_node("b")], {"gpu_model": "*h100*"}, {}, None,
                 id="model-glob-case-sensitive"),
    pytest.param([make_node("a", model=A100, memory_mib=A100_MIB), make_node("b")],
                 {"gpu_memory_mib": 50_000}, {}, "b", id="memory-min"),
    pytest.param([make_node("a"), make_node("b")], {"gpu_memory_mib": 81_559}, {}, "a",
                 id="memory-min-inclusive"),
    pytest.param([make_node("a", labels={"rack": "r1"}),
                  make_node("b", labels={"rack": "r2", "ib": "yes"})],
                 {"node_selector": {"rack": "r2", "ib": "yes"}}, {}, "b", id="selector"),
    pytest.param([make_node("a", labels={"rack": "r1"})], {"node_selector": {"rack": "r2"}},
                 {}, None, id="selector-none"),
    pytest.param([make_node("a", 0), make_node("b", 0)], {"gpus": 0}, {}, "a",
                 id="zero-gpus-cpu-nodes"),
    pytest.param([make_node("a", 2), make_node("b", 8)], {"gpus": 4}, {}, "b",
                 id="too-few-gpus"),
])
def test_filters(nodes: list[NodeRecord], kwargs: dict[str, Any], extra: dict[str, Any],
                 expected: str | None) -> None:
    assert choose(make_snapshot(nodes, **extra), request(**kwargs)) == expected


def test_cooldown_is_soft_when_nothing_else_fits() -> None:
    snapshot = loaded({"a": [], "b": [1]})
    assert choose(snapshot, request(avoid={"a": NOW + 5, "b": NOW + 5}), NOW) == "a"


@pytest.mark.parametrize(("until", "now", "expected"), [
    (NOW + 5, NOW, "b"),      # cooling down: avoided
    (NOW, NOW, "a"),          # expires exactly now: no longer avoided
    (NOW - 1, NOW, "a"),      # expired
    (NOW + 5, NOW + 6, "a"),  # same entry, later clock
])
def test_avoid_only_while_in_future(until: float, now: float, expected: str) -> None:
    snapshot = loaded({"a": [], "b": [1]})
    assert choose(snapshot, request(avoid={"a": until}), now) == expected


@pytest.mark.parametrize(("allocations", "prefer", "avoid", "gpus", "expected"), [
    pytest.param({"a": [], "b": []}, "b", {}, 1, "b", id="prefer-wins-tie"),
    pytest.param({"a": [], "b": [2]}, "b", {}, 1, "b", id="prefer-restart-in-place"),
    pytest.param({"a": [], "b": []}, "b", {"b": NOW + 10}, 1, "a", id="prefer-but-avoided"),
    pytest.param({"a": [], "b": [3]}, "b", {}, 2, "a", id="prefer-but-full"),
    pytest.param({"a": [], "b": []}, "zz", {}, 1, "a", id="prefer-unknown-node"),
])
def test_prefer(allocations: dict[str, list[int]], prefer: str, avoid: dict[str, float],
                gpus: int, expected: str) -> None:
    req = request(gpus=gpus, prefer=prefer, avoid=avoid)
    assert choose(loaded(allocations), req) == expected


def test_place_one_takes_lowest_free_healthy_indices_and_does_not_mutate() -> None:
    snapshot = make_snapshot([make_node("a", 8, unhealthy_gpus=[0])],
                             assignments=[placed("x", "a", [2])])
    capacity = capacity_from(snapshot)
    before = [g.index for g in capacity["a"].free]
    assert place_one(request(gpus=3), capacity, NOW) == Placed("a", (1, 3, 4))
    assert [g.index for g in capacity["a"].free] == before
    assert capacity["a"].allocated_gpus == 1


@pytest.mark.parametrize(("snapshot", "req", "parts"), [
    pytest.param(make_snapshot([]), request(), ["no ready nodes"], id="no-nodes"),
    pytest.param(make_snapshot([make_node("a")], down=["a"]), request(), ["no ready nodes"],
                 id="all-down"),
    pytest.param(
        make_snapshot([make_node("a"), make_node("b", 1, labels={"rack": "r9"}),
                       make_node("c", 1, labels={"rack": "r9"})]),
        request(gpus=2, node_selector={"rack": "r9"}, avoid={"b": NOW + 1}),
        ["no node fits (", "1 node(s): cooling down after a failure",
         "1 node(s): label rack=r9 not matched",
         "1 node(s): not enough free healthy GPUs of the requested model/memory"],
        id="mixed"),
    pytest.param(make_snapshot([make_node("a", 1), make_node("b", 1)]), request(gpus=2),
                 ["2 node(s): not enough free healthy GPUs"], id="counted"),
])
def test_unplaceable_reason(snapshot: ClusterSnapshot, req: PlacementRequest,
                            parts: list[str]) -> None:
    outcome = place_one(req, capacity_from(snapshot), NOW)
    assert isinstance(outcome, Unplaceable)
    for part in parts:
        assert part in outcome.reason


BATCH = [
    request("big", 4, submitted_at=5.0),
    request("hi", 2, submitted_at=9.0, priority=10),
    request("old", 2, submitted_at=1.0),
    request("mid", 1, submitted_at=3.0),
    request("cpu", 0, submitted_at=2.0),
    request("late", 3, submitted_at=8.0),
]


def batch_snapshot() -> ClusterSnapshot:
    return make_snapshot([make_node("a", 4), make_node("b", 4), make_node("c", 2)],
                         assignments=[placed("existing", "c", [0])])


def test_batch_is_independent_of_input_order_and_never_overfills() -> None:
    expected = place_batch(BATCH, capacity_from(batch_snapshot()), NOW)
    for perm in itertools.permutations(BATCH):
        assert place_batch(list(perm), capacity_from(batch_snapshot()), NOW) == expected
    used: dict[str, list[int]] = {"a": [], "b": [], "c": [0]}
    for outcome in expected.values():
        if isinstance(outcome, Placed):
            used[outcome.node].extend(outcome.gpus)
    sizes = {"a": 4, "b": 4, "c": 2}
    for node, indices in used.items():
        assert len(indices) == len(set(indices)) <= sizes[node]
        assert all(0 <= i < sizes[node] for i in indices)
    placements = {w: o for w, o in expected.items() if isinstance(o, Placed)}
    assert placements == {"hi": Placed("a", (0, 1)), "old": Placed("b", (0, 1)),
                          "cpu": Placed("c", ()), "mid": Placed("c", (1,))}
    assert isinstance(expected["big"], Unplaceable)
    assert isinstance(expected["late"], Unplaceable)


def test_batch_mutates_only_the_given_capacity() -> None:
    capacity = capacity_from(batch_snapshot())
    place_batch(BATCH, capacity, NOW)
    assert sum(c.allocated_gpus for c in capacity.values()) == 1 + 2 + 2 + 0 + 1
    assert capacity_from(batch_snapshot())["a"].allocated_gpus == 0


@pytest.mark.parametrize(("requests", "winner"), [
    pytest.param([request("low", 2, submitted_at=0.0), request("high", 2, submitted_at=9.0,
                                                                priority=1)],
                 "high", id="priority-beats-age"),
    pytest.param([request("young", 2, submitted_at=5.0), request("elder", 2, submitted_at=1.0)],
                 "elder", id="older-first"),
    pytest.param([request("wb", 2, submitted_at=1.0), request("wa", 2, submitted_at=1.0)],
                 "wa", id="then-id"),
    pytest.param([request("neg", 2, priority=-5), request("zero", 2, submitted_at=50.0)],
                 "zero", id="negative-priority-last"),
])
def test_priority_order_for_the_last_slot(requests: list[PlacementRequest],
                                          winner: str) -> None:
    snapshot = make_snapshot([make_node("a", 2)])
    results = place_batch(requests, capacity_from(snapshot), NOW)
    assert isinstance(results[winner], Placed)
    losers = [r.workload for r in requests if r.workload != winner]
    assert all(isinstance(results[w], Unplaceable) for w in losers)


def test_batch_order() -> None:
    assert [r.workload for r in batch_order(BATCH)] == ["hi", "old", "cpu", "mid", "big",
                                                         "late"]


def test_batch_spreads_over_equal_nodes() -> None:
    snapshot = make_snapshot([make_node(n, 4) for n in "abc"])
    reqs = [request(f"w{i}", 1, submitted_at=float(i)) for i in range(6)]
    results = place_batch(reqs, capacity_from(snapshot), NOW)
    nodes = Counter(o.node for o in results.values() if isinstance(o, Placed))
    assert nodes == {"a": 2, "b": 2, "c": 2}
    assert results["w0"] == Placed("a", (0,)) and results["w3"] == Placed("a", (1,))
