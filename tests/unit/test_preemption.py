"""Preemption through ``reconcile``: who is stopped, where the preemptor goes, no loops."""

from __future__ import annotations

import dataclasses
import itertools
import random
from fnmatch import fnmatchcase
from typing import Any

import pytest

from hafo.decisions.placement import (
    NodeCapacity,
    PlacementRequest,
    capacity_from,
    gpu_matches,
)
from hafo.decisions.preemption import Victim, VictimIndex, choose_victims
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import Assignment, ClusterSnapshot, NodeRecord, Submission

from .conftest import A100, H100, make_node, make_snapshot, make_spec, placed, status, submit

NOW = 20_000.0


def cluster(nodes: list[NodeRecord], running: dict[str, tuple[str, list[int], int]],
            pending: list[Submission], **extra: Any) -> ClusterSnapshot:
    """``running``: workload -> (node, GPUs, priority), placed and running (epoch 10 + i)."""
    subs = [submit(w, len(g), priority=p, submitted_at=1.0) for w, (_, g, p) in running.items()]
    assignments = [placed(w, n, g, epoch=10 + i) for i, (w, (n, g, _)) in
                   enumerate(running.items())]
    statuses = [status(w, n, 10 + i) for i, (w, (n, _, _)) in enumerate(running.items())]
    return make_snapshot(nodes, workloads=[*subs, *pending], assignments=assignments,
                         statuses=statuses, **extra)


def x(gpus: int = 2, priority: int = 5, preempt: bool = True, **kwargs: Any) -> Submission:
    return submit("x", gpus, priority=priority, preempt=preempt, submitted_at=9.0, **kwargs)


TWO_BY_FOUR = [make_node("a"), make_node("b")]


@pytest.mark.parametrize(("nodes", "running", "preemptor", "node", "victims"), [
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0, 1], 0), "l2": ("a", [2, 3], 0),
                               "l3": ("b", [0, 1, 2, 3], 0)},
                 x(2), "a", ["l1"], id="one-victim-ties-by-node-then-id"),
    pytest.param(TWO_BY_FOUR, {"s1": ("a", [0], 0), "s2": ("a", [1], 0), "s3": ("a", [2], 0),
                               "s4": ("a", [3], 0), "big": ("b", [0, 1, 2, 3], 3)},
                 x(3), "b", ["big"], id="fewest-victims"),
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0, 1, 2, 3], 2), "l2": ("b", [0, 1, 2, 3], 1)},
                 x(2), "b", ["l2"], id="lowest-total-priority"),
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0, 1, 2, 3], -3), "l2": ("b", [0, 1], 0),
                               "l3": ("b", [2, 3], 0)},
                 x(4), "a", ["l1"], id="one-big-beats-two-small"),
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0], 0), "h1": ("a", [1, 2], 9),
                               "l3": ("b", [0, 1, 2, 3], 4)},
                 x(2), "a", ["l1"], id="free-gpus-count"),
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0, 1], 1), "l2": ("a", [2], 0),
                               "l3": ("a", [3], 0), "h": ("b", [0, 1, 2, 3], 9)},
                 x(2), "a", ["l1"], id="fewest-before-lowest-priority"),
    pytest.param(TWO_BY_FOUR, {"l1": ("a", [0], 1), "l2": ("a", [1], 0),
                               "l3": ("a", [2], 0), "l4": ("a", [3], 2),
                               "h": ("b", [0, 1, 2, 3], 9)},
                 x(2), "a", ["l2", "l3"], id="lowest-priority-victims-on-the-node"),
    pytest.param([make_node("a", labels={"rack": "r1"}), make_node("b", labels={"rack": "r2"})],
                 {"l1": ("a", [0, 1, 2, 3], 0), "l2": ("b", [0, 1, 2, 3], 1)},
                 x(2, node_selector={"rack": "r2"}), "b", ["l2"], id="labels-honoured"),
])
def test_preemption_choice(nodes: list[NodeRecord], running: dict[str, tuple[str, list[int],
                                                                            int]],
                           preemptor: Submission, node: str, victims: list[str]) -> None:
    plan = reconcile(cluster(nodes, running, [preemptor]), NOW)
    moves = {a.workload: a for a in plan.actions if a.kind == "move"}
    assert sorted(moves) == victims
    for action in moves.values():
        new = action.assignment
        assert new is not None and action.event == "preempted"
        assert (new.phase, new.node, new.urgent, new.after_stop, new.preempted_for) == (
            "moving", node, False, "move", "x")
        assert new.reason == "preempted by x (priority 5)"
        assert action.why.endswith(f"checkpoint and stop on {node}")
    (pending,) = [a for a in plan.actions if a.workload == "x"]
    assert pending.kind == "pending" and pending.assignment is not None
    assert pending.assignment.reason == (f"waiting for {len(victims)} preempted workload(s) "
                                         f"on {node} to stop")


