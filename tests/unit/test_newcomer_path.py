"""What a new user trips on with ``make demo`` / ``hafo dev``, one section per wrong turn:

1. the resume step: the events, the reasons and ``hafo show`` name the same checkpoint step;
2. a gang whose member could not start says so (member, node, error) while it waits;
3. the REASON column of ``hafo workloads`` is cut to fit, the full text elsewhere;
4. "restarts: 8" beside "max 3 restarts": each says what it counts;
5. every node cordoned (``hafo drain``): the pending reason says so, not "no ready nodes";
6. a pending workload's detail shows the checkpoint it will resume from;
7. the detail view names each GPU by its index (``GPU 0``) beside its UUID;
8. ``hafo dev`` says which example specs run here, and what the others need.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.instances import GuardState, InstanceKey
from hafo.agent.supervisor import Supervisor
from hafo.decisions.pending_reasons import live_reasons, waiting_after
from hafo.decisions.placement_failure import (
    GangShortage,
    NoReadyNodes,
    node_states,
    with_node_states,
)
from hafo.decisions.reconcile import Action, reconcile
from hafo.local.dev_server import Found, banner, example_lines
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceStatus,
    Member,
    Restore,
)
from hafo.model.history_view import show_view
from hafo.model.resume import resume_note
from hafo.model.spec import RestartPolicy
from hafo.model.views import all_workloads, workload_view
from hafo.render import (
    MAX_REASON,
    brief,
    render_show,
    render_workload,
    render_workloads,
)

from .conftest import make_checkpointer, make_node, make_snapshot, placed, status, submit
from .test_dev_control import status as dev_status
from .test_quota import applied, pool, q
from .test_render_why import fields

NOW = 10_000.0
CK = CheckpointInfo(step=820, epoch=32, path="/ck/ckpt-e32-s820")
CK_LAST = CheckpointInfo(step=840, epoch=32, path="/ck/ckpt-e32-s840")
TORCHRUN = "could not start: [Errno 2] No such file or directory: 'torchrun'"


def step(snapshot: ClusterSnapshot, actions: list[Action], revision: int,
         statuses: list[InstanceStatus] | None = None) -> ClusterSnapshot:
    """The snapshot once ``actions`` were written at ``revision`` (their epoch)."""
    assignments = dict(snapshot.assignments)
    for action in actions:
        if action.assignment is not None:
            assignments[action.workload] = dataclasses.replace(action.assignment,
                                                               epoch=revision)
    return dataclasses.replace(
        snapshot, revision=revision, assignments=assignments,
        statuses={(s.workload, s.node): s for s in statuses}
        if statuses is not None else snapshot.statuses)


# --- 1. one resume step everywhere -----------------------------------------------------------

@pytest.mark.parametrize(("checkpoint", "exact", "said"), [
    (CK_LAST, True, "resumes from checkpoint step 840"),
    (None, True, "resumes from the start (no checkpoint)"),
    (CK, False, "resumes from its latest checkpoint (step 820 or newer)"),
    (None, False, "resumes from its latest checkpoint, if any"),
])
def test_the_resume_note(checkpoint: CheckpointInfo | None, exact: bool, said: str) -> None:
    assert resume_note(checkpoint, exact=exact) == said


def _moved(ended: InstanceStatus | None, down: tuple[str, ...] = ()) -> str:
    """The reason the workload is placed again with after a drain's move off a."""
    moving = Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=40,
                        stopping=32, reason="drain a", cause="planned")
    snap = make_snapshot([make_node("a"), make_node("b")], down=down, cordoned=["a"],
                         workloads=[submit("w")], assignments=[moving],
                         statuses=[ended] if ended is not None else [])
    (action,) = reconcile(snap, NOW).actions
    return action.why


@pytest.mark.parametrize(("ended", "down", "said"), [
    # the stopped instance reported its end: its agent read the checkpoints after it ended
    pytest.param(status("w", "a", 32, "exited", exit_code=0, checkpoint=CK_LAST), (),
                 "(instance 32 stopped; resumes from checkpoint step 840) -> b", id="ended"),
    # its node died while it stopped: what was reported last, and maybe newer ones
    pytest.param(status("w", "a", 32, "stopping", checkpoint=CK), ("a",),
                 "(instance 32 stopped; resumes from its latest checkpoint (step 820 or "
                 "newer)) -> b", id="node-down"),
])
def test_a_moved_workload_says_where_it_resumes(ended: InstanceStatus, down: tuple[str, ...],
                                                said: str) -> None:
    assert _moved(ended, down).endswith(said)


