"""When the leader calls the autoscale hook (``autoscale.command`` or ``autoscale.url``). Pure.

The hook is told the demand (``hafo.decisions.demand``) when it is news: when the pending
shapes or the set of removable nodes differ from what the hook last took (a call that
succeeded), and at most once per ``autoscale.interval`` seconds, counted from the start of
the last call, whatever its outcome. Idle times alone are no news (they grow every second).
A call that failed is tried again, with the demand of then, once the interval has passed;
its failure is logged once per change of the demand, not at every try (``HookState``).
Before the first call, the hook is taken to know an empty demand: a leader with nothing
pending and nothing removable calls nobody.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = ["EMPTY", "HookState", "after_call", "due", "started"]

#: What the hook knows before any call: nothing pending, nothing removable.
EMPTY: Any = ((), ())


@dataclass(frozen=True)
class HookState:
    """The caller's memory: the demand the hook last took (``delivered``, a
    ``Demand.key``), when the last call started (None: never) on the deciding controller's
    clock, whether one runs now, and the demand whose failure was last logged."""

    delivered: Any = EMPTY
    last_start: float | None = None
    running: bool = False
    logged_failure: Any = None


def due(state: HookState, key: Any, now: float, interval: float) -> bool:
    """Whether to call the hook now with the demand ``key``: it is news, no call runs, and
    ``interval`` seconds have passed since the last one started."""
    if state.running or key == state.delivered:
        return False
    return state.last_start is None or now - state.last_start >= interval


def started(state: HookState, now: float) -> HookState:
    """A call starts at ``now``."""
    return replace(state, running=True, last_start=now)


def after_call(state: HookState, key: Any, ok: bool) -> tuple[HookState, bool]:
    """The state after a call with ``key`` ended (``ok``: it succeeded), and whether its
    failure is to be logged (the first failure for this demand)."""
    if ok:
        return replace(state, running=False, delivered=key, logged_failure=None), False
    log = state.logged_failure != key
    return replace(state, running=False, logged_failure=key), log