FULL = {"l1": ("a", [0, 1, 2, 3], 0), "l2": ("b", [0, 1, 2, 3], 0)}


@pytest.mark.parametrize(("preemptor", "extra", "why"), [
    pytest.param(x(2, preempt=False), {}, "preempt is off", id="preempt-off"),
    pytest.param(x(2, priority=0), {}, "equal priority is never preempted", id="equal-priority"),
    pytest.param(x(2, priority=-1), {}, "higher priority is never preempted",
                 id="higher-priority"),
    pytest.param(x(8), {}, "no single node can free 8 GPUs", id="too-big"),
    pytest.param(x(2), {"cordoned": ["a", "b"]}, "work on cordoned nodes is not preempted",
                 id="cordoned"),
    pytest.param(x(2), {"down": ["a", "b"]}, "work on down nodes is not preempted",
                 id="down"),
    pytest.param(x(2, node_selector={"rack": "r9"}), {}, "no node matches", id="selector"),
    pytest.param(x(2, gpu_model="*A100*"), {}, "no GPU of the model", id="model"),
])
def test_no_preemption(preemptor: Submission, extra: dict[str, Any], why: str) -> None:
    plan = reconcile(cluster(TWO_BY_FOUR, FULL, [preemptor], **extra), NOW)
    pending = [a for a in plan.actions if a.workload == "x"]
    assert [a.kind for a in pending] == ["pending"], why
    assert not [a for a in plan.actions if a.event == "preempted"], why
    assert pending[0].assignment is not None
    assert not pending[0].assignment.reason.startswith("waiting"), why


def test_a_workload_that_fits_is_placed_not_preempting() -> None:
    running = {"l1": ("a", [0, 1], 0), "l2": ("b", [0, 1, 2, 3], 0)}
    plan = reconcile(cluster(TWO_BY_FOUR, running, [x(2)]), NOW)
    assert [(a.kind, a.workload) for a in plan.actions] == [("place", "x")]


def test_two_preemptors_pick_different_victims_in_priority_order() -> None:
    second = submit("y", 2, priority=4, preempt=True, submitted_at=2.0)
    plan = reconcile(cluster(TWO_BY_FOUR, FULL, [x(2), second]), NOW)
    moves = {a.workload: a.assignment.preempted_for for a in plan.actions
             if a.kind == "move" and a.assignment}
    assert moves == {"l1": "x", "l2": "y"}


def test_two_preemptors_share_the_free_room_of_one_node() -> None:
    running = {"l1": ("a", [0, 1], 0), "h": ("b", [0, 1, 2, 3], 9)}
    second = submit("y", 2, priority=4, preempt=True, submitted_at=2.0)
    plan = reconcile(cluster(TWO_BY_FOUR, running, [x(3), second]), NOW)
    # x (priority 5) needs 3 of a's GPUs: the 2 free ones and l1's; nothing is left for y
    moves = {a.workload: a.assignment.preempted_for for a in plan.actions
             if a.kind == "move" and a.assignment}
    assert moves == {"l1": "x"}
    reasons = {a.workload: a.assignment.reason for a in plan.actions if a.assignment}
    assert reasons["y"].startswith("no node fits (")


# -- the steps after the decision ----------------------------------------------------------