def test_a_failover_names_the_last_reported_step_as_a_lower_bound() -> None:
    snap = make_snapshot([make_node("a"), make_node("b")], down=["a"], workloads=[submit("w")],
                         assignments=[placed("w", "a", epoch=32)],
                         statuses=[status("w", "a", 32, checkpoint=CK)])
    (action,) = reconcile(snap, NOW).actions
    assert action.why == ("node a is down; resumes from its latest checkpoint (step 820 or "
                          "newer) -> b")


def test_an_ended_instance_reports_the_checkpoints_read_after_its_end(tmp_path: Path) -> None:
    """The agent re-reads the checkpoints at most every 2 s; an instance that ended since
    gets them read again, so its exited report (and its ``stopped`` event) names the step
    the next instance restores, not one read up to 2 s before its last commit."""
    supervisor = Supervisor("node-a", tmp_path / "state", tmp_path / "ck")
    ck = make_checkpointer(tmp_path / "ck" / "w", epoch=32)
    ck.save({"x": 1}, step=820)
    running = GuardState(guard_pid=None, pid=1, state="running", exit_code=None,
                         started_at=1.0, finished_at=None, reason="")
    key = InstanceKey("w", 32)
    assert supervisor.status_of(key, running).checkpoint is not None
    ck.save({"x": 2}, step=840)  # committed before it stops, within the 2 s of the cache
    assert supervisor.status_of(key, running).checkpoint.step == 820  # type: ignore[union-attr]
    ended = dataclasses.replace(running, state="exited", exit_code=0,
                                finished_at=time.time() + 0.001)
    time.sleep(0.002)
    report = supervisor.status_of(key, ended)
    assert report.checkpoint is not None and report.checkpoint.step == 840
    assert resume_note(report.checkpoint, exact=True) == "resumes from checkpoint step 840"


# --- 2. a gang whose member could not start ---------------------------------------------------

def _gang_that_could_not_start() -> tuple[ClusterSnapshot, Action]:
    """A gang of 2 on a and b (examples/ddp.yaml: no GPU) whose member 0 could not start; it
    may not restart in place, so a is excluded and, with only b left, the gang waits."""
    spec_kw: dict[str, Any] = {"nodes": 2, "restart": RestartPolicy(max_restarts=0)}
    members = (Member(rank=0, node="a", gpus=()), Member(rank=1, node="b", gpus=()))
    gang = Assignment(workload="g", phase="placed", node="a", epoch=10, members=members)
    spawned = dataclasses.replace(status("g", "a", 10, "exited", exit_code=127),
                                  stderr_tail=TORCHRUN + "\n")
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("g", 0, **spec_kw)],
                         assignments=[gang], statuses=[spawned, status("g", "b", 10)])
    (stop,) = reconcile(snap, NOW).actions
    assert stop.kind == "move" and stop.assignment is not None
    assert stop.assignment.failure == f"member 0 exited with code 127 on a: {TORCHRUN}"
    stopped = step(snap, [stop], 20, [spawned, status("g", "b", 10, "exited", exit_code=0)])
    (pending,) = reconcile(stopped, NOW + 1).actions
    return step(stopped, [pending], 30, []), pending


def test_a_gang_whose_member_could_not_start_says_so_while_it_waits() -> None:
    snap, pending = _gang_that_could_not_start()
    reason = (f"member 0 exited with code 127 on a: {TORCHRUN}; waiting to run again: gang "
              "of 2: only 1 of 2 nodes ready; 1 more node(s) excluded: the workload failed "
              "there too often")
    assert pending.kind == "pending"
    assert pending.assignment is not None and pending.assignment.reason == reason
    # the next cycles keep it (the failure travels with the pending assignment): nothing
    # to write
    assert reconcile(snap, NOW + 2).actions == ()
    view = workload_view(snap, "g", NOW + 2)
    assert view["reason"] == reason  # hafo workloads --json, the API
    assert fields(render_workload(view))["reason"] == reason  # hafo workloads g
    assert render_workloads([view]).splitlines()[1].endswith(
        brief(reason, MAX_REASON))  # hafo workloads
    assert TORCHRUN[:30] in render_workloads([view])
    shown = show_view(snap, "g", None, (), NOW + 2)
    assert f"reason:     {reason}" in render_show(shown)  # hafo show g


def test_the_failure_is_forgotten_once_it_runs_again() -> None:
    snap, _pending = _gang_that_could_not_start()
    back = make_snapshot([make_node("a"), make_node("b"), make_node("c")],  # a third node
                         workloads=list(snap.workloads.values()),
                         assignments=list(snap.assignments.values()), revision=31)
    (placed_again,) = reconcile(back, NOW + 3).actions
    assert placed_again.kind == "place" and placed_again.assignment is not None
    assert placed_again.assignment.failure == ""


