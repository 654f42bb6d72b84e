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

from hafo.decisions.placement import (
    PlacementRequest,
    Unplaceable,
    capacity_from,
    place_one,
)
from hafo.decisions.plan import Action, Need
from hafo.model.cluster import Assignment, ClusterSnapshot, MoveRequest
from hafo.model.views import latest_checkpoint


def _refuse(wid: str, move: MoveRequest, why: str) -> Action:
    return Action("refuse-move", wid, f"move refused: {why}", 0, None, "move-refused",
                  clear_move=True)


def start_move(snapshot: ClusterSnapshot, wid: str, move: MoveRequest, now: float) -> Action:
    """Step 1 for a workload with a pending move request."""
    current = snapshot.assignments.get(wid)
    if current is None or current.phase != "placed" or current.node is None:
        return _refuse(wid, move, "the workload is not running")
    if snapshot.node_state(current.node) == "down":
        return _refuse(wid, move, f"its node {current.node} is down (it fails over instead)")
    if move.to is not None:
        if move.to == current.node:
            return _refuse(wid, move, f"it already runs on {move.to}")
        submission = snapshot.workloads[wid]
        fit = place_one(PlacementRequest(wid, submission.spec, submission.submitted_at,
                                         only=move.to), capacity_from(snapshot, [wid]), now)
        if isinstance(fit, Unplaceable):
            return _refuse(wid, move, f"{move.to} cannot take it ({fit.reason})")
    moving = Assignment(workload=wid, phase="moving", node=current.node, gpus=current.gpus,
                        restarts=current.restarts, restart_times=current.restart_times,
                        reason=move.reason or "planned move", avoid=current.avoid,
                        stopping=current.epoch, move_to=move.to)
    target = move.to or "another node"
    return Action("move", wid, f"{move.reason or 'planned move'}: checkpoint and stop on "
                  f"{current.node}, then run on {target}", current.epoch, moving,
                  "checkpoint-requested", clear_move=True)


def moved_off(snapshot: ClusterSnapshot, current: Assignment, now: float,
              cooldown: float) -> Need | None:
    """Step 2 for a workload in phase ``moving``: place it once its instance has stopped."""
    node = current.node
    assert node is not None
    status = snapshot.statuses.get((current.workload, node))
    stopped = (snapshot.node_state(node) == "down" or status is None
               or status.epoch != current.stopping or status.state == "exited")
    if not stopped:
        return None
    submission = snapshot.workloads[current.workload]
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    if current.move_to is None:
        avoid[node] = now + cooldown
    request = PlacementRequest(current.workload, submission.spec, submission.submitted_at,
                               avoid, prefer=current.move_to, only=current.move_to)
    checkpoint = latest_checkpoint(snapshot, current.workload)
    resume = (f", resumes from the checkpoint it took (last reported: step {checkpoint.step})"
              if checkpoint else "")
    return Need(request, current, current.restarts, current.restart_times, "moved",
                f"planned move off {node} (instance {current.stopping} stopped{resume})")
