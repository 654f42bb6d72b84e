"""Table-driven tests of the controller's pure decision: snapshot + now -> Plan."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hafo.decisions.classify import classify
from hafo.decisions.health import HealthState, apply_to_inventory, assess
from hafo.decisions.observed import Observations, observe
from hafo.decisions.reconcile import FAILED_NODE_COOLDOWN, Action, reconcile
from hafo.model import health as h
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    Gpu,
    InstanceStatus,
    NodeRecord,
    mig_index,
)
from hafo.model.health import Finding
from hafo.model.health_config import HealthConfig
from hafo.model.queues import QueueSpec
from hafo.model.spec import RestartPolicy

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 10_000.0


def three_nodes(**overrides: Any) -> list[NodeRecord]:
    """Nodes a, b, c with 4 GPUs each; overrides replace a node by name."""
    return [overrides.get(n, make_node(n)) for n in "abc"]


def exit_seen(at: float, wid: str = "w1", node: str = "a", epoch: int = 10) -> Observations:
    """The controller saw that instance's exit at ``at`` (its own clock)."""
    return Observations(ended={(wid, node, epoch): at})


def only(snapshot: ClusterSnapshot, now: float = NOW,
         seen: Observations | None = None) -> Action:
    plan = reconcile(snapshot, now, seen=seen)
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


@pytest.mark.parametrize("queued", [False, True])
def test_a_completion_frees_its_gpus_and_quota_for_the_same_cycle(queued: bool) -> None:
    """done exited 0 on the only node's 4 GPUs: next, waiting for them, is placed on them in
    the cycle that finishes done, not the one after (with a queue of 4: its quota too)."""
    snap = make_snapshot(
        [make_node("a")], workloads=[submit("done", 4), submit("next", 4, submitted_at=5.0)],
        assignments=[placed("done", "a", [0, 1, 2, 3], epoch=10)],
        statuses=[status("done", "a", 10, "exited", exit_code=0)])
    if queued:
        snap = dataclasses.replace(snap, queues={"default": QueueSpec(name="default", gpus=4)})
    kinds = {a.workload: (a.kind, a.assignment) for a in reconcile(snap, NOW).actions}
    assert kinds["done"][0] == "finish"
    kind, assignment = kinds["next"]
    assert kind == "place" and assignment is not None
    assert (assignment.node, assignment.gpus) == ("a", (0, 1, 2, 3))


def test_a_running_workload_keeps_its_gpus() -> None:
    """The same, with done still running: next waits."""
    snap = make_snapshot(
        [make_node("a")], workloads=[submit("done", 4), submit("next", 4, submitted_at=5.0)],
        assignments=[placed("done", "a", [0, 1, 2, 3], epoch=10)],
        statuses=[status("done", "a", 10)])
    kinds = {a.workload: a.kind for a in reconcile(snap, NOW).actions}
    assert kinds == {"next": "pending"}


def test_exit_nonzero_restarts_in_place() -> None:
    # b also runs "other", so a and c are emptier: only the in-place preference picks b.
    prior = placed("w1", "b", [1, 2], epoch=10, restarts=1, restart_times=(NOW - 30,))
    snap = make_snapshot(
        three_nodes(), workloads=[submit("w1", 2), submit("other")],
        assignments=[prior, placed("other", "b", [0], epoch=5)],
        statuses=[status("w1", "b", 10, "exited", exit_code=3, finished_at=NOW - 60),
                  status("other", "b", 5)])
    action = only(snap, seen=exit_seen(NOW - 60, node="b"))
    assert (action.kind, action.event, action.expected_revision) == ("place", "restarted", 10)
    # its exited report names no checkpoint (its agent read them after it ended): exactly
    assert action.why == ("exited with code 3 on b; restart 2/3 in place after a 1s backoff; "
                          "resumes from the start (no checkpoint) -> b")
    new = action.assignment
    assert new is not None
    assert (new.node, new.gpus, new.restarts) == ("b", (1, 2), 2)
    assert new.restart_times == (NOW - 30, NOW)