def test_a_queued_workload_pending_after_a_failure_keeps_its_live_figures() -> None:
    """The failure comes first; the quota's live figures and the place in the queue follow."""
    snapshot = pool((q("a", 6),), workloads=(submit("g", 4, queue="a", nodes=2),))
    waiting = applied(snapshot)
    pending = waiting.assignments["g"]
    failed = dataclasses.replace(pending, failure="member 1 exited with code 1 on n2",
                                 reason=waiting_after("member 1 exited with code 1 on n2")
                                 + pending.reason)
    live = live_reasons(dataclasses.replace(waiting, assignments={"g": failed}))
    assert live["g"] == ("member 1 exited with code 1 on n2; waiting to run again: queue a: "
                         "0 of 6 GPUs used, needs 8; 1st of 1 waiting in queue a")


# --- 3. the REASON column is cut to fit -------------------------------------------------------

LONG = ("move off node-2: node node-2 is unhealthy (GPU 0: xid 79 (simulated): GPU has fallen "
        "off the bus) (instance 32 stopped; resumes from checkpoint step 540)")


@pytest.mark.parametrize(("text", "width", "shown"), [
    ("running", 80, "running"),
    ("a" * 80, 80, "a" * 80),
    ("first clause; second clause that is long" + "x" * 60, 80, "first clause; ..."),
    ("x" * 100 + "; the rest", 80, "x" * 77 + "..."),
    (LONG, 80, LONG[:77] + "..."),
    ("no node fits (2 node(s): cordoned); 1st of 3 waiting in queue default", 40,
     "no node fits (2 node(s): cordoned); ..."),
])
def test_brief(text: str, width: int, shown: str) -> None:
    assert brief(text, width) == shown
    assert len(brief(text, width)) <= width


@pytest.mark.parametrize("width", [None, 100, 300])
def test_the_table_never_runs_past_its_reason_room(width: int | None) -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[Assignment(workload="w", phase="pending", reason=LONG * 3)])
    views = all_workloads(snap)
    lines = render_workloads(views, width).splitlines()
    start = lines[0].index("REASON")
    assert len(lines[1]) - start <= MAX_REASON
    assert views[0]["reason"] == LONG * 3  # whole in --json
    assert fields(render_workload(views[0]))["reason"] == LONG * 3  # and in the detail view


# --- 4. restarts: in all, and the restart policy's count ----------------------------------------

def _restarted(restarts: int, times: tuple[float, ...]) -> ClusterSnapshot:
    return make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", [0], epoch=50, restarts=restarts,
                                             restart_times=times, reason="exited")],
                         statuses=[status("w", "a", 50)])


@pytest.mark.parametrize(("restarts", "times", "detail", "now_line"), [
    (8, (NOW - 30,), "8 in all; 1 of the 3 allowed in place within 600s, then it moves to "
     "another node", "8 restart(s) in all, 1 of 3 in place within 600s"),
    (8, (NOW - 900, NOW - 30), "8 in all; 1 of the 3 allowed in place within 600s, then it "
     "moves to another node", "8 restart(s) in all, 1 of 3 in place within 600s"),
    (0, (), "0 in all; 0 of the 3 allowed in place within 600s, then it moves to another node",
     "0 restart(s) in all, 0 of 3 in place within 600s"),
])
def test_restarts_say_what_they_count(restarts: int, times: tuple[float, ...], detail: str,
                                      now_line: str) -> None:
    snap = _restarted(restarts, times)
    view = workload_view(snap, "w", NOW)
    assert view["restarts"] == restarts
    assert fields(render_workload(view))["restarts"] == detail
    text = render_show(show_view(snap, "w", None, (), NOW))
    assert f", {now_line}\n" in text
    assert ("up to 3 restarts in place within 600s, then another node"
            in fields(text)["spec"])


def test_no_restart_in_place_allowed() -> None:
    snap = make_snapshot([make_node("a")],
                         workloads=[submit("w", restart=RestartPolicy(max_restarts=0))],
                         assignments=[placed("w", "a", epoch=5, restarts=2)])
    assert fields(render_workload(workload_view(snap, "w", NOW)))["restarts"] == (
        "2 in all; none allowed in place: a failure moves it to another node")


# --- 5. no node takes new work: say why -------------------------------------------------------

