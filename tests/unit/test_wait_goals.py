"""What ``--wait`` waits for (``hafo.decisions.wait_goals``), and how its lines look
(``hafo.commands.wait``): table-driven over snapshots built in code."""

from __future__ import annotations

import argparse
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

import pytest

from hafo.commands.base import CliError
from hafo.commands.wait import (
    PlainRenderer,
    WaitResult,
    add_wait_args,
    check_wait_args,
    final_line,
    renderer_for,
)
from hafo.decisions.wait_goals import (
    DrainGoal,
    MigrateGoal,
    SubmitGoal,
    WaitGoal,
    WaitOutcome,
    drain_goal,
    migrate_goal,
    settled,
    submit_goal,
    wait_outcome,
)
from hafo.model.cluster import (
    Assignment,
    ClusterSnapshot,
    Event,
    InstanceStatus,
    Member,
    MoveRequest,
    Submission,
)

from .conftest import make_node, make_snapshot, make_spec, placed, status, submit

NOW = 1000.0
NODES = [make_node("a"), make_node("b"), make_node("c")]


def snap(workloads: Iterable[Submission], assignments: Iterable[Assignment] = (),
         statuses: Iterable[InstanceStatus] = (),
         moves: Iterable[MoveRequest] = ()) -> ClusterSnapshot:
    snapshot = make_snapshot(NODES, workloads=workloads, assignments=assignments,
                             statuses=statuses)
    return replace(snapshot, moves={m.workload: m for m in moves})


def pending(wid: str, reason: str = "") -> Assignment:
    return Assignment(workload=wid, phase="pending", reason=reason)


def moving(wid: str, node: str, stopping: int, urgent: bool = False) -> Assignment:
    return Assignment(workload=wid, phase="moving", node=node, gpus=(0,), epoch=stopping + 1,
                      stopping=stopping, reason="migrate", urgent=urgent)


def finished(wid: str, phase: str, reason: str) -> Assignment:
    return Assignment(workload=wid, phase=phase, reason=reason)  # type: ignore[arg-type]


W = submit("w")


def outcome(goal: WaitGoal, snapshot: ClusterSnapshot,
            events: Sequence[Event] = ()) -> tuple[str, str]:
    found = wait_outcome(goal, snapshot, NOW, events)
    return found.state, found.message


# -- submit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("snapshot", "expected"), [
    (snap([]), ("failed", "deleted")),
    (snap([W]), ("waiting", "waiting for the controller to place it")),
    (snap([W], [pending("w", "no node has 8 free GPUs")]),
     ("waiting", "pending: no node has 8 free GPUs")),
    (snap([W], [pending("w")]), ("waiting", "pending: waiting to be placed")),
    (snap([W], [placed("w", "a", epoch=12)]), ("waiting", "starting on a (epoch 12)")),
    (snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 11)]),  # an older instance
     ("waiting", "starting on a (epoch 12)")),
    (snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12, "starting")]),
     ("waiting", "starting on a (epoch 12)")),
    (snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12)]),
     ("done", "running on a (epoch 12)")),
    (snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12, "exited", exit_code=0)]),
     ("done", "completed on a (epoch 12, exit code 0)")),
    (snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12, "exited", exit_code=1)]),
     ("waiting", "exited on a (epoch 12, code 1); its restart policy decides what next")),
    (snap([W], [moving("w", "a", 12)]),
     ("waiting", "stopping on a (checkpoint first): migrate")),
    (snap([W], [moving("w", "a", 12, urgent=True)]), ("waiting", "stopping on a (now): migrate")),
    (snap([W], [finished("w", "failed", "exited with code 1 on c; it failed on every node "
                         "that can run it")]),
     ("failed", "exited with code 1 on c; it failed on every node that can run it")),
    (snap([W], [finished("w", "completed", "exited with code 0")]),
     ("done", "completed (exited with code 0)")),
])
def test_submit(snapshot: ClusterSnapshot, expected: tuple[str, str]) -> None:
    assert outcome(SubmitGoal("w"), snapshot) == expected


