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

Which node is suspect, and what a second hang there does (``Assignment.suspects``), is
``suspect_after``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hafo.decisions.failures import AfterFailure, after_failure
from hafo.model.cluster import Assignment, InstanceStatus, Member, Stall
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


def after_hang(current: Assignment, policy: RestartPolicy, node: str, hang: Hang,
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
    why = (f"{after.subject}; the second hang on {node} within {policy.window:g}s: moving to "
           f"another node, {node} excluded for {policy.window:g}s")
    return AfterFailure("move", after.restarts, (), failed_on, now, why, after.subject), suspects
