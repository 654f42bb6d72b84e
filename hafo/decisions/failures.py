"""What happens after a workload fails on a node: restart in place, move, or give up. Pure.

Like Pacemaker's migration-threshold and failure-timeout: a workload that fails (exits
non-zero, fails a check, or hits an application XID) restarts in place, each restart after an
exponential backoff (``restart.backoff`` doubling to ``restart.max_backoff``, none for the
first), up to ``restart.max_restarts`` restarts within ``restart.window``. One more failure
moves it to another node, and the failed node is excluded for ``restart.window`` seconds; the
count starts again on the new node. A workload that has failed on every node that could run
it is ``failed``. Backoff damps flapping; the exclusion list bounds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hafo.model.cluster import Assignment
from hafo.model.exits import failure_subject
from hafo.model.spec import RestartPolicy


@dataclass(frozen=True)
class AfterFailure:
    """The decision for one failure."""

    kind: Literal["restart", "move"]
    restarts: int
    restart_times: tuple[float, ...]
    failed_on: dict[str, float]
    not_before: float
    why: str


def after_failure(current: Assignment, policy: RestartPolicy, node: str, what: str,
                  failed_at: float, now: float, detail: str = "") -> AfterFailure:
    """Decide for ``current`` (placed on ``node``), which failed at ``failed_at`` because of
    ``what`` (e.g. "exited with code 3"); ``detail``: what it said (the last line of its
    stderr, ``hafo.model.exits.stderr_line``), quoted after the node."""
    subject = failure_subject(what, node, detail)
    recent = tuple(t for t in current.restart_times if now - t < policy.window)
    failed_on = {n: t for n, t in current.failed_on.items() if t > now}
    if len(recent) < policy.max_restarts:
        delay = policy.delay(len(recent))
        wait = f" after a {delay:g}s backoff" if delay else ""
        return AfterFailure("restart", current.restarts + 1, (*recent, now), failed_on,
                            failed_at + delay,
                            f"{subject}; restart {len(recent) + 1}/"
                            f"{policy.max_restarts} in place{wait}")
    failed_on[node] = now + policy.window
    return AfterFailure("move", current.restarts + 1, (), failed_on, now,
                        f"{subject}; {len(recent)} restarts within "
                        f"{policy.window:g}s (max {policy.max_restarts}): moving to another "
                        f"node, {node} excluded for {policy.window:g}s")
