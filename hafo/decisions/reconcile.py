"""The controller's one decision per cycle: snapshot + now -> Plan. Pure and deterministic.

For every workload it decides one of: place (new instance, new epoch), keep pending (with the
reason), finish (completed / failed), forget (deleted by the user), start a planned move
(checkpoint and stop the instance, see ``hafo.decisions.moves``) or refuse one, move work off
an unhealthy node or GPU, or act on a failed application (``hafo.decisions.failures``:
restart in place with backoff, then move), or preempt lower-priority work for a workload
that may (``hafo.decisions.preemption``). Each action carries the revision of the assignment
it was decided from, so applying it is a compare-and-swap, and a one-line ``why`` for the
log. Linear in nodes + workloads, plus O(log nodes) per placement.

One pipeline, four stages: 1. **assess** each workload (``hafo.decisions.assessment``: an
action, a need for a placement, or ``Settled`` with the reason); 2. **admit** the placement
requests, in the order they are tried (``hafo.decisions.admission``); 3. **place** them in
that order (``hafo.decisions.placement``, gangs ``hafo.decisions.gang_placement``), under a
preemption policy (``hafo.decisions.preemption_policy``); 4. turn the results into
**actions** (here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hafo.decisions.admission import Admitted, admit
from hafo.decisions.assessment import assess, revision
from hafo.decisions.gang_placement import choose_spares
from hafo.decisions.gang_preflight import needs_preflight
from hafo.decisions.gangs import gang_ports, master_port, stop_gang, with_addresses
from hafo.decisions.moves import latest_checkpoints, stop_then_place
from hafo.decisions.observed import Observations, observe
from hafo.decisions.pending_reasons import waiting_after
from hafo.decisions.placement import (
    NodeCapacity,
    Placed,
    PlacementRequest,
    Strategy,
    Unplaceable,
    capacity_from,
    place_in_order,
)
from hafo.decisions.placement_failure import node_states, with_node_states
from hafo.decisions.plan import FAILED_NODE_COOLDOWN, Action, Cause, Need, Plan, Settled
from hafo.decisions.preemption import (
    Preempting,
    Preemption,
    WaitingPreemptor,
    reserve,
    waiting_preemptors,
)
from hafo.decisions.preemption_policy import PRIORITY_ONLY, PreemptionPolicy, QueueScoped
from hafo.decisions.quota import Quotas
from hafo.decisions.reclaim import DEFAULT_MIN_RUNTIME, Reclaiming
from hafo.decisions.services import ReplicaChange, apart_from, decide_services
from hafo.decisions.standby import choose_standby, lacks_standby, standby_actions
from hafo.model.cluster import Assignment, ClusterSnapshot, Member

__all__ = ["FAILED_NODE_COOLDOWN", "Action", "Cause", "Plan", "ReplicaChange", "reconcile"]


def _remembered(need: Need) -> tuple[Member, ...]:
    """The members a gang waiting to be placed again remembers (not those it had to leave:
    their nodes are down, bad or drained)."""
    leave = set(need.request.leave)
    return tuple(m for m in need.request.members if m.node not in leave)


def _strategy(name: str) -> Strategy:
    if name == "spread":
        return "spread"
    if name == "binpack":
        return "binpack"
    raise ValueError(f"unknown placement strategy {name!r} (spread or binpack)")


def _reserved(admitted: Admitted, waiting: Mapping[str, WaitingPreemptor],
              capacity: Mapping[str, NodeCapacity]) -> list[PlacementRequest]:
    """The admitted requests, in their order; a preemptor waiting for its victims gets the
    room held for it (in that order, so several on one node share it deterministically)."""
    requests = []
    for request in admitted.requests:
        wait = waiting.get(request.workload)
        # A gang that reclaimed holds nothing: its victims free several nodes, and it is
        # first in its cohort's order once they have stopped.
        if wait is not None and not request.spec.is_gang:
            request = reserve(request, wait.room_for(request, capacity), capacity)
        requests.append(request)
    return requests


def _victim_actions(snapshot: ClusterSnapshot,
                    preemptions: Mapping[str, Preemption]) -> list[Action]:
    actions = []
    for preemptor, preemption in preemptions.items():
        spec = snapshot.workloads[preemptor].spec
        for victim in preemption.victims:
            theirs = snapshot.workloads[victim].spec.queue
            why = (f"preempted by {preemptor} (priority {spec.priority})"
                   if theirs == spec.queue else
                   f"reclaimed by {preemptor}: queue {spec.queue} takes back the quota it "
                   f"lent to {theirs}")
            current = snapshot.assignments[victim]
            if current.is_gang:  # reclaimed whole: every member, checkpoint first
                action = stop_gang(current, why, Cause.PREEMPTED, urgent=False)
                assert action.assignment is not None
                actions.append(replace(action, assignment=replace(
                    action.assignment, preempted_for=preemptor)))
                continue
            actions.append(stop_then_place(current, why, Cause.PREEMPTED, urgent=False,
                                           preempted_for=preemptor))
    return actions


def _running_since(seen: Observations, snapshot: ClusterSnapshot) -> dict[str, float]:
    """workload -> since when its latest instance runs: when this controller first saw it
    running, or earlier when its agent says it started earlier (``started_at``: a leader
    that took office after the start, or restarted, would count all borrowed work as young
    for ``fair_sharing.min_runtime`` otherwise)."""
    since: dict[str, float] = {}
    for (wid, node, epoch), at in seen.running.items():
        reported = snapshot.statuses.get((wid, node))
        if reported is not None and reported.epoch == epoch \
                and reported.started_at is not None and math.isfinite(reported.started_at):
            at = min(at, reported.started_at)
        since[wid] = max(since.get(wid, at), at)
    return since


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


@dataclass(frozen=True)
class _Assessed:
    """Stage 1's outcome for every workload, in workload order."""

    actions: tuple[Action, ...]
    needs: tuple[Need, ...]
    settled: dict[str, Settled]


