"""What ``hafo submit|drain|migrate --wait`` waits for, judged from one snapshot. Pure.

A goal says what was asked: a submit of workload W (``SubmitGoal``), a drain of node N with
the workloads asked to move off it (``DrainGoal``), a planned move of W from its instance of
epoch E on node X (``MigrateGoal``; for a gang, X is the node of the member that moves; for a
replica of a service, its replacement is what is waited for). ``wait_outcome`` says, for one
snapshot, whether the goal is still ``waiting`` (with what is going on, for people),
``done`` or ``failed``:

- submit: done when the workload runs (``running``, every gang member running), or has
  completed; a service when every replica is ready on its spec. Failed: phase ``failed``
  (it failed on every node that can run it), deleted, or a service's rollout stopped.
  An updated workload (``after``) waits for an instance newer than ``after``.
- drain: done when no assignment holds the node and no instance runs there, and none of the
  moved workloads is still stopping or starting elsewhere (a workload that nothing can take
  is reported ``pending``: the node is empty all the same). Failed: a move was refused (the
  request is gone, the workload still runs on the node at the same epoch).
- migrate: done when the workload runs at a newer epoch on another node (for a gang, with no
  member left on X; for a replica, when its replacement is ready). Failed: refused, deleted,
  failed, or placed back on X.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hafo.model.cluster import Assignment, ClusterSnapshot, Event, Submission
from hafo.model.endpoints import instance_ready
from hafo.model.service_state import service_state, stalled_replacements
from hafo.model.views import workload_state

__all__ = ["SETTLE", "DrainGoal", "Held", "MigrateGoal", "SubmitGoal", "WaitGoal", "WaitOutcome",
           "WaitState", "drain_goal", "migrate_goal", "settled", "submit_goal", "wait_outcome"]

WaitState = Literal["waiting", "done", "failed"]
#: Seconds a running (or ready) outcome must hold, as the waiter sees it, before a wait ends
#: with it: an instance that exits at once is reported running for a moment, and is not a
#: success. Its node reports an exit within a fraction of a second.
SETTLE = 1.0
#: What ``settled`` remembers: the outcome being held (its message), and since when.
Held = tuple[str, float]


@dataclass(frozen=True)
class WaitOutcome:
    """One judgement: ``state``, and ``message`` for people (what is going on, or how it
    ended: e.g. "pending: no node has 8 free GPUs", "running on node-b (epoch 1234)").
    ``node``/``epoch``: where the workload runs once done (None for a drain); ``steps``:
    (finished, all) for a goal of several parts (a drain's workloads, a service's replicas);
    ``settle``: done only once it has stayed so ``SETTLE`` seconds (``settled``)."""

    state: WaitState
    message: str
    node: str | None = None
    epoch: int | None = None
    steps: tuple[int, int] | None = None
    settle: bool = False

    @property
    def final(self) -> bool:
        """Done or failed: nothing more to wait for."""
        return self.state != "waiting"


@dataclass(frozen=True)
class SubmitGoal:
    """A submitted workload should run. ``after``: an updated workload's instance that runs
    the old spec (its next, newer epoch runs the new one); 0 for none."""

    workload: str
    after: int = 0


@dataclass(frozen=True)
class DrainGoal:
    """Node ``node`` should hold no work. ``moved``: the workloads asked to move off it, each
    with the epoch of its instance there when asked (0: unknown)."""

    node: str
    moved: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MigrateGoal:
    """Workload ``workload`` (its instance of ``epoch``, on ``node``: for a gang the node of
    the member that moves) should run elsewhere (on ``to`` when given)."""

    workload: str
    node: str
    epoch: int
    to: str | None = None


WaitGoal = SubmitGoal | DrainGoal | MigrateGoal


def _waiting(message: str, steps: tuple[int, int] | None = None) -> WaitOutcome:
    return WaitOutcome("waiting", message, steps=steps)


def _failed(message: str) -> WaitOutcome:
    return WaitOutcome("failed", message)


# -- goals from what the command saw -------------------------------------------------------


def submit_goal(snapshot: ClusterSnapshot, workload: str, change: str) -> SubmitGoal:
    """The goal of a submit that ``change``d (``created``/``updated``/``unchanged``) the
    workload, from a snapshot read after the submit: an update of a running workload waits
    for its next instance (the planned move that restarts it with the new spec)."""
    assignment = snapshot.assignments.get(workload)
    after = 0
    if change == "updated" and assignment is not None:
        move = snapshot.moves.get(workload)
        if assignment.phase == "placed" and move is not None and move.restart:
            after = assignment.epoch
        elif assignment.phase == "moving":
            after = assignment.stopping
    return SubmitGoal(workload, after)


def drain_goal(before: ClusterSnapshot, node: str, moved: Sequence[str]) -> DrainGoal:
    """The goal of a drain of ``node`` that asked ``moved`` to move, with their epochs on the
    node as read ``before`` the drain."""
    epochs: dict[str, int] = {}
    for wid in moved:
        assignment = before.assignments.get(wid)
        placed = assignment is not None and assignment.phase == "placed" \
            and node in assignment.nodes
        epochs[wid] = assignment.epoch if placed and assignment is not None else 0
    return DrainGoal(node, epochs)


def migrate_goal(snapshot: ClusterSnapshot, workload: str, member: str | None,
                 to: str | None) -> MigrateGoal | None:
    """The goal of a planned move of ``workload`` (its gang member on ``member``), from the
    snapshot the move was checked against; None if it is not placed (the move is refused)."""
    assignment = snapshot.assignments.get(workload)
    if assignment is None or assignment.phase != "placed" or assignment.node is None:
        return None
    return MigrateGoal(workload, member or assignment.node, assignment.epoch, to)


# -- describing a workload -----------------------------------------------------------------


def _where(assignment: Assignment) -> str:
    return ", ".join(assignment.nodes) or str(assignment.node)


def _stopping(assignment: Assignment) -> str:
    how = "now" if assignment.urgent else "checkpoint first"
    why = f": {assignment.reason}" if assignment.reason else ""
    return f"stopping on {_where(assignment)} ({how}){why}"


def _exit_code(snapshot: ClusterSnapshot, wid: str) -> str:
    status = snapshot.current_status(wid)
    return f", code {status.exit_code}" if status is not None and status.exit_code else ""


def _instance(snapshot: ClusterSnapshot, wid: str, after: int = 0) -> WaitOutcome:
    """How a single (not service) workload is doing: done once it runs or completed."""
    assignment = snapshot.assignments.get(wid)
    if assignment is None:
        return _waiting("waiting for the controller to place it")
    if assignment.phase == "failed":
        return _failed(assignment.reason or "failed")
    if assignment.phase == "completed":
        return WaitOutcome("done", "completed" + (f" ({assignment.reason})"
                                                  if assignment.reason else ""))
    if assignment.phase == "pending":
        return _waiting(f"pending: {assignment.reason or 'waiting to be placed'}")
    if assignment.phase == "moving":
        return _waiting(_stopping(assignment))
    where, epoch = _where(assignment), assignment.epoch
    if epoch <= after:
        return _waiting(f"running the previous spec on {where} (epoch {epoch}); waiting for "
                        "the controller to restart it")
    state = workload_state(snapshot, wid)
    if state == "running":
        return WaitOutcome("done", f"running on {where} (epoch {epoch})", assignment.node,
                           epoch, settle=True)
    if state == "completed":
        return WaitOutcome("done", f"completed on {where} (epoch {epoch}, exit code 0)",
                           assignment.node, epoch)
    if state == "failed":
        return _waiting(f"exited on {where} (epoch {epoch}{_exit_code(snapshot, wid)}); "
                        "its restart policy decides what next")
    return _waiting(f"{state} on {where} (epoch {epoch})")


def _service(snapshot: ClusterSnapshot, sid: str, now: float) -> WaitOutcome:
    """A service: done once every replica is ready on its spec."""
    state = service_state(snapshot, sid, now)
    steps = (state.current, state.desired)
    if stalled_replacements(snapshot, sid, now):
        return _failed(state.reason)
    if state.state == "running":
        nodes = sorted({a.node for rid in snapshot.replicas.get(sid, ())
                        if (a := snapshot.assignments.get(rid)) is not None
                        and a.node is not None and instance_ready(snapshot, rid)})
        return WaitOutcome("done", f"{state.ready} of {state.desired} replica(s) ready"
                           + (f" on {', '.join(nodes)}" if nodes else ""), steps=steps,
                           settle=True)
    return _waiting(f"{state.state}: {state.reason}", steps)


def _summary(snapshot: ClusterSnapshot, wid: str) -> str:
    """Where a workload is now, in a few words (for a drain's lines)."""
    if wid not in snapshot.workloads:
        replacement = _replacement(snapshot, wid)
        if replacement is None:
            return f"{wid} deleted"
        return f"{wid} replaced by {replacement.id} ({_summary(snapshot, replacement.id)})"
    assignment = snapshot.assignments.get(wid)
    if assignment is None:
        return f"{wid} waiting for the controller"
    if assignment.phase == "pending":
        return f"{wid} pending ({assignment.reason or 'waiting to be placed'})"
    if assignment.phase == "moving":
        return f"{wid} {_stopping(assignment)}"
    if assignment.phase in ("completed", "failed"):
        return f"{wid} {assignment.phase}"
    return f"{wid} {workload_state(snapshot, wid)} on {_where(assignment)}"


def _replacement(snapshot: ClusterSnapshot, wid: str) -> Submission | None:
    """The replica that replaces replica ``wid`` (a drain's or a move's), newest first."""
    found = [s for s in snapshot.workloads.values() if s.replaces == wid]
    return max(found, key=lambda s: (s.submitted_at, s.id)) if found else None


def _refusal(events: Sequence[Event], wid: str) -> str:
    """The controller's reason for refusing a move of ``wid``, from the newest such event."""
    for event in reversed(events):
        if event.kind == "move-refused" and event.workload == wid:
            return event.message
    return "move refused by the controller (see `hafo events`)"


def _refused(snapshot: ClusterSnapshot, wid: str, epoch: int, node: str) -> bool:
    """The move request of ``wid`` (of its instance of ``epoch`` on ``node``) is gone and the
    instance still runs there: the controller refused it. A replica's request stays until
    the replica is replaced."""
    submission = snapshot.workloads.get(wid)
    assignment = snapshot.assignments.get(wid)
    return (epoch > 0 and submission is not None and submission.service is None
            and wid not in snapshot.moves and assignment is not None
            and assignment.phase == "placed" and assignment.epoch == epoch
            and node in assignment.nodes)


# -- the goals -----------------------------------------------------------------------------


def _submit(goal: SubmitGoal, snapshot: ClusterSnapshot, now: float) -> WaitOutcome:
    submission = snapshot.workloads.get(goal.workload)
    if submission is None:
        return _failed("deleted")
    if submission.spec.is_service and submission.service is None:
        return _service(snapshot, goal.workload, now)
    return _instance(snapshot, goal.workload, goal.after)


def _drain(goal: DrainGoal, snapshot: ClusterSnapshot,
           events: Sequence[Event]) -> WaitOutcome:
    node = goal.node
    if node not in snapshot.nodes:
        return _failed(f"node {node} is gone")
    refused = [wid for wid, epoch in sorted(goal.moved.items())
               if _refused(snapshot, wid, epoch, node)]
    if refused:
        return _failed(f"{refused[0]} stays on {node}: {_refusal(events, refused[0])}"
                       + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""))
    live = {wid for (wid, on), status in snapshot.statuses.items()
            if on == node and status.state != "exited"}
    remaining = sorted(set(snapshot.holders.get(node, ())) | live)
    total = len(set(goal.moved) | set(remaining))
    steps = (total - len(remaining), total)
    if remaining:
        shown = "; ".join(_summary(snapshot, wid) for wid in remaining[:3])
        more = f"; {len(remaining) - 3} more" if len(remaining) > 3 else ""
        return _waiting(f"{steps[0]} of {total} moved off {node}; {shown}{more}", steps)
    unsettled = [wid for wid in sorted(goal.moved) if _unsettled(snapshot, wid)]
    if unsettled:
        return _waiting(f"{node} is empty; " + "; ".join(_summary(snapshot, wid)
                                                         for wid in unsettled), steps)
    moved = "; ".join(_summary(snapshot, wid) for wid in sorted(goal.moved))
    return WaitOutcome("done", f"{node} is empty" + (f": {moved}" if moved else
                                                      " (nothing was placed on it)"),
                       steps=steps)