@pytest.mark.parametrize(("times", "max_restarts", "window", "outcome"), [
    pytest.param((), 3, 600.0, "restart", id="first-failure"),
    pytest.param((NOW - 3, NOW - 2), 3, 600.0, "restart", id="below-max"),
    pytest.param((NOW - 3, NOW - 2, NOW - 1), 3, 600.0, "move", id="at-max"),
    pytest.param((NOW - 900, NOW - 800, NOW - 1), 3, 600.0, "restart", id="old-ones-expired"),
    pytest.param((NOW - 600, NOW - 2, NOW - 1), 3, 600.0, "restart", id="window-edge-expired"),
    pytest.param((), 0, 600.0, "move", id="no-restarts-allowed"),
    pytest.param((NOW - 20, NOW - 10), 2, 15.0, "restart", id="short-window"),
])
def test_restart_budget_restarts_in_place_then_moves(
        times: tuple[float, ...], max_restarts: int, window: float, outcome: str) -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=len(times), restart_times=times)
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1, finished_at=NOW - 100),
                        assignment=prior,
                        restart=RestartPolicy(max_restarts=max_restarts, window=window))
    action = only(snap, seen=exit_seen(NOW - 100))
    new = action.assignment
    assert action.kind == "place" and new is not None and new.restarts == len(times) + 1
    recent = tuple(t for t in times if NOW - t < window)
    if outcome == "restart":
        assert (new.node, new.restart_times, dict(new.failed_on)) == ("a", (*recent, NOW), {})
    else:
        assert new.node != "a" and new.restart_times == ()
        assert dict(new.failed_on) == {"a": NOW + window}
        assert f"(max {max_restarts})" in action.why


@pytest.mark.parametrize(("seen_ago", "restarts_in_window", "waits"), [
    pytest.param(0.0, 0, False, id="first-restart-immediate"),
    pytest.param(0.5, 1, True, id="second-waits-1s"),
    pytest.param(1.5, 1, False, id="second-after-1s"),
    pytest.param(1.5, 2, True, id="third-waits-2s"),
    pytest.param(2.5, 2, False, id="third-after-2s"),
])
def test_restart_backoff_doubles(seen_ago: float, restarts_in_window: int,
                                 waits: bool) -> None:
    times = tuple(NOW - 10 - i for i in range(restarts_in_window))
    prior = placed("w1", "a", [0], epoch=10, restarts=restarts_in_window, restart_times=times)
    policy = RestartPolicy(max_restarts=5, window=600.0, backoff=1.0, max_backoff=30.0)
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1, finished_at=NOW),
                        assignment=prior, restart=policy)
    assert bool(reconcile(snap, NOW, seen=exit_seen(NOW - seen_ago))) != waits


# Issue 28, finding 4: the agent's finished_at is its wall clock. An agent 1 h ahead made the
# first restart wait an hour; 1 h behind, there was no backoff at all. The backoff is timed
# from when the controller saw the exit, so the agent's clock changes nothing.
@pytest.mark.parametrize("agent_offset", [
    pytest.param(3600.0, id="agent-1h-ahead"),
    pytest.param(-3600.0, id="agent-1h-behind"),
    pytest.param(0.0, id="agent-in-step"),
])
@pytest.mark.parametrize(("restarts_in_window", "seen_ago", "waits"), [
    pytest.param(0, 0.0, False, id="first-at-once"),
    pytest.param(1, 0.0, True, id="second-seen-now-waits"),
    pytest.param(1, 0.9, True, id="second-before-1s"),
    pytest.param(1, 1.0, False, id="second-after-1s"),
    pytest.param(3, 3.5, True, id="fourth-before-4s"),
    pytest.param(3, 4.0, False, id="fourth-after-4s"),
])
def test_restart_backoff_is_the_policy_s_whatever_the_agent_s_clock(
        agent_offset: float, restarts_in_window: int, seen_ago: float, waits: bool) -> None:
    times = tuple(NOW - 10 - i for i in range(restarts_in_window))
    prior = placed("w1", "a", [0], epoch=10, restarts=restarts_in_window, restart_times=times)
    policy = RestartPolicy(max_restarts=5, window=600.0, backoff=1.0, max_backoff=30.0)
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1,
                               finished_at=NOW - seen_ago + agent_offset),
                        assignment=prior, restart=policy)
    seen = observe(exit_seen(NOW - seen_ago), snap, NOW)
    assert bool(reconcile(snap, NOW, seen=seen)) != waits


def test_a_new_leader_backs_off_from_its_own_sighting_of_an_old_exit() -> None:
    """A leader that did not see the exit happen sees it first now: the backoff runs from
    there (at most one backoff later than its predecessor), never from the agent's clock."""
    prior = placed("w1", "a", [0], epoch=10, restarts=1, restart_times=(NOW - 100,))
    policy = RestartPolicy(max_restarts=5, window=600.0, backoff=1.0, max_backoff=30.0)
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1, finished_at=NOW + 3600),
                        assignment=prior, restart=policy)
    first = observe(Observations(), snap, NOW)
    assert not reconcile(snap, NOW, seen=first)
    later = observe(first, snap, NOW + 1.0)
    assert later.ended_at(("w1", "a", 10), NOW + 1.0) == NOW
    assert only(snap, NOW + 1.0, seen=later).kind == "place"