def _assess_all(snapshot: ClusterSnapshot, now: float, cooldown: float, allow_failover: bool,
                seen: Observations) -> _Assessed:
    """Stage 1, **assess**, for every workload (``hafo.decisions.assessment``)."""
    checkpoints = latest_checkpoints(snapshot)
    actions: list[Action] = []
    needs: list[Need] = []
    settled: dict[str, Settled] = {}
    for wid in sorted(snapshot.workloads):
        outcome = assess(snapshot, wid, now, cooldown, allow_failover, checkpoints, seen)
        if isinstance(outcome, Action):
            actions.append(outcome)
        elif isinstance(outcome, Need):
            needs.append(replace(outcome, checkpoint=checkpoints.get(wid)))
        else:
            settled[wid] = outcome
    return _Assessed(tuple(actions), tuple(needs), settled)


@dataclass(frozen=True)
class _Placing:
    """Stage 3's outcome: each need's placement or why not, the preemptions chosen, and what
    the pending reasons say besides (``waiting``, ``releasing``, ``spares``)."""

    results: Mapping[str, Placed | Unplaceable]
    preemptions: Mapping[str, Preemption]
    waiting: Mapping[str, WaitingPreemptor]
    releasing: set[str]
    spares: Mapping[str, NodeCapacity]


def _place(snapshot: ClusterSnapshot, needs: tuple[Need, ...], admitted: Admitted,
           settled: Iterable[str], now: float, strategy: Strategy, spares: int,
           policy: PreemptionPolicy, reclaims: bool = False,
           completed: frozenset[str] = frozenset()) -> _Placing:
    """Stage 3, **place**: the admitted requests, in their order, on the capacity left by
    everything that does not need a placement (nor completes in this cycle: ``completed``);
    preempting under ``policy`` (``reclaims``: a queue may take back quota it lent,
    ``hafo.decisions.reclaim``)."""
    releasing = {n.request.workload for n in needs}
    capacity = capacity_from(snapshot, releasing | completed)
    spare_nodes = choose_spares(snapshot, capacity, spares)
    waiting = waiting_preemptors(snapshot)
    preempting = (Preempting(snapshot, settled, capacity, waiting, now, policy)
                  if reclaims or any(policy.preempts(n.request) for n in needs) else None)
    results = place_in_order(_reserved(admitted, waiting, capacity), capacity, now, strategy,
                             preempting, spare_nodes, admitted.quotas)
    preemptions = preempting.chosen if preempting is not None else {}
    return _Placing(results, preemptions, waiting, releasing, spare_nodes)


