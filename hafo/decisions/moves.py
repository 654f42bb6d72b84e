"""Planned moves (``hafo migrate``, ``hafo drain``): checkpoint, stop, then place. Pure.

1. A move request for a placed workload becomes phase ``moving``: the assignment keeps its
   node and GPUs and names the instance to stop (``stopping``). The node's agent asks the
   workload to checkpoint (SIGUSR1), waits for the commit (bounded by ``stop_grace``) and stops
   it. A request that cannot be honoured (not running, or the target cannot take it) is
   refused with the reason.
2. Once that instance has exited (its report is gone or says exited, or its node is down),
   the workload is placed anew: on the requested node, else anywhere but the old one (a soft
   cool-down), with a new epoch, and resumes from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hafo.decisions.failures import AfterFailure
from hafo.decisions.gangs import gang_move_refusal, start_gang_move
from hafo.decisions.placement import (
    PlacementRequest,
    Unplaceable,
    node_capacity,
    place_one,
)
from hafo.decisions.plan import Action, Cause, Need, Settled, SettledReason, move_cause
from hafo.model.cluster import (
    PLANNED_CAUSES,
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceStatus,
    MoveRequest,
)
from hafo.model.resume import resume_note
from hafo.model.views import latest_checkpoint


def _refuse(wid: str, why: str) -> Action:
    return Action(kind="refuse-move", workload=wid, cause=Cause.MOVE_REFUSED,
                  why=f"move refused: {why}", expected_revision=0, assignment=None,
                  clear_move=True)


def move_refusal(snapshot: ClusterSnapshot, wid: str, to: str | None, now: float,
                 node: str | None = None) -> str:
    """Why a planned move of ``wid`` (to ``to``; for a gang, of its member on ``node``) would
    be refused now, "" if it would start. ``start_move`` applies these rules to a request;
    the API answers 409 with this reason before it writes one."""
    submission = snapshot.workloads.get(wid)
    if submission is not None and submission.spec.is_service and submission.service is None:
        return ("it is a service: move one of its replicas (--from NODE, or the replica's "
                "id), or drain that node")
    if submission is not None and submission.service is not None and to is not None:
        return "a replica's replacement goes where hafo places it (--to is not for replicas)"
    current = snapshot.assignments.get(wid)
    if current is None or current.phase != "placed" or current.node is None:
        return "the workload is not running"
    if current.is_gang:
        if node is not None and snapshot.node_state(node) == "down":
            return f"its member's node {node} is down (the gang fails over instead)"
        return gang_move_refusal(snapshot, current, MoveRequest(wid, to, node=node), now)
    if node is not None and node != current.node:
        return f"it does not run on {node}"
    if snapshot.node_state(current.node) == "down":
        return f"its node {current.node} is down (it fails over instead)"
    if to is None:
        return ""
    if to == current.node:
        return f"it already runs on {to}"
    if to not in snapshot.nodes:
        return f"{to} cannot take it (no such node)"
    state = snapshot.node_state(to)
    if state != "ready":
        return f"{to} cannot take it (it is {state})"
    submission = snapshot.workloads[wid]
    fit = place_one(PlacementRequest(wid, submission.spec, submission.submitted_at, only=to),
                    node_capacity(snapshot, to, [wid]), now)
    if isinstance(fit, Unplaceable):
        return f"{to} cannot take it ({fit.reason})"
    return ""


@dataclass(frozen=True)
class MoveRefusal:
    """Why a requested planned move is not made: ``not_found`` (a name that does not exist:
    exit 4 on the CLI, 404 on the API) or else refused (exit 5, 409); ``reason`` is the same
    text on both."""

    reason: str
    not_found: bool = False


def requested_move_refusal(snapshot: ClusterSnapshot, wid: str, to: str | None,
                           node: str | None, now: float) -> MoveRefusal | None:
    """The one rule ``hafo migrate`` and ``POST /v1/workloads/{id}/migrate`` apply before
    they write a move request (None: it would start): an unknown workload or node is not
    found; anything ``move_refusal`` says (already on ``to``, ``to`` not ready or too small,
    not running, a gang member not named, a service's replica with ``to``) is refused."""
    if wid not in snapshot.workloads:
        return MoveRefusal(f"no workload {wid!r}", not_found=True)
    for name in (to, node):
        if name is not None and name not in snapshot.nodes:
            return MoveRefusal(f"no node {name!r}", not_found=True)
    why = move_refusal(snapshot, wid, to, now, node)
    return MoveRefusal(why) if why else None


def start_move(snapshot: ClusterSnapshot, wid: str, move: MoveRequest, now: float) -> Action:
    """Step 1 for a workload with a pending move request."""
    current = snapshot.assignments.get(wid)
    if move.restart and current is not None and current.is_gang and current.phase == "placed":
        return start_gang_move(current, move)  # a changed spec: the whole gang, in place
    refused = move_refusal(snapshot, wid, move.to, now, move.node)
    if refused:
        return _refuse(wid, refused)
    current = snapshot.assignments[wid]
    assert current.node is not None
    if current.is_gang:
        return start_gang_move(current, move)
    moving = Assignment(workload=wid, phase="moving", node=current.node, gpus=current.gpus,
                        restarts=current.restarts, restart_times=current.restart_times,
                        reason=move.reason or "planned move", avoid=current.avoid,
                        stopping=current.epoch, move_to=move.to, cause="planned")
    target = move.to or "another node"
    return Action(kind="move", workload=wid, cause=Cause.PLANNED,
                  why=f"{move.reason or 'planned move'}: checkpoint and stop on "
                  f"{current.node}, then run on {target}", expected_revision=current.revision,
                  assignment=moving, clear_move=True)


def stop_then_place(current: Assignment, why: str, cause: Cause, *, urgent: bool,
                    after: AfterFailure | None = None,
                    preempted_for: str | None = None) -> Action:
    """Stop the running instance first, then place the workload again (see ``moved_off``):
    for a GPU or node going bad or to make room for ``preempted_for`` (``after`` None: a
    move, checkpoint first unless ``urgent``) or for a failing application (``after``:
    restart in place or move, per the policy)."""
    assert current.node is not None
    moving = Assignment(
        workload=current.workload, phase="moving", node=current.node, gpus=current.gpus,
        restarts=after.restarts if after else current.restarts,
        restart_times=after.restart_times if after else current.restart_times,
        reason=after.why if after else why, avoid=current.avoid, stopping=current.epoch,
        urgent=urgent, after_stop=after.kind if after else "move",
        not_before=after.not_before if after else 0.0,
        failed_on=after.failed_on if after else current.failed_on,
        preempted_for=preempted_for, cause=move_cause(cause),
        failure=after.subject if after else "", suspects=current.suspects)
    how = "stop now" if urgent else "checkpoint and stop"
    return Action(kind="move", workload=current.workload, cause=cause,
                  why=f"{after.why if after else why}: {how} on {current.node}",
                  expected_revision=current.revision, assignment=moving)


def moved_off(snapshot: ClusterSnapshot, current: Assignment, now: float, cooldown: float,
              checkpoints: Mapping[str, CheckpointInfo] | None = None) -> Need | Settled:
    """Step 2 for a workload in phase ``moving``: place it once its instance has stopped
    (and, after a failure, its backoff has passed; ``Settled``: not yet, and why)."""
    node = current.node
    assert node is not None
    status = snapshot.statuses.get((current.workload, node))
    stopped = (snapshot.node_state(node) == "down" or status is None
               or status.epoch != current.stopping or status.state == "exited")
    if not stopped:
        return Settled(SettledReason.STOPPING, f"instance {current.stopping} on {node}")
    if now < current.not_before:
        return Settled(SettledReason.BACKING_OFF)
    submission = snapshot.workloads[current.workload]
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    if current.after_stop == "restart":
        request = PlacementRequest(current.workload, submission.spec, submission.submitted_at,
                                   avoid, prefer=node, exclude=current.failed_on)
        return Need(request=request, previous=current, restarts=current.restarts,
                    restart_times=current.restart_times, cause=Cause.RESTARTED,
                    why=f"{current.reason}{_resumes(snapshot, current, checkpoints)}",
                    failure=current.failure)
    kept = dict(avoid)  # what the new assignment remembers
    if current.move_to is None:
        avoid[node] = now + cooldown  # this placement goes elsewhere if it can
        if current.cause not in PLANNED_CAUSES:
            kept[node] = avoid[node]  # a node that went bad stays avoided for a while
    request = PlacementRequest(current.workload, submission.spec, submission.submitted_at,
                               avoid, prefer=current.move_to, only=current.move_to,
                               exclude=current.failed_on)
    return Need(request=request, previous=current, restarts=current.restarts,
                restart_times=current.restart_times, cause=Cause.MOVED,
                why=f"move off {node}: {current.reason} (instance {current.stopping} stopped"
                f"{_resumes(snapshot, current, checkpoints)})", avoid=kept,
                failure=current.failure)


def latest_checkpoints(snapshot: ClusterSnapshot) -> dict[str, CheckpointInfo]:
    """``hafo.model.views.latest_checkpoint`` of every workload at once (one pass over the
    reports and the assignments instead of one per workload)."""
    best: dict[str, CheckpointInfo] = dict(snapshot.checkpoints)
    found: list[tuple[str, CheckpointInfo | None]] = [
        (wid, a.checkpoint) for wid, a in snapshot.assignments.items()
        if a.checkpoint is not None]
    found += [(wid, status.checkpoint) for (wid, _node), status in snapshot.statuses.items()]
    for wid, ck in found:
        if ck is None:
            continue
        known = best.get(wid)
        if known is None or (ck.epoch, ck.step) > (known.epoch, known.step):
            best[wid] = ck
    return best


def resume_point(known: CheckpointInfo | None, ended: InstanceStatus | None) -> str:
    """Where the next instance resumes (``hafo.model.resume``): exactly when ``ended``, the
    exited report of the instance it replaces, names the newest ``known`` checkpoint (its agent
    read the checkpoints after that instance ended) or when ``ended`` and nothing else names
    one; else as far as reported."""
    if ended is not None and ended.state == "exited":
        mine = ended.checkpoint
        if mine is None and known is None:
            return resume_note(None, exact=True)
        if mine is not None and (known is None
                                 or (mine.epoch, mine.step) >= (known.epoch, known.step)):
            return resume_note(mine, exact=True)
    return resume_note(known)


def _resumes(snapshot: ClusterSnapshot, current: Assignment,
             checkpoints: Mapping[str, CheckpointInfo] | None) -> str:
    """The "resumes from" part of a stopped instance's reason ("" while no checkpoint is
    known: a workload that does not checkpoint, a service's replica)."""
    wid = current.workload
    checkpoint = (checkpoints.get(wid) if checkpoints is not None
                  else latest_checkpoint(snapshot, wid))
    if checkpoint is None:
        return ""
    status = snapshot.statuses.get((wid, current.node)) if current.node is not None else None
    ended = status if status is not None and status.epoch == current.stopping else None
    return f"; {resume_point(checkpoint, ended)}"
