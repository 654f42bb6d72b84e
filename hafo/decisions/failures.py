"""What happens after a workload fails on a node: restart in place, move, or give up. Pure.

Like Pacemaker's migration-threshold and failure-timeout: a workload that fails (exits
non-zero, fails a check, or hits an application XID) restarts in place, each restart after an
exponential backoff (``restart.backoff`` doubling to ``restart.max_backoff``, none for the
first), up to ``restart.max_restarts`` restarts within ``restart.window``. One more failure
moves it to another node, and the failed node is excluded for ``restart.window`` seconds; the
count starts again on the new node. A workload that has failed on every node that could run
it is ``failed``. Backoff damps flapping; the exclusion list bounds it.

A restart the infrastructure caused (fencing, a lost guard, a node claimed anew) is not
counted, but it backs off too (``uncounted_backoff``): the first of a row is immediate, each
further one of instances that ran less than ``QUICK_RUN`` waits ``UNCOUNTED_BACKOFF`` doubling
to ``UNCOUNTED_MAX_BACKOFF``, so no fault outside the workload restarts it at more than one
instance per 30 s for long. Every backoff is timed from when the deciding controller saw the
failure (``hafo.decisions.observed``), never from the agent's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hafo.model.cluster import Assignment
from hafo.model.exits import failure_subject
from hafo.model.spec import RestartPolicy

#: An instance that ran at least this long (as the deciding controller saw it) ends a row of
#: uncounted restarts.
QUICK_RUN = 60.0
UNCOUNTED_BACKOFF = 1.0
UNCOUNTED_MAX_BACKOFF = 30.0


def uncounted_backoff(streak: int, ran_for: float | None) -> tuple[int, float]:
    """For an uncounted restart: (the row's length once it is done, seconds to wait from the
    end's sighting). ``streak``: uncounted restarts in a row so far (``quick_restarts``);
    ``ran_for``: how long the ended instance ran (None: not seen running by this controller,
    taken as quick)."""
    if ran_for is not None and ran_for >= QUICK_RUN:
        streak = 0
    if streak <= 0:
        return 1, 0.0
    return streak + 1, float(min(UNCOUNTED_BACKOFF * 2 ** (streak - 1), UNCOUNTED_MAX_BACKOFF))


@dataclass(frozen=True)
class AfterFailure:
    """The decision for one failure: ``subject`` says what failed, where, and what it said
    (``exited with code 1 on n1: ...``), ``why`` that and what follows from it."""

    kind: Literal["restart", "move"]
    restarts: int
    restart_times: tuple[float, ...]
    failed_on: dict[str, float]
    not_before: float
    why: str
    subject: str = ""


def after_failure(current: Assignment, policy: RestartPolicy, node: str, what: str,
                  failed_at: float, now: float, detail: str = "") -> AfterFailure:
    """Decide for ``current`` (placed on ``node``), which failed at ``failed_at`` because of
    ``what`` (e.g. "exited with code 3"); ``detail``: what it said (the last line of its
    stderr, ``hafo.model.exits.stderr_line``), quoted after the node. ``failed_at`` and
    ``now`` are the deciding controller's clock (``failed_at``: when it saw the failure)."""
    subject = failure_subject(what, node, detail)
    recent = tuple(t for t in current.restart_times if now - t < policy.window)
    failed_on = {n: t for n, t in current.failed_on.items() if t > now}
    if len(recent) < policy.max_restarts:
        delay = policy.delay(len(recent))
        wait = f" after a {delay:g}s backoff" if delay else ""
        return AfterFailure("restart", current.restarts + 1, (*recent, now), failed_on,
                            failed_at + delay,
                            f"{subject}; restart {len(recent) + 1}/"
                            f"{policy.max_restarts} in place{wait}", subject)
    failed_on[node] = now + policy.window
    return AfterFailure("move", current.restarts + 1, (), failed_on, now,
                        f"{subject}; {len(recent)} restarts within "
                        f"{policy.window:g}s (max {policy.max_restarts}): moving to another "
                        f"node, {node} excluded for {policy.window:g}s", subject)
