"""Which rank of a hung workload stalled first (``hang_timeout``;
docs/reference/workloads.md, "Hang detection"). Pure.

Each agent reports a running instance whose oldest rank made no progress for the spec's
``hang_timeout`` (``InstanceStatus.stalled``, ``hafo.agent.progress_watch``). In a gang that
trains in lockstep one stuck rank stops every rank within a step: the others wait for it in
the next collective. So once one member reports a stall, the controller waits for the other
members' reports, at most ``HANG_SETTLE`` seconds from its first sighting (a member that does
not stall by then progresses: the one that did is hung on its own), then names the rank whose
progress is oldest, as NCCL's flight recorder would:

1. the lowest last step (a rank that reports before its step's collectives, as the SDK's
   ``heartbeat`` asks, and never reached them is behind the ones that wait in them);
2. then a rank whose process is stopped (SIGSTOP, a debugger) over one that runs;
3. then the earliest onset: when the controller first saw the report less how long the agent
   said it had stalled (one clock: the controller's; the agents' delays only shift it by
   their sampling period);
4. then the lowest rank, so every controller decides alike.

A gang none of whose members has reported progress yet (``InstanceStatus.progressed``, or a
step in a stall) is still starting (imports, rendezvous, a checkpoint load): not judged. Once
one has, a member that never reported any is the oldest (it never reached the first step the
others did). A single workload is likewise hung only once it reported progress.

A straggler (``straggler_lag``, gangs only): every member reports its slowest rank's own time
per step outside the collectives (``InstanceStatus.pace``: the median of recent steps, from
the SDK's ``synced()`` to its next ``heartbeat``). In lockstep training every rank makes the
same number of steps, so a slow rank shows only there: its own work is longer, and the others
wait for it in the collectives. A member whose pace exceeds the median of the others' by more
than the lag is named and handled as a hang (``find_straggler``).

Which node is suspect, and what a second hang or straggler there does
(``Assignment.suspects``), is ``suspect_after``'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hafo.decisions.failures import AfterFailure, after_failure
from hafo.model.cluster import Assignment, InstanceStatus, Member, Pace, Stall
from hafo.model.progress import Heartbeat
from hafo.model.spec import RestartPolicy

#: Seconds after the first sighting of a gang member's stall that the controller waits for
#: the other members' reports before it names the rank.
HANG_SETTLE = 1.0

#: An instance: (workload, node, epoch).
InstanceRef = tuple[str, str, int]


@dataclass(frozen=True)
class Hang:
    """The verdict: the member whose rank stalled first, its stall, and how many of the
    gang's members had stalled."""

    member: Member
    stall: Stall
    stalled_members: int
    members: int

    kind = "hang"

    @property
    def what(self) -> str:
        """``member 1 hung`` (the node follows it: ``hafo.model.exits.failure_subject``)."""
        return f"member {self.member.rank} hung" if self.members > 1 else "hung"

    @property
    def detail(self) -> str:
        """``rank 1 made no progress for 10.2s since step 41 (2 of 3 members stalled)``."""
        others = f" ({self.stalled_members} of {self.members} members stalled)" \
            if self.members > 1 else ""
        return f"{self.stall.describe()}{others}"


#: A rank's progress as an agent tracks it: its last heartbeat, and when (the agent's
#: monotonic clock) it last changed.
RankProgress = tuple[Heartbeat, float]


def oldest_stall(ranks: Mapping[int, RankProgress], first_seen: float, now: float,
                 hang_timeout: float) -> tuple[Stall, int | None] | None:
    """An agent's verdict on one instance: its stall, if its oldest rank (the earliest last
    change, then the lowest step) made no progress for ``hang_timeout`` (or, no rank having
    reported, the instance ran that long since ``first_seen``), with the pid to look at for
    ``Stall.stopped`` (left False here: reading ``/proc`` is the agent's); None if it
    progresses."""
    if not ranks:
        idle = now - first_seen
        if idle < hang_timeout:
            return None
        return Stall(rank=None, step=None, stalled_for=round(idle, 1)), None
    rank, (beat, changed) = min(ranks.items(), key=lambda item: (item[1][1], item[1][0].step))
    idle = now - changed
    if idle < hang_timeout:
        return None
    return Stall(rank=rank, step=beat.step, stalled_for=round(idle, 1)), beat.pid


def slowest_pace(ranks: Mapping[int, RankProgress], known: Pace | None,
                 quantum: float) -> Pace | None:
    """The slowest rank's own time per step, as an agent reports it: ``known`` (the last
    report) until it moved by ``quantum`` or another rank became the slowest; None before
    any heartbeat carries one."""
    timed = [(beat.compute, rank) for rank, (beat, _) in ranks.items()
             if beat.compute is not None]
    if not timed:
        return known
    compute, rank = max(timed)
    if known is None or known.rank != rank or abs(known.compute - compute) >= quantum:
        return Pace(rank=rank, compute=round(compute, 3))
    return known


