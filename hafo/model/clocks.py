"""The clocks hafo measures durations on (docs/safety.md, "One clock per decision").

Every duration is measured on one machine's monotonic clock; the wall clock only stamps what
people read (logs, events, displays). Two clocks for the two kinds of record:

- ``since_boot``: seconds since this machine booted (``CLOCK_BOOTTIME``: not stepped by NTP,
  counts a suspend, the same for every process of the machine, so a stamp survives a restart
  of the process that wrote it within one boot; with the boot id beside it, a stamp of
  another boot is recognised as such). ``CLOCK_MONOTONIC`` where the kernel has no boot
  clock.
- ``SteadyClock``: wall-clock seconds as read once, then advanced by the monotonic clock: a
  step of the wall clock afterwards changes nothing. The controller decides by it, so the
  times it writes into assignments (restart windows, exclusions, cool-downs) keep their
  meaning whatever NTP does to its machine meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["SteadyClock", "since_boot"]

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


def since_boot() -> float:
    """Seconds since this machine booted (see the module docstring)."""
    if _BOOTTIME is not None:
        try:
            return time.clock_gettime(_BOOTTIME)
        except OSError:  # a kernel without it
            pass
    return time.monotonic()


class SteadyClock:
    """Wall-clock seconds at the first reading, advanced by ``mono`` from then on. Callable,
    like ``time.time``; ``wall`` and ``mono`` are injected in tests."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic) -> None:
        self._mono = mono
        self._origin = wall() - mono()

    def __call__(self) -> float:
        return self._origin + self._mono()
