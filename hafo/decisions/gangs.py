"""Decisions for a gang (a workload of ``nodes`` > 1): it is stopped and started as one.
Pure.

A gang has one assignment and one epoch for all its members (docs/safety.md, "Gangs"). When
anything goes wrong with one member (its node down, unhealthy or with a bad GPU, its instance
failing a check, exiting non-zero, or ended by the infrastructure), the gang becomes
``moving``: every member of the epoch is stopped (checkpoint first, bounded by
``stop_grace``, unless the cause is urgent). Only once every member is stopped (reported
exited, never launched, or its node down, that is its lease expired) is the gang placed again,
with a new epoch: members on nodes that are still fine keep their node and rank, the others
go elsewhere (spares first). A gang completes when every member exited 0.

Restarts count against the gang's restart policy, blamed on the member that failed; a member
that keeps failing on one node excludes that node (``hafo.decisions.failures``). A member that
exited non-zero because a peer's node died (its collective broke) is not blamed: if, once all
are stopped, a member's node is down, the restart is not counted.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping

from hafo.decisions.failures import AfterFailure, after_failure, uncounted_backoff
from hafo.decisions.gang_preflight import PreflightBlame, preflight_blame
from hafo.decisions.hangs import Verdict, after_hang, find_hang, find_straggler
from hafo.decisions.hardware import hardware_fault
from hafo.decisions.observed import Observations
from hafo.decisions.placement import PlacementRequest, Unplaceable, node_capacity, place_one
from hafo.decisions.plan import Action, Cause, Need, Settled, SettledReason, move_cause
from hafo.model.cluster import (
    PLANNED_CAUSES,
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceStatus,
    Member,
    MoveRequest,
)
from hafo.model.resume import resume_note
from hafo.model.spec import RestartPolicy

#: The rendezvous ports a gang's ``MASTER_PORT`` is chosen from (docs/reference/workloads.md,
#: "What a workload gets").
GANG_PORT_FIRST = 29500
GANG_PORT_COUNT = 2000


def warm_park(current: Assignment, warm: bool, *lost: str) -> tuple[str, ...]:
    """The nodes whose members park instead of stopping (a ``warm`` gang's survivors): every
    member's but those of ``lost`` (down, failing, leaving, exited); none unless ``warm``."""
    return tuple(m.node for m in current.members if m.node not in lost) if warm else ()


def stop_gang(current: Assignment, why: str, cause: Cause, *, urgent: bool,
              after: AfterFailure | None = None, leave: tuple[str, ...] = (),
              move_to: str | None = None, not_before: float = 0.0,
              quick_restarts: int = 0, park: tuple[str, ...] = ()) -> Action:
    """Stop every member of the gang's epoch (``moving``); ``moved_off_gang`` places it again
    once all are stopped. ``after``: a failure's outcome (restart counted, backoff);
    ``leave``: the nodes whose members go elsewhere; ``not_before`` and ``quick_restarts``:
    an uncounted restart's backoff (``hafo.decisions.failures.uncounted_backoff``);
    ``park``: the nodes whose members park instead (``warm_park``: ``urgent`` is then for
    the others)."""
    moving = dataclasses.replace(
        current, phase="moving", stopping=current.epoch, urgent=urgent,
        restarts=after.restarts if after else current.restarts,
        restart_times=after.restart_times if after else current.restart_times,
        failed_on=after.failed_on if after else current.failed_on,
        not_before=after.not_before if after else not_before,
        quick_restarts=quick_restarts,
        after_stop=after.kind if after else ("move" if leave else "restart"),
        reason=after.why if after else why, move_to=move_to, leave=leave,
        park=tuple(n for n in park if n not in leave) + tuple(
            s.node for s in current.standby if s.node not in current.nodes),
        cause=move_cause(cause), preempted_for=None, failure=after.subject if after else "")
    how = "stop every member now" if urgent else "checkpoint and stop every member"
    parked = [n for n in moving.park if n in current.nodes]
    if parked:
        how = f"park the members on {', '.join(parked)}, stop the others" + (
            " now" if urgent else "")
    return Action(kind="move", workload=current.workload, cause=cause,
                  why=f"{after.why if after else why}: {how}", expected_revision=current.revision,
                  assignment=moving)


def _status(snapshot: ClusterSnapshot, current: Assignment, member: Member,
            epoch: int) -> InstanceStatus | None:
    status = snapshot.statuses.get((current.workload, member.node))
    return status if status is not None and status.epoch == epoch else None


def _uncounted(current: Assignment, member: Member, why: str, seen: Observations,
               now: float, warm: bool = False) -> Action:
    """Stop the gang for an uncounted restart (the infrastructure ended ``member``), placed
    again after its backoff (timed from when this controller saw the end)."""
    ref = (current.workload, member.node, current.epoch)
    streak, delay = uncounted_backoff(current.quick_restarts, seen.ran_for(ref))
    wait = f" after a {delay:g}s backoff" if delay else ""
    return stop_gang(current, f"{why}: restart, not counted{wait}", Cause.INFRASTRUCTURE,
                     urgent=False, not_before=seen.ended_at(ref, now) + delay,
                     quick_restarts=streak, park=warm_park(current, warm, member.node))


def assess_gang(snapshot: ClusterSnapshot, current: Assignment, now: float,
                allow_failover: bool, seen: Observations | None = None) -> Action | Settled:
    """Decide for a placed gang: stop it (a member lost, failing, exited non-zero, on a bad
    node or GPU), finish it (every member exited 0), or leave it (``Settled``: why). ``seen``:
    when this controller saw each member's end (None: now)."""
    seen = seen if seen is not None else Observations()
    wid = current.workload
    spec = snapshot.workloads[wid].spec
    down = [m.node for m in current.members if snapshot.node_state(m.node) == "down"]
    if down:
        if not allow_failover:
            # failsafe: an agent may still run a member on our word
            return Settled(SettledReason.FAILSAFE, f"gang member's node {down[0]} is down")
        return stop_gang(current, f"gang member on {down[0]} lost (node down)",
                         Cause.MEMBER_LOST, urgent=False,
                         park=warm_park(current, spec.warm, *down))
    for member in current.members:
        registered = snapshot.alive.get(member.node)
        if registered is not None and current.epoch <= registered.claimed:
            return _uncounted(current, member, f"{member.node} was registered again by an "
                              f"agent with a new lease; member {member.rank} of instance "
                              f"{current.epoch} is gone", seen, now, spec.warm)
    hardware = _hardware(snapshot, current, spec.warm)
    if hardware is not None:
        return hardware
    statuses = [(m, _status(snapshot, current, m, current.epoch)) for m in current.members]
    blame = preflight_blame(statuses) if current.preflight else None
    if blame is not None:
        return _preflight_failed(current, blame, spec.restart, now)
    for member, status in statuses:
        if status is None or status.state == "exited" or not status.failing \
                or status.state == "stopping":
            continue
        after = after_failure(current, spec.restart, member.node,
                              f"member {member.rank} failing ({status.failing})", now, now)
        cause = Cause.FAILING if after.kind == "restart" else Cause.APP_FAILED
        return stop_gang(current, after.why, cause, urgent=True, after=after,
                         leave=(member.node,) if after.kind == "move" else (),
                         park=warm_park(current, spec.warm, member.node))
    # a member's node about to be confirmed down is a lost member, not a hang: wait for it
    hung = _hung(current, statuses, spec.restart, seen, now) \
        if spec.hang_timeout is not None \
        and not any(m.node in snapshot.expiring for m in current.members) else None
    if hung is not None:
        return hung
    straggler = find_straggler(statuses, spec.straggler_lag) \
        if spec.straggler_lag is not None else None
    if straggler is not None:
        return _blame(current, straggler, straggler.member.node, Cause.STRAGGLER,
                      spec.restart, now)
    exited = [(m, s) for m, s in statuses if s is not None and s.state == "exited"]
    def exit_seen(ms: tuple[Member, InstanceStatus]) -> tuple[float, int]:
        return seen.ended_at((wid, ms[0].node, ms[1].epoch), now), ms[0].rank

    # The first exit this controller saw (the agents' finished_at are their clocks): the
    # member that failed first is blamed, the others' exits follow from it.
    for member, status in sorted(exited, key=exit_seen):
        if status.exit_code == 0:
            continue
        if status.ended_by_infrastructure:
            return _uncounted(current, member, f"member {member.rank} on {member.node} was "
                              "ended by the infrastructure", seen, now, spec.warm)
        after = after_failure(current, spec.restart, member.node,
                              f"member {member.rank} exited with code {status.exit_code}",
                              exit_seen((member, status))[0], now, detail=status.stderr_line)
        return stop_gang(current, after.why, Cause.EXITED, urgent=False, after=after,
                         leave=(member.node,) if after.kind == "move" else (),
                         park=warm_park(current, spec.warm, member.node))
    if len(exited) == len(current.members):
        done = Assignment(workload=wid, phase="completed", node=None,
                          restarts=current.restarts, restart_times=current.restart_times,
                          reason=f"all {len(exited)} members exited with code 0")
        return Action(kind="finish", workload=wid, cause=Cause.COMPLETED,
                      why=f"every member of gang instance {current.epoch} exited 0",
                      expected_revision=current.revision, assignment=done)
    return Settled(SettledReason.RUNNING)


def _hung(current: Assignment, statuses: list[tuple[Member, InstanceStatus | None]],
          policy: RestartPolicy, seen: Observations, now: float) -> Action | None:
    """Stop the gang, every member at once, if it is hung (``hafo.decisions.hangs``): the
    restart is blamed on the member whose rank stalled first; its node becomes suspect, and
    a second hang there moves that member elsewhere."""
    hang = find_hang(statuses, seen.stalled_since, now,
                     seen.started.get((current.workload, current.epoch)))
    if hang is None:
        return None
    return _blame(current, hang, hang.member.node, Cause.HUNG, policy, now)


def _blame(current: Assignment, verdict: Verdict, node: str, cause: Cause,
           policy: RestartPolicy, now: float) -> Action:
    """Stop every member at once for a hang or a straggler on ``node`` (``cause``: restarted
    in place, counted) or, the node suspect already, move that member (``app-failed``)."""
    after, suspects = after_hang(current, policy, node, verdict, now)
    action = stop_gang(current, after.why, cause if after.kind == "restart" else
                       Cause.APP_FAILED, urgent=True, after=after,
                       leave=(node,) if after.kind == "move" else ())
    assert action.assignment is not None
    return dataclasses.replace(
        action, assignment=dataclasses.replace(action.assignment, suspects=suspects))


def _preflight_failed(current: Assignment, blame: PreflightBlame, policy: RestartPolicy,
                      now: float) -> Action:
    """Stop every member at once: the pre-flight blamed ``blame.members``, which go elsewhere,
    their nodes excluded for ``restart.window``; not counted (``hafo.decisions.gang_preflight``)."""
    failed_on = {n: t for n, t in current.failed_on.items() if t > now}
    failed_on.update({node: now + policy.window for node in blame.nodes})
    why = (f"{blame.describe()}, {', '.join(blame.nodes)} excluded for {policy.window:g}s; "
           "not counted")
    after = AfterFailure("move", current.restarts, current.restart_times, failed_on, 0.0, why,
                         subject=f"pre-flight failed: {blame.why}")
    return stop_gang(current, why, Cause.PREFLIGHT, urgent=True, after=after,
                     leave=blame.nodes)


def _hardware(snapshot: ClusterSnapshot, current: Assignment,
              warm: bool = False) -> Action | None:
    """Stop the gang if a member's node is unhealthy or one of its GPUs is bad; that member
    goes elsewhere (no checkpoint wait if the GPU does not answer at all); with ``warm``,
    the others park."""
    for member in current.members:
        fault = hardware_fault(snapshot, member.node, member.gpus)
        if fault is not None:
            return stop_gang(current, f"member {member.rank}: {fault.subject}", fault.cause,
                             urgent=fault.lost, leave=(member.node,),
                             park=warm_park(current, warm, member.node))
    return None


def all_stopped(snapshot: ClusterSnapshot, current: Assignment) -> bool:
    """Every member of the instance being stopped is gone: reported exited, never launched
    (no report of that epoch: it never will be, its assignment changed), or its node is down
    (its lease expired, so its guard killed it); or, asked to park (``current.park``),
    reported parked: its process confirmed that it left the epoch's process group and opens
    no link until it is handed the next epoch (docs/safety.md, "Warm survivors keep the
    epoch rule")."""
    for member in current.members:
        if snapshot.node_state(member.node) == "down":
            continue
        status = _status(snapshot, current, member, current.stopping)
        if status is None or status.state == "exited":
            continue
        if status.state == "parked" and member.node in current.park:
            continue
        return False
    return True


def moved_off_gang(snapshot: ClusterSnapshot, current: Assignment, now: float,
                   cooldown: float, resumes: str) -> Need | Settled:
    """Place a stopping gang again once every member is stopped (and its backoff passed):
    members whose node is down, or that leave their node, go elsewhere; the others keep their
    node and rank. ``Settled``: not yet, and why."""
    if not all_stopped(snapshot, current):
        return Settled(SettledReason.STOPPING, f"gang instance {current.stopping}")
    if now < current.not_before:
        return Settled(SettledReason.BACKING_OFF)
    if any(m.node in snapshot.expiring for m in current.members):
        # a member's node is about to be confirmed down: replace it, not keep it
        return Settled(SettledReason.NODE_EXPIRING)
    wid = current.workload
    submission = snapshot.workloads[wid]
    down = tuple(m.node for m in current.members if snapshot.node_state(m.node) == "down")
    restarts, times = current.restarts, current.restart_times
    cause = Cause.RESTARTED
    why, failure = current.reason, current.failure
    if down and current.cause == "app-failed" and restarts > 0 and times:
        # a member exited because a peer's node died: not the workload's failure
        restarts, times = restarts - 1, times[:-1]
        why, failure = f"gang member on {down[0]} lost (node down)", ""
    if down:
        cause = Cause.NODE_DOWN
    elif current.leave:
        cause = Cause.MOVED
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    kept = dict(avoid)  # what the new assignment remembers
    for node in (*current.leave, *down):
        avoid[node] = now + cooldown  # this placement puts those members elsewhere
        if current.cause not in PLANNED_CAUSES:
            kept[node] = avoid[node]  # a node that went bad stays avoided for a while
    request = PlacementRequest(wid, submission.spec, submission.submitted_at, avoid,
                               prefer=current.move_to, exclude=current.failed_on,
                               members=current.members, leave=(*current.leave, *down),
                               spares_first=current.cause not in PLANNED_CAUSES,
                               standby=tuple(s.node for s in current.standby))
    return Need(request=request, previous=current, restarts=restarts, restart_times=times,
                cause=cause, why=f"{why} (gang instance {current.stopping} stopped){resumes}",
                avoid=kept, quick_restarts=current.quick_restarts, failure=failure)


def gang_move_refusal(snapshot: ClusterSnapshot, current: Assignment, move: MoveRequest,
                      now: float) -> str:
    """Why a planned move of one member of a placed gang would be refused ("" if not): the
    request must name a member's node that is up; ``to``, if given, must take a member."""
    if move.node is None:
        nodes = ", ".join(current.nodes)
        return (f"a gang moves one member at a time: name the node of the member to move "
                f"({nodes})")
    if current.member_on(move.node) is None:
        return f"no member of the gang runs on {move.node}"
    if move.to is None:
        return ""
    if move.to in current.nodes:
        return f"a member already runs on {move.to}"
    if move.to not in snapshot.nodes:
        return f"{move.to} cannot take it (no such node)"
    state = snapshot.node_state(move.to)
    if state != "ready":
        return f"{move.to} cannot take it (it is {state})"
    submission = snapshot.workloads[current.workload]
    fit = place_one(PlacementRequest(current.workload, submission.spec,
                                     submission.submitted_at, only=move.to),
                    node_capacity(snapshot, move.to), now)
    if isinstance(fit, Unplaceable):
        return f"{move.to} cannot take it ({fit.reason})"
    return ""


def start_gang_move(current: Assignment, move: MoveRequest) -> Action:
    """A planned move of the member on ``move.node``: every member checkpoints and stops, then
    the gang starts again with that member elsewhere (on ``move.to`` if given). A restart for
    a changed spec (``move.restart``): every member starts again where it was."""
    if move.restart:
        action = stop_gang(current, f"{move.reason or 'restart'}: every member checkpoints, "
                           "stops and starts again in place", Cause.PLANNED, urgent=False)
        return dataclasses.replace(action, clear_move=True)
    assert move.node is not None
    member = current.member_on(move.node)
    rank = member.rank if member is not None else "?"
    reason = move.reason or "planned move"
    action = stop_gang(current, f"{reason}: member {rank} leaves {move.node}", Cause.PLANNED,
                       urgent=False, leave=(move.node,), move_to=move.to)
    return dataclasses.replace(action, clear_move=True)


def gang_ports(snapshot: ClusterSnapshot) -> dict[str, set[int]]:
    """rank 0's node -> the rendezvous ports of the gangs placed (or stopping) with rank 0
    there (computed once per cycle)."""
    used: dict[str, set[int]] = {}
    for assignment in snapshot.assignments.values():
        if assignment.is_gang and assignment.holds_node and assignment.master_port:
            used.setdefault(assignment.members[0].node, set()).add(assignment.master_port)
    return used


def master_port(revision: int, rank0: str, previous: int, used: Mapping[str, set[int]],
                workload: str) -> int:
    """A rendezvous port for a new gang epoch whose rank 0 runs on ``rank0``: never the gang's
    previous one (``previous``), nor one another gang uses with rank 0 on that node (``used``:
    ``gang_ports`` plus those given this cycle). Scans from a point that moves with the store
    ``revision`` and depends on the ``workload``, so that two gangs placed at the same
    revision (by two clusters whose nodes share one host's ports, as the local harness's do)
    do not start from the same port; every controller still decides alike."""
    taken = used.get(rank0, set()) | {previous}
    start = (revision + zlib.crc32(workload.encode())) % GANG_PORT_COUNT
    for offset in range(GANG_PORT_COUNT):
        port = GANG_PORT_FIRST + (start + offset) % GANG_PORT_COUNT
        if port not in taken:
            return port
    return GANG_PORT_FIRST + start  # more than GANG_PORT_COUNT gangs on one node


def with_addresses(snapshot: ClusterSnapshot, members: tuple[Member, ...]) -> tuple[Member, ...]:
    """The members with their nodes' addresses (``NodeRecord.address``; the node name when a
    node does not publish one)."""
    out = []
    for member in members:
        record = snapshot.nodes.get(member.node)
        address = record.address if record is not None and record.address else member.node
        out.append(dataclasses.replace(member, address=address))
    return tuple(out)


def resumes_note(checkpoints: Mapping[str, CheckpointInfo], wid: str) -> str:
    """The "resumes from" part of a gang's reason, as far as reported ("" if none is known):
    its members stop at different times, the newest checkpoint is read at each one's end."""
    checkpoint = checkpoints.get(wid)
    return f"; {resume_note(checkpoint)}" if checkpoint else ""