def after_preemption(victim_state: str, *, others: tuple[Submission, ...] = (),
                     second_victim: str | None = None, gpus: int = 3) -> ClusterSnapshot:
    """x (``gpus``) waits for l1 (and maybe l3) moving off a; l2 fills b; 4 GPUs each."""
    moving = [Assignment("l1", "moving", "a", (0, 1), epoch=30, stopping=10,
                         reason="preempted by x (priority 5)", preempted_for="x")]
    statuses = [status("l1", "a", 10, victim_state), status("l2", "b", 12)]
    running = [placed("l2", "b", [0, 1, 2, 3], epoch=12)]
    subs = [submit("l1", 2), submit("l2", 4), x(gpus), *others]
    if second_victim is not None:
        moving.append(Assignment("l3", "moving", "a", (2,), epoch=31, stopping=11,
                                 reason="preempted by x (priority 5)", preempted_for="x"))
        statuses.append(status("l3", "a", 11, second_victim))
        subs.append(submit("l3", 1))
    count = len(moving)
    waiting = Assignment("x", "pending", epoch=32,
                         reason=f"waiting for {count} preempted workload(s) on a to stop")
    return make_snapshot(TWO_BY_FOUR, workloads=subs,
                         assignments=[*moving, *running, waiting], statuses=statuses)


def test_while_victims_stop_nothing_more_is_decided() -> None:
    assert not reconcile(after_preemption("stopping"), NOW)
    assert not reconcile(after_preemption("running", second_victim="running"), NOW)


def test_when_the_victims_stopped_the_preemptor_gets_the_node() -> None:
    plan = reconcile(after_preemption("exited"), NOW)
    by = {a.workload: a for a in plan.actions}
    assert by["x"].kind == "place" and by["x"].assignment is not None
    assert (by["x"].assignment.node, by["x"].assignment.gpus) == ("a", (0, 1, 2))
    assert by["l1"].kind == "pending" and by["l1"].why.startswith(
        "move off a: preempted by x (priority 5) (instance 10 stopped)")
    assert by["l1"].assignment is not None and by["l1"].assignment.preempted_for is None
    assert by["l1"].assignment.reason.startswith("no node fits (")


def test_room_freed_early_is_held_for_the_preemptor() -> None:
    low = submit("z", 1, submitted_at=0.5, priority=9)  # higher than everyone, no preempt
    snap = after_preemption("exited", second_victim="running", others=(low,), gpus=4)
    plan = reconcile(snap, NOW)
    by = {a.workload: a for a in plan.actions}
    # a's GPUs 0, 1 (l1's) and 3 (free) are held for x; z gets nothing on a
    assert by["z"].kind == "pending"
    assert by["x"].kind == "pending" and by["x"].assignment is not None
    assert by["x"].assignment.reason == "waiting for 1 preempted workload(s) on a to stop"
    assert by["l1"].kind == "pending"  # moved off; a is held, b is full
    assert "l3" not in by


def test_the_preemptor_is_not_confined_once_its_victims_are_gone() -> None:
    # l1 finished moving off (placed elsewhere); x still pending: a normal request again
    snap = make_snapshot([make_node("a"), make_node("b")],
                         workloads=[submit("l2", 4), x(3)],
                         assignments=[placed("l2", "a", [0, 1, 2, 3], epoch=12),
                                      Assignment("x", "pending", epoch=32, reason="w")],
                         statuses=[status("l2", "a", 12)])
    plan = reconcile(snap, NOW)
    assert [(a.kind, a.workload, a.assignment.node if a.assignment else None)
            for a in plan.actions] == [("place", "x", "b")]


def test_choose_victims_takes_the_room_it_counts_on() -> None:
    snapshot = make_snapshot([make_node("a")], assignments=[placed("l1", "a", [0])])
    capacity = capacity_from(snapshot)
    req = PlacementRequest("x", make_spec("x", 4, priority=1), 0.0)
    victims = VictimIndex({"a": [Victim("l1", 0, (0,))]}, capacity)
    chosen = choose_victims(req, victims, NOW)
    assert chosen is not None and chosen.victims == ("l1",) and victims.taken == {"l1"}
    assert capacity["a"].free == []
    assert choose_victims(req, victims, NOW) is None


