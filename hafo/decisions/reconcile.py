"""The controller's one decision per cycle: snapshot + now -> Plan. Pure and deterministic.

For every workload it decides one of: place (new instance, new epoch), keep pending (with the
reason), finish (completed / failed), forget (deleted by the user), start a planned move
(checkpoint and stop the instance, see ``hafo.decisions.moves``) or refuse one, move work off
an unhealthy node or GPU, or act on a failed application (``hafo.decisions.failures``:
restart in place with backoff, then move). Each action
carries the revision of the assignment it was decided from, so applying it is a
compare-and-swap, and a one-line ``why`` for the log.
"""

from __future__ import annotations

from hafo.decisions.failures import after_failure
from hafo.decisions.moves import moved_off, start_move, stop_then_place
from hafo.decisions.placement import (
    Placed,
    PlacementRequest,
    capacity_from,
    place_batch,
)
from hafo.decisions.plan import FAILED_NODE_COOLDOWN, Action, Need, Plan
from hafo.model.cluster import Assignment, ClusterSnapshot
from hafo.model.views import latest_checkpoint

__all__ = ["FAILED_NODE_COOLDOWN", "Action", "Plan", "reconcile"]


def _resume(snapshot: ClusterSnapshot, wid: str) -> str:
    """Where the next instance resumes: the work since that checkpoint is redone."""
    checkpoint = latest_checkpoint(snapshot, wid)
    if checkpoint is None:
        return "resumes from its latest checkpoint, if any"
    return f"resumes from its latest checkpoint (last reported: step {checkpoint.step})"


def _revision(assignment: Assignment | None) -> int:
    return assignment.epoch if assignment is not None else 0


def _assess(snapshot: ClusterSnapshot, wid: str, now: float, cooldown: float,
            allow_failover: bool) -> Action | Need | None:
    """Decide for one workload, except the placement itself."""
    submission = snapshot.workloads[wid]
    spec = submission.spec
    current = snapshot.assignments.get(wid)
    move = snapshot.moves.get(wid)
    if move is not None:
        return start_move(snapshot, wid, move, now)
    if current is not None and current.phase == "moving":
        return moved_off(snapshot, current, now, cooldown)
    if current is None or current.phase == "pending":
        avoid = dict(current.avoid) if current else {}
        return Need(PlacementRequest(wid, spec, submission.submitted_at, avoid), current,
                     current.restarts if current else 0,
                     current.restart_times if current else (), "placed", "new workload")
    if current.phase in ("completed", "failed") or current.node is None:
        return None
    node = current.node
    node_state = snapshot.node_state(node)
    if node_state == "down":
        if not allow_failover:
            return None  # failsafe: an agent may still run it on our word; decide later
        avoid = {n: t for n, t in current.avoid.items() if t > now}
        avoid[node] = now + cooldown
        return Need(PlacementRequest(wid, spec, submission.submitted_at, avoid,
                                     exclude=current.failed_on), current,
                    current.restarts, current.restart_times, "failover",
                    f"node {node} is down; {_resume(snapshot, wid)}")
    hardware = _hardware_move(snapshot, current)
    if hardware is not None:
        return hardware
    status = snapshot.current_status(wid)
    if status is None:
        return None
    if status.state != "exited":
        if not status.failing or status.state == "stopping":
            return None
        after = after_failure(current, spec.restart, node, f"failing ({status.failing})",
                              now, now)
        return stop_then_place(current, after.why, "app-failed", urgent=True, after=after)
    if status.exit_code == 0:
        done = Assignment(workload=wid, phase="completed", node=None, restarts=current.restarts,
                          restart_times=current.restart_times, reason="exited with code 0")
        return Action("finish", wid, f"exited 0 on {node}", _revision(current), done, "completed")
    after = after_failure(current, spec.restart, node, f"exited with code {status.exit_code}",
                          status.finished_at or now, now)
    if now < after.not_before:
        return None  # backing off; a later cycle restarts it
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    request = PlacementRequest(wid, spec, submission.submitted_at, avoid,
                               prefer=node if after.kind == "restart" else None,
                               exclude=after.failed_on)
    return Need(request, current, after.restarts, after.restart_times, "restarted",
                f"{after.why}; {_resume(snapshot, wid)}")