def _unsettled(snapshot: ClusterSnapshot, wid: str) -> bool:
    """A moved workload still on its way: stopping, or starting on its new node."""
    assignment = snapshot.assignments.get(wid)
    if assignment is None:
        replacement = _replacement(snapshot, wid) if wid not in snapshot.workloads else None
        return replacement is not None and not instance_ready(snapshot, replacement.id)
    if assignment.phase == "moving":
        return True
    return assignment.phase == "placed" and workload_state(snapshot, wid) == "starting"


def _replica(goal: MigrateGoal, snapshot: ClusterSnapshot,
             events: Sequence[Event]) -> WaitOutcome:
    wid = goal.workload
    replacement = _replacement(snapshot, wid)
    if replacement is None:
        if wid not in snapshot.workloads:
            return _failed("deleted")
        if wid in snapshot.moves:
            return _waiting("waiting for the controller to start a replacement")
        return _failed(_refusal(events, wid))
    rid = replacement.id
    if instance_ready(snapshot, rid):
        assignment = snapshot.assignments[rid]
        return WaitOutcome("done", f"replaced by {rid}, ready on {assignment.node} (epoch "
                           f"{assignment.epoch})", assignment.node, assignment.epoch,
                           settle=True)
    if replacement.retiring is not None:
        return _failed(f"its replacement {rid} was withdrawn (a newer spec supersedes it)")
    return _waiting(f"replacement {rid}: {_instance(snapshot, rid).message}")