@pytest.mark.parametrize(("field", "value", "bounded_to"), [
    pytest.param("failed_on", {"b": NOW + 3600 + 600}, {"b": NOW + 600},
                 id="exclusion-of-a-leader-1h-ahead"),
    pytest.param("avoid", {"b": NOW + 3600 + 60}, {"b": NOW + 60},
                 id="cool-down-of-a-leader-1h-ahead"),
])
def test_windows_a_leader_with_another_clock_wrote_last_at_most_their_length(
        field: str, value: dict[str, float], bounded_to: dict[str, float]) -> None:
    """A leader whose clock was 1 h ahead wrote an exclusion and a cool-down: its successor
    keeps them at most their length after it first saw them, not an hour more."""
    prior = placed("w1", "a", [0], epoch=10, restarts=1, restart_times=(NOW + 3600,),
                   **{field: value})
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1), assignment=prior,
                        restart=RestartPolicy(max_restarts=5, window=600.0))
    seen = observe(exit_seen(NOW - 5), snap, NOW)  # the assignment seen first now
    action = only(snap, seen=seen)
    assert action.assignment is not None
    assert dict(getattr(action.assignment, field)) == bounded_to
    assert action.assignment.restart_times == (NOW, NOW)  # the inherited one: seen now


def test_failed_on_every_node_is_failed() -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=9, restart_times=(NOW - 3, NOW - 2),
                   failed_on={"b": NOW + 100, "c": NOW + 100})
    snap = running_on_a(status("w1", "a", 10, "exited", exit_code=1, finished_at=NOW - 100),
                        assignment=prior, restart=RestartPolicy(max_restarts=2, window=600.0))
    action = only(snap)
    assert (action.kind, action.event) == ("finish", "failed")
    assert action.assignment is not None and action.assignment.phase == "failed"
    assert action.assignment.reason == ("failed: exited with code 1 on a, b and c (2 restarts "
                                        "each); no other node can run it")
    assert action.why == action.assignment.reason


@pytest.mark.parametrize(("what", "nodes", "restarts", "sentence"), [
    ("exited with code 1", ["node-1", "node-2", "node-3"], 3,
     "failed: exited with code 1 on node-1, node-2 and node-3 (3 restarts each); no other "
     "node can run it"),
    ("exited with code 2", ["a"], 1,
     "failed: exited with code 2 on a (1 restart); no other node can run it"),
    ("", ["a", "b"], 0, "failed: it failed on a and b (no restarts); no other node can run it"),
    ("exited with code 1", [], 3, "failed: exited with code 1; no node can run it"),
])
def test_the_final_failed_event_is_one_sentence(what: str, nodes: list[str], restarts: int,
                                                sentence: str) -> None:
    from hafo.decisions.reconcile import failed_everywhere

    assert failed_everywhere(what, nodes, restarts) == sentence


def test_failing_check_stops_the_instance_now_then_restarts_in_place() -> None:
    snap = running_on_a(status("w1", "a", 10, failing="check http[0] failed 3 times"))
    action = only(snap)
    new = action.assignment
    assert (action.kind, action.event) == ("move", "app-failed") and new is not None
    assert (new.phase, new.stopping, new.urgent, new.after_stop) == ("moving", 10, True,
                                                                     "restart")
    assert new.restarts == 1 and new.restart_times == (NOW,)
    stopped = running_on_a(status("w1", "a", 10, "exited", exit_code=-15),
                           assignment=dataclasses.replace(new, epoch=11))
    again = only(stopped)
    assert (again.kind, again.event) == ("place", "restarted")
    assert again.assignment is not None and again.assignment.node == "a"


def test_failing_check_past_the_budget_moves_and_excludes_the_node() -> None:
    prior = placed("w1", "a", [0], epoch=10, restarts=3,
                   restart_times=(NOW - 3, NOW - 2, NOW - 1))
    action = only(running_on_a(status("w1", "a", 10, failing="check http[0] failed"),
                               assignment=prior))
    new = action.assignment
    assert new is not None and (new.after_stop, new.urgent) == ("move", True)
    assert dict(new.failed_on) == {"a": NOW + 600.0}
    stopped = running_on_a(status("w1", "a", 10, "exited", exit_code=-15),
                           assignment=dataclasses.replace(new, epoch=11))
    again = only(stopped)
    assert again.assignment is not None and again.assignment.node != "a"


@pytest.mark.parametrize(("gpu", "event", "urgent"), [
    pytest.param(make_node("a").gpus[0].__class__(0, "u0", "H100", 81559, healthy=False,
                                                  reason="GPU 0: xid 48"),
                 "gpu-unhealthy", False, id="unhealthy-gpu"),
    pytest.param(make_node("a").gpus[0].__class__(0, "u0", "H100", 81559, degraded=True,
                                                  reason="GPU 0: remap pending"),
                 "gpu-degraded", False, id="degrading-gpu"),
    pytest.param(make_node("a").gpus[0].__class__(0, "u0", "H100", 81559, healthy=False,
                                                  lost=True, reason="GPU 0: lost"),
                 "gpu-unhealthy", True, id="lost-gpu"),
])
def test_bad_gpu_moves_only_the_workload_using_it(gpu: Any, event: str, urgent: bool) -> None:
    node_a = make_node("a")
    node_a = NodeRecord(name="a", gpus=(gpu, *node_a.gpus[1:]))
    snap = make_snapshot(three_nodes(a=node_a), workloads=[submit("w1"), submit("w2")],
                         assignments=[placed("w1", "a", [0], epoch=10),
                                      placed("w2", "a", [1], epoch=11)],
                         statuses=[status("w1", "a", 10), status("w2", "a", 11)])
    action = only(snap)
    assert (action.workload, action.kind, action.event) == ("w1", "move", event)
    assert action.assignment is not None and action.assignment.urgent == urgent


