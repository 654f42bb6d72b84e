"""When a gang runs its pre-flight, and what its reports decide (docs/reference/gangs.md,
"Pre-flight"). Pure.

The spec's ``preflight`` asks for a short collective test among a gang's members before their
command starts (``hafo.agent.preflight``; the verdict on the figures is
``hafo.decisions.preflight.judge``). It runs on a new set of nodes: the gang's first
placement, and any placement whose nodes are not the previous epoch's (a member replaced);
a restart in place on the same nodes skips it. A ``warm`` gang runs it at its first
placement only: its survivors are handed the next epoch in the same process, which runs no
pre-flight, so the members of a later epoch could not all take part.

When a member's report blames ranks (they did not join, failed, or were much slower than
the others; every member judges the same figures, so the first report seen decides), the
gang is stopped and those members are replaced, their nodes excluded for
``restart.window``; the restart is not counted (the nodes failed, not the workload).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hafo.model.cluster import Assignment, InstanceStatus, Member
from hafo.model.spec import WorkloadSpec


def needs_preflight(spec: WorkloadSpec, previous: Assignment | None,
                    members: Sequence[Member]) -> bool:
    """Whether a gang placed on ``members`` (after ``previous``, its assignment until now,
    None for its first) runs the spec's pre-flight before its command."""
    if spec.preflight is None or len(members) < 2:
        return False
    if previous is None:
        return True
    if spec.warm:
        return False
    if not previous.members:
        return True
    return {m.node for m in members} != {m.node for m in previous.members}


@dataclass(frozen=True)
class PreflightBlame:
    """The members a gang's pre-flight blamed, and why (the report's sentence)."""

    members: tuple[Member, ...]
    why: str

    @property
    def nodes(self) -> tuple[str, ...]:
        """The blamed members' nodes."""
        return tuple(m.node for m in self.members)

    def describe(self) -> str:
        """``pre-flight failed: rank 1's probe took ...; replacing member 1 (on n2)``."""
        which = ", ".join(f"{m.rank} (on {m.node})" for m in self.members)
        plural = "s" if len(self.members) > 1 else ""
        return f"pre-flight failed: {self.why}; replacing member{plural} {which}"


def preflight_blame(statuses: Sequence[tuple[Member, InstanceStatus | None]]
                    ) -> PreflightBlame | None:
    """The members blamed by the first (lowest rank's) failed pre-flight report among a gang
    epoch's ``statuses`` that names ranks of this gang, or None."""
    by_rank = {m.rank: m for m, _ in statuses}
    for _member, status in sorted(statuses, key=lambda ms: ms[0].rank):
        report = status.preflight if status is not None else None
        if report is None or report.passed:
            continue
        blamed = tuple(by_rank[r] for r in sorted(set(report.blamed)) if r in by_rank)
        if blamed:
            return PreflightBlame(blamed, report.why or "no reason given")
    return None
