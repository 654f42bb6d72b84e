"""No starvation of large work by a stream of smaller work: the first request refused for too
little of its cohort's pool holds the room left against the borrowers after it
(``Quotas.hold_pool``), as the first waiting gang holds the nodes closest to fitting it; and
a gang holds only nodes it would fit once they were empty."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.quota import Quotas
from hafo.decisions.reconcile import Action, reconcile
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import QueueSpec

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit

NOW = 1000.0


def by_workload(snapshot: ClusterSnapshot) -> dict[str, Action]:
    return {a.workload: a for a in reconcile(snapshot, now=NOW).actions}


def reason_of(action: Action) -> str:
    return action.assignment.reason if action.assignment is not None else ""


def busy(*slots: tuple[str, str, tuple[int, ...]], **spec: Any) -> dict[str, Any]:
    """Running work: (id, node, GPUs) each; its submissions, assignments and statuses."""
    return {"workloads": [submit(w, len(g), **spec) for w, _n, g in slots],
            "assignments": [placed(w, n, g) for w, n, g in slots],
            "statuses": [status(w, n) for w, n, _g in slots]}


def merged(*parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, list[Any]] = {"workloads": [], "assignments": [], "statuses": []}
    for part in parts:
        for key, values in part.items():
            out[key] = [*out[key], *values]
    for key, values in extra.items():
        out[key] = [*out.get(key, []), *values]
    return out


# -- a waiting gang holds only nodes it could fit ------------------------------------------

@pytest.mark.parametrize(("gpus", "small_placed"), [
    (8, 6),  # members of more GPUs than any node has: it could never fit, holds nothing
    (4, 0),  # two whole nodes: it holds both, the later small work waits
])
def test_a_gang_holds_only_nodes_it_could_fit_once_empty(gpus: int,
                                                           small_placed: int) -> None:
    """Holding for a gang that could never fit would keep GPUs idle for nothing."""
    work = merged(busy(("old-a", "a", (0,)), ("old-b", "b", (0,))),
                  workloads=[submit("big", gpus, nodes=2, submitted_at=10.0),
                             *(submit(f"s{i}", 1, submitted_at=20.0 + i) for i in range(6))])
    actions = by_workload(make_snapshot([make_node("a"), make_node("b")], **work))
    assert actions["big"].kind == "pending"
    small = [w for w in actions if w.startswith("s")]
    assert sum(1 for w in small if actions[w].kind == "place") == small_placed


# -- the cohort's pool is held ------------------------------------------------------------

def cohort(*names: str, gpus: int = 4) -> tuple[QueueSpec, ...]:
    return tuple(QueueSpec(name=n, gpus=gpus, cohort="c") for n in names)


def pool(queues: tuple[QueueSpec, ...], **work: Any) -> ClusterSnapshot:
    snapshot = make_snapshot([make_node("n1", 8), make_node("n2", 8)], **work)
    return dataclasses.replace(snapshot, queues={x.name: x for x in queues})


def in_queue(queue: str, *slots: tuple[str, str, tuple[int, ...]]) -> dict[str, Any]:
    return busy(*slots, queue=queue)


def test_a_request_short_of_the_pool_holds_it_against_the_borrowers_after_it() -> None:
    """Pool 12 (a, b, c: 4 each) on 16 GPUs. a borrows 2 (uses 6), b uses 1: 5 left. c's
    request within its quota is placed (4 left); b's 5 is refused and holds the pool, so
    a's borrowing request after it in the fair order waits, saying so, instead of taking
    the room a few GPUs at a time for ever."""
    work = merged(in_queue("a", *((f"a{i}", "n1", (i,)) for i in range(6))),
                  in_queue("b", ("b0", "n1", (6,))),
                  workloads=[submit("b-big", 5, queue="b", submitted_at=10.0),
                             submit("a-more", 1, queue="a", submitted_at=11.0),
                             submit("c-small", 1, queue="c", submitted_at=12.0)])
    actions = by_workload(pool(cohort("a", "b", "c"), **work))
    assert actions["c-small"].kind == "place"
    assert actions["b-big"].kind == "pending"
    assert actions["a-more"].kind == "pending"
    assert reason_of(actions["a-more"]).endswith(
        "queue a: needs 1; cohort c has too little to lend")


def test_no_hold_when_the_borrowed_work_ending_would_not_make_room() -> None:
    """a uses its 4 (borrows nothing), c 3, b 1: the 4 left would not grow by any borrower
    ending, so b's 5 holds nothing and c's borrowing request is placed."""
    work = merged(in_queue("a", *((f"a{i}", "n1", (i,)) for i in range(4))),
                  in_queue("b", ("b0", "n1", (4,))),
                  in_queue("c", *((f"c{i}", "n2", (i,)) for i in range(3))),
                  workloads=[submit("b-big", 5, queue="b", submitted_at=10.0),
                             submit("a-more", 1, queue="a", submitted_at=11.0)])
    actions = by_workload(pool(cohort("a", "b", "c"), **work))
    assert actions["b-big"].kind == "pending"
    assert actions["a-more"].kind == "place"


def test_a_request_within_its_quota_is_never_held() -> None:
    quotas = Quotas({x.name: x for x in cohort("a", "b", "c")}, {"a": 6.0, "b": 1.0})
    big = PlacementRequest("b-big", make_spec("b-big", 6, queue="b"), 1.0)
    refusal = quotas.refusal(big)
    assert refusal is not None and quotas.hold_pool(big, refusal)
    mine = PlacementRequest("c1", make_spec("c1", 3, queue="c"), 2.0)
    borrower = PlacementRequest("a1", make_spec("a1", 1, queue="a"), 3.0)
    assert quotas.refusal(mine) is None
    held = quotas.refusal(borrower)
    assert held is not None and held.held
    assert held.summary() == "queue a: needs 1; cohort c has too little to lend"
    assert not quotas.hold_pool(borrower, held)  # one hold per pool and pass
