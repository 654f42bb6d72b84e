"""Why a workload is where it is: the stderr tail from the guard's state.json to the agent's
report, the controller's reasons and events, and the views (reason, GPUs requested, ports,
stderr tail, an empty cluster). Pure, table-driven."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.instances import InstanceKey, read_guard_state
from hafo.agent.supervisor import Supervisor
from hafo.decisions.failures import after_failure
from hafo.decisions.history import update_history
from hafo.decisions.reconcile import reconcile
from hafo.model.cluster import Assignment, InstanceStatus, Member, NodeRecord
from hafo.model.exits import STDERR_LINE_CHARS, bounded_tail, failure_subject, stderr_line
from hafo.model.output import TAIL_BYTES
from hafo.model.spec import RestartPolicy
from hafo.model.views import (
    empty_cluster,
    gpus_requested,
    node_view,
    shown_reason,
    workload_view,
)

from .conftest import make_node, make_snapshot, placed, status, submit

NOW = 10_000.0
TRACEBACK = ('Traceback (most recent call last):\n  File "<string>", line 1, in <module>\n'
             "ModuleNotFoundError: No module named 'nosuchmodule'\n")
MODULE_ERROR = "ModuleNotFoundError: No module named 'nosuchmodule'"


def exited(wid: str, node: str, epoch: int = 10, code: int = 1, tail: str = TRACEBACK,
           finished_at: float = NOW - 1) -> InstanceStatus:
    return dataclasses.replace(status(wid, node, epoch, "exited", exit_code=code,
                                      finished_at=finished_at), stderr_tail=tail)


# -- the pure pieces ------------------------------------------------------------------------

@pytest.mark.parametrize(("tail", "line"), [
    pytest.param(TRACEBACK, MODULE_ERROR, id="python-traceback"),
    pytest.param("fatal: bad thing\n\n   \n\t\n", "fatal: bad thing", id="blank-lines-after"),
    pytest.param("", "", id="empty"),
    pytest.param("\n \n", "", id="only-blank"),
    pytest.param("step 1\rstep 2\rboom: bad\n", "boom: bad", id="carriage-returns"),
    pytest.param("\x1b[31mERROR\x1b[0m: disk full\n", "ERROR: disk full", id="colours"),
    pytest.param("real error\n\x1b[0m\n", "real error", id="escape-only-line"),
    pytest.param("a\tb\x00c  d\n", "a b c d", id="control-characters"),
    pytest.param("no newline at the end", "no newline at the end", id="no-final-newline"),
    pytest.param("RuntimeError: CUDA error: out of memory\r\n", "RuntimeError: CUDA error: "
                 "out of memory", id="crlf"),
])
def test_stderr_line(tail: str, line: str) -> None:
    assert stderr_line(tail) == line


def test_stderr_line_is_bounded() -> None:
    line = stderr_line("x" * 1000 + "\n")
    assert len(line) == STDERR_LINE_CHARS and line.endswith("...")
    assert stderr_line("y" * 50, limit=10) == "yyyyyyy..."
    assert stderr_line("short", limit=10) == "short"


@pytest.mark.parametrize(("text", "limit", "kept"), [
    ("abc", 10, "abc"),
    ("abcdef", 3, "def"),
    ("aé", 2, "é"),       # é is 2 bytes: it fits exactly
    ("aéb", 2, "b"),      # a cut in the middle of é drops the half
    ("", 5, ""),
])
def test_bounded_tail(text: str, limit: int, kept: str) -> None:
    assert bounded_tail(text, limit) == kept


def test_bounded_tail_default_is_the_guards_bound() -> None:
    text = "é" * TAIL_BYTES
    kept = bounded_tail(text)
    assert len(kept.encode()) <= TAIL_BYTES and text.endswith(kept) and kept


@pytest.mark.parametrize(("what", "node", "detail", "subject"), [
    ("exited with code 1", "n1", MODULE_ERROR, f"exited with code 1 on n1: {MODULE_ERROR}"),
    ("exited with code 3", "b", "", "exited with code 3 on b"),
    ("member 2 exited with code 1", "c", "boom", "member 2 exited with code 1 on c: boom"),
])
def test_failure_subject(what: str, node: str, detail: str, subject: str) -> None:
    assert failure_subject(what, node, detail) == subject


@pytest.mark.parametrize(("times", "why"), [
    pytest.param((), f"exited with code 1 on a: {MODULE_ERROR}; restart 1/1 in place",
                 id="restart"),
    pytest.param((NOW - 5,), f"exited with code 1 on a: {MODULE_ERROR}; 1 restarts within "
                 "600s (max 1): moving to another node, a excluded for 600s", id="move"),
])
def test_after_failure_quotes_the_detail(times: tuple[float, ...], why: str) -> None:
    current = placed("w", "a", restart_times=times)
    after = after_failure(current, RestartPolicy(max_restarts=1), "a", "exited with code 1",
                          NOW, NOW, detail=MODULE_ERROR)
    assert after.why == why


# -- the agent: state.json -> GuardState -> InstanceStatus -----------------------------------

def write_state(path: Path, **fields: Any) -> None:
    path.mkdir(parents=True, exist_ok=True)
    base = {"guard_pid": None, "pid": 7, "state": "exited", "exit_code": 1, "started_at": 1.0,
            "finished_at": 2.0, "reason": "exited with code 1", "ended": "exit"}
    (path / "state.json").write_text(json.dumps({**base, **fields}))


@pytest.mark.parametrize(("fields", "tail"), [
    pytest.param({"stderr_tail": TRACEBACK}, TRACEBACK, id="recorded"),
    pytest.param({}, "", id="older-guard"),
    pytest.param({"stderr_tail": None}, "", id="null"),
    pytest.param({"stderr_tail": 5}, "", id="not-text"),
    pytest.param({"exit_code": 127, "pid": None, "reason": "could not start: [Errno 2] No "
                  "such file or directory: 'nosuch'"},
                 "could not start: [Errno 2] No such file or directory: 'nosuch'",
                 id="could-not-start"),
    pytest.param({"exit_code": 1, "reason": "exited with code 1"}, "", id="said-nothing"),
    pytest.param({"pid": None, "ended": "fenced", "exit_code": None,
                  "reason": "fenced before start: lease deadline already passed"}, "",
                 id="fenced-before-start"),
])
def test_the_agent_reports_the_stderr_tail(tmp_path: Path, fields: dict[str, Any],
                                           tail: str) -> None:
    key = InstanceKey("w", 12)
    path = tmp_path / "instances" / key.dirname
    write_state(path, **fields)
    state = read_guard_state(path)
    assert state is not None
    report = Supervisor("n1", tmp_path, tmp_path / "ck").status_of(key, state)
    assert report.stderr_tail == tail
    assert InstanceStatus.from_dict(report.to_dict()) == report


def test_a_running_instance_reports_no_tail(tmp_path: Path) -> None:
    key = InstanceKey("w", 12)
    path = tmp_path / "instances" / key.dirname
    write_state(path, state="running", exit_code=None, stderr_tail="left over")
    state = read_guard_state(path)
    assert state is not None
    assert Supervisor("n1", tmp_path, tmp_path / "ck").status_of(key, state).stderr_tail == ""


@pytest.mark.parametrize(("value", "kept"), [
    (None, ""), ("", ""), ("boom\n", "boom\n"), ("x" * (TAIL_BYTES + 10), "x" * TAIL_BYTES),
])
def test_the_report_field_is_bounded(value: Any, kept: str) -> None:
    data = exited("w", "a").to_dict() | {"stderr_tail": value}
    assert InstanceStatus.from_dict(data).stderr_tail == kept


def test_an_old_agents_report_has_no_tail() -> None:
    data = exited("w", "a").to_dict()
    del data["stderr_tail"]
    report = InstanceStatus.from_dict(data)
    assert (report.stderr_tail, report.stderr_line) == ("", "")


# -- the controller: reasons and events -----------------------------------------------------

def test_a_restart_quotes_the_last_stderr_line() -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=10)], statuses=[exited("w", "a")])
    (action,) = reconcile(snap, NOW).actions
    assert (action.kind, action.event) == ("place", "restarted")
    assert action.why.startswith(f"exited with code 1 on a: {MODULE_ERROR}; restart 1/3 ")
    assert action.assignment is not None
    assert action.assignment.reason.startswith(f"exited with code 1 on a: {MODULE_ERROR};")


def test_the_failed_event_quotes_the_last_stderr_line() -> None:
    snap = make_snapshot([make_node("a")],
                         workloads=[submit("w", restart=RestartPolicy(max_restarts=0))],
                         assignments=[placed("w", "a", epoch=10)], statuses=[exited("w", "a")])
    (action,) = reconcile(snap, NOW).actions
    assert (action.kind, action.event) == ("finish", "failed")
    assert action.assignment is not None and action.assignment.phase == "failed"
    for text in (action.why, action.assignment.reason):
        assert text == (f"failed: exited with code 1 on a (no restarts): {MODULE_ERROR}; no "
                        "other node can run it")


def test_without_a_tail_the_reason_is_as_before() -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=10)],
                         statuses=[exited("w", "a", tail="\n")])
    (action,) = reconcile(snap, NOW).actions
    assert action.why.startswith("exited with code 1 on a; restart 1/3 in place")


def test_a_gang_members_exit_quotes_its_stderr() -> None:
    members = tuple(Member(rank=r, node=n, gpus=(0,)) for r, n in enumerate("ab"))
    gang = Assignment(workload="g", phase="placed", node="a", gpus=(0,), epoch=50,
                      members=members, master_port=29500)
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("g", nodes=2)],
                         assignments=[gang],
                         statuses=[status("g", "a", 50),
                                   exited("g", "b", 50, tail="RuntimeError: NCCL timeout\n")])
    (action,) = reconcile(snap, NOW).actions
    assert action.event == "member-exited"
    assert "member 1 exited with code 1 on b: RuntimeError: NCCL timeout; restart 1/3" \
        in action.why


# -- the views ------------------------------------------------------------------------------

RESTARTED = "exited with code -9 on a; restart 1/3 in place; resumes from its latest checkpoint"


@pytest.mark.parametrize(("state", "assignment", "statuses", "reason"), [
    pytest.param("pending", None, [], "waiting for the controller", id="undecided"),
    pytest.param("pending", Assignment(workload="w", phase="pending", reason="no room"), [],
                 "no room", id="pending"),
    pytest.param("running", placed("w", "a", reason="new workload"), [status("w", "a")],
                 "running", id="first-instance"),
    pytest.param("running", placed("w", "a", reason="planned move"), [status("w", "a")],
                 "running", id="moved-never-failed"),
    pytest.param("running", placed("w", "a", reason=RESTARTED, restarts=1),
                 [status("w", "a")], f"running again after: {RESTARTED}", id="restarted"),
    pytest.param("running", placed("w", "a", reason="node b is down; resumes",
                                   avoid={"b": NOW + 60}),
                 [status("w", "a")], "running again after: node b is down; resumes",
                 id="failed-over"),
    pytest.param("running", placed("w", "a", reason="new workload"),
                 [status("w", "a", failing="check http: 3 failures")],
                 "running, but failing: check http: 3 failures", id="failing"),
    pytest.param("starting", placed("w", "a", reason=RESTARTED), [], RESTARTED,
                 id="starting-again"),
    pytest.param("failed", placed("w", "a", reason="new workload"), [exited("w", "a")],
                 f"exited with code 1 on a: {MODULE_ERROR}", id="exited-controller-not-yet"),
    pytest.param("completed", placed("w", "a", reason="new workload"),
                 [exited("w", "a", code=0, tail="")], "exited with code 0 on a",
                 id="completed-controller-not-yet"),
    pytest.param("failed", Assignment(workload="w", phase="failed", reason="it failed"), [],
                 "it failed", id="failed"),
    pytest.param("stopping", Assignment(workload="w", phase="moving", node="a",
                                        reason="planned move"), [status("w", "a")],
                 "planned move", id="moving"),
])
def test_shown_reason(state: str, assignment: Assignment | None,
                      statuses: list[InstanceStatus], reason: str) -> None:
    assert shown_reason(state, assignment, statuses) == reason


def test_a_running_workload_no_longer_shows_its_old_failure() -> None:
    report = dataclasses.replace(status("w", "a", 11), ports={"http": 8080})
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=11, restarts=1, reason=RESTARTED)],
                         statuses=[report])
    view = workload_view(snap, "w")
    assert (view["state"], view["reason"]) == ("running", f"running again after: {RESTARTED}")
    assert view["ports"] == {"http": 8080}
    assert view["stderr_tail"] == ""


def test_the_view_carries_the_newest_stderr_tail() -> None:
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=10)],
                         statuses=[exited("w", "a", 10), exited("w", "b", 7, tail="old\n")])
    view = workload_view(snap, "w")
    assert view["state"] == "failed"
    assert view["stderr_tail"] == TRACEBACK
    assert view["reason"] == f"exited with code 1 on a: {MODULE_ERROR}"


@pytest.mark.parametrize(("submission", "requested"), [
    (submit("one", 2), 2),
    (submit("none", 0), 0),
    (submit("gang", 8, nodes=8), 64),
])
def test_gpus_requested(submission: Any, requested: int) -> None:
    assert gpus_requested(submission) == requested
    snap = make_snapshot([make_node("a")], workloads=[submission])
    view = workload_view(snap, submission.id)
    assert (view["gpus"], view["gpus_requested"]) == ([], requested)


def test_the_node_view_has_its_api() -> None:
    node = dataclasses.replace(make_node("a"), api="http://127.0.0.1:9000")
    assert node_view(make_snapshot([node]), "a")["api"] == "http://127.0.0.1:9000"


@pytest.mark.parametrize(("nodes", "controllers", "leader", "empty"), [
    ([], [], None, True),
    ([make_node("a")], [], None, False),
    ([], ["ctl-1"], None, False),
    ([], [], "ctl-1", False),
])
def test_empty_cluster(nodes: list[NodeRecord], controllers: list[str], leader: str | None,
                       empty: bool) -> None:
    snap = make_snapshot(nodes, controllers=controllers, leader=leader)
    assert empty_cluster(snap) is empty


@pytest.mark.parametrize(("code", "how", "number"), [(1, "exit", 1), (-11, "signal", 11)])
def test_the_history_keeps_the_last_stderr_line(code: int, how: str, number: int) -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=10)],
                         statuses=[exited("w", "a", code=code)])
    history = update_history(None, snap, "w", NOW)
    assert history is not None
    end = history.epochs[-1].end
    assert end is not None and (end.how, end.code, end.detail) == (how, number, MODULE_ERROR)
