"""Queue quotas, borrowing in a cohort, the fair order and the pending reasons
(``hafo.decisions.quota``), alone and through ``reconcile``: table-driven, pure."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from hafo.decisions.admission import admit
from hafo.decisions.fair_order import admission_order
from hafo.decisions.pending_reasons import live_reasons, ordinal, with_live_reasons
from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.queue_standings import standings
from hafo.decisions.quota import Quotas, charge, usage
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import ClusterSnapshot
from hafo.model.queues import QueueSpec
from hafo.model.spec import WorkloadSpec

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit


def q(name: str, gpus: int | None = 4, **kwargs: Any) -> QueueSpec:
    return QueueSpec(name=name, gpus=gpus, **kwargs)


def spec(queue: str = "a", gpus: int = 1, **kwargs: Any) -> WorkloadSpec:
    return make_spec("w", gpus, queue=queue, **kwargs)


def request(wid: str, queue: str = "a", gpus: int = 1, *, priority: int = 0,
            at: float = 0.0, **kwargs: Any) -> PlacementRequest:
    return PlacementRequest(workload=wid, spec=make_spec(wid, gpus, queue=queue,
                                                         priority=priority, **kwargs),
                            submitted_at=at)


def quotas(used: dict[str, float], *queues: QueueSpec) -> Quotas:
    return Quotas({x.name: x for x in queues}, dict(used))


@pytest.mark.parametrize(("workload", "expected"), [
    (spec(gpus=2), 2.0),
    (spec(gpus=0), 0.0),
    (spec(gpus=2, nodes=3), 6.0),  # a gang counts every member
    (spec(gpus=2, gpu_profile="1g.10gb"), 2 / 7),  # MIG by its compute slices
    (spec(gpus=1, gpu_profile="3g.40gb"), 3 / 7),
    (spec(gpus=1, gpu_profile="7g.80gb"), 1.0),
])
def test_charge(workload: WorkloadSpec, expected: float) -> None:
    assert charge(workload) == pytest.approx(expected)


COHORT_AB = (q("a", 4, cohort="c"), q("b", 4, cohort="c"))


@pytest.mark.parametrize(("queues", "used", "workload", "reason"), [
    # No cohort: the nominal quota is the limit.
    ((q("a", 4),), {"a": 3}, spec(gpus=1), None),
    ((q("a", 4),), {"a": 3}, spec(gpus=2), "queue a: 3 of 4 GPUs used, needs 2"),
    ((q("a", 0),), {}, spec(gpus=0), None),  # no GPUs: no quota needed
    ((q("a", None),), {"a": 1000}, spec(gpus=8), None),  # no quota at all
    # Undeclared queue.
    ((q("a", 4),), {}, spec("zz"),
     "no queue named 'zz' (declared: a); `hafo queue set zz --gpus N` declares it"),
    # Borrowing: b idle lends a its 4.
    (COHORT_AB, {"a": 4}, spec(gpus=4), None),
    (COHORT_AB, {"a": 8}, spec(gpus=1),
     "queue a: 8 of 4 GPUs used, needs 1; cohort c lends 0 of 8"),
    # b borrowed everything: a waits within its own quota (reclaim is not a quota's job).
    (COHORT_AB, {"b": 8}, spec(gpus=4),
     "queue a: 0 of 4 GPUs used, needs 4; cohort c lends 0 of 8 (b uses 8 of its 4)"),
    (COHORT_AB, {"b": 6}, spec(gpus=2), None),
    (COHORT_AB, {"b": 6}, spec(gpus=3),
     "queue a: 0 of 4 GPUs used, needs 3; cohort c lends 2 of 8 (b uses 6 of its 4)"),
    # Lending limit: b lends only 1 of its 4, keeps 3.
    ((q("a", 4, cohort="c"), q("b", 4, cohort="c", lending_limit=1)), {"a": 4},
     spec(gpus=1), None),
    ((q("a", 4, cohort="c"), q("b", 4, cohort="c", lending_limit=1)), {"a": 5},
     spec(gpus=1), "queue a: 5 of 4 GPUs used, needs 1; cohort c lends 0 of 5"),
    # What a queue keeps is its own even when the pool is used up.
    ((q("a", 4, cohort="c", lending_limit=0), q("b", 4, cohort="c")), {"b": 4},
     spec(gpus=4), None),
    # Borrowing limit.
    ((q("a", 4, cohort="c", borrowing_limit=1), q("b", 4, cohort="c")), {"a": 5},
     spec(gpus=1), "queue a: 5 of 4 GPUs used, needs 1; at its borrowing limit (1)"),
    ((q("a", 4, cohort="c", borrowing_limit=1), q("b", 4, cohort="c")), {"a": 4},
     spec(gpus=1), None),
    # Fractions of MIG devices add up exactly.
    ((q("a", 1),), {"a": 6 / 7}, spec(gpus=1, gpu_profile="1g.10gb"), None),
    ((q("a", 1),), {"a": 1.0}, spec(gpus=1, gpu_profile="1g.10gb"),
     "queue a: 1 of 1 GPUs used, needs 0.14"),
])
def test_refusal(queues: tuple[QueueSpec, ...], used: dict[str, float],
                 workload: WorkloadSpec, reason: str | None) -> None:
    refusal = quotas(used, *queues).refusal_for(workload)
    assert (refusal.render() if refusal else None) == reason


def test_charging_a_placement_counts_against_the_next() -> None:
    state = quotas({}, q("a", 2))
    first = request("w1", gpus=2)
    assert state.refusal(first) is None
    state.charge(first)
    assert state.refusal(request("w2")) is not None


@pytest.mark.parametrize(("queues", "used", "requests", "order"), [
    # One queue: priority, then age.
    ((q("a", 8),), {}, [request("old", at=1), request("high", priority=5, at=9),
                        request("new", at=5)], ["high", "old", "new"]),
    # Within nominal comes first, whatever the priority of the borrower's request.
    (COHORT_AB, {"b": 4}, [request("b-high", "b", priority=100), request("a-low", "a")],
     ["a-low", "b-high"]),
    # A queue's own requests, counted in turn: the third of a's 2-GPU requests borrows.
    (COHORT_AB, {}, [request("a1", gpus=2, at=1), request("a2", gpus=2, at=2),
                     request("a3", gpus=2, at=3), request("b1", "b", gpus=2, at=4)],
     ["a1", "a2", "b1", "a3"]),
    # Borrowers by dominant share: b borrows 1 (share 1/8) before a borrows 3 (3/8).
    (COHORT_AB, {"a": 6, "b": 4}, [request("a1", at=1), request("b1", "b", at=2)],
     ["b1", "a1"]),
    # ... and the weight divides the share: a with weight 4 borrows 3 at 3/32.
    ((q("a", 4, cohort="c", weight=4), q("b", 4, cohort="c")), {"a": 6, "b": 4},
     [request("a1", at=1), request("b1", "b", at=2)], ["a1", "b1"]),
    # Undeclared queues go last.
    ((q("a", 4),), {}, [request("x", "nope", priority=9), request("a1")], ["a1", "x"]),
])
def test_admission_order(queues: tuple[QueueSpec, ...], used: dict[str, float],
                         requests: list[PlacementRequest], order: list[str]) -> None:
    state = quotas(used, *queues)
    assert [r.workload for r in admission_order(requests, state)] == order
    # The order does not depend on the order the requests came in.
    shuffled = list(requests)
    random.Random(7).shuffle(shuffled)
    assert [r.workload for r in admit(shuffled, state).requests] == order


@pytest.mark.parametrize("n", [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111])
def test_ordinal(n: int) -> None:
    assert ordinal(n) == {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th",
                          13: "13th", 21: "21st", 22: "22nd", 101: "101st", 111: "111th"}[n]


# -- through reconcile ------------------------------------------------------------------

def pool(queues: tuple[QueueSpec, ...], *, nodes: int = 2, gpus: int = 4,
         workloads: tuple[Any, ...] = (), assignments: tuple[Any, ...] = (),
         statuses: tuple[Any, ...] = (), down: tuple[str, ...] = ()) -> ClusterSnapshot:
    snapshot = make_snapshot([make_node(f"n{i}", gpus) for i in range(1, nodes + 1)],
                             workloads=workloads, assignments=assignments, statuses=statuses,
                             down=down)
    return dataclasses.replace(snapshot, queues={x.name: x for x in queues})


def applied(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The snapshot once the plan of one cycle is written (placed instances running)."""
    assignments = dict(snapshot.assignments)
    statuses = dict(snapshot.statuses)
    for action in reconcile(snapshot, now=1000.0).actions:
        if action.assignment is not None:
            assignments[action.workload] = dataclasses.replace(action.assignment, epoch=50)
            if action.assignment.phase == "placed" and action.assignment.node is not None:
                statuses[(action.workload, action.assignment.node)] = status(
                    action.workload, action.assignment.node, 50)
    return dataclasses.replace(snapshot, assignments=assignments, statuses=statuses)