def test_a_done_submit_says_where() -> None:
    found = wait_outcome(SubmitGoal("w"), snap([W], [placed("w", "b", epoch=7)],
                                                [status("w", "b", 7)]), NOW)
    assert found == WaitOutcome("done", "running on b (epoch 7)", "b", 7, settle=True)
    assert found.final


def test_running_counts_once_it_stayed_up() -> None:
    running = WaitOutcome("done", "running on b (epoch 7)", "b", 7, settle=True)
    first, held = settled(running, None, 50.0)
    assert first == WaitOutcome("waiting", "running on b (epoch 7); checking that it stays up")
    assert held == ("running on b (epoch 7)", 50.0)
    assert settled(running, held, 50.9)[0].state == "waiting"
    assert settled(running, held, 51.0) == (running, held)
    moved = WaitOutcome("done", "running on c (epoch 9)", "c", 9, settle=True)
    assert settled(moved, held, 51.0) == (  # another instance: held anew
        WaitOutcome("waiting", "running on c (epoch 9); checking that it stays up"),
        ("running on c (epoch 9)", 51.0))
    exited = WaitOutcome("waiting", "exited on b (epoch 7, code 1)")
    assert settled(exited, held, 51.0) == (exited, None)  # not running: forgotten
    done = WaitOutcome("done", "completed on b (epoch 7, exit code 0)", "b", 7)
    assert settled(done, None, 50.0) == (done, None)  # final at once
    assert settled(running, None, 50.0, seconds=0) == (running, ("running on b (epoch 7)",
                                                                 50.0))


def test_an_updated_workload_waits_for_its_next_instance() -> None:
    restart = MoveRequest("w", None, "update to the new spec", restart=True)
    before = snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12)], [restart])
    goal = submit_goal(before, "w", "updated")
    assert goal == SubmitGoal("w", after=12)
    assert outcome(goal, before)[0] == "waiting"
    assert submit_goal(snap([W], [moving("w", "a", 12)]), "w", "updated").after == 12
    after = snap([W], [placed("w", "b", epoch=20)], [status("w", "b", 20)])
    assert outcome(goal, after) == ("done", "running on b (epoch 20)")
    assert submit_goal(before, "w", "unchanged") == SubmitGoal("w")  # runs already: done
    assert outcome(SubmitGoal("w"), before) == ("done", "running on a (epoch 12)")


def test_a_gang_runs_when_every_member_runs() -> None:
    gang = submit("g", spec=make_spec("g", nodes=2))
    members = (Member(0, "a", (0,)), Member(1, "b", (0,)))
    assignment = placed("g", "a", epoch=30, members=members)
    one = snap([gang], [assignment], [status("g", "a", 30)])
    assert outcome(SubmitGoal("g"), one) == ("waiting", "starting on a, b (epoch 30)")
    both = snap([gang], [assignment], [status("g", "a", 30), status("g", "b", 30)])
    assert outcome(SubmitGoal("g"), both) == ("done", "running on a, b (epoch 30)")


def service_snapshot(ready: int, replicas: int = 2) -> ClusterSnapshot:
    spec = make_spec("s", replicas=replicas)
    service = Submission(id="s", spec=spec, submitted_at=0.0)
    subs, assignments, statuses = [service], [], []
    for n, node in enumerate(["a", "b"][:replicas]):
        rid = f"s.{n}"
        subs.append(Submission(id=rid, spec=spec.template, submitted_at=0.0, service="s"))
        assignments.append(placed(rid, node, epoch=40 + n))
        statuses.append(replace(status(rid, node, 40 + n), ready=n < ready))
    return snap(subs, assignments, statuses)


def test_a_service_is_done_when_every_replica_is_ready() -> None:
    state, message = outcome(SubmitGoal("s"), service_snapshot(1))
    assert state == "waiting" and message.startswith("degraded: 1 of 2 replicas ready")
    assert wait_outcome(SubmitGoal("s"), service_snapshot(1), NOW).steps == (1, 2)
    assert outcome(SubmitGoal("s"), service_snapshot(2)) == (
        "done", "2 of 2 replica(s) ready on a, b")