def test_unhealthy_node_moves_all_its_work_checkpoint_first() -> None:
    node_a = NodeRecord(name="a", gpus=make_node("a").gpus, healthy=False,
                        reason="checkpoint filesystem not writable")
    snap = make_snapshot(three_nodes(a=node_a), workloads=[submit("w1"), submit("w2")],
                         assignments=[placed("w1", "a", [0], epoch=10),
                                      placed("w2", "a", [1], epoch=11)],
                         statuses=[status("w1", "a", 10), status("w2", "a", 11)])
    plan = reconcile(snap, NOW)
    assert [(a.workload, a.event) for a in plan.actions] == [("w1", "node-unhealthy"),
                                                             ("w2", "node-unhealthy")]
    assert all(a.assignment is not None and not a.assignment.urgent for a in plan.actions)
    assert "checkpoint filesystem not writable" in plan.actions[0].why


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
    # the node is down: a newer checkpoint may have been committed after its last report
    assert "resumes from its latest checkpoint (step 40 or newer)" in action.why


@pytest.mark.parametrize(("strategy", "placement", "expected"), [
    pytest.param("spread", None, "c", id="spread-default"),
    pytest.param("binpack", None, "b", id="binpack-default"),
    pytest.param("spread", "binpack", "b", id="spec-binpack"),
    pytest.param("binpack", "spread", "c", id="spec-spread"),
])
def test_reconcile_takes_the_cluster_strategy(strategy: str, placement: str | None,
                                              expected: str) -> None:
    snap = make_snapshot(three_nodes(), workloads=[submit("w1", placement=placement),
                                                   submit("a1"), submit("b1", 2)],
                         assignments=[placed("a1", "a", [0], epoch=5),
                                      placed("b1", "b", [0, 1], epoch=6)],
                         statuses=[status("a1", "a", 5), status("b1", "b", 6)])
    (action,) = reconcile(snap, NOW, strategy=strategy).actions
    assert action.assignment is not None and action.assignment.node == expected


def test_reconcile_refuses_an_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="unknown placement strategy"):
        reconcile(make_snapshot(three_nodes()), NOW, strategy="random")


def test_bad_physical_gpu_moves_work_off_its_mig_devices() -> None:
    inventory = [Gpu(0, "GPU-0", "H100", 81559),
                 Gpu(mig_index(1, 0), "MIG-0", "H100", 10240, profile="1g.10gb", parent=1),
                 Gpu(mig_index(1, 1), "MIG-1", "H100", 10240, profile="1g.10gb", parent=1)]
    verdict = classify(Finding(h.XID, 1, code=48), HealthConfig())
    state = assess(HealthState(), [verdict], [g.index for g in inventory], NOW, 60.0).state
    node_a = NodeRecord(name="a", gpus=tuple(apply_to_inventory(inventory, state)))
    snap = make_snapshot(three_nodes(a=node_a),
                         workloads=[submit("w1", gpu_profile="1g.10gb"), submit("w2")],
                         assignments=[placed("w1", "a", [201], epoch=10),
                                      placed("w2", "a", [0], epoch=11)],
                         statuses=[status("w1", "a", 10), status("w2", "a", 11)])
    action = only(snap)
    assert (action.workload, action.kind, action.event) == ("w1", "move", "gpu-unhealthy")
    assert action.why.startswith("GPU 201 on a is unhealthy (GPU 1: xid 48")


def test_mass_failover_resumes_each_from_its_own_checkpoint() -> None:
    wids = [f"w{i}" for i in range(50)]
    snap = make_snapshot(
        [make_node("a", 50), make_node("b", 50)], down=["a"],
        workloads=[submit(w) for w in wids],
        assignments=[placed(w, "a", [i], epoch=20 + i) for i, w in enumerate(wids)],
        statuses=[status(w, "a", 20 + i, checkpoint=CheckpointInfo(i, 20 + i, f"/ck/{w}"))
                  for i, w in enumerate(wids)])
    plan = reconcile(snap, NOW)
    assert len(plan.actions) == 50
    assert all(f"(step {a.workload[1:]} or newer)" in a.why for a in plan.actions)