def kinds(snapshot: ClusterSnapshot) -> dict[str, str]:
    return {a.workload: a.kind for a in reconcile(snapshot, now=1000.0).actions}


def reasons(snapshot: ClusterSnapshot) -> dict[str, str]:
    return {a.workload: a.assignment.reason for a in reconcile(snapshot, now=1000.0).actions
            if a.kind == "pending" and a.assignment is not None}


def test_without_queues_nothing_changes() -> None:
    """No queue declared: the plan is the one hafo made before queues (any queue name)."""
    work = tuple(submit(f"w{i}", 1, queue=("x" if i % 2 else "default"), submitted_at=i)
                 for i in range(10))
    snapshot = pool((), workloads=work)
    plan = reconcile(snapshot, now=1000.0)
    assert sum(1 for a in plan.actions if a.kind == "place") == 8
    assert Quotas.of(snapshot) is None and standings(snapshot) == {}


def test_an_idle_queue_lends_all_its_quota_and_the_limit_holds() -> None:
    """a idle, b asks for 10 on 8 GPUs: b takes all 8 (borrowing a's 4); its other two wait
    with their queue's reason and their place in it."""
    work = tuple(submit(f"b{i}", 1, queue="b", submitted_at=i) for i in range(10))
    found = kinds(pool(COHORT_AB, workloads=work))
    assert sorted(w for w, k in found.items() if k == "place") == [f"b{i}" for i in range(8)]
    snapshot = pool(COHORT_AB, workloads=work)
    said = reasons(snapshot)
    # What is stored changes only with the quotas or the request (no rewrite each cycle) ...
    assert said["b8"].endswith("queue b: needs 1; cohort c has too little to lend")
    # ... and what a reader sees is live, with its place in the queue.
    after = applied(snapshot)
    live = live_reasons(after)
    assert live["b8"] == ("queue b: 8 of 4 GPUs used, needs 1; cohort c lends 0 of 8; "
                          "1st of 2 waiting in queue b")
    assert live["b9"].endswith("2nd of 2 waiting in queue b")
    assert reconcile(after, now=1001.0).actions == (), "nothing rewritten the next cycle"


