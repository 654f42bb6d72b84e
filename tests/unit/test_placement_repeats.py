"""A pass tries a request like an earlier one that was not placed only when something changed
since (``hafo.decisions.placement._repeat_key``): the plans are the same as when every
request is tried. Random clusters of queues, priorities and waiting work of a few shapes,
with and without the shortcut. Pure."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hafo.decisions import placement
from hafo.decisions.observed import Observations, observe
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import QueueSpec

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 10_000.0


def random_cluster(seed: int) -> ClusterSnapshot:
    """4-8 nodes of 8 GPUs partly filled, 0-4 queues in up to two cohorts, 10-60 waiting
    requests of a few shapes (some of higher priority: preemption; some of a gang)."""
    rng = random.Random(seed)
    queues = [QueueSpec(name=f"q{i}", gpus=rng.choice((4, 8, 12)),
                        cohort=rng.choice((None, "c1", "c2")) or None)
              for i in range(rng.randint(0, 4))]
    names = [q.name for q in queues] or ["default"]
    nodes = [make_node(f"n{i}", gpus=8) for i in range(rng.randint(4, 8))]
    subs, assigned, reports = [], [], []
    k = 0
    for node in nodes:
        used = 0
        while used < 8 and rng.random() < 0.8:
            size = min(rng.choice((1, 2, 4)), 8 - used)
            wid = f"r{k}"
            k += 1
            subs.append(submit(wid, size, queue=rng.choice(names), submitted_at=k,
                               priority=rng.randint(0, 2)))
            assigned.append(placed(wid, node.name, range(used, used + size)))
            reports.append(status(wid, node.name))
            used += size
    for j in range(rng.randint(10, 60)):
        subs.append(submit(f"p{j}", rng.choice((1, 1, 2, 4, 8)), queue=rng.choice(names),
                           submitted_at=1000 + j, priority=rng.randint(0, 4),
                           nodes=rng.choice((1, 1, 1, 1, 2))))
    snapshot = make_snapshot(nodes, workloads=subs, assignments=assigned, statuses=reports)
    return dataclasses.replace(snapshot, queues={q.name: q for q in queues})


def plan_of(snapshot: ClusterSnapshot) -> list[tuple[str, str, str, object]]:
    seen = observe(Observations(), snapshot, NOW - 600)
    plan = reconcile(snapshot, NOW, seen=seen, min_runtime=0.0)
    return [(a.workload, a.kind, a.why, a.assignment) for a in plan.actions]


@pytest.mark.parametrize("seed", range(150))
def test_the_shortcut_changes_no_plan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = random_cluster(seed)
    fast = plan_of(snapshot)
    monkeypatch.setattr(placement, "_repeat_key", lambda request, quotas: None)
    assert plan_of(snapshot) == fast