def _migrate(goal: MigrateGoal, snapshot: ClusterSnapshot,
             events: Sequence[Event]) -> WaitOutcome:
    wid = goal.workload
    submission = snapshot.workloads.get(wid)
    if (submission is not None and submission.service is not None) or (
            submission is None and _replacement(snapshot, wid) is not None):
        return _replica(goal, snapshot, events)
    if submission is None:
        return _failed("deleted")
    assignment = snapshot.assignments.get(wid)
    if assignment is None:
        return _waiting("waiting for the controller")
    if assignment.phase == "placed" and assignment.epoch <= goal.epoch:
        if wid in snapshot.moves:
            return _waiting("move requested; waiting for the controller")
        return _failed(_refusal(events, wid))
    if assignment.phase != "placed":
        return _instance(snapshot, wid)
    if assignment.is_gang:
        if assignment.member_on(goal.node) is not None:
            return _failed(f"a member runs on {goal.node} again (epoch {assignment.epoch}): "
                           "no other node could take it")
    elif assignment.node == goal.node:
        return _failed(f"it runs on {goal.node} again (epoch {assignment.epoch}): no other "
                       "node could take it")
    elif goal.to is not None and assignment.node != goal.to:
        return _failed(f"placed on {assignment.node}, not on {goal.to} (epoch "
                       f"{assignment.epoch})")
    return _instance(snapshot, wid)


def settled(outcome: WaitOutcome, held: Held | None, now: float,
            seconds: float = SETTLE) -> tuple[WaitOutcome, Held | None]:
    """``outcome`` as the wait should take it at monotonic time ``now``, and what to remember
    for the next look: a done outcome that must ``settle`` is still waiting until the same
    outcome (same message: node, epoch) has held ``seconds``."""
    if outcome.state != "done" or not outcome.settle:
        return outcome, None
    if held is None or held[0] != outcome.message:
        held = (outcome.message, now)
    if now - held[1] >= seconds:
        return outcome, held
    return WaitOutcome("waiting", f"{outcome.message}; checking that it stays up",
                       steps=outcome.steps), held


def wait_outcome(goal: WaitGoal, snapshot: ClusterSnapshot, now: float,
                 events: Sequence[Event] = ()) -> WaitOutcome:
    """Where ``goal`` stands in ``snapshot`` at wall-clock time ``now``. ``events``: recent
    events, oldest first (a refused move's reason is taken from them)."""
    if isinstance(goal, SubmitGoal):
        return _submit(goal, snapshot, now)
    if isinstance(goal, DrainGoal):
        return _drain(goal, snapshot, events)
    return _migrate(goal, snapshot, events)
