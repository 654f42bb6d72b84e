"""Table-driven tests of placement: filter, score, global batch pass (no etcd)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from hafo.decisions.placement import (
    Placed,
    PlacementRequest,
    Strategy,
    Unplaceable,
    batch_order,
    capacity_from,
    node_capacity,
    place_batch,
    place_one,
)
from hafo.model.cluster import Assignment, ClusterSnapshot, Gpu, NodeRecord, mig_index

from .conftest import (
    A100,
    A100_MIB,
    H100,
    H100_MIB,
    make_node,
    make_snapshot,
    make_spec,
    placed,
)

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
         "1 node(s): not enough free healthy GPUs (needs 2)"],
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
    snapshot = batch_snapshot()
    capacity = capacity_from(snapshot)
    place_batch(BATCH, capacity, NOW)
    assert sum(c.allocated_gpus for c in capacity.values()) == 1 + 2 + 2 + 0 + 1
    # the snapshot it was built from is untouched: a fresh capacity of it is the one before
    assert capacity_from(snapshot) == capacity_from(batch_snapshot())
    assert sum(c.allocated_gpus for c in capacity_from(snapshot).values()) == 1


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


# -- strategies, utilization, MIG, reasons ---------------------------------------------------


def node_with(name: str, *gpus: Gpu, labels: dict[str, str] | None = None) -> NodeRecord:
    return NodeRecord(name=name, labels=labels or {}, gpus=gpus)


def whole(index: int, node: str = "x", *, model: str = H100, memory_mib: int = H100_MIB,
          utilization: float | None = None, healthy: bool = True) -> Gpu:
    return Gpu(index, f"GPU-{node}-{index}", model, memory_mib, healthy=healthy,
               utilization=utilization)


def mig(parent: int, slot: int, profile: str, node: str = "x", *,
        healthy: bool = True) -> Gpu:
    memory = int(profile.split(".")[1][:-2]) * 1024
    return Gpu(mig_index(parent, slot), f"MIG-{node}-{parent}-{slot}", H100, memory,
               healthy=healthy, profile=profile, parent=parent)


@pytest.mark.parametrize(("allocations", "gpus", "strategy", "placement", "expected"), [
    pytest.param({"a": [1], "b": [3], "c": []}, 1, "binpack", None, "b", id="binpack-fullest"),
    pytest.param({"a": [1], "b": [3], "c": []}, 2, "binpack", None, "a",
                 id="binpack-fullest-that-fits"),
    pytest.param({"a": [2], "b": [2]}, 1, "binpack", None, "a", id="binpack-then-name"),
    pytest.param({"a": [], "b": []}, 1, "binpack", None, "a", id="binpack-empty-name"),
    pytest.param({"a": [1, 1], "b": [2]}, 1, "binpack", None, "a",
                 id="binpack-ignores-workload-count"),
    pytest.param({"a": [1], "b": [3], "c": []}, 1, "spread", "binpack", "b",
                 id="spec-binpack-overrides"),
    pytest.param({"a": [1], "b": [3], "c": []}, 1, "binpack", "spread", "c",
                 id="spec-spread-overrides"),
    pytest.param({"a": [1], "b": [3], "c": []}, 1, "spread", None, "c", id="spread-default"),
])
def test_strategy_choice(allocations: dict[str, list[int]], gpus: int, strategy: Strategy,
                         placement: str | None, expected: str) -> None:
    req = request(gpus=gpus, placement=placement)
    outcome = place_one(req, capacity_from(loaded(allocations)), NOW, strategy)
    assert isinstance(outcome, Placed) and outcome.node == expected


def test_binpack_still_prefers_the_preferred_node() -> None:
    req = request(prefer="c", placement="binpack")
    outcome = place_one(req, capacity_from(loaded({"a": [1], "b": [3], "c": []})), NOW)
    assert isinstance(outcome, Placed) and outcome.node == "c"


def test_binpack_batch_fills_one_node_before_the_next() -> None:
    snapshot = make_snapshot([make_node(n, 4) for n in "abc"])
    reqs = [request(f"w{i}", 1, submitted_at=float(i)) for i in range(6)]
    results = place_batch(reqs, capacity_from(snapshot), NOW, "binpack")
    assert [(o.node, o.gpus) for o in results.values() if isinstance(o, Placed)] == [
        ("a", (0,)), ("a", (1,)), ("a", (2,)), ("a", (3,)), ("b", (0,)), ("b", (1,))]


@pytest.mark.parametrize(("utilization", "allocations", "expected"), [
    pytest.param({"a": [90, 90], "b": [0, 0]}, {}, "b", id="idle-node-first"),
    pytest.param({"a": [90, None], "b": [50, 50]}, {}, "a", id="none-counts-as-zero"),
    pytest.param({"a": [None, None], "b": [0, 0]}, {}, "a", id="unknown-is-idle-then-name"),
    pytest.param({"a": [0, 0], "b": [80, 80]}, {"a": 1}, "b",
                 id="allocated-gpus-before-utilization"),
    pytest.param({"a": [40, 40], "b": [40, 40]}, {"a": 0}, "b",
                 id="utilization-before-workloads"),
])
def test_spread_uses_mean_utilization_after_allocated_gpus(
        utilization: dict[str, list[float | None]], allocations: dict[str, int],
        expected: str) -> None:
    nodes = [node_with(n, *(whole(i, n, utilization=u) for i, u in enumerate(utils)))
             for n, utils in utilization.items()]
    # "a": 0 in allocations: one workload with no GPUs (more workloads, same GPUs)
    assignments = [placed(f"{n}-x", n, range(k)) for n, k in allocations.items()]
    snapshot = make_snapshot(nodes, assignments=assignments)
    assert choose(snapshot, request(gpus=1)) == expected


def test_capacity_records_mean_utilization_and_inventory() -> None:
    node = node_with("a", whole(0, "a", utilization=30), whole(1, "a"),
                     whole(2, "a", utilization=60, healthy=False))
    cap = capacity_from(make_snapshot([node]))["a"]
    assert cap.utilization == 30.0
    assert cap.inventory == node.gpus and [g.index for g in cap.free] == [0, 1]


MIG_NODE = node_with("m", whole(0, "m"), mig(1, 0, "1g.10gb", "m"), mig(1, 1, "1g.10gb", "m"),
                     mig(1, 2, "3g.40gb", "m"))


@pytest.mark.parametrize(("kwargs", "expected"), [
    pytest.param({"gpus": 1}, (0,), id="whole-gpu-only"),
    pytest.param({"gpus": 2, "gpu_profile": "1g.10gb"}, (200, 201), id="two-1g"),
    pytest.param({"gpus": 1, "gpu_profile": "3g.40gb"}, (202,), id="one-3g"),
    pytest.param({"gpus": 3, "gpu_profile": "1g.10gb"}, None, id="not-enough-1g"),
    pytest.param({"gpus": 2}, None, id="mig-devices-are-not-whole-gpus"),
    pytest.param({"gpus": 1, "gpu_profile": "7g.80gb"}, None, id="unknown-profile"),
    pytest.param({"gpus": 1, "gpu_profile": "1g.10gb", "gpu_memory_mib": 20_000}, None,
                 id="profile-and-memory"),
])
def test_mig_devices_are_schedulable_units(kwargs: dict[str, Any],
                                           expected: tuple[int, ...] | None) -> None:
    outcome = place_one(request(**kwargs), capacity_from(make_snapshot([MIG_NODE])), NOW)
    assert (outcome.gpus if isinstance(outcome, Placed) else None) == expected


def test_mig_batch_shares_one_gpu_between_workloads() -> None:
    reqs = [request(f"w{i}", 1, submitted_at=float(i), gpu_profile="1g.10gb")
            for i in range(3)]
    results = place_batch(reqs, capacity_from(make_snapshot([MIG_NODE])), NOW)
    assert [r.gpus if isinstance(r, Placed) else None for r in results.values()] == [
        (200,), (201,), None]


@pytest.mark.parametrize(("nodes", "kwargs", "reason"), [
    pytest.param([make_node("a", 2)], {"gpus": 4},
                 "1 node(s): not enough free healthy GPUs (needs 4)", id="capacity"),
    pytest.param([make_node("a", 4, unhealthy_gpus=[0, 1, 2])], {"gpus": 2},
                 "1 node(s): not enough free healthy GPUs (needs 2)", id="unhealthy"),
    pytest.param([make_node("a")], {"gpu_model": "*A100*"},
                 "1 node(s): no GPU of model *A100*", id="model-glob"),
    pytest.param([make_node("a", model=A100, memory_mib=A100_MIB)], {"gpu_memory_mib": 80_000},
                 "1 node(s): no GPU with at least 80000 MiB", id="memory"),
    pytest.param([make_node("a"), make_node("b", model=A100, memory_mib=A100_MIB)],
                 {"gpu_model": "*A100*", "gpu_memory_mib": 80_000},
                 "1 node(s): no GPU of model *A100*, "
                 "1 node(s): no GPU of model *A100* with at least 80000 MiB",
                 id="model-and-memory"),
    pytest.param([make_node("a", 2, model=A100, memory_mib=A100_MIB)],
                 {"gpus": 3, "gpu_model": "*A100*"},
                 "1 node(s): not enough free healthy GPUs of model *A100* (needs 3)",
                 id="model-but-too-few"),
    pytest.param([make_node("a")], {"gpu_profile": "1g.10gb"},
                 "1 node(s): no 1g.10gb MIG device", id="profile-missing"),
    pytest.param([MIG_NODE], {"gpus": 3, "gpu_profile": "1g.10gb"},
                 "1 node(s): not enough free healthy 1g.10gb MIG devices (needs 3)",
                 id="profile-too-few"),
    pytest.param([node_with("m", mig(0, 0, "1g.10gb", "m"))], {"gpus": 1},
                 "1 node(s): no whole GPU (only MIG devices)", id="mig-only-node"),
    pytest.param([make_node("a", labels={"rack": "r1"}), make_node("b")],
                 {"node_selector": {"rack": "r2"}},
                 "2 node(s): label rack=r2 not matched", id="labels"),
    pytest.param([make_node("a", labels={"rack": "r2"})],
                 {"node_selector": {"rack": "r2", "ib": "yes"}},
                 "1 node(s): label ib=yes not matched", id="second-label"),
])
def test_pending_reason_names_the_constraint(nodes: list[NodeRecord], kwargs: dict[str, Any],
                                             reason: str) -> None:
    outcome = place_one(request(**kwargs), capacity_from(make_snapshot(nodes)), NOW)
    assert outcome == Unplaceable(f"no node fits ({reason})")


@pytest.mark.parametrize(("req", "reason"), [
    pytest.param(PlacementRequest("w", make_spec("w", 1), 0.0, only="b"),
                 "1 node(s): not enough free healthy GPUs (needs 1), "
                 "1 node(s): not the requested node b", id="only-full"),
    pytest.param(PlacementRequest("w", make_spec("w", 1), 0.0, only="zz"),
                 "2 node(s): not the requested node zz", id="only-unknown"),
])
def test_only_reasons(req: PlacementRequest, reason: str) -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b", 1)],
                             assignments=[placed("x", "b", [0])])
    outcome = place_one(req, capacity_from(snapshot), NOW)
    assert outcome == Unplaceable(f"no node fits ({reason})")


def test_exhausted_only_when_excluded_nodes_could_take_it() -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b", 1)])
    exclude = {"a": NOW + 50}
    fits = PlacementRequest("w", make_spec("w", 2), 0.0, exclude=exclude)
    assert place_one(fits, capacity_from(snapshot), NOW) == Unplaceable(
        "no node fits (1 node(s): not enough free healthy GPUs (needs 2), "
        "1 node(s): the workload failed there too often)", exhausted=True)
    too_big = PlacementRequest("w", make_spec("w", 8), 0.0, exclude=exclude)
    outcome = place_one(too_big, capacity_from(snapshot), NOW)
    assert isinstance(outcome, Unplaceable) and not outcome.exhausted


def test_reserved_gpus_are_only_for_their_request() -> None:
    snapshot = make_snapshot([make_node("a", 2)])
    capacity = capacity_from(snapshot)
    held = tuple(capacity["a"].free)
    capacity["a"].free = []
    owner = PlacementRequest("owner", make_spec("owner", 2), 5.0, only="a", reserved=held)
    other = PlacementRequest("other", make_spec("other", 1, priority=9), 0.0)
    results = place_batch([owner, other], capacity, NOW)
    assert results["owner"] == Placed("a", (0, 1))
    assert isinstance(results["other"], Unplaceable)


def test_node_capacity_is_capacity_from_for_one_node() -> None:
    snapshot = make_snapshot([make_node("a"), make_node("b")], cordoned=["b"],
                             assignments=[placed("x", "a", [1]), placed("y", "a", [2, 3]),
                                          placed("z", "b", [0])])
    assert node_capacity(snapshot, "a") == {"a": capacity_from(snapshot)["a"]}
    assert node_capacity(snapshot, "a", ["y"]) == {"a": capacity_from(snapshot, ["y"])["a"]}
    assert node_capacity(snapshot, "b") == {} and node_capacity(snapshot, "zz") == {}
    assert snapshot.holders == {"a": ("x", "y"), "b": ("z",)}
