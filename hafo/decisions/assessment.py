"""Stage 1 of the reconcile pipeline, **assess**: what one workload needs this cycle. Pure.

Every workload comes to one ``Assessment`` (``hafo.decisions.plan``): an ``Action`` decided
here (finish it, start a planned move, stop it to move or restart it), a ``Need`` (a
placement request, for stages 2 and 3: ``hafo.decisions.admission``, then
``hafo.decisions.placement``), or ``Settled`` (nothing to do, with the reason: out of
rotation, a service, ended, failsafe, running, stopping, backing off, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hafo.decisions.failures import after_failure, uncounted_backoff
from hafo.decisions.gangs import assess_gang, moved_off_gang, resumes_note
from hafo.decisions.hangs import after_hang, find_hang
from hafo.decisions.hardware import hardware_fault
from hafo.decisions.moves import moved_off, resume_point, start_move, stop_then_place
from hafo.decisions.observed import Observations, bounded
from hafo.decisions.placement_rules import PlacementRequest
from hafo.decisions.plan import Action, Assessment, Cause, Need, Settled, SettledReason
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceEnd,
    InstanceStatus,
    Member,
)
from hafo.model.spec import WorkloadSpec

__all__ = ["assess", "revision"]


def _resume(checkpoints: Mapping[str, CheckpointInfo], wid: str,
            ended: InstanceStatus | None = None) -> str:
    """Where the next instance resumes (the work since that checkpoint is redone): exactly
    when ``ended``, the exited report of the instance it replaces, says so, else as far as
    reported (``hafo.decisions.moves.resume_point``)."""
    return resume_point(checkpoints.get(wid), ended)


def revision(assignment: Assignment | None) -> int:
    """The revision an action on ``assignment`` compares (0: there is none yet)."""
    return assignment.revision if assignment is not None else 0


def assess(snapshot: ClusterSnapshot, wid: str, now: float, cooldown: float,
           allow_failover: bool, checkpoints: Mapping[str, CheckpointInfo],
           seen: Observations) -> Assessment:
    """Decide for one workload, except the placement itself (a ``Need`` asks for one)."""
    submission = snapshot.workloads[wid]
    spec = submission.spec
    current = snapshot.assignments.get(wid)
    if current is not None and current.phase not in ("completed", "failed"):
        # times a leader with another clock wrote: bounded (an ended assignment's are read
        # no more, and a cluster keeps thousands of them, assessed every cycle)
        current = bounded(current, seen.assigned_at(wid, current.epoch, now), spec.restart,
                          cooldown)
    move = snapshot.moves.get(wid)
    if submission.retiring is not None:
        # out of rotation, deleted soon (hafo.decisions.services): left as it is
        return Settled(SettledReason.RETIRING)
    if move is not None and submission.service is None:
        return start_move(snapshot, wid, move, now)  # a replica's: its service replaces it
    if spec.is_service and submission.service is None:
        return Settled(SettledReason.SERVICE)  # a service is its replicas (services)
    if current is not None and current.is_gang and current.phase == "moving":
        return moved_off_gang(snapshot, current, now, cooldown, resumes_note(checkpoints, wid))
    if current is not None and current.is_gang and current.phase == "placed":
        return assess_gang(snapshot, current, now, allow_failover, seen)
    if current is not None and current.phase == "moving":
        return moved_off(snapshot, current, now, cooldown, checkpoints)
    if current is None or current.phase == "pending":
        avoid = dict(current.avoid) if current else {}
        exclude = {n: t for n, t in current.failed_on.items() if t > now} if current else {}
        remembered = current.members if current else ()  # a gang waiting to be placed again
        return Need(request=PlacementRequest(wid, spec, submission.submitted_at, avoid,
                                             exclude=exclude, members=remembered,
                                             spares_first=bool(remembered)), previous=current,
                    restarts=current.restarts if current else 0,
                    restart_times=current.restart_times if current else (), cause=Cause.NEW,
                    why="new workload", quick_restarts=current.quick_restarts if current else 0,
                    failure=current.failure if current else "")
    if current.phase in ("completed", "failed") or current.node is None:
        return Settled(SettledReason.ENDED, current.phase)
    node = current.node
    node_state = snapshot.node_state(node)
    if node_state == "down":
        if not allow_failover:
            # failsafe: an agent may still run it on our word; decide later
            return Settled(SettledReason.FAILSAFE, f"node {node} is down")
        avoid = {n: t for n, t in current.avoid.items() if t > now}
        avoid[node] = now + cooldown
        return Need(request=PlacementRequest(wid, spec, submission.submitted_at, avoid,
                                             exclude=current.failed_on), previous=current,
                    restarts=current.restarts, restart_times=current.restart_times,
                    cause=Cause.NODE_DOWN, why=f"node {node} is down; {_resume(checkpoints, wid)}")
    registered = snapshot.alive.get(node)
    if registered is not None and current.epoch <= registered.claimed:
        return _infrastructure_restart(
            snapshot, current, now, checkpoints,
            f"{node} was registered again by an agent with a new lease; instance "
            f"{current.epoch} of the previous registration is gone", seen)
    hardware = _hardware_move(snapshot, current)
    if hardware is not None:
        return hardware
    status = snapshot.current_status(wid)
    if status is None:
        return Settled(SettledReason.NO_REPORT)
    if status.state != "exited":
        if status.state == "stopping":
            return Settled(SettledReason.STOPPING)
        if not status.failing:
            return _hung(current, status, spec, seen, now) or Settled(SettledReason.RUNNING)
        after = after_failure(current, spec.restart, node, f"failing ({status.failing})",
                              now, now)
        cause = Cause.FAILING if after.kind == "restart" else Cause.APP_FAILED
        return stop_then_place(current, after.why, cause, urgent=True, after=after)
    if status.exit_code == 0:
        done = Assignment(workload=wid, phase="completed", node=None, restarts=current.restarts,
                          restart_times=current.restart_times, reason="exited with code 0")
        return Action(kind="finish", workload=wid, cause=Cause.COMPLETED,
                      why=f"exited 0 on {node}", expected_revision=revision(current),
                      assignment=done)
    if status.ended_by_infrastructure:
        how = "fenced" if status.ended is InstanceEnd.FENCED else "lost with its guard"
        return _infrastructure_restart(snapshot, current, now, checkpoints,
                                       f"instance {current.epoch} on {node} was {how}", seen)
    # When this controller saw the exit: the agent's finished_at is another machine's clock.
    failed_at = seen.ended_at((wid, status.node, status.epoch), now)
    after = after_failure(current, spec.restart, node, f"exited with code {status.exit_code}",
                          failed_at, now, detail=status.stderr_line)
    if now < after.not_before:
        # a later cycle restarts it
        return Settled(SettledReason.BACKING_OFF, f"exited with code {status.exit_code}")
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    request = PlacementRequest(wid, spec, submission.submitted_at, avoid,
                               prefer=node if after.kind == "restart" else None,
                               exclude=after.failed_on)
    restart = after.kind == "restart"
    return Need(request=request, previous=current, restarts=after.restarts,
                restart_times=after.restart_times,
                cause=Cause.EXITED if restart else Cause.APP_FAILED,
                why=f"{after.why}; {_resume(checkpoints, wid, status)}",
                known_since=after.not_before if restart else failed_at, failure=after.subject)


def _hung(current: Assignment, status: InstanceStatus, spec: WorkloadSpec,
          seen: Observations, now: float) -> Action | None:
    """Stop a hung single instance at once and run it again (``hafo.decisions.hangs``): in
    place, unless its node is a repeat offender."""
    if spec.hang_timeout is None or current.node is None:
        return None
    hang = find_hang([(Member(rank=0, node=current.node), status)], seen.stalled_since, now,
                     seen.started.get((current.workload, current.epoch)))
    if hang is None:
        return None
    after, suspects = after_hang(current, spec.restart, current.node, hang, now)
    cause = Cause.HUNG if after.kind == "restart" else Cause.APP_FAILED
    action = stop_then_place(current, after.why, cause, urgent=True, after=after)
    assert action.assignment is not None
    return replace(action, assignment=replace(action.assignment, suspects=suspects))


def _infrastructure_restart(snapshot: ClusterSnapshot, current: Assignment, now: float,
                            checkpoints: Mapping[str, CheckpointInfo], why: str,
                            seen: Observations) -> Need | Settled:
    """Run again, in place, an instance that the infrastructure ended (fencing, lease loss,
    an etcd outage, a lost guard): not the workload's fault, so no restart is counted and no
    node excluded or cooled down; the first of a row at once, a row of quick ones backing
    off (``uncounted_backoff``, timed from when this controller saw the end). ``Settled``:
    backing off."""
    assert current.node is not None
    ref = (current.workload, current.node, current.epoch)
    streak, delay = uncounted_backoff(current.quick_restarts, seen.ran_for(ref))
    if now < seen.ended_at(ref, now) + delay:
        # a row of quick uncounted restarts: a later cycle restarts it
        return Settled(SettledReason.BACKING_OFF, "ended by the infrastructure")
    submission = snapshot.workloads[current.workload]
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    request = PlacementRequest(current.workload, submission.spec, submission.submitted_at,
                               avoid, prefer=current.node, exclude=current.failed_on)
    return Need(request=request, previous=current, restarts=current.restarts,
                restart_times=current.restart_times, cause=Cause.INFRASTRUCTURE,
                why=f"{why}: restart in place, not counted (not the workload's fault"
                f"{f'; after a {delay:g}s backoff' if delay else ''}); "
                f"{_resume(checkpoints, current.workload)}", quick_restarts=streak)


def _hardware_move(snapshot: ClusterSnapshot, current: Assignment) -> Action | None:
    """A move off an unhealthy node or off a GPU that is unhealthy or degrading: stop first
    (with a checkpoint unless the GPU is lost), then place elsewhere."""
    assert current.node is not None
    fault = hardware_fault(snapshot, current.node, current.gpus)
    if fault is None:
        return None
    return stop_then_place(current, fault.subject, fault.cause, urgent=fault.lost)