def test_preempted_for_round_trips() -> None:
    moving = Assignment("l1", "moving", "a", (0,), epoch=3, preempted_for="x")
    assert Assignment.from_dict(moving.to_dict(), 3) == moving
    assert Assignment.from_dict({"workload": "l1", "phase": "placed"}, 1).preempted_for is None


# -- whole cycles: decisions applied, agents stop what they are told to --------------------


def run_cycles(snapshot: ClusterSnapshot, cycles: int = 8) -> tuple[ClusterSnapshot,
                                                                   list[tuple[str, str]]]:
    """Apply each plan (a new revision per write) and let agents act at once: a placed
    instance runs, a moving one exits. Returns the final snapshot and the events."""
    revision = 100
    events: list[tuple[str, str]] = []
    for _ in range(cycles):
        plan = reconcile(snapshot, NOW)
        if not plan:
            return snapshot, events
        assignments = dict(snapshot.assignments)
        for action in plan.actions:
            revision += 1
            events.append((action.event, action.workload))
            if action.assignment is None:
                assignments.pop(action.workload, None)
            else:
                assignments[action.workload] = dataclasses.replace(action.assignment,
                                                                   epoch=revision)
        statuses = dict(snapshot.statuses)
        for wid, a in assignments.items():
            if a.phase == "placed" and a.node is not None:
                statuses[(wid, a.node)] = status(wid, a.node, a.epoch)
            elif a.phase == "moving" and a.node is not None:
                statuses[(wid, a.node)] = status(wid, a.node, a.stopping, "exited",
                                                 exit_code=-15)
        snapshot = dataclasses.replace(snapshot, assignments=assignments, statuses=statuses)
    raise AssertionError(f"no fixed point after {cycles} cycles: {events}")


@pytest.mark.parametrize(("l1_preempts", "expected_events", "final"), [
    # A preempted workload avoids its node for the placement that follows the stop only
    # (a preemption says nothing against the node), so its pending reason is restated once.
    pytest.param(False, [("pending", "x"), ("preempted", "l1"),
                         ("pending", "l1"), ("placed", "x"), ("pending", "l1")],
                 {"x": ("placed", "a"), "l1": ("pending", None), "l4": ("placed", "c")},
                 id="victim-waits"),
    pytest.param(True, [("pending", "x"), ("preempted", "l1"),
                        ("pending", "l1"), ("placed", "x"), ("preempted", "l4"),
                        ("preempted", "l5"),
                        ("placed", "l1"), ("pending", "l4"), ("pending", "l5"),
                        ("pending", "l4"), ("pending", "l5")],
                 {"x": ("placed", "a"), "l1": ("placed", "c"), "l4": ("pending", None),
                  "l5": ("pending", None)},
                 id="chain-ends-at-the-lowest-priority"),
])
def test_preemption_converges(l1_preempts: bool, expected_events: list[tuple[str, str]],
                              final: dict[str, tuple[str, str | None]]) -> None:
    nodes = [make_node("a"), make_node("b"), make_node("c", 2)]
    running = {"l1": ("a", [0, 1], 3), "l2": ("a", [2, 3], 3), "l3": ("b", [0, 1, 2, 3], 3),
               "l4": ("c", [0], 1), "l5": ("c", [1], 1)}
    snapshot = cluster(nodes, running, [x(2)])
    subs = dict(snapshot.workloads)
    subs["l1"] = submit("l1", 2, priority=3, preempt=l1_preempts, submitted_at=1.0)
    snapshot, events = run_cycles(dataclasses.replace(snapshot, workloads=subs))
    assert events == expected_events
    got = {w: (a.phase, a.node) for w, a in snapshot.assignments.items() if w in final}
    assert got == final


# -- the victim index against a brute-force scan ---------------------------------------------


