"""The state of one application check over its runs. Pure; times are monotonic seconds.

A check is *failing* once ``failure_threshold`` probes in a row failed; one success clears it.
The first probe runs ``initial_delay`` after the instance's checks started (startup grace),
then one every ``interval`` seconds, counted from the start of the previous probe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckState:
    """What the runner remembers about one check of one instance."""

    consecutive_failures: int = 0
    last_detail: str = ""
    failing: bool = False
    runs: int = 0


def observe(state: CheckState, ok: bool, detail: str, threshold: int) -> CheckState:
    """The state after one probe: failing once ``threshold`` (at least 1) failures in a row."""
    runs = state.runs + 1
    if ok:
        return CheckState(consecutive_failures=0, last_detail=detail, failing=False, runs=runs)
    failures = state.consecutive_failures + 1
    return CheckState(consecutive_failures=failures, last_detail=detail,
                      failing=failures >= max(1, threshold), runs=runs)


def next_due(started_at: float, initial_delay: float, interval: float,
             last_run: float | None) -> float:
    """When the next probe is due.

    ``started_at``: when the checks started; ``last_run``: when the previous probe started
    (None before the first). Never before the end of the startup grace; a result in the past
    means "now" (a probe that took longer than ``interval`` is followed at once by the next).
    """
    grace_end = started_at + max(0.0, initial_delay)
    if last_run is None:
        return grace_end
    return max(grace_end, last_run + max(0.0, interval))