@pytest.mark.parametrize(("cordoned", "down", "unhealthy", "reason"), [
    pytest.param(["a", "b"], [], [], "no node takes new work: 2 node(s) cordoned "
                 "(hafo uncordon NODE)", id="drained"),
    pytest.param(["a"], ["b"], ["c"], "no node takes new work: 1 node(s) cordoned (hafo "
                 "uncordon NODE), 1 node(s) unhealthy, 1 node(s) down", id="mixed"),
    pytest.param([], ["a", "b"], [], "no node takes new work: 2 node(s) down", id="down"),
])
def test_a_pending_reason_counts_the_nodes_by_state(cordoned: list[str], down: list[str],
                                                    unhealthy: list[str], reason: str) -> None:
    nodes = [make_node(n, healthy=n not in unhealthy) for n in "abc"
             if n in (*cordoned, *down, *unhealthy)]
    snap = make_snapshot(nodes, down=down, cordoned=cordoned, workloads=[submit("w")])
    (action,) = reconcile(snap, NOW).actions
    assert action.kind == "pending" and action.assignment is not None
    assert action.assignment.reason == reason


@pytest.mark.parametrize(("failure", "states", "said"), [
    (NoReadyNodes(), [], "no ready nodes"),
    (NoReadyNodes(), ["cordoned", "ready"], "no node takes new work: 1 node(s) cordoned "
     "(hafo uncordon NODE)"),
    (GangShortage(members=2, found=0, gpus=0, kind="GPUs"), ["cordoned", "cordoned"],
     "gang of 2: only 0 of 2 nodes ready; taking no new work: 2 node(s) cordoned (hafo "
     "uncordon NODE)"),
    (GangShortage(members=2, found=1, gpus=0, kind="GPUs", excluded=1), ["ready", "ready"],
     "gang of 2: only 1 of 2 nodes ready; 1 more node(s) excluded: the workload failed "
     "there too often"),
    ("as it was", ["down"], "as it was"),
])
def test_with_node_states(failure: Any, states: list[str], said: str) -> None:
    shown = with_node_states(failure, node_states(states))
    assert (shown if isinstance(shown, str) else shown.render()) == said


# --- 6. the checkpoint a pending workload resumes from ----------------------------------------

def test_a_drained_workload_shows_the_checkpoint_it_resumes_from() -> None:
    moving = Assignment(workload="w", phase="moving", node="a", gpus=(0,), epoch=40,
                        stopping=32, reason="drain a", cause="planned")
    ended = status("w", "a", 32, "exited", exit_code=0, checkpoint=CK_LAST)
    snap = make_snapshot([make_node("a")], cordoned=["a"], workloads=[submit("w")],
                         assignments=[moving], statuses=[ended])
    (pending,) = reconcile(snap, NOW).actions
    assert pending.kind == "pending" and pending.assignment is not None
    assert pending.assignment.checkpoint == CK_LAST
    # the agent forgets the ended instance: its report is gone; the assignment remembers
    after = step(snap, [pending], 41, [])
    view = workload_view(after, "w", NOW)
    assert view["checkpoint"] == CK_LAST.to_dict()
    assert fields(render_workload(view))["checkpoint"] == (
        "step 840 (epoch 32) at /ck/ckpt-e32-s840")
    assert "checkpoint: step 840 (epoch 32)" in render_show(show_view(after, "w", None, ()))
    # ... and so does the placement that follows (until the new instance reports)
    (placed_again,) = reconcile(dataclasses.replace(after, cordoned=frozenset()), NOW).actions
    assert placed_again.assignment is not None
    assert placed_again.assignment.checkpoint == CK_LAST


def test_none_yet_only_when_none_is_known() -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[Assignment(workload="w", phase="pending", reason="x")])
    view = workload_view(snap, "w")
    assert fields(render_workload(view))["checkpoint"] == "none yet"
    assert "checkpoint: none yet" in render_show(show_view(snap, "w", None, ()))


# --- 7. GPUs by index --------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "shown"), [
    ((0,), "1 of 1 allocated: GPU 0 (GPU-a-0)"),
    ((2, 3), "2 of 2 allocated: GPU 2 (GPU-a-2), GPU 3 (GPU-a-3)"),
])
def test_the_detail_view_names_each_gpu_by_its_index(gpus: tuple[int, ...],
                                                     shown: str) -> None:
    snap = make_snapshot([make_node("a")], workloads=[submit("w", len(gpus))],
                         assignments=[placed("w", "a", gpus, epoch=5)],
                         statuses=[status("w", "a", 5)])
    view = workload_view(snap, "w")
    assert view["gpu_indexes"] == list(gpus)
    assert fields(render_workload(view))["gpus"] == shown


