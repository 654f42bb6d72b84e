"""``hafo.decisions.live_view``: which workloads are dormant, and that a cycle decides the same
without them (random clusters that complete, fail, restart, move, retire replicas, delete and
lose nodes)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from hafo.decisions.history import history_changes
from hafo.decisions.live_view import dormant, live_view
from hafo.decisions.observed import Observations, observe
from hafo.decisions.plan import Plan
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import (
    Assignment,
    ClusterSnapshot,
    InstanceStatus,
    Liveness,
    MoveRequest,
    Phase,
    Submission,
)
from hafo.model.history import WorkloadHistory
from hafo.model.queues import QueueSpec
from hafo.model.spec import RestartPolicy

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit

NOW = 10_000.0


def ended(wid: str, phase: Phase = "completed") -> Assignment:
    """An ended assignment."""
    return Assignment(workload=wid, phase=phase, node=None, reason="exited with code 0")


@pytest.mark.parametrize(("case", "is_dormant"), [
    ("completed, no report", True),
    ("failed, no report", True),
    ("completed, its exit still reported", False),
    ("completed, a move asked", False),
    ("completed, deleted", False),
    ("completed replica", False),
    ("completed service", False),
    ("retiring", False),
    ("placed", False),
    ("pending", False),
])
def test_which_workloads_are_dormant(case: str, is_dormant: bool) -> None:
    """Ended, unreported, unmoved, not retiring, not a service's: dormant; anything else a
    cycle may act on."""
    node = make_node("n1")
    workloads: list[Submission] = [submit("w")]
    assignments = [ended("w", "failed" if case.startswith("failed") else "completed")]
    statuses: list[InstanceStatus] = []
    moves: dict[str, MoveRequest] = {}
    if case == "completed, its exit still reported":
        statuses.append(status("w", "n1", 10, "exited", exit_code=0))
    elif case == "completed, a move asked":
        moves["w"] = MoveRequest(workload="w")
    elif case == "completed, deleted":
        workloads = []
    elif case == "completed replica":
        workloads = [dataclasses.replace(submit("w"), service="s")]
    elif case == "completed service":
        workloads = [submit("w", replicas=2)]
    elif case == "retiring":
        workloads = [dataclasses.replace(submit("w"), service="s", retiring=NOW)]
    elif case == "placed":
        assignments = [placed("w", "n1")]
    elif case == "pending":
        assignments = [Assignment(workload="w", phase="pending", node=None)]
    snapshot = dataclasses.replace(
        make_snapshot([node], workloads=workloads, assignments=assignments,
                      statuses=statuses), moves=moves)
    assert (dormant(snapshot) == {"w"}) is is_dormant
    view = live_view(snapshot)
    assert ("w" in view.assignments) is not is_dormant
    if not is_dormant:
        assert view is snapshot  # nothing left out: the same object


# -- random clusters ---------------------------------------------------------------------


def agents(snapshot: ClusterSnapshot, rng: random.Random, now: float) -> ClusterSnapshot:
    """What the agents report after a cycle: a placed instance runs, and now and then exits
    (0, or 1); a moving one stops; an instance no longer desired has its report deleted, as
    an agent does; a node that is down reports nothing."""
    statuses: dict[tuple[str, str], InstanceStatus] = {}
    for wid, a in snapshot.assignments.items():
        for node in a.nodes:
            alive = snapshot.alive.get(node)
            if alive is None:
                continue
            old = snapshot.statuses.get((wid, node))
            if a.phase == "placed" and a.epoch > alive.claimed:
                if old is not None and old.epoch == a.epoch and old.state == "exited":
                    statuses[(wid, node)] = old
                elif rng.random() < 0.25:
                    statuses[(wid, node)] = status(wid, node, a.epoch, "exited",
                                                   exit_code=rng.choice((0, 0, 1)),
                                                   finished_at=now)
                else:
                    statuses[(wid, node)] = status(wid, node, a.epoch)
            elif a.phase == "moving" and a.stopping > alive.claimed:
                statuses[(wid, node)] = status(wid, node, a.stopping, "exited", exit_code=0,
                                               finished_at=now)
    return dataclasses.replace(snapshot, statuses=statuses)


def applied(snapshot: ClusterSnapshot, plan: Plan, revision: list[int]) -> ClusterSnapshot:
    """The plan written: assignments (a new epoch each), replica changes, moves cleared."""
    assignments = dict(snapshot.assignments)
    workloads = dict(snapshot.workloads)
    moves = dict(snapshot.moves)
    for action in plan.actions:
        revision[0] += 1
        if action.clear_move:
            moves.pop(action.workload, None)
        if action.kind == "refuse-move":
            continue
        if action.assignment is None:
            assignments.pop(action.workload, None)
        else:
            assignments[action.workload] = dataclasses.replace(action.assignment,
                                                               epoch=revision[0])
    for change in plan.replicas:
        if change.kind == "delete":
            workloads.pop(change.replica, None)
            moves.pop(change.replica, None)
        elif change.submission is not None:
            workloads[change.replica] = change.submission
    return dataclasses.replace(snapshot, assignments=assignments, workloads=workloads,
                               moves=moves, revision=revision[0])


def submissions(rng: random.Random, cycle: int, now: float) -> list[Submission]:
    """A few new workloads: singles and gangs, in queues, some that give up after one
    failure, now and then a service."""
    out = []
    for k in range(rng.randint(0, 3)):
        wid = f"w{cycle}x{k}"
        if rng.random() < 0.05:
            out.append(submit(wid, 1, replicas=2, submitted_at=now, queue="a"))
            continue
        out.append(submit(wid, rng.choice((1, 1, 2, 4)), submitted_at=now,
                          queue=rng.choice("ab"), priority=rng.randint(0, 2),
                          nodes=rng.choice((1, 1, 1, 2)),
                          restart=RestartPolicy(max_restarts=rng.choice((0, 3)))))
    return out


def operator(snapshot: ClusterSnapshot, rng: random.Random, now: float,
             revision: list[int]) -> ClusterSnapshot:
    """An operator's doings: deletes (an ended workload too), moves (of an ended one too),
    nodes powered off and back on with their disks."""
    workloads, moves = dict(snapshot.workloads), dict(snapshot.moves)
    alive = dict(snapshot.alive)
    ids = sorted(w for w, s in workloads.items() if s.service is None)
    if ids and rng.random() < 0.2:
        workloads.pop(rng.choice(ids))
    if ids and rng.random() < 0.2:
        wid = rng.choice(ids)
        moves[wid] = MoveRequest(workload=wid, reason="drain")
    if rng.random() < 0.1:
        down = sorted(set(snapshot.nodes) - set(alive))
        if down:
            name = rng.choice(down)
            revision[0] += 1
            alive[name] = Liveness(node=name, lease=revision[0], since=now,
                                   claimed=revision[0])
        elif len(alive) > 1:
            del alive[rng.choice(sorted(alive))]
    return dataclasses.replace(snapshot, workloads=workloads, moves=moves, alive=alive)


@pytest.mark.parametrize("seed", range(40))
def test_a_cycle_decides_the_same_without_its_dormant_workloads(seed: int) -> None:
    """Over a random trace, every cycle's plan on the live view is the plan on the whole
    snapshot (the controller's observations kept on each, as the daemon keeps them on the
    live view), and the histories' changes are the same when the dormant workloads' closed
    histories are passed over."""
    rng = random.Random(seed)
    queues = {"a": QueueSpec(name="a", gpus=6, cohort="c"),
              "b": QueueSpec(name="b", gpus=6, cohort="c")}
    snapshot = dataclasses.replace(
        make_snapshot([make_node(f"n{i}") for i in range(1, 5)]),
        queues=queues if seed % 2 else {})
    seen_whole, seen_live = Observations(), Observations()
    revision, now = [100], NOW
    left_out = 0
    histories: dict[str, WorkloadHistory] = {}
    for cycle in range(60):
        now += 1.0
        workloads = dict(snapshot.workloads)
        workloads.update({s.id: s for s in submissions(rng, cycle, now)})
        snapshot = operator(dataclasses.replace(snapshot, workloads=workloads), rng, now,
                            revision)
        view = live_view(snapshot)
        left_out += len(snapshot.workloads) - len(view.workloads)
        seen_whole = observe(seen_whole, snapshot, now)
        seen_live = observe(seen_live, view, now)
        whole = reconcile(snapshot, now, seen=seen_whole, min_runtime=0.0, strategy="binpack")
        live = reconcile(view, now, seen=seen_live, min_runtime=0.0, strategy="binpack")
        assert live == whole, f"cycle {cycle}"
        changes = history_changes(histories, snapshot, now, quiet=dormant(snapshot))
        assert changes == history_changes(histories, snapshot, now), f"cycle {cycle}"
        histories.update(changes.changed)
        for wid in changes.gone:
            del histories[wid]
        snapshot = agents(applied(snapshot, whole, revision), rng, now)
    assert left_out > 0  # not vacuous: workloads ended and were left out


def test_a_move_asked_of_an_ended_workload_is_refused_as_before() -> None:
    """A move of a workload that completed wakes it (not dormant): the cycle answers it."""
    snapshot = dataclasses.replace(
        make_snapshot([make_node("n1")], workloads=[submit("w", spec=make_spec("w"))],
                      assignments=[ended("w")]),
        moves={"w": MoveRequest(workload="w")})
    view = live_view(snapshot)
    plan = reconcile(view, NOW)
    assert plan == reconcile(snapshot, NOW)
    assert [a.workload for a in plan.actions] == ["w"]
