"""When the deciding controller saw things, on its own clock. Pure.

A decision that spans machines never compares their clocks (docs/safety.md, "One clock per
decision"): an agent's ``finished_at`` is its wall clock, not the controller's, and a time
written into an assignment by a previous leader is that leader's clock. So the controller
keeps, in memory, the cycle (its ``now``) at which it first saw

- an instance running (reported ``running`` or ``stopping``),
- an instance ended (reported ``exited``, or its node registered again by a new agent),
- an instance ready (in rotation, ``hafo.model.endpoints.instance_ready``; a new
  ``ready_since`` in its agent's report is a new ready period, seen anew: the agent's stamp
  is only compared with itself, never with this clock),
- an assignment (workload at a revision),
- an instance's stall (``InstanceStatus.stalled``: a new stall, or another rank or step, is
  seen anew), and an instance past its start-up (a member reported progress),

and times from those: a restart's backoff from when it saw the exit, how long an instance
ran from when it saw it running to when it saw it end, how long a service replica has been
ready (``update.min_ready_seconds``) from when it saw it ready, and a time a previous leader wrote
(``restart_times``, ``failed_on``, ``avoid``, ``not_before``) bounded by the policy's length
after it first saw that assignment (``bounded``). Nothing is written to etcd. A new leader
starts with no observations: it sees an old exit "now" and backs off from there, at most one
backoff (``restart.max_backoff``) later than its predecessor would have; a window it inherits
lasts at most its length after it first saw the assignment, and a replica already ready
waits ``min_ready_seconds`` again from when it first saw it ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hafo.decisions.failures import UNCOUNTED_MAX_BACKOFF
from hafo.model.cluster import Assignment, ClusterSnapshot, Stall
from hafo.model.endpoints import instance_ready, serving_status
from hafo.model.spec import RestartPolicy

__all__ = ["Observations", "bounded", "observe"]

#: An instance: (workload, node, epoch).
InstanceRef = tuple[str, str, int]


@dataclass(frozen=True)
class Observations:
    """First sightings, in the deciding controller's clock (see the module docstring)."""

    running: Mapping[InstanceRef, float] = field(default_factory=dict)
    ended: Mapping[InstanceRef, float] = field(default_factory=dict)
    assigned: Mapping[tuple[str, int], float] = field(default_factory=dict)
    #: instance -> when first seen ready (in rotation), in this period of readiness
    ready: Mapping[InstanceRef, float] = field(default_factory=dict)
    #: instance -> its agent's ``ready_since`` at that sighting (tells periods apart)
    ready_stamp: Mapping[InstanceRef, float | None] = field(default_factory=dict)
    #: instance -> (its stall, when first seen): ``hang_timeout``'s
    stalls: Mapping[InstanceRef, tuple[Stall, float]] = field(default_factory=dict)
    #: (workload, epoch) -> when first seen past its start-up (a member reported progress)
    started: Mapping[tuple[str, int], float] = field(default_factory=dict)

    @property
    def stalled_since(self) -> dict[InstanceRef, float]:
        """instance -> when this controller first saw its current stall."""
        return {ref: since for ref, (_, since) in self.stalls.items()}

    def ended_at(self, ref: InstanceRef, now: float) -> float:
        """When this controller first saw the instance end (``now``: not before)."""
        return self.ended.get(ref, now)

    def ran_for(self, ref: InstanceRef) -> float | None:
        """Seconds from its first sighting running to its first sighting ended (None: not
        seen both)."""
        start, end = self.running.get(ref), self.ended.get(ref)
        return end - start if start is not None and end is not None else None

    def assigned_at(self, wid: str, epoch: int, now: float) -> float:
        """When this controller first saw the assignment of ``wid`` at ``epoch``."""
        return self.assigned.get((wid, epoch), now)