def brute_cost(req: PlacementRequest, cap: NodeCapacity, victims: list[Victim],
               taken: set[str]) -> tuple[int, int] | None:
    """(count, total priority) of the cheapest way to make room on one node, by trying every
    subset; None if there is none (or the node is out for other reasons)."""
    spec = req.spec
    if req.avoid.get(cap.name, 0.0) > NOW or req.exclude.get(cap.name, 0.0) > NOW:
        return None
    if any(cap.labels.get(k) != v for k, v in spec.node_selector.items()):
        return None
    kind = {g.index for g in cap.inventory if g.usable and g.profile == spec.gpu_profile
            and (spec.gpu_model is None or fnmatchcase(g.model, spec.gpu_model))}
    deficit = spec.gpus - sum(1 for g in cap.free if g.index in kind)
    if deficit <= 0:
        return None
    usable = [(v.priority, sum(1 for i in v.gpus if i in kind)) for v in victims
              if v.priority < spec.priority and v.workload not in taken]
    for count in range(1, len(usable) + 1):
        totals = [sum(p for p, _ in subset) for subset in itertools.combinations(usable, count)
                  if sum(g for _, g in subset) >= deficit]
        if totals:
            return count, min(totals)
    return None


@pytest.mark.parametrize("seed", range(40))
def test_victim_index_matches_a_brute_force_scan(seed: int) -> None:
    rng = random.Random(seed)
    nodes: list[NodeRecord] = []
    assignments: list[Assignment] = []
    priorities: dict[str, int] = {}
    for n in rng.sample(range(100), rng.randint(1, 25)):
        name = f"n{n:02d}"
        size = rng.choice([2, 4, 8])
        record = make_node(name, size, model=rng.choice([H100, A100]),
                           labels={"rack": rng.choice(["r1", "r2"])},
                           unhealthy_gpus=[i for i in range(size) if rng.random() < 0.05])
        nodes.append(record)
        free = list(range(size))
        rng.shuffle(free)
        k = 0
        while free and rng.random() < 0.85:
            wid = f"{name}-v{k}"
            k += 1
            gpus = [free.pop() for _ in range(min(len(free), rng.choice([1, 1, 2, 3])))]
            assignments.append(placed(wid, name, gpus))
            priorities[wid] = rng.randint(-3, 4)
    snapshot = make_snapshot(nodes, assignments=assignments)
    capacity = capacity_from(snapshot)
    by_node: dict[str, list[Victim]] = {}
    for a in assignments:
        assert a.node is not None
        by_node.setdefault(a.node, []).append(Victim(a.workload, priorities[a.workload],
                                                     a.gpus))
    index = VictimIndex(by_node, capacity)
    reference = capacity_from(snapshot)
    taken: set[str] = set()
    names = [n.name for n in nodes]
    for i in range(rng.randint(1, 30)):
        spec = make_spec(f"p{i}", rng.choice([1, 1, 2, 3, 4, 6, 8]),
                         priority=rng.randint(-2, 6),
                         gpu_model=rng.choice([None, None, "*A100*"]),
                         node_selector=rng.choice([{}, {}, {"rack": "r1"}]))
        avoid = {n: NOW + 5 for n in rng.sample(names, min(len(names), rng.choice([0, 1, 3])))}
        req = PlacementRequest(f"p{i}", spec, 0.0, avoid=avoid)
        costs = {name: cost for name, cap in reference.items()
                 if (cost := brute_cost(req, cap, by_node.get(name, []), taken)) is not None}
        expected = min(((c, t, n) for n, (c, t) in costs.items()), default=None)
        chosen = choose_victims(req, index, NOW)
        if expected is None:
            assert chosen is None
            continue
        assert chosen is not None and chosen.node == expected[2]
        picked = [v for v in by_node[chosen.node] if v.workload in chosen.victims]
        assert (len(picked), sum(v.priority for v in picked)) == expected[:2]
        taken.update(chosen.victims)
        cap = reference[chosen.node]
        kind = {g.index for g in cap.free if gpu_matches(spec, g)}
        cap.free = [g for g in cap.free if g.index not in kind]
        assert capacity[chosen.node].free == cap.free
    assert index.taken == taken