def test_a_queue_within_its_quota_goes_before_a_borrower() -> None:
    """4 free GPUs, b (at its quota) and a (idle) both ask for 4: a gets them, although b's
    request is older and of higher priority."""
    running = tuple(submit(f"b{i}", 1, queue="b") for i in range(4))
    work = (*running, submit("b-more", 4, queue="b", priority=50, submitted_at=1),
            submit("a-job", 4, queue="a", submitted_at=5))
    snapshot = pool(COHORT_AB, workloads=work,
                    assignments=tuple(placed(f"b{i}", "n1", (i,)) for i in range(4)),
                    statuses=tuple(status(f"b{i}", "n1") for i in range(4)))
    found = kinds(snapshot)
    assert found["a-job"] == "place"
    assert found["b-more"] == "pending"


def test_a_gang_is_admitted_whole_or_not_at_all() -> None:
    """A 2x4 gang in a queue of 6: never placed in part, and it holds no node."""
    snapshot = pool((q("a", 6),), workloads=(submit("g", 4, queue="a", nodes=2),))
    assert kinds(snapshot) == {"g": "pending"}
    assert reasons(snapshot)["g"].endswith(
        "queue a: needs 8, more than its quota of 6 GPUs leaves")
    assert live_reasons(applied(snapshot))["g"] == ("queue a: 0 of 6 GPUs used, needs 8; 1st "
                                                    "of 1 waiting in queue a")
    # The nodes are still free for a smaller job of the queue.
    smaller = pool((q("a", 6),), workloads=(submit("g", 4, queue="a", nodes=2),
                                            submit("s", 4, queue="a", submitted_at=9)))
    assert kinds(smaller) == {"g": "pending", "s": "place"}


def test_a_failover_in_a_full_queue_is_not_refused_by_its_own_usage() -> None:
    """A queue at its quota whose node dies: the workload is placed again (its own usage is
    not counted twice)."""
    snapshot = pool((q("a", 1),), workloads=(submit("w", 1, queue="a"),),
                    assignments=(placed("w", "n1"),), statuses=(status("w", "n1"),),
                    down=("n1",))
    assert kinds(snapshot) == {"w": "place"}


def test_preemption_stays_within_the_queue() -> None:
    """A high-priority preemptor of queue a never stops queue b's work."""
    full = tuple(submit(f"b{i}", 4, queue="b") for i in range(2))
    snapshot = pool((q("a", 8), q("b", 8)),
                    workloads=(*full, submit("urgent", 4, queue="a", priority=100,
                                             preempt=True, submitted_at=9)),
                    assignments=(placed("b0", "n1", range(4)), placed("b1", "n2", range(4))),
                    statuses=(status("b0", "n1"), status("b1", "n2")))
    assert kinds(snapshot) == {"urgent": "pending"}
    # The same preemptor in b's queue may stop b's lower-priority work.
    same = pool((q("b", 12),),
                workloads=(*full, submit("urgent", 4, queue="b", priority=100, preempt=True,
                                         submitted_at=9)),
                assignments=(placed("b0", "n1", range(4)), placed("b1", "n2", range(4))),
                statuses=(status("b0", "n1"), status("b1", "n2")))
    found = kinds(same)
    assert found["urgent"] == "pending" and "move" in found.values()