def test_a_stalled_rollout_fails() -> None:
    spec = make_spec("s", replicas=1)
    old = Submission(id="s.0", spec=replace(spec.template, env={"v": "1"}), submitted_at=0.0,
                     service="s")
    new = Submission(id="s.1", spec=spec.template, submitted_at=0.0, service="s",
                     replaces="s.0")
    snapshot = snap([Submission(id="s", spec=spec, submitted_at=0.0), old, new],
                    [placed("s.0", "a", epoch=5), placed("s.1", "b", epoch=6)],
                    [replace(status("s.0", "a", 5), ready=True), status("s.1", "b", 6)])
    state, message = outcome(SubmitGoal("s"), snapshot)  # 1000 s > the 600 s deadline
    assert state == "failed" and message.startswith("rollout stopped")


# -- drain ----------------------------------------------------------------------------------

X, Y = submit("x"), submit("y")


@pytest.mark.parametrize(("snapshot", "expected"), [
    # both still on a: one asked (placed, request pending), one stopping
    (snap([X, Y], [placed("x", "a", epoch=5), moving("y", "a", 6)],
          [status("x", "a", 5), status("y", "a", 6, "stopping")], [MoveRequest("x")]),
     ("waiting", "0 of 2 moved off a; x running on a; y stopping on a (checkpoint first): "
                 "migrate")),
    # x moved, y's assignment left but its instance still stops there
    (snap([X, Y], [placed("x", "b", epoch=9), placed("y", "c", epoch=10)],
          [status("x", "b", 9), status("y", "a", 6, "stopping")]),
     ("waiting", "1 of 2 moved off a; y starting on c")),
    # empty, but y still starting elsewhere
    (snap([X, Y], [placed("x", "b", epoch=9), placed("y", "c", epoch=10)],
          [status("x", "b", 9), status("y", "a", 6, "exited", exit_code=0)]),
     ("waiting", "a is empty; y starting on c")),
    (snap([X, Y], [placed("x", "b", epoch=9), pending("y", "no node has 1 free GPU")],
          [status("x", "b", 9)]),
     ("done", "a is empty: x running on b; y pending (no node has 1 free GPU)")),
    (snap([X, Y], [placed("x", "b", epoch=9), placed("y", "c", epoch=10)],
          [status("x", "b", 9), status("y", "c", 10)]),
     ("done", "a is empty: x running on b; y running on c")),
    (snap([Y], [placed("y", "c", epoch=10)], [status("y", "c", 10)]),
     ("done", "a is empty: x deleted; y running on c")),
    # refused: the request is gone, x still runs on a at the same epoch
    (snap([X, Y], [placed("x", "a", epoch=5), moving("y", "a", 6)], [status("x", "a", 5)]),
     ("failed", "x stays on a: move refused: it is a service")),
])
def test_drain(snapshot: ClusterSnapshot, expected: tuple[str, str]) -> None:
    events = [Event(ts=NOW, kind="move-refused", message="move refused: it is a service",
                    workload="x")]
    assert outcome(DrainGoal("a", {"x": 5, "y": 6}), snapshot, events) == expected


def test_drain_of_an_empty_node_and_a_late_arrival() -> None:
    assert outcome(DrainGoal("a"), snap([])) == ("done", "a is empty (nothing was placed on it)")
    late = snap([X], [placed("x", "a", epoch=50)], [status("x", "a", 50)])
    found = wait_outcome(DrainGoal("a"), late, NOW)
    assert found.state == "waiting" and found.steps == (0, 1)
    assert outcome(DrainGoal("zz"), late) == ("failed", "node zz is gone")


def test_drain_goal_remembers_the_epochs_on_the_node() -> None:
    before = snap([X, Y], [placed("x", "a", epoch=5), placed("y", "b", epoch=6)])
    assert drain_goal(before, "a", ["x", "y"]) == DrainGoal("a", {"x": 5, "y": 0})