def reconcile(snapshot: ClusterSnapshot, now: float,
              cooldown: float = FAILED_NODE_COOLDOWN, allow_failover: bool = True,
              strategy: str = "spread", spares: int = 0,
              seen: Observations | None = None,
              preemption: PreemptionPolicy = PRIORITY_ONLY,
              min_runtime: float = DEFAULT_MIN_RUNTIME,
              usage_history: Mapping[str, float] | None = None) -> Plan:
    """Compute the plan for one reconcile cycle. ``now`` is the deciding controller's clock
    (``hafo.model.clocks.SteadyClock``: wall-clock seconds, advanced monotonically).

    With ``allow_failover`` False (a controller that told an agent "etcd is unavailable to me"
    within TTL + margin: failsafe mode), work on down or unhealthy nodes is left where it is.
    ``strategy`` (``spread`` or ``binpack``) places workloads whose spec does not choose.
    ``spares``: how many idle nodes to keep for replacing gang members (besides the nodes
    labelled as spares; ``hafo.decisions.gang_placement``). ``seen``: what this controller
    observed, when (``hafo.decisions.observed.observe``, with this snapshot); None: all of it
    seen first now. ``preemption``: who may preempt whom (``PriorityOnly``: hafo's rule;
    while queues are declared, within a queue). ``min_runtime``: how long borrowed work runs
    before a lender may take its quota back (``fair_sharing.min_runtime``).
    ``usage_history``: queue -> effective usage by decayed history, which orders the
    borrowers instead of their usage now (``fair_sharing.usage_half_life``;
    ``hafo.decisions.usage_history``); None: the usage now.

    The pipeline: assess every workload (``hafo.decisions.assessment``), admit the
    placement requests in order (``hafo.decisions.admission``), place them in that order
    (``hafo.decisions.placement``, preempting under ``preemption``), then turn the results
    into actions (here).
    """
    if seen is None:
        seen = observe(Observations(), snapshot, now)
    default = _strategy(strategy)
    replicas = tuple(decide_services(snapshot, now, seen.ready))
    actions = _gone(snapshot)
    assessed = _assess_all(snapshot, now, cooldown, allow_failover, seen)  # 1. assess
    actions += assessed.actions
    if not assessed.needs:
        if any(lacks_standby(snapshot, a) for a in snapshot.assignments.values()):
            spare_nodes = choose_spares(snapshot, capacity_from(snapshot, set()), spares)
            actions += standby_actions(snapshot, spare_nodes, {a.workload for a in actions},
                                       now)
        return Plan(tuple(actions), replicas)  # nothing to place: no capacity to compute
    needs = tuple(_kept_apart(snapshot, need) for need in assessed.needs)
    # Work that completes in this cycle (every instance exited 0) leaves its GPUs and its
    # quota to this cycle's placements, not the next one's: at runtimes of seconds, a
    # cycle's wait per completion is GPU time lost.
    completed = frozenset(a.workload for a in assessed.actions
                          if a.kind == "finish" and a.cause is Cause.COMPLETED)
    quotas = Quotas.of(snapshot, {n.request.workload for n in needs} | completed)
    admitted = admit((n.request for n in needs), quotas, usage_history)  # 2. admit
    reclaims = False
    if quotas is not None:
        if preemption is PRIORITY_ONLY:
            preemption = QueueScoped(preemption)
        reclaims = any(spec.cohort is not None for spec in quotas.queues.values())
        if reclaims:
            preemption = Reclaiming(preemption, snapshot, quotas, _running_since(seen, snapshot),
                                    now, min_runtime)
    placing = _place(snapshot, needs, admitted, assessed.settled, now, default,  # 3. place
                     spares, preemption, reclaims, completed)
    notes: dict[str, str] = {}
    if isinstance(preemption, Reclaiming):
        for wid in preemption.held_young - set(placing.preemptions):
            notes[wid] = ("it takes back its lent quota once the borrowed work has run "
                          f"fair_sharing.min_runtime ({min_runtime:g} s)")
    actions += _placement_actions(snapshot, needs, placing, notes, now)  # 4. actions
    actions += _victim_actions(snapshot, placing.preemptions)
    actions += standby_actions(snapshot, placing.spares, {a.workload for a in actions}, now)
    return Plan(tuple(actions), replicas)