def observe(previous: Observations, snapshot: ClusterSnapshot, now: float) -> Observations:
    """``previous`` with this snapshot's sightings added at ``now``; sightings of instances
    and assignments no longer in the snapshot are dropped (linear in reports + assignments)."""
    running: dict[InstanceRef, float] = {}
    ended: dict[InstanceRef, float] = {}
    stalls: dict[InstanceRef, tuple[Stall, float]] = {}
    started: dict[tuple[str, int], float] = {}
    for status in snapshot.statuses.values():
        ref = (status.workload, status.node, status.epoch)
        if status.progressed or (status.stalled is not None
                                 and status.stalled.step is not None):
            instance = (status.workload, status.epoch)
            started[instance] = previous.started.get(instance, started.get(instance, now))
        if status.stalled is not None:
            known = previous.stalls.get(ref)
            same = known is not None and (known[0].rank, known[0].step) == (
                status.stalled.rank, status.stalled.step)
            stalls[ref] = (status.stalled, known[1] if same and known else now)
        seen_running = previous.running.get(ref)
        if seen_running is not None:
            running[ref] = seen_running
        elif status.state in ("running", "stopping"):
            running[ref] = now
        if status.state == "exited":
            ended[ref] = previous.ended.get(ref, now)
    assigned: dict[tuple[str, int], float] = {}
    for wid, assignment in snapshot.assignments.items():
        key = (wid, assignment.epoch)
        assigned[key] = previous.assigned.get(key, now)
        if assignment.phase != "placed":
            continue
        for node in assignment.nodes:
            alive = snapshot.alive.get(node)
            if alive is not None and assignment.epoch <= alive.claimed:
                ref = (wid, node, assignment.epoch)  # its agent is gone: it ended
                ended[ref] = previous.ended.get(ref, now)
    ready: dict[InstanceRef, float] = {}
    ready_stamp: dict[InstanceRef, float | None] = {}
    for wid in snapshot.assignments:
        serving = serving_status(snapshot, wid) if instance_ready(snapshot, wid) else None
        if serving is None:
            continue  # not in rotation: its next period of readiness is seen anew
        ref = (wid, serving.node, serving.epoch)
        stamp = serving.ready_since
        seen_ready = previous.ready.get(ref)
        same_period = seen_ready is not None and previous.ready_stamp.get(ref) == stamp
        ready[ref] = seen_ready if same_period and seen_ready is not None else now
        ready_stamp[ref] = stamp
    return Observations(running, ended, assigned, ready, ready_stamp, stalls, started)


def bounded(current: Assignment, seen: float, policy: RestartPolicy,
            cooldown: float) -> Assignment:
    """``current`` with the times a controller wrote into it bounded by this controller's
    first sighting of it (``seen``): no restart after ``seen``, no exclusion (nor suspect
    node) past ``seen`` + ``restart.window``, no cool-down past ``seen`` + ``cooldown``, no
    backoff past ``seen`` + the longer of ``restart.max_backoff`` and
    ``UNCOUNTED_MAX_BACKOFF``. Times written by this controller are within those bounds
    already (it wrote them when it decided, no later than it saw the result); only those of a
    leader whose clock was ahead are cut. The same object when nothing is cut."""
    timeless = not (current.restart_times or current.failed_on or current.avoid
                    or current.suspects)
    if timeless and current.not_before <= seen:
        return current  # nothing to cut (most assignments: a cheap path for every cycle)
    latest = seen + max(policy.max_backoff, UNCOUNTED_MAX_BACKOFF)
    if timeless and current.not_before <= latest:
        return current
    times = tuple(min(t, seen) for t in current.restart_times)
    failed_on = {n: min(t, seen + policy.window) for n, t in current.failed_on.items()}
    avoid = {n: min(t, seen + cooldown) for n, t in current.avoid.items()}
    suspects = {n: min(t, seen + policy.window) for n, t in current.suspects.items()}
    not_before = min(current.not_before, latest)
    if (times == current.restart_times and failed_on == current.failed_on
            and avoid == current.avoid and not_before == current.not_before
            and suspects == current.suspects):
        return current
    return replace(current, restart_times=times, failed_on=failed_on, avoid=avoid,
                   not_before=not_before, suspects=suspects)