def replaced_replica() -> tuple[Submission, Submission, Submission]:
    """A one-replica service ``s``, its replica ``s.0`` and the replica ``s.1`` replacing it."""
    spec = make_spec("s", replicas=1)
    service = Submission(id="s", spec=spec, submitted_at=0.0)
    old = Submission(id="s.0", spec=spec.template, submitted_at=0.0, service="s")
    new = Submission(id="s.1", spec=spec.template, submitted_at=1.0, service="s",
                     replaces="s.0")
    return service, old, new


def test_a_drained_replica_is_replaced() -> None:
    service, old, new = replaced_replica()
    goal = DrainGoal("a", {"s.0": 5})
    starting = snap([service, old, new], [placed("s.0", "a", epoch=5), placed("s.1", "b",
                                                                                epoch=8)],
                    [replace(status("s.0", "a", 5), ready=True)], [MoveRequest("s.0")])
    assert outcome(goal, starting)[0] == "waiting"
    gone = snap([service, new], [placed("s.1", "b", epoch=8)],
                [replace(status("s.1", "b", 8), ready=True)])
    assert outcome(goal, gone) == ("done", "a is empty: s.0 replaced by s.1 (s.1 running on b)")


# -- migrate --------------------------------------------------------------------------------

MOVE = MoveRequest("w")


@pytest.mark.parametrize(("to", "snapshot", "expected"), [
    (None, snap([]), ("failed", "deleted")),
    (None, snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12)], [MOVE]),
     ("waiting", "move requested; waiting for the controller")),
    (None, snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12)]),
     ("failed", "move refused: b cannot take it")),
    (None, snap([W], [moving("w", "a", 12)], [status("w", "a", 12, "stopping")]),
     ("waiting", "stopping on a (checkpoint first): migrate")),
    (None, snap([W], [pending("w", "no room")]), ("waiting", "pending: no room")),
    (None, snap([W], [placed("w", "b", epoch=20)]), ("waiting", "starting on b (epoch 20)")),
    (None, snap([W], [placed("w", "b", epoch=20)], [status("w", "b", 20)]),
     ("done", "running on b (epoch 20)")),
    (None, snap([W], [placed("w", "a", epoch=20)], [status("w", "a", 20)]),
     ("failed", "it runs on a again (epoch 20): no other node could take it")),
    ("c", snap([W], [placed("w", "b", epoch=20)], [status("w", "b", 20)]),
     ("failed", "placed on b, not on c (epoch 20)")),
    ("c", snap([W], [placed("w", "c", epoch=20)], [status("w", "c", 20)]),
     ("done", "running on c (epoch 20)")),
    (None, snap([W], [finished("w", "failed", "it failed everywhere")]),
     ("failed", "it failed everywhere")),
])
def test_migrate(to: str | None, snapshot: ClusterSnapshot, expected: tuple[str, str]) -> None:
    events = [Event(ts=NOW, kind="move-refused", message="move refused: b cannot take it",
                    workload="w"),
              Event(ts=NOW, kind="move-refused", message="move refused: other", workload="v")]
    assert outcome(MigrateGoal("w", "a", 12, to), snapshot, events) == expected


def test_a_refusal_without_its_event_points_at_the_events() -> None:
    snapshot = snap([W], [placed("w", "a", epoch=12)], [status("w", "a", 12)])
    assert outcome(MigrateGoal("w", "a", 12), snapshot) == (
        "failed", "move refused by the controller (see `hafo events`)")


def test_migrate_goal() -> None:
    snapshot = snap([W], [placed("w", "a", epoch=12)])
    assert migrate_goal(snapshot, "w", None, "b") == MigrateGoal("w", "a", 12, "b")
    assert migrate_goal(snap([W], [pending("w")]), "w", None, None) is None


def test_a_gang_member_moves_off_its_node() -> None:
    gang = submit("g", spec=make_spec("g", nodes=2))
    goal = MigrateGoal("g", "b", 30)
    stayed = placed("g", "a", epoch=31, members=(Member(0, "a", (0,)), Member(1, "b", (0,))))
    assert outcome(goal, snap([gang], [stayed]))[0] == "failed"
    moved = placed("g", "a", epoch=31, members=(Member(0, "a", (0,)), Member(1, "c", (0,))))
    assert outcome(goal, snap([gang], [moved], [status("g", "a", 31), status("g", "c", 31)])) \
        == ("done", "running on a, c (epoch 31)")