def _gone(snapshot: ClusterSnapshot) -> list[Action]:
    """Forget the assignments of deleted workloads; refuse the moves of unknown ones."""
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
    return actions


def _suspects(need: Need) -> Mapping[str, float]:
    """The suspect nodes a new assignment keeps: its previous one's (``hafo.decisions.hangs``;
    expired ones are dropped when the next hang is decided)."""
    return need.previous.suspects if need.previous is not None else {}


def _placement_actions(snapshot: ClusterSnapshot, needs: tuple[Need, ...],
                       placing: _Placing, notes: Mapping[str, str],
                       now: float) -> list[Action]:
    """Stage 4, **actions**: each need's place, final failure or pending (in workload
    order; nothing for one already pending for the same reason). ``notes``: what
    else a pending one waits for (a reclaim held back by ``fair_sharing.min_runtime``). Its
    place in its queue and the live figures are not stored (they would change every cycle):
    readers get them from ``hafo.decisions.pending_reasons.live_reasons``."""
    results, preemptions = placing.results, placing.preemptions
    waiting, releasing, spare_nodes = placing.waiting, placing.releasing, placing.spares
    actions: list[Action] = []
    ports = gang_ports(snapshot) if any(n.request.spec.is_gang for n in needs) else {}
    states: tuple[tuple[str, int], ...] | None = None
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
                             master_port=port, quick_restarts=need.quick_restarts,
                             checkpoint=need.checkpoint, suspects=_suspects(need),
                             preflight=needs_preflight(need.request.spec, need.previous,
                                                       result.members),
                             standby=choose_standby(need.request, result.members, spare_nodes,
                                                    snapshot.assignments, now))
            where = ", ".join(f"{m.rank}:{m.node}" for m in result.members) or result.node
            actions.append(Action(kind="place", workload=wid, cause=need.cause,
                                  why=f"{need.why} -> {where}",
                                  expected_revision=revision(need.previous), assignment=new,
                                  known_since=need.known_since))
            continue
        previous = need.previous
        if result.exhausted:
            what = _last_failure(snapshot, need)
            reason = failed_everywhere(what, sorted(failed_on),
                                       need.request.spec.restart.max_restarts,
                                       _last_words(snapshot, need) if what else "")
            if not what and need.failure:  # a gang's: which member failed how, and where
                reason += f"; last failure: {need.failure}"
            failed = Assignment(workload=wid, phase="failed", node=None,
                                restarts=need.restarts, restart_times=need.restart_times,
                                reason=reason, failed_on=failed_on)
            actions.append(Action(kind="finish", workload=wid, cause=need.cause, why=reason,
                                  expected_revision=revision(previous), assignment=failed,
                                  known_since=need.known_since))
            continue
        if states is None:  # the nodes by state, once, for the reasons that count them
            states = node_states(snapshot.node_state(n) for n in snapshot.nodes)
        reason = (_waiting_reason(wid, preemptions, waiting, releasing)
                  or Unplaceable(with_node_states(result.failure, states)).reason)
        if spare_nodes and not need.request.spec.is_gang:
            reason += f"; {len(spare_nodes)} spare node(s) kept for gang failover"
        if wid in notes:
            reason += f"; {notes[wid]}"
        reason = waiting_after(need.failure) + reason  # why it runs no more comes first
        unchanged = previous is not None and previous.phase == "pending" \
            and previous.reason == reason
        if unchanged:
            continue  # already pending for the same reason: nothing to write
        pending = Assignment(workload=wid, phase="pending", node=None, restarts=need.restarts,
                             restart_times=need.restart_times, reason=reason,
                             avoid=avoid, failed_on=failed_on,
                             members=_remembered(need),
                             master_port=previous.master_port if previous else 0,
                             quick_restarts=need.quick_restarts, failure=need.failure,
                             checkpoint=need.checkpoint, suspects=_suspects(need))
        actions.append(Action(kind="pending", workload=wid, cause=need.cause,
                              why=f"{need.why}; {reason}", expected_revision=revision(previous),
                              assignment=pending, known_since=need.known_since))
    return actions


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
