"""The controller's one decision per cycle: snapshot + now -> Plan. Pure and deterministic.

For every workload it decides one of: place (new instance, new epoch), keep pending (with the
reason), finish (completed / failed), forget (deleted by the user), start a planned move
(checkpoint and stop the instance, see ``hafo.decisions.moves``) or refuse one, move work off
an unhealthy node or GPU, or act on a failed application (``hafo.decisions.failures``:
restart in place with backoff, then move), or preempt lower-priority work for a workload
that may (``hafo.decisions.preemption``). Each action carries the revision of the assignment
it was decided from, so applying it is a compare-and-swap, and a one-line ``why`` for the
log. Linear in nodes + workloads, plus O(log nodes) per placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from hafo.decisions.failures import after_failure, uncounted_backoff
from hafo.decisions.gang_placement import choose_spares
from hafo.decisions.gangs import (
    assess_gang,
    gang_ports,
    master_port,
    moved_off_gang,
    resumes_note,
    with_addresses,
)
from hafo.decisions.hardware import hardware_fault
from hafo.decisions.moves import latest_checkpoints, moved_off, start_move, stop_then_place
from hafo.decisions.observed import Observations, bounded, observe
from hafo.decisions.placement import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Strategy,
    Unplaceable,
    batch_order,
    capacity_from,
    place_batch,
)
from hafo.decisions.placement_index import SignatureKey, signature
from hafo.decisions.plan import FAILED_NODE_COOLDOWN, Action, Cause, Need, Plan
from hafo.decisions.preemption import (
    Preemption,
    WaitingPreemptor,
    choose_victims,
    reserve,
    victims_by_node,
    waiting_preemptors,
)
from hafo.decisions.services import ReplicaChange, apart_from, decide_services
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    ClusterSnapshot,
    InstanceEnd,
    Member,
)

__all__ = ["FAILED_NODE_COOLDOWN", "Action", "Cause", "Plan", "ReplicaChange", "reconcile"]


def _resume(checkpoints: Mapping[str, CheckpointInfo], wid: str) -> str:
    """Where the next instance resumes: the work since that checkpoint is redone."""
    checkpoint = checkpoints.get(wid)
    if checkpoint is None:
        return "resumes from its latest checkpoint, if any"
    return f"resumes from its latest checkpoint (last reported: step {checkpoint.step})"


def _revision(assignment: Assignment | None) -> int:
    return assignment.revision if assignment is not None else 0


def _assess(snapshot: ClusterSnapshot, wid: str, now: float, cooldown: float,
            allow_failover: bool, checkpoints: Mapping[str, CheckpointInfo],
            seen: Observations) -> Action | Need | None:
    """Decide for one workload, except the placement itself."""
    submission = snapshot.workloads[wid]
    spec = submission.spec
    current = snapshot.assignments.get(wid)
    if current is not None:  # times a leader with another clock wrote: bounded
        current = bounded(current, seen.assigned_at(wid, current.epoch, now), spec.restart,
                          cooldown)
    move = snapshot.moves.get(wid)
    if submission.retiring is not None:
        return None  # out of rotation, deleted soon (hafo.decisions.services): left as it is
    if move is not None and submission.service is None:
        return start_move(snapshot, wid, move, now)  # a replica's: its service replaces it
    if spec.is_service and submission.service is None:
        return None  # a service is its replicas (hafo.decisions.services)
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
                    why="new workload", quick_restarts=current.quick_restarts if current else 0)
    if current.phase in ("completed", "failed") or current.node is None:
        return None
    node = current.node
    node_state = snapshot.node_state(node)
    if node_state == "down":
        if not allow_failover:
            return None  # failsafe: an agent may still run it on our word; decide later
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
        return None
    if status.state != "exited":
        if not status.failing or status.state == "stopping":
            return None
        after = after_failure(current, spec.restart, node, f"failing ({status.failing})",
                              now, now)
        cause = Cause.FAILING if after.kind == "restart" else Cause.APP_FAILED
        return stop_then_place(current, after.why, cause, urgent=True, after=after)
    if status.exit_code == 0:
        done = Assignment(workload=wid, phase="completed", node=None, restarts=current.restarts,
                          restart_times=current.restart_times, reason="exited with code 0")
        return Action(kind="finish", workload=wid, cause=Cause.COMPLETED,
                      why=f"exited 0 on {node}", expected_revision=_revision(current),
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
        return None  # backing off; a later cycle restarts it
    avoid = {n: t for n, t in current.avoid.items() if t > now}
    request = PlacementRequest(wid, spec, submission.submitted_at, avoid,
                               prefer=node if after.kind == "restart" else None,
                               exclude=after.failed_on)
    restart = after.kind == "restart"
    return Need(request=request, previous=current, restarts=after.restarts,
                restart_times=after.restart_times,
                cause=Cause.EXITED if restart else Cause.APP_FAILED,
                why=f"{after.why}; {_resume(checkpoints, wid)}",
                known_since=after.not_before if restart else failed_at)


def _remembered(need: Need) -> tuple[Member, ...]:
    """The members a gang waiting to be placed again remembers (not those it had to leave:
    their nodes are down, bad or drained)."""
    leave = set(need.request.leave)
    return tuple(m for m in need.request.members if m.node not in leave)


def _infrastructure_restart(snapshot: ClusterSnapshot, current: Assignment, now: float,
                            checkpoints: Mapping[str, CheckpointInfo], why: str,
                            seen: Observations) -> Need | None:
    """Run again, in place, an instance that the infrastructure ended (fencing, lease loss,
    an etcd outage, a lost guard): not the workload's fault, so no restart is counted and no
    node excluded or cooled down; the first of a row at once, a row of quick ones backing
    off (``uncounted_backoff``, timed from when this controller saw the end). None: backing
    off."""
    assert current.node is not None
    ref = (current.workload, current.node, current.epoch)
    streak, delay = uncounted_backoff(current.quick_restarts, seen.ran_for(ref))
    if now < seen.ended_at(ref, now) + delay:
        return None  # a row of quick uncounted restarts: a later cycle restarts it
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


def _strategy(name: str) -> Strategy:
    if name == "spread":
        return "spread"
    if name == "binpack":
        return "binpack"
    raise ValueError(f"unknown placement strategy {name!r} (spread or binpack)")


def _requests(needs: list[Need], waiting: Mapping[str, WaitingPreemptor],
              capacity: Mapping[str, NodeCapacity]) -> list[PlacementRequest]:
    """The needs' requests; a preemptor waiting for its victims gets the room held for it
    (in priority order, so several on one node share it deterministically)."""
    requests = []
    for request in batch_order(n.request for n in needs):
        wait = waiting.get(request.workload)
        requests.append(reserve(request, wait.node, capacity) if wait else request)
    return requests


class _Preempting:
    """The ``place_batch`` fallback that picks victims for each unplaceable workload that may
    preempt and is not already waiting, in batch (priority) order, so a preemptor gets the
    room it makes before lower-priority work is placed."""

    def __init__(self, snapshot: ClusterSnapshot, settled: list[str],
                 capacity: Mapping[str, NodeCapacity], waiting: Mapping[str, WaitingPreemptor],
                 now: float) -> None:
        self.waiting = waiting
        self.now = now
        self.victims = victims_by_node(snapshot, settled, capacity)
        self.chosen: dict[str, Preemption] = {}
        self.hopeless: set[tuple[SignatureKey, int, int]] = set()

    def __call__(self, request: PlacementRequest, result: Unplaceable) -> tuple[str, ...]:
        if not request.spec.preempt or result.exhausted or request.workload in self.waiting:
            return ()
        # Room only shrinks during a pass: a request like one that found no victims (and
        # no more restricted than it was) finds none either.
        plain = request.only is None and not any(
            t > self.now for t in (*request.avoid.values(), *request.exclude.values()))
        key = (signature(request.spec), request.spec.gpus, request.spec.priority)
        if key in self.hopeless:
            return ()
        preemption = choose_victims(request, self.victims, self.now)
        if preemption is None:
            if plain:
                self.hopeless.add(key)
            return ()
        self.chosen[request.workload] = preemption
        return (preemption.node,)


def _victim_actions(snapshot: ClusterSnapshot,
                    preemptions: Mapping[str, Preemption]) -> list[Action]:
    actions = []
    for preemptor, preemption in preemptions.items():
        priority = snapshot.workloads[preemptor].spec.priority
        for victim in preemption.victims:
            actions.append(stop_then_place(
                snapshot.assignments[victim], f"preempted by {preemptor} (priority {priority})",
                Cause.PREEMPTED, urgent=False, preempted_for=preemptor))
    return actions


def _waiting_reason(wid: str, preemptions: Mapping[str, Preemption],
                    waiting: Mapping[str, WaitingPreemptor], releasing: set[str]) -> str | None:
    if wid in preemptions:
        node, count = preemptions[wid].node, len(preemptions[wid].victims)
    elif wid in waiting:
        node = waiting[wid].node
        count = sum(1 for v in waiting[wid].victims if v not in releasing)
    else:
        return None
    return f"waiting for {count} preempted workload(s) on {node} to stop" if count else None


def reconcile(snapshot: ClusterSnapshot, now: float,
              cooldown: float = FAILED_NODE_COOLDOWN, allow_failover: bool = True,
              strategy: str = "spread", spares: int = 0,
              seen: Observations | None = None) -> Plan:
    """Compute the plan for one reconcile cycle. ``now`` is the deciding controller's clock
    (``hafo.model.clocks.SteadyClock``: wall-clock seconds, advanced monotonically).

    With ``allow_failover`` False (a controller that told an agent "etcd is unavailable to me"
    within TTL + margin: failsafe mode), work on down or unhealthy nodes is left where it is.
    ``strategy`` (``spread`` or ``binpack``) places workloads whose spec does not choose.
    ``spares``: how many idle nodes to keep for replacing gang members (besides the nodes
    labelled as spares; ``hafo.decisions.gang_placement``). ``seen``: what this controller
    observed, when (``hafo.decisions.observed.observe``, with this snapshot); None: all of it
    seen first now.
    """
    if seen is None:
        seen = observe(Observations(), snapshot, now)
    default = _strategy(strategy)
    replicas = tuple(decide_services(snapshot, now, seen.ready))
    actions: list[Action] = []
    for wid, assignment in sorted(snapshot.assignments.items()):
        if wid not in snapshot.workloads:
            actions.append(Action(kind="forget", workload=wid, cause=Cause.DELETED,
                                  why="workload deleted", expected_revision=assignment.revision,
                                  assignment=None))
    for wid in sorted(snapshot.moves):
        if wid not in snapshot.workloads:
            actions.append(Action(kind="refuse-move", workload=wid, cause=Cause.MOVE_REFUSED,
                                  why="no such workload", expected_revision=0, assignment=None,
                                  clear_move=True))
    checkpoints = latest_checkpoints(snapshot)
    needs: list[Need] = []
    settled: list[str] = []
    for wid in sorted(snapshot.workloads):
        outcome = _assess(snapshot, wid, now, cooldown, allow_failover, checkpoints, seen)
        if isinstance(outcome, Action):
            actions.append(outcome)
        elif isinstance(outcome, Need):
            needs.append(outcome)
        else:
            settled.append(wid)
    if not needs:
        return Plan(tuple(actions), replicas)  # nothing to place: no capacity to compute
    needs = [_kept_apart(snapshot, need) for need in needs]
    releasing = {n.request.workload for n in needs}
    capacity = capacity_from(snapshot, releasing)
    spare_nodes = choose_spares(snapshot, capacity, spares)
    waiting = waiting_preemptors(snapshot)
    preempting = (_Preempting(snapshot, settled, capacity, waiting, now)
                  if any(n.request.spec.preempt for n in needs) else None)
    results = place_batch(_requests(needs, waiting, capacity), capacity, now, default,
                          preempting, spare_nodes)
    preemptions = preempting.chosen if preempting is not None else {}
    ports = gang_ports(snapshot) if any(n.request.spec.is_gang for n in needs) else {}
    for need in needs:
        wid = need.request.workload
        result = results[wid]
        avoid = dict(need.request.avoid if need.avoid is None else need.avoid)
        failed_on = dict(need.request.exclude)
        if isinstance(result, Placed):
            port = 0
            if result.members:
                previous_port = need.previous.master_port if need.previous else 0
                port = master_port(snapshot.revision, result.node, previous_port, ports, wid)
                ports.setdefault(result.node, set()).add(port)
            new = Assignment(workload=wid, phase="placed", node=result.node, gpus=result.gpus,
                             restarts=need.restarts, restart_times=need.restart_times,
                             reason=need.why, avoid=avoid, failed_on=failed_on,
                             members=with_addresses(snapshot, result.members),
                             master_port=port, quick_restarts=need.quick_restarts)
            where = ", ".join(f"{m.rank}:{m.node}" for m in result.members) or result.node
            actions.append(Action(kind="place", workload=wid, cause=need.cause,
                                  why=f"{need.why} -> {where}",
                                  expected_revision=_revision(need.previous), assignment=new,
                                  known_since=need.known_since))
            continue
        previous = need.previous
        if result.exhausted:
            what = _last_failure(snapshot, need)
            reason = failed_everywhere(what, sorted(failed_on),
                                       need.request.spec.restart.max_restarts,
                                       _last_words(snapshot, need) if what else "")
            failed = Assignment(workload=wid, phase="failed", node=None,
                                restarts=need.restarts, restart_times=need.restart_times,
                                reason=reason, failed_on=failed_on)
            actions.append(Action(kind="finish", workload=wid, cause=need.cause, why=reason,
                                  expected_revision=_revision(previous), assignment=failed,
                                  known_since=need.known_since))
            continue
        reason = _waiting_reason(wid, preemptions, waiting, releasing) or result.reason
        if spare_nodes and not need.request.spec.is_gang:
            reason += f"; {len(spare_nodes)} spare node(s) kept for gang failover"
        unchanged = previous is not None and previous.phase == "pending" \
            and previous.reason == reason
        if unchanged:
            continue  # already pending for the same reason: nothing to write
        pending = Assignment(workload=wid, phase="pending", node=None, restarts=need.restarts,
                             restart_times=need.restart_times, reason=reason,
                             avoid=avoid, failed_on=failed_on,
                             members=_remembered(need),
                             master_port=previous.master_port if previous else 0,
                             quick_restarts=need.quick_restarts)
        actions.append(Action(kind="pending", workload=wid, cause=need.cause,
                              why=f"{need.why}; {reason}", expected_revision=_revision(previous),
                              assignment=pending, known_since=need.known_since))
    actions.extend(_victim_actions(snapshot, preemptions))
    return Plan(tuple(actions), replicas)


def failed_everywhere(what: str, nodes: list[str], restarts: int, said: str = "") -> str:
    """The one sentence of a workload's final ``failed``: what it did (``what``, e.g.
    "exited with code 1"; "" if not known), where, what it said last (``said``: the last line
    of its stderr, "" if none) and that no other node can run it."""
    said = f": {said}" if said else ""
    if not nodes:
        return f"failed: {what or 'it failed'}{said}; no node can run it"
    where = nodes[0] if len(nodes) == 1 else f"{', '.join(nodes[:-1])} and {nodes[-1]}"
    tries = ("no restarts" if restarts == 0 else
             f"{restarts} restart{'s' if restarts > 1 else ''} each" if len(nodes) > 1 else
             f"{restarts} restart{'s' if restarts > 1 else ''}")
    return (f"failed: {what or 'it failed'} on {where} ({tries}){said}; no other node can run "
            "it")


def _last_failure(snapshot: ClusterSnapshot, need: Need) -> str:
    """What the instance that failed last did, where its report says so (an exit)."""
    previous = need.previous
    status = snapshot.current_status(need.request.workload)
    if previous is None or previous.phase != "placed" or previous.is_gang or status is None \
            or status.state != "exited" or not status.exit_code:
        return ""
    return f"exited with code {status.exit_code}"


def _last_words(snapshot: ClusterSnapshot, need: Need) -> str:
    """The last line of stderr of the instance that failed last (an exit; "" if none)."""
    status = snapshot.current_status(need.request.workload)
    return status.stderr_line if status is not None and status.state == "exited" else ""


def _kept_apart(snapshot: ClusterSnapshot, need: Need) -> Need:
    """A replica's request, kept off the nodes of the other replicas of its service (in this
    pass too: ``group``)."""
    submission = snapshot.workloads[need.request.workload]
    if submission.service is None:
        return need
    request = replace(need.request, apart=apart_from(snapshot, submission),
                      group=submission.service if submission.spec.distinct_nodes else None)
    return replace(need, request=request)