def find_hang(members: Sequence[tuple[Member, InstanceStatus | None]],
              seen: Mapping[InstanceRef, float], now: float,
              started_at: float | None = None) -> Hang | None:
    """The hang among ``members`` (each with its current epoch's report, or None) at ``now``,
    or None (no stall; still starting; waiting for the other members' reports). ``seen``:
    when this controller first saw each instance's current stall (not there: ``now``);
    ``started_at``: when it first saw the instance past its start-up (None: ``now``): the
    wait for the other members' reports runs from the later of the two, so a member still
    starting when another made its first step gets the same time to make it."""
    stalled = [(m, s, s.stalled) for m, s in members
               if s is not None and s.state == "running" and s.stalled is not None]
    started = any(s is not None and s.progressed for _, s in members) or any(
        stall.step is not None for _, _, stall in stalled)
    if not stalled or not started:
        return None

    def sighting(status: InstanceStatus) -> float:
        return seen.get((status.workload, status.node, status.epoch), now)

    first = max(min(sighting(s) for _, s, _ in stalled),
                now if started_at is None else started_at)
    if len(stalled) < len(members) and now - first < HANG_SETTLE:
        return None

    def order(item: tuple[Member, InstanceStatus, Stall]) -> tuple[int, bool, float, int]:
        member, status, stall = item
        step = stall.step if stall.step is not None else -1
        return (step, not stall.stopped, sighting(status) - stall.stalled_for, member.rank)

    member, _, stall = min(stalled, key=order)
    return Hang(member=member, stall=stall, stalled_members=len(stalled), members=len(members))


def suspect_after(suspects: Mapping[str, float], node: str, now: float,
                  window: float) -> tuple[bool, dict[str, float]]:
    """After a hang blamed on ``node``: (whether it is a repeat offender, so its member
    moves elsewhere, and the suspects the assignment keeps). A node stays suspect for
    ``window`` seconds (``restart.window``) after a hang blamed on it; suspects whose time
    passed are dropped."""
    kept = {n: t for n, t in suspects.items() if t > now}
    repeat = node in kept
    kept[node] = now + window
    return repeat, kept


class Verdict(Protocol):
    """A hang or a straggler: what failed (``member 1 hung``), how, and its kind."""

    @property
    def kind(self) -> str: ...

    @property
    def what(self) -> str: ...

    @property
    def detail(self) -> str: ...


@dataclass(frozen=True)
class Straggler:
    """The member whose slowest rank works longest per step outside the collectives, by more
    than ``straggler_lag`` over the other members' median."""

    member: Member
    pace: Pace
    others: float
    lag: float
    kind = "straggler"

    @property
    def what(self) -> str:
        """``member 1 straggles``."""
        return f"member {self.member.rank} straggles"

    @property
    def detail(self) -> str:
        """``rank 1 works 0.62s per step outside the collectives, 0.51s more than the other
        members (median 0.11s; straggler_lag 0.3s)``."""
        return (f"rank {self.pace.rank} works {self.pace.compute:.2f}s per step outside the "
                f"collectives, {self.pace.compute - self.others:.2f}s more than the other "
                f"members (median {self.others:.2f}s; straggler_lag {self.lag:g}s)")


def find_straggler(members: Sequence[tuple[Member, InstanceStatus | None]],
                   lag: float) -> Straggler | None:
    """The straggler among a gang's running ``members`` (each with its current epoch's
    report), or None: once every member reported its pace, the one whose own time per step
    exceeds the median of the others' by more than ``lag`` (the largest excess; then the
    lowest rank). The pace is a median over recent steps, so one slow step or a checkpoint
    save every few steps is no straggler."""
    paces = [(m, s.pace) for m, s in members
             if s is not None and s.state == "running" and s.pace is not None]
    if len(paces) < 2 or len(paces) < len(members):
        return None
    best: Straggler | None = None
    for i, (member, pace) in enumerate(paces):
        others = statistics.median(p.compute for j, (_, p) in enumerate(paces) if j != i)
        excess = pace.compute - others
        if excess > lag and (best is None or excess > best.pace.compute - best.others):
            best = Straggler(member=member, pace=pace, others=others, lag=lag)
    return best


def after_hang(current: Assignment, policy: RestartPolicy, node: str, hang: Verdict,
               now: float) -> tuple[AfterFailure, dict[str, float]]:
    """The decision after ``hang``, blamed on ``node``, and the suspects the assignment
    keeps: counted like any failure (``hafo.decisions.failures.after_failure``), and a repeat
    offender (another hang blamed on it within ``restart.window``) leaves its node at once,
    which is excluded for the window."""
    repeat, suspects = suspect_after(current.suspects, node, now, policy.window)
    after = after_failure(current, policy, node, hang.what, now, now, detail=hang.detail)
    if not repeat or after.kind == "move":
        return after, suspects
    failed_on = {**after.failed_on, node: now + policy.window}
    again = f"the second hang on {node} within {policy.window:g}s" if hang.kind == "hang" \
        else f"{node} was suspect already (a hang or straggler within {policy.window:g}s)"
    why = (f"{after.subject}; {again}: moving to another node, {node} excluded for "
           f"{policy.window:g}s")
    return AfterFailure("move", after.restarts, (), failed_on, now, why, after.subject), suspects