def test_a_replica_is_done_when_its_replacement_is_ready() -> None:
    service, old, new = replaced_replica()
    goal = MigrateGoal("s.0", "a", 5)
    base = [placed("s.0", "a", epoch=5)]
    assert outcome(goal, snap([service, old], base, moves=[MoveRequest("s.0")])) == (
        "waiting", "waiting for the controller to start a replacement")
    assert outcome(goal, snap([service, old, new], [*base, pending("s.1", "no room")])) == (
        "waiting", "replacement s.1: pending: no room")
    ready = snap([service, new], [placed("s.1", "b", epoch=8)],
                 [replace(status("s.1", "b", 8), ready=True)])
    assert outcome(goal, ready) == ("done", "replaced by s.1, ready on b (epoch 8)")
    withdrawn = snap([service, old, replace(new, retiring=2.0)],
                     [*base, placed("s.1", "b", epoch=8)])
    assert outcome(goal, withdrawn)[0] == "failed"


# -- the command side: flags, lines ---------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_wait_args(p, "it runs")
    args = p.parse_args(list(argv))
    args.command = "submit"
    return args


def test_timeout_needs_wait() -> None:
    check_wait_args(parse("--wait", "--timeout", "3"))
    check_wait_args(parse())
    with pytest.raises(CliError) as caught:
        check_wait_args(parse("--timeout", "3"))
    assert caught.value.code == 2 and "--timeout" in str(caught.value)
    for bad in ("0", "-1", "soon", "1e9"):
        with pytest.raises(SystemExit):
            parse("--wait", "--timeout", bad)


@pytest.mark.parametrize(("result", "line"), [
    ("done", "w: running on b (epoch 7) after 2.1 s"),
    ("failed", "w: failed after 2.1 s: running on b (epoch 7)"),
    ("timeout", "w: timed out after 2.1 s: running on b (epoch 7); it stays"),
    ("interrupted", "w: interrupted after 2.1 s: running on b (epoch 7); it stays"),
])
def test_final_lines(result: str, line: str) -> None:
    assert final_line("w", result, "running on b (epoch 7)", 2.06, "it stays") == line  # type: ignore[arg-type]


def test_plain_lines_have_no_escape_codes() -> None:
    out = io.StringIO()
    render = renderer_for(out, "w")
    assert isinstance(render, PlainRenderer)
    render.update(WaitOutcome("waiting", "pending: no\x1b[31m room"), 0.31)
    render.update(WaitOutcome("waiting", "pending: no\x1b[31m room"), 0.62)  # unchanged
    render.update(WaitOutcome("waiting", "starting on b (epoch 3)", steps=(0, 1)), 1.0)
    render.finish(WaitResult("done", "w: running on b (epoch 3) after 1.4 s",
                             "running on b (epoch 3)", 1.4, "b", 3))
    lines = out.getvalue().splitlines()
    assert lines == ["   0.3s  pending: no [31m room", "   1.0s  starting on b (epoch 3)",
                     "w: running on b (epoch 3) after 1.4 s"]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", out.getvalue())


def test_result_json_and_exit_codes() -> None:
    result = WaitResult("timeout", "w: timed out", "pending", 3.01234)
    assert result.exit_code == 6
    assert result.to_dict() == {"result": "timeout", "message": "pending",
                                "line": "w: timed out", "seconds": 3.012, "node": None,
                                "epoch": None}
    assert [WaitResult(r, "", "", 0).exit_code for r in ("done", "failed", "interrupted")] \
        == [0, 1, 130]


@pytest.mark.parametrize("argv", [
    ["submit", "spec.yaml", "--timeout", "5"],
    ["drain", "node-1", "--timeout", "5"],
    ["migrate", "w", "--timeout", "5"],
    ["submit", "spec.yaml", "--wait", "--timeout", "0"],
])
def test_cli_refuses_timeout_without_wait(argv: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from hafo.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout" in err and "Traceback" not in err