def _hardware_move(snapshot: ClusterSnapshot, current: Assignment) -> Action | None:
    """A move off an unhealthy node or off a GPU that is unhealthy or degrading: stop first
    (with a checkpoint unless the GPU is lost), then place elsewhere."""
    assert current.node is not None
    record = snapshot.nodes.get(current.node)
    gpus = {g.index: g for g in record.gpus} if record else {}
    used = [gpus[i] for i in current.gpus if i in gpus]
    lost = any(g.lost for g in used)
    if snapshot.node_state(current.node) == "unhealthy":
        reason = record.reason if record and record.reason else "no reason given"
        return stop_then_place(current, f"node {current.node} is unhealthy ({reason})",
                               "node-unhealthy", urgent=lost)
    bad = [g for g in used if not g.usable]
    if not bad:
        return None
    gpu = bad[0]
    level = "degrading" if gpu.healthy else "unhealthy"
    return stop_then_place(current, f"GPU {gpu.index} on {current.node} is {level} "
                           f"({gpu.reason or 'no reason given'})",
                           "gpu-degraded" if gpu.healthy else "gpu-unhealthy", urgent=lost)


def reconcile(snapshot: ClusterSnapshot, now: float,
              cooldown: float = FAILED_NODE_COOLDOWN, allow_failover: bool = True) -> Plan:
    """Compute the plan for one reconcile cycle. ``now`` is wall-clock seconds.

    With ``allow_failover`` False (a controller that told an agent "etcd is unavailable to me"
    within TTL + margin: failsafe mode), work on down or unhealthy nodes is left where it is.
    """
    actions: list[Action] = []
    for wid, assignment in sorted(snapshot.assignments.items()):
        if wid not in snapshot.workloads:
            actions.append(Action("forget", wid, "workload deleted", assignment.epoch, None,
                                  "deleted"))
    for wid in sorted(snapshot.moves):
        if wid not in snapshot.workloads:
            actions.append(Action("refuse-move", wid, "no such workload", 0, None,
                                  "move-refused", clear_move=True))
    needs: list[Need] = []
    for wid in sorted(snapshot.workloads):
        outcome = _assess(snapshot, wid, now, cooldown, allow_failover)
        if isinstance(outcome, Action):
            actions.append(outcome)
        elif isinstance(outcome, Need):
            needs.append(outcome)
    releasing = [n.request.workload for n in needs]
    capacity = capacity_from(snapshot, releasing)
    results = place_batch([n.request for n in needs], capacity, now)
    for need in needs:
        wid = need.request.workload
        result = results[wid]
        avoid = dict(need.request.avoid)
        failed_on = dict(need.request.exclude)
        if isinstance(result, Placed):
            new = Assignment(workload=wid, phase="placed", node=result.node, gpus=result.gpus,
                             restarts=need.restarts, restart_times=need.restart_times,
                             reason=need.why, avoid=avoid, failed_on=failed_on)
            actions.append(Action("place", wid, f"{need.why} -> {result.node}",
                                  _revision(need.previous), new, need.event))
            continue
        previous = need.previous
        if result.exhausted:
            reason = f"{need.why}; it failed on every node that can run it"
            failed = Assignment(workload=wid, phase="failed", node=None,
                                restarts=need.restarts, restart_times=need.restart_times,
                                reason=reason, failed_on=failed_on)
            actions.append(Action("finish", wid, reason, _revision(previous), failed,
                                  "failed"))
            continue
        unchanged = previous is not None and previous.phase == "pending" \
            and previous.reason == result.reason
        if unchanged:
            continue  # already pending for the same reason: nothing to write
        pending = Assignment(workload=wid, phase="pending", node=None, restarts=need.restarts,
                             restart_times=need.restart_times, reason=result.reason,
                             avoid=avoid, failed_on=failed_on)
        actions.append(Action("pending", wid, f"{need.why}; {result.reason}",
                              _revision(previous), pending, "pending"))
    return Plan(tuple(actions))
