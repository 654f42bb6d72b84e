"""The placement index gives exactly the answers of filtering and scoring every node.

A straightforward reference (a scan of every node per request, as placement was first
written) is run against ``place_one`` / ``place_batch`` on seeded random clusters: labels,
models, memory, MIG devices, unhealthy GPUs, utilization, cool-downs, exclusions, preferred
and required nodes, both strategies. Plus a timing bound at 2,000 nodes x 2,000 requests.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Mapping
from fnmatch import fnmatchcase

import pytest

from hafo.decisions.placement import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Unplaceable,
    batch_order,
    capacity_from,
    place_batch,
    place_one,
)
from hafo.decisions.placement_rules import (
    COOLING,
    EXCLUDED,
    Strategy,
    missing_kind,
    not_enough,
)
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import (
    Assignment,
    ClusterSnapshot,
    Gpu,
    Liveness,
    NodeRecord,
    Submission,
    mig_index,
)
from hafo.model.spec import WorkloadSpec

from .conftest import A100, A100_MIB, H100, H100_MIB

NOW = 5_000.0

# -- the reference: every node, every request ------------------------------------------------


def ref_matches(spec: WorkloadSpec, gpu: Gpu) -> bool:
    return (gpu.profile == spec.gpu_profile
            and (spec.gpu_model is None or fnmatchcase(gpu.model, spec.gpu_model))
            and (spec.gpu_memory_mib is None or gpu.memory_mib >= spec.gpu_memory_mib))


def ref_filter(req: PlacementRequest, cap: NodeCapacity, honour_cooldown: bool,
               honour_exclude: bool = True) -> str | None:
    if req.only is not None and cap.name != req.only:
        return f"not the requested node {req.only}"
    if honour_exclude and req.exclude.get(cap.name, 0.0) > NOW:
        return EXCLUDED
    if honour_cooldown and req.avoid.get(cap.name, 0.0) > NOW:
        return COOLING
    for key, value in req.spec.node_selector.items():
        if cap.labels.get(key) != value:
            return f"label {key}={value} not matched"
    if sum(1 for g in cap.free if ref_matches(req.spec, g)) < req.spec.gpus:
        return missing_kind(req.spec, cap.inventory) or not_enough(req.spec)
    return None


def ref_score(req: PlacementRequest, cap: NodeCapacity, strategy: Strategy) -> tuple[object, ...]:
    preferred = 0 if req.prefer == cap.name else 1
    if (req.spec.placement or strategy) == "binpack":
        return (preferred, -cap.allocated_gpus, cap.name)
    mean = (sum(g.utilization or 0 for g in cap.inventory) / len(cap.inventory)
            if cap.inventory else 0.0)
    return (preferred, cap.allocated_gpus, mean, cap.workloads, cap.name)


def ref_best(req: PlacementRequest, capacity: Mapping[str, NodeCapacity], strategy: Strategy,
             honour_cooldown: bool, reasons: Counter[str],
             honour_exclude: bool = True) -> NodeCapacity | None:
    best = None
    for cap in capacity.values():
        why = ref_filter(req, cap, honour_cooldown, honour_exclude)
        if why is not None:
            reasons[why] += 1
        elif best is None or ref_score(req, cap, strategy) < ref_score(req, best, strategy):
            best = cap
    return best


def ref_place_one(req: PlacementRequest, capacity: Mapping[str, NodeCapacity],
                  strategy: Strategy) -> Placed | Unplaceable:
    if not capacity:
        return Unplaceable("no ready nodes")
    reasons: Counter[str] = Counter()
    best = ref_best(req, capacity, strategy, True, reasons) \
        or ref_best(req, capacity, strategy, False, Counter())
    if best is None:
        summary = ", ".join(f"{n} node(s): {why}" for why, n in sorted(reasons.items()))
        exhausted = bool(req.exclude) and ref_best(req, capacity, strategy, False, Counter(),
                                                   honour_exclude=False) is not None
        return Unplaceable(f"no node fits ({summary})", exhausted)
    indices = sorted(g.index for g in best.free if ref_matches(req.spec, g))
    return Placed(best.name, tuple(indices[:req.spec.gpus]))


def ref_place_batch(requests: list[PlacementRequest], capacity: dict[str, NodeCapacity],
                    strategy: Strategy) -> dict[str, Placed | Unplaceable]:
    out: dict[str, Placed | Unplaceable] = {}
    for req in batch_order(requests):
        result = ref_place_one(req, capacity, strategy)
        if isinstance(result, Placed):
            cap = capacity[result.node]
            cap.free = [g for g in cap.free if g.index not in result.gpus]
            cap.allocated_gpus += len(result.gpus)
            cap.workloads += 1
        out[req.workload] = result
    return out


# -- random clusters -------------------------------------------------------------------------

PROFILES = ("1g.10gb", "3g.40gb")


def random_node(rng: random.Random, name: str) -> NodeRecord:
    model, memory = rng.choice([(H100, H100_MIB), (A100, A100_MIB)])
    gpus: list[Gpu] = []
    for i in range(rng.choice([0, 1, 2, 4, 4, 8, 8, 8])):
        healthy, degraded = rng.random() > 0.08, rng.random() < 0.04
        if rng.random() < 0.15:
            for slot, profile in enumerate(rng.sample(PROFILES * 2, rng.randint(1, 4))):
                gpus.append(Gpu(mig_index(i, slot), f"MIG-{name}-{i}-{slot}", model,
                                int(profile.split(".")[1][:-2]) * 1024, healthy=healthy,
                                degraded=degraded, profile=profile, parent=i))
            continue
        util = rng.choice([None, None, 0.0, 10.0, 50.0, 90.0])
        gpus.append(Gpu(i, f"GPU-{name}-{i}", model, memory, healthy=healthy,
                        degraded=degraded, utilization=util))
    labels = {"rack": rng.choice(["r1", "r2", "r3"])}
    if rng.random() < 0.5:
        labels["ib"] = "yes"
    return NodeRecord(name, labels, tuple(gpus))


def random_cluster(rng: random.Random) -> ClusterSnapshot:
    names = rng.sample([f"n{i:03d}" for i in range(200)], rng.randint(1, 40))
    nodes = {n: random_node(rng, n) for n in names}
    alive = {n: Liveness(n, 1, 0.0) for n in names if rng.random() > 0.1}
    cordoned = frozenset(n for n in names if rng.random() < 0.05)
    assignments: dict[str, Assignment] = {}
    for name, record in nodes.items():
        free = [g.index for g in record.gpus]
        rng.shuffle(free)
        for k in range(rng.randint(0, 3)):
            take = [free.pop() for _ in range(min(len(free), rng.randint(0, 3)))]
            wid = f"old-{name}-{k}"
            assignments[wid] = Assignment(wid, rng.choice(["placed", "moving"]), name,
                                          tuple(take), epoch=3)
    return ClusterSnapshot(1, nodes, alive, cordoned, {}, assignments, {})


def random_request(rng: random.Random, wid: str, names: list[str]) -> PlacementRequest:
    def some_nodes() -> dict[str, float]:
        picked = rng.sample(names, min(len(names), rng.choice([0, 0, 1, 2, 5])))
        return {n: NOW + rng.choice([-10.0, 0.0, 30.0]) for n in picked}

    spec = WorkloadSpec(
        name=wid, command=("x",), gpus=rng.choice([0, 1, 1, 1, 2, 2, 3, 4, 8]),
        gpu_model=rng.choice([None, None, None, "*A100*", "*H100*", "*V100*"]),
        gpu_memory_mib=rng.choice([None, None, None, 30_000, 50_000, 90_000]),
        gpu_profile=rng.choice([None] * 6 + [*PROFILES, "7g.80gb"]),
        node_selector=rng.choice([{}, {}, {}, {"rack": "r1"}, {"ib": "yes", "rack": "r2"},
                                  {"rack": "r9"}]),
        placement=rng.choice([None, None, "spread", "binpack"]),
        priority=rng.randint(-2, 2))
    only = rng.choice(names) if names and rng.random() < 0.08 else None
    prefer = rng.choice(names) if names and rng.random() < 0.2 else None
    return PlacementRequest(wid, spec, float(rng.randint(0, 50)), avoid=some_nodes(),
                            prefer=prefer, only=only, exclude=some_nodes())


@pytest.mark.parametrize("seed", range(60))
def test_index_matches_the_reference_scan(seed: int) -> None:
    rng = random.Random(seed)
    snapshot = random_cluster(rng)
    names = [*sorted(snapshot.nodes), "ghost"]
    requests = [random_request(rng, f"w{i:03d}", names) for i in range(rng.randint(1, 120))]
    strategy: Strategy = rng.choice(["spread", "binpack"])
    for req in requests[:10]:
        assert place_one(req, capacity_from(snapshot), NOW, strategy) == \
            ref_place_one(req, capacity_from(snapshot), strategy), req
    expected = ref_place_batch(requests, capacity_from(snapshot), strategy)
    capacity = capacity_from(snapshot)
    got = place_batch(reversed(requests), capacity, NOW, strategy)
    assert got == expected
    reference = capacity_from(snapshot)
    ref_place_batch(requests, reference, strategy)
    assert capacity == reference  # the same commits


def test_the_random_clusters_cover_every_outcome() -> None:
    seen: Counter[str] = Counter()
    for seed in range(60):
        rng = random.Random(seed)
        snapshot = random_cluster(rng)
        names = [*sorted(snapshot.nodes), "ghost"]
        requests = [random_request(rng, f"w{i:03d}", names) for i in range(rng.randint(1, 120))]
        for result in place_batch(requests, capacity_from(snapshot), NOW).values():
            if isinstance(result, Placed):
                seen["placed"] += 1
            else:
                seen["exhausted" if result.exhausted else "unplaceable"] += 1
                for part in ("cooling", "failed there", "label", "not enough", "MIG device",
                             "of model", "with at least", "no whole GPU", "not the requested"):
                    seen[part] += part in result.reason
    assert all(seen[k] > 0 for k in ("placed", "exhausted", "unplaceable", "cooling",
                                     "failed there", "label", "not enough", "MIG device",
                                     "of model", "with at least", "no whole GPU",
                                     "not the requested")), seen


# -- scale ---------------------------------------------------------------------------------


def big_cluster(nodes: int, workloads: int) -> ClusterSnapshot:
    records = {f"node-{i:05d}": NodeRecord(
        f"node-{i:05d}", {"zone": f"z{i % 4}"},
        tuple(Gpu(g, f"GPU-{i}-{g}", H100, H100_MIB, utilization=float(10 * (i % 3)))
              for g in range(8))) for i in range(nodes)}
    subs = {f"w{i:05d}": Submission(f"w{i:05d}", WorkloadSpec(f"w{i}", ("x",), gpus=1,
                                                              priority=i % 3), float(i))
            for i in range(workloads)}
    return ClusterSnapshot(1, records, {n: Liveness(n, 1, 0.0) for n in records},
                           frozenset(), subs, {}, {})


def test_batch_at_scale_is_fast() -> None:
    snapshot = big_cluster(2_000, 2_000)
    requests = [PlacementRequest(w, s.spec, s.submitted_at)
                for w, s in snapshot.workloads.items()]
    started = time.perf_counter()
    results = place_batch(requests, capacity_from(snapshot), NOW)
    batch = time.perf_counter() - started
    started = time.perf_counter()
    plan = reconcile(snapshot, NOW)
    whole = time.perf_counter() - started
    print(f"2,000 nodes x 2,000 requests: place_batch {batch:.3f}s, reconcile {whole:.3f}s")
    assert batch < 5.0 and whole < 5.0
    assert all(isinstance(r, Placed) for r in results.values())
    assert len(plan.actions) == 2_000
    per_node = Counter(a.assignment.node for a in plan.actions if a.assignment)
    assert set(per_node.values()) == {1}  # spread: one each on 2,000 empty nodes
