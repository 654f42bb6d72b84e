"""Table-driven tests of the controller's pure decision: snapshot + now -> Plan."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.decisions.reconcile import FAILED_NODE_COOLDOWN, Action, reconcile
from hafo.model.cluster import Assignment, ClusterSnapshot, InstanceStatus, NodeRecord
from hafo.model.spec import RestartPolicy

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 10_000.0


def three_nodes(**overrides: Any) -> list[NodeRecord]:
    """Nodes a, b, c with 4 GPUs each; overrides replace a node by name."""
    return [overrides.get(n, make_node(n)) for n in "abc"]


def only(snapshot: ClusterSnapshot, now: float = NOW) -> Action:
    plan = reconcile(snapshot, now)
    assert len(plan.actions) == 1, plan.actions
    return plan.actions[0]


def running_on_a(*statuses: InstanceStatus, nodes: list[NodeRecord] | None = None,
                 restart: RestartPolicy | None = None, **extra: Any) -> ClusterSnapshot:
    """w1 placed on a (epoch 10, GPU 0), b holding one other workload so a/b/c differ."""
    restart_kw: dict[str, Any] = {"restart": restart} if restart else {}
    assignment = extra.pop("assignment", placed("w1", "a", [0], epoch=10))
    return make_snapshot(
        nodes or three_nodes(),
        workloads=[submit("w1", **restart_kw), submit("other", submitted_at=1.0)],
        assignments=[assignment, placed("other", "b", [0], epoch=5)],
        statuses=[*statuses, status("other", "b", 5)], **extra)


def test_new_workload_is_placed_with_expected_revision_zero() -> None:
    action = only(make_snapshot(three_nodes(), workloads=[submit("w1", 2)]))
    assert (action.kind, action.workload, action.expected_revision, action.event) == (
        "place", "w1", 0, "placed")
    assert action.assignment == Assignment(workload="w1", phase="placed", node="a",
                                           gpus=(0, 1), reason="new workload")


def test_pending_assignment_is_placed_with_its_revision() -> None:
    pending = Assignment(workload="w1", phase="pending", epoch=7, reason="no node fits (x)")
    action = only(make_snapshot(three_nodes(), workloads=[submit("w1")], assignments=[pending]))
    assert (action.kind, action.expected_revision) == ("place", 7)
    assert action.assignment is not None and action.assignment.node == "a"


@pytest.mark.parametrize(("extra", "nodes", "why"), [
    pytest.param({"down": ["a"]}, None, "node a is down", id="down"),
    pytest.param({}, three_nodes(a=make_node("a", healthy=False)), "node a is unhealthy",
                 id="unhealthy"),
])
def test_failover_moves_work_and_avoids_old_node(extra: dict[str, Any],
                                                 nodes: list[NodeRecord] | None,
                                                 why: str) -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=1, restart_times=(NOW - 5,),
                   avoid={"z": NOW + 1, "old": NOW - 1})
    snap = running_on_a(status("w1", "a", 10), nodes=nodes, assignment=prior, **extra)
    action = only(snap)
    assert (action.kind, action.event, action.expected_revision) == ("place", "failover", 10)
    assert action.why == f"{why}; resumes from its latest checkpoint, if any -> c"
    new = action.assignment
    assert new is not None
    assert (new.phase, new.node, new.gpus, new.epoch) == ("placed", "c", (0,), 0)
    assert (new.restarts, new.restart_times) == (1, (NOW - 5,))
    assert dict(new.avoid) == {"a": NOW + FAILED_NODE_COOLDOWN, "z": NOW + 1}


def test_failover_uses_the_given_cooldown() -> None:
    plan = reconcile(running_on_a(down=["a"]), NOW, cooldown=5.0)
    assert plan.actions[0].assignment is not None
    assert dict(plan.actions[0].assignment.avoid) == {"a": NOW + 5.0}


def test_failover_of_many_workloads_is_spread_as_one_batch() -> None:
    wids = [f"w{i}" for i in range(4)]
    snap = make_snapshot(
        [make_node("a"), make_node("b"), make_node("c")], down=["a"],
        workloads=[submit(w, submitted_at=float(i)) for i, w in enumerate(wids)],
        assignments=[placed(w, "a", [i], epoch=20 + i) for i, w in enumerate(wids)])
    plan = reconcile(snap, NOW)
    targets = {a.workload: a.assignment.node for a in plan.actions if a.assignment}
    assert targets == {"w0": "b", "w1": "c", "w2": "b", "w3": "c"}
    assert {a.event for a in plan.actions} == {"failover"}


def test_cordoned_node_keeps_its_running_work() -> None:
    assert not reconcile(running_on_a(status("w1", "a", 10), cordoned=["a"]), NOW)


@pytest.mark.parametrize("state", ["starting", "running", "stopping"])
def test_live_instance_needs_nothing(state: Any) -> None:
    assert not reconcile(running_on_a(status("w1", "a", 10, state)), NOW)


def test_exit_zero_finishes_completed() -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=2, restart_times=(NOW - 9, NOW - 8))
    action = only(running_on_a(status("w1", "a", 10, "exited", exit_code=0), assignment=prior))
    assert (action.kind, action.event, action.expected_revision) == ("finish", "completed", 10)
    assert action.assignment == Assignment(workload="w1", phase="completed", restarts=2,
                                           restart_times=(NOW - 9, NOW - 8),
                                           reason="exited with code 0")


def test_exit_nonzero_restarts_in_place() -> None:
    # b also runs "other", so a and c are emptier: only the in-place preference picks b.
    prior = placed("w1", "b", [1, 2], epoch=10, restarts=1, restart_times=(NOW - 30,))
    snap = make_snapshot(
        three_nodes(), workloads=[submit("w1", 2), submit("other")],
        assignments=[prior, placed("other", "b", [0], epoch=5)],
        statuses=[status("w1", "b", 10, "exited", exit_code=3), status("other", "b", 5)])
    action = only(snap)
    assert (action.kind, action.event, action.expected_revision) == ("place", "restarted", 10)
    assert action.why == "exited with code 3 on b; resumes from its latest checkpoint, if any -> b"
    new = action.assignment
    assert new is not None
    assert (new.node, new.gpus, new.restarts) == ("b", (1, 2), 2)
    assert new.restart_times == (NOW - 30, NOW)


@pytest.mark.parametrize(("times", "max_restarts", "window", "kind"), [
    pytest.param((), 3, 600.0, "place", id="first-failure"),
    pytest.param((NOW - 3, NOW - 2), 3, 600.0, "place", id="below-max"),
    pytest.param((NOW - 3, NOW - 2, NOW - 1), 3, 600.0, "finish", id="at-max"),
    pytest.param((NOW - 900, NOW - 800, NOW - 1), 3, 600.0, "place", id="old-ones-expired"),
    pytest.param((NOW - 600, NOW - 2, NOW - 1), 3, 600.0, "place", id="window-edge-expired"),
    pytest.param((), 0, 600.0, "finish", id="no-restarts-allowed"),
    pytest.param((NOW - 20, NOW - 10), 2, 15.0, "place", id="short-window"),
])
def test_restart_budget(times: tuple[float, ...], max_restarts: int, window: float,
                        kind: str) -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=len(times), restart_times=times)
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1), assignment=prior,
                        restart=RestartPolicy(max_restarts=max_restarts, window=window))
    action = only(snap)
    assert action.kind == kind
    assert action.assignment is not None
    recent = tuple(t for t in times if NOW - t < window)
    if kind == "finish":
        assert (action.event, action.assignment.phase) == ("failed", "failed")
        assert action.assignment.restart_times == recent
        assert f"(max {max_restarts})" in action.assignment.reason
    else:
        assert action.assignment.restart_times == (*recent, NOW)
        assert action.assignment.node == "a"


def test_deleted_workload_is_forgotten() -> None:
    snap = make_snapshot(three_nodes(), assignments=[placed("gone", "a", [0], epoch=42)])
    action = only(snap)
    assert (action.kind, action.workload, action.expected_revision) == ("forget", "gone", 42)
    assert (action.assignment, action.event) == (None, "deleted")


def test_status_of_an_older_epoch_is_ignored() -> None:
    prior = placed("w1", "a", [0], epoch=11, restarts=1, restart_times=(NOW - 1,))
    old_exit = status("w1", "a", 10, "exited", exit_code=1)
    assert not reconcile(running_on_a(old_exit, assignment=prior), NOW)


def test_finished_workloads_are_left_alone() -> None:
    done = Assignment(workload="w1", phase="completed", epoch=12)
    failed = Assignment(workload="w2", phase="failed", epoch=13)
    snap = make_snapshot(three_nodes(), down=["a"], workloads=[submit("w1"), submit("w2")],
                         assignments=[done, failed])
    assert not reconcile(snap, NOW)


def test_unplaceable_goes_pending_then_stays_quiet() -> None:
    snap = make_snapshot(three_nodes(), workloads=[submit("huge", 8)])
    action = only(snap)
    assert (action.kind, action.event, action.expected_revision) == ("pending", "pending", 0)
    assert action.assignment is not None
    reason = action.assignment.reason
    assert reason.startswith("no node fits (3 node(s): not enough free healthy GPUs")
    assert action.why == f"new workload; {reason}"
    already = Assignment(workload="huge", phase="pending", epoch=8, reason=reason)
    same = make_snapshot(three_nodes(), workloads=[submit("huge", 8)], assignments=[already])
    assert not reconcile(same, NOW)
    changed = Assignment(workload="huge", phase="pending", epoch=8, reason="no ready nodes")
    again = only(make_snapshot(three_nodes(), workloads=[submit("huge", 8)],
                               assignments=[changed]))
    assert (again.kind, again.expected_revision) == ("pending", 8)


def test_failover_without_room_goes_pending_keeping_history() -> None:
    prior = placed("w1", "a", [0, 1, 2, 3], epoch=10, restarts=2, restart_times=(NOW - 1,))
    snap = make_snapshot([make_node("a"), make_node("b", 2)], down=["a"],
                         workloads=[submit("w1", 4)], assignments=[prior])
    action = only(snap)
    assert (action.kind, action.expected_revision) == ("pending", 10)
    assert action.assignment is not None
    assert (action.assignment.restarts, action.assignment.restart_times) == (2, (NOW - 1,))
    assert dict(action.assignment.avoid) == {"a": NOW + FAILED_NODE_COOLDOWN}


def busy_snapshot(reverse: bool) -> ClusterSnapshot:
    wids = [f"w{i}" for i in range(8)]
    subs = [submit(w, i % 3, submitted_at=float(i % 4), priority=i % 2)
            for i, w in enumerate(wids)]
    assigns = [placed("w0", "a", [0], epoch=30), placed("w1", "b", [0], epoch=31),
               placed("w2", "b", [1, 2], epoch=32), placed("ghost", "c", [0], epoch=33)]
    stats = [status("w2", "b", 32, "exited", exit_code=2), status("w1", "b", 31)]
    nodes = [make_node("a"), make_node("b"), make_node("c"), make_node("d", 2)]
    if reverse:
        subs, assigns, stats, nodes = subs[::-1], assigns[::-1], stats[::-1], nodes[::-1]
    return make_snapshot(nodes, down=["a"], workloads=subs, assignments=assigns,
                         statuses=stats)


def test_reconcile_is_deterministic() -> None:
    first = reconcile(busy_snapshot(False), NOW)
    assert reconcile(busy_snapshot(False), NOW) == first
    assert reconcile(busy_snapshot(True), NOW) == first
    kinds = [(a.kind, a.workload) for a in first.actions]
    assert kinds[0] == ("forget", "ghost")
    assert sorted(w for k, w in kinds if k == "place") == ["w0", "w2", "w3", "w4", "w5",
                                                            "w6", "w7"]


def test_failover_event_says_where_the_workload_resumes() -> None:
    from hafo.model.cluster import CheckpointInfo

    from .conftest import make_node, make_snapshot, placed, status, submit

    snapshot = make_snapshot([make_node("a"), make_node("b")], down=["a"],
                             workloads=[submit("w", 1)], assignments=[placed("w", "a")],
                             statuses=[status("w", "b", 3, "exited", exit_code=0,
                                              checkpoint=CheckpointInfo(40, 10, "/ck"))])
    (action,) = reconcile(snapshot, 1000.0).actions
    assert "resumes from its latest checkpoint (last reported: step 40)" in action.why