def test_standings() -> None:
    """b borrows 2 of a's idle quota: b shows 2 borrowed, a 2 lent; the pending charge."""
    work = (*(submit(f"b{i}", 1, queue="b") for i in range(6)),
            submit("a-wait", 3, queue="a"))
    snapshot = pool(COHORT_AB, workloads=work,
                    assignments=tuple(placed(f"b{i}", "n1" if i < 4 else "n2", (i % 4,))
                                      for i in range(6)))
    assert usage(snapshot) == {"b": 6.0}
    table = standings(snapshot)
    assert (table["b"].used, table["b"].borrowed, table["b"].lent) == (6.0, 2.0, 0.0)
    assert (table["a"].used, table["a"].lent, table["a"].pending) == (0.0, 2.0, 3.0)
    assert table["b"].share == pytest.approx(2 / 8)


def test_random_traces_keep_every_limit() -> None:
    """600 random cycles of submits and completions on a cohort of three queues: after
    every cycle each queue is within its nominal quota plus its borrowing limit, the
    cohort's pool is never overdrawn, and no running workload is ever stopped by quota."""
    rng = random.Random(30)
    queues = (q("a", 4, cohort="c", borrowing_limit=2), q("b", 6, cohort="c", lending_limit=3),
              q("c", 2, cohort="c", weight=2))
    work: dict[str, Any] = {}
    running: dict[str, Any] = {}
    placements = 0
    for cycle in range(600):
        for _ in range(rng.randint(0, 3)):
            wid = f"w{cycle}-{rng.randint(0, 10**6)}"
            work[wid] = submit(wid, rng.choice((1, 1, 2, 4)), queue=rng.choice("abc"),
                               submitted_at=cycle, priority=rng.randint(0, 2))
        for wid in list(running):
            if rng.random() < 0.2:
                running.pop(wid)
                work.pop(wid)
        snapshot = pool(queues, nodes=3, gpus=4, workloads=tuple(work.values()),
                        assignments=tuple(running.values()),
                        statuses=tuple(status(w, a.node) for w, a in running.items()))
        plan = reconcile(snapshot, now=1000.0 + cycle)
        assert not [a for a in plan.actions if a.kind == "move"], "quota stopped work"
        for action in plan.actions:
            if action.kind == "place" and action.assignment is not None:
                running[action.workload] = dataclasses.replace(action.assignment, epoch=10)
                placements += 1
        after = pool(queues, nodes=3, gpus=4, workloads=tuple(work.values()),
                     assignments=tuple(running.values()))
        used = usage(after)
        state = Quotas.of(after)
        assert state is not None
        for queue in queues:
            limit = (queue.gpus or 0) + (queue.borrowing_limit
                                         if queue.borrowing_limit is not None else 100)
            assert used.get(queue.name, 0) <= limit
        assert state.pool_used("c") <= state.pool("c") + 1e-9
    assert placements > 300  # the trace did place work (and borrowed: see the limits)


def test_a_reason_names_at_most_three_queues_most_first() -> None:
    """Five queues borrow the pool a waits for: the three using most are named, then a
    count (a reason stays one short line in a cohort of a thousand queues)."""
    queues = [q("a", 2, cohort="c"), *(q(f"b{i}", 2, cohort="c") for i in range(5))]
    used = {"a": 0.0, "b3": 4.0, "b1": 3.0, "b4": 3.0, "b0": 1.0, "b2": 1.0}
    refusal = quotas(used, *queues).refusal_for(spec(gpus=2))
    assert refusal is not None
    assert refusal.render() == ("queue a: 0 of 2 GPUs used, needs 2; cohort c lends 0 of 12 "
                                "(b3 uses 4 of its 2, b1 uses 3 of its 2, b4 uses 3 of its 2, "
                                "2 more)")


def test_readers_see_the_live_reason_in_the_workload_views() -> None:
    """``hafo workloads`` and the API overlay the live figures on the stored summary; a
    workload of a queue without a quota, or placed, keeps its own reason."""
    from hafo.model.views import all_workloads, workload_view

    work = (*(submit(f"b{i}", 1, queue="b", submitted_at=i) for i in range(9)),
            submit("free", 1, queue="free", submitted_at=20))
    snapshot = applied(pool((*COHORT_AB, q("free", None)), nodes=3, workloads=work))
    views = with_live_reasons(all_workloads(snapshot), snapshot)
    reasons_now = {v["id"]: v["reason"] for v in views}
    assert reasons_now["b8"] == ("queue b: 8 of 4 GPUs used, needs 1; cohort c lends 0 of 8; "
                                 "1st of 1 waiting in queue b")
    assert "waiting in queue" not in reasons_now["free"]
    one = with_live_reasons(workload_view(snapshot, "b8"), snapshot)
    assert one["reason"] == reasons_now["b8"]