def test_a_view_without_indexes_still_shows_the_uuids() -> None:
    """An older controller's API: no ``gpu_indexes``."""
    snap = make_snapshot([make_node("a")], workloads=[submit("w")],
                         assignments=[placed("w", "a", (1,), epoch=5)])
    view: dict[str, Any] = dict(workload_view(snap, "w"))
    del view["gpu_indexes"]
    assert fields(render_workload(view))["gpus"] == "1 of 1 allocated: GPU-a-1"


# --- 8. which examples run here ------------------------------------------------------------

@pytest.mark.parametrize(("found", "nodes", "lines"), [
    pytest.param(Found("/venv/bin/python", torch=True, torchrun=True, openai_check=True), 3,
                 ["counter.yaml", "service.yaml", "train.yaml", "ddp.yaml",
                  "openai-service.yaml"], id="make-test"),
    pytest.param(Found("/venv/bin/python", torch=False, torchrun=False, openai_check=False),
                 3, ["counter.yaml", "service.yaml"], id="make-demo"),
    pytest.param(Found("/venv/bin/python", torch=True, torchrun=False, openai_check=True), 1,
                 ["counter.yaml", "train.yaml"], id="one-node-no-torchrun"),
])
def test_hafo_dev_says_which_examples_run_here(found: Found, nodes: int,
                                               lines: list[str]) -> None:
    shown = example_lines(found, nodes)
    assert shown[0] == "examples/ (each file's header says what it needs):"
    runs = [line.split()[0] for line in shown[1:] if line.endswith("runs here as shipped")]
    assert runs == lines
    needs = {line.split()[0]: line for line in shown[1:] if "needs" in line}
    if not found.torch:
        assert "torch for /venv/bin/python (pip install torch)" in needs["train.yaml"]
    if found.torch and not found.torchrun:
        assert needs["ddp.yaml"].split(": needs ")[1].startswith("torchrun on the PATH")
    if not found.openai_check:
        assert "pip install -e plugins/hafo-check-openai" in needs["openai-service.yaml"]
    if nodes < 3:
        assert f"3 nodes (this cluster has {nodes})" in needs["service.yaml"]


def test_the_banner_lists_the_examples() -> None:
    found = Found("/venv/bin/python", torch=False, torchrun=False, openai_check=False)
    text = "\n".join(banner(dev_status(), 1.0, temporary=True, found=found))
    assert "examples/ (each file's header says what it needs):" in text
    assert "\n".join(example_lines(found, len(dev_status().nodes))) in text


@pytest.mark.parametrize("name", ["counter.yaml", "train.yaml", "ddp.yaml", "service.yaml",
                                  "openai-service.yaml"])
def test_every_example_spec_says_what_it_needs(name: str) -> None:
    header = (Path(__file__).resolve().parents[2] / "examples" / name).read_text()
    assert "\n# Needs: " in header.split("\nname:")[0]


def test_a_gang_says_how_each_member_restored() -> None:
    members = (Member(rank=0, node="a", gpus=()), Member(rank=1, node="b", gpus=()))
    gang = Assignment(workload="g", phase="placed", node="a", epoch=10, members=members)
    own = dataclasses.replace(status("g", "a", 10), restored=Restore(0, "own", 41, 0.04))
    peer = dataclasses.replace(status("g", "b", 10), restored=Restore(1, "peer", 41, 0.213))
    snap = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("g", 0)],
                         assignments=[gang], statuses=[own, peer])
    view = workload_view(snap, "g", NOW)
    assert [m["restored"] for m in view["members"]] == [
        {"rank": 0, "tier": "own", "step": 41, "seconds": 0.04},
        {"rank": 1, "tier": "peer", "step": 41, "seconds": 0.213}]
    assert "step 41 from peer RAM, 0.21s" in render_workload(view)  # hafo workloads g
    text = render_show(show_view(snap, "g", None, (), NOW))  # hafo show g
    assert "restored:   rank 0 on a: step 41 from own RAM, 0.04s" in text
    assert "restored:   rank 1 on b: step 41 from peer RAM, 0.21s" in text
    # an older epoch's report is not this epoch's
    stale = make_snapshot([make_node("a"), make_node("b")], workloads=[submit("g", 0)],
                          assignments=[dataclasses.replace(gang, epoch=11)],
                          statuses=[own, peer])
    assert [m["restored"] for m in workload_view(stale, "g", NOW)["members"]] == [None, None]
    assert "RESTORED" not in render_workload(workload_view(stale, "g", NOW))
