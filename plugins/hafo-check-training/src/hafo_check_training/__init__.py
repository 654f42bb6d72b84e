"""hafo check type ``training``: is a training job still making progress?

It reads the heartbeat the hafo checkpoint SDK writes (``$HAFO_CHECKPOINT_DIR/heartbeat.json``,
``{"step", "epoch", "t", "pid"}``, see ``hafo.model.progress``) and, per probe:

* ``stall_after``: fails when no new step was reported for that many seconds;
* ``nccl_hang_after``: fails sooner, with "NCCL hang suspected", when no new step was reported
  for that long *and* a process of the workload (``ctx.pid`` or a descendant, all threads)
  spins on a CPU (> ``spin_cpu_percent`` of one core between two probes): the signature of a
  rank stuck in a collective whose peer died, which busy-polls forever;
* ``min_steps_per_minute``: fails when the step rate over the last ``rate_window`` seconds
  falls below it.

None of these fail within ``startup_grace`` seconds (default: ``stall_after``) of the
instance's start. A heartbeat written before the instance started (``t < ctx.started_at``) is
a previous instance's and is ignored. The check keeps state between probes (last step seen,
CPU samples, step history); the factory is called once per workload instance.

Registered as the entry point ``training`` in the group ``hafo.checks``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hafo.checks.api import CheckContext, CheckOptionError, CheckResult
from hafo.model.progress import HEARTBEAT_FILE, Heartbeat, parse_heartbeat

__all__ = ["ProcessCPU", "TrainingCheck", "make_check"]

_OPTIONS = frozenset({
    "stall_after", "startup_grace", "nccl_hang_after", "min_steps_per_minute", "rate_window",
    "spin_cpu_percent", "include_children",
})
_MAX_PROCESSES = 512


def _clk_tck() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


class ProcessCPU:
    """CPU use of a process tree from ``/proc``, measured between two calls of ``sample``.

    A process's ``utime + stime`` in ``/proc/<pid>/stat`` covers all its threads. Processes
    are keyed by (pid, start time) so a reused pid is never compared with its predecessor.
    """

    def __init__(self, proc_root: Path = Path("/proc"),
                 monotonic: Callable[[], float] = time.monotonic,
                 include_children: bool = True) -> None:
        self.proc_root = proc_root
        self.monotonic = monotonic
        self.include_children = include_children
        self._tck = _clk_tck()
        self._prev: dict[tuple[int, int], int] = {}
        self._prev_at: float | None = None

    def _stat(self, pid: int) -> tuple[int, int, int] | None:
        """(ppid, utime+stime ticks, start time) of ``pid``, or None if it is gone."""
        try:
            text = (self.proc_root / str(pid) / "stat").read_text()
            rest = text[text.rindex(")") + 2:].split()
            return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[19])
        except (OSError, ValueError, IndexError):
            return None

    def _children(self, pid: int) -> list[int] | None:
        """Direct children of ``pid`` from ``/proc/<pid>/task/*/children``; None where the
        kernel does not provide those files."""
        found: list[int] = []
        try:
            tasks = list((self.proc_root / str(pid) / "task").iterdir())
        except OSError:
            return []
        for task in tasks:
            try:
                found.extend(int(c) for c in (task / "children").read_text().split())
            except FileNotFoundError:
                if not task.exists():
                    continue  # the thread ended meanwhile
                return None
            except (OSError, ValueError):
                continue
        return found

    def _scan_children(self) -> dict[int, list[int]]:
        """ppid -> children for every process (fallback without ``children`` files)."""
        tree: dict[int, list[int]] = {}
        for entry in self.proc_root.iterdir():
            if entry.name.isdigit():
                stat = self._stat(int(entry.name))
                if stat is not None:
                    tree.setdefault(stat[0], []).append(int(entry.name))
        return tree

    def tree(self, pid: int) -> list[int]:
        """``pid`` and (with ``include_children``) its descendants."""
        pids = [pid]
        if not self.include_children:
            return pids
        scanned: dict[int, list[int]] | None = None
        i = 0
        while i < len(pids) and len(pids) < _MAX_PROCESSES:
            kids = self._children(pids[i]) if scanned is None else scanned.get(pids[i], [])
            if kids is None:
                scanned = self._scan_children()
                kids = scanned.get(pids[i], [])
            pids.extend(k for k in kids if k not in pids)
            i += 1
        return pids[:_MAX_PROCESSES]

    def sample(self, pid: int) -> tuple[float, int] | None:
        """The busiest process of ``pid``'s tree since the previous call: (percent of one
        core, its pid); None on the first call, or when no process was seen in both."""
        now = self.monotonic()
        current: dict[tuple[int, int], int] = {}
        for p in self.tree(pid):
            stat = self._stat(p)
            if stat is not None:
                current[(p, stat[2])] = stat[1]
        prev, prev_at = self._prev, self._prev_at
        self._prev, self._prev_at = current, now
        if prev_at is None or now <= prev_at:
            return None
        elapsed = now - prev_at
        best: tuple[float, int] | None = None
        for key, ticks in current.items():
            if key in prev:
                percent = 100.0 * (ticks - prev[key]) / self._tck / elapsed
                if best is None or percent > best[0]:
                    best = (percent, key[0])
        return best


class TrainingCheck:
    """A configured ``training`` check (see the module docstring).

    ``clock`` is wall-clock time (the heartbeat's ``t`` and ``ctx.started_at`` use it); tests
    inject it, and may inject ``cpu`` (a ``ProcessCPU``) too.
    """

    def __init__(self, stall_after: float, startup_grace: float | None = None,
                 nccl_hang_after: float | None = None,
                 min_steps_per_minute: float | None = None, rate_window: float = 300.0,
                 spin_cpu_percent: float = 50.0, include_children: bool = True, *,
                 clock: Callable[[], float] = time.time, cpu: ProcessCPU | None = None) -> None:
        self.stall_after = stall_after
        self.startup_grace = stall_after if startup_grace is None else startup_grace
        self.nccl_hang_after = nccl_hang_after
        self.min_steps_per_minute = min_steps_per_minute
        self.rate_window = rate_window
        self.spin_cpu_percent = spin_cpu_percent
        self.clock = clock
        self.cpu = cpu if cpu is not None else ProcessCPU(include_children=include_children)
        self._lock = threading.Lock()
        self._first_probe: float | None = None
        self._step: int | None = None
        self._progress_t: float | None = None  # when the current step was first reported
        self._samples: deque[tuple[float, int]] = deque()  # (t, step) of distinct heartbeats

    def probe(self, ctx: CheckContext) -> CheckResult:
        """Read the heartbeat and judge progress (runs in a thread: it reads files)."""
        if not self._lock.acquire(blocking=False):
            return CheckResult(False, "the previous probe is still running "
                                      "(is the checkpoint directory responsive?)")
        try:
            return self._probe(ctx)
        finally:
            self._lock.release()

    def _read(self, ctx: CheckContext, started: float) -> Heartbeat | str | None:
        path = ctx.checkpoint_dir / HEARTBEAT_FILE
        try:
            beat = parse_heartbeat(path.read_text(errors="replace"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot read {path}: {exc.strerror or exc}"
        if beat is None:
            return None
        if ctx.started_at is not None:
            return beat if beat.t >= started else None
        return beat if beat.epoch >= ctx.epoch else None

    def _observe(self, beat: Heartbeat, now: float) -> None:
        if self._step is not None and beat.step < self._step:  # went back: forget the history
            self._samples.clear()
            self._step = None
        if beat.step != self._step:
            self._step, self._progress_t = beat.step, beat.t
        if not self._samples or beat.t > self._samples[-1][0]:
            self._samples.append((beat.t, beat.step))
        # keep the newest sample at least a window old (the rate's baseline) and all after it
        while len(self._samples) >= 2 and self._samples[1][0] <= now - self.rate_window:
            self._samples.popleft()

    def _rate(self, now: float) -> float | None:
        """Steps per minute from the baseline sample (>= one window old) to now."""
        if self._step is None or not self._samples:
            return None
        t0, step0 = self._samples[0]
        if now - t0 < self.rate_window:
            return None
        return (self._step - step0) * 60.0 / (now - t0)

    def _probe(self, ctx: CheckContext) -> CheckResult:
        now = self.clock()
        if self._first_probe is None:
            self._first_probe = now
        started = ctx.started_at if ctx.started_at is not None else self._first_probe
        beat = self._read(ctx, started)
        if isinstance(beat, str):
            return CheckResult(False, beat)
        if beat is not None:
            self._observe(beat, now)
        cpu = None
        if self.nccl_hang_after is not None and ctx.pid is not None:
            cpu = self.cpu.sample(ctx.pid)

        if self._progress_t is None:
            age, what = now - started, "no heartbeat since start"
        else:
            age, what = now - max(self._progress_t, started), f"last step {self._step}"
        rate = self._rate(now) if self.min_steps_per_minute is not None else None
        notes = [f"{what}, {max(age, 0.0):.0f}s ago"]
        if rate is not None:
            notes.append(f"{rate:.1f} steps/min")
        if cpu is not None:
            notes.append(f"cpu {cpu[0]:.0f}%")

        left = self.startup_grace - (now - started)
        if left > 0:
            return CheckResult(True, "; ".join([*notes, f"startup grace {left:.0f}s left"]))
        if (self.nccl_hang_after is not None and cpu is not None and age > self.nccl_hang_after
                and cpu[0] > self.spin_cpu_percent):
            who = "" if cpu[1] == ctx.pid else f" (pid {cpu[1]})"
            return CheckResult(False, f"NCCL hang suspected: no step for {age:.0f}s while the "
                                      f"process spins at {cpu[0]:.0f}% CPU{who}")
        if age > self.stall_after:
            return CheckResult(False, f"stalled: no new step for {age:.0f}s ({what}; "
                                      f"stall_after {self.stall_after:g}s)")
        if (self.min_steps_per_minute is not None and rate is not None
                and rate < self.min_steps_per_minute):
            return CheckResult(False, f"slow: {rate:.1f} steps/min over the last "
                                      f"{self.rate_window:g}s < min_steps_per_minute "
                                      f"{self.min_steps_per_minute:g}")
        return CheckResult(True, "; ".join(notes))


def _number(options: Mapping[str, Any], key: str, *, required: bool = False,
            allow_zero: bool = False) -> float | None:
    value = options.get(key)
    if value is None:
        if required:
            raise CheckOptionError(key, "is required (seconds)")
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
        bound = ">= 0" if allow_zero else "> 0"
        raise CheckOptionError(key, f"must be a number {bound}, got {value!r}")
    return float(value)


def make_check(options: Mapping[str, Any]) -> TrainingCheck:
    """The ``training`` check factory: validate ``options`` and build the check.

    Raises ``CheckOptionError`` naming the first bad option.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise CheckOptionError(unknown[0], f"unknown option (known: {', '.join(sorted(_OPTIONS))})")
    stall_after = _number(options, "stall_after", required=True)
    assert stall_after is not None
    include_children = options.get("include_children", True)
    if not isinstance(include_children, bool):
        raise CheckOptionError("include_children", "must be true or false")
    return TrainingCheck(
        stall_after=stall_after,
        startup_grace=_number(options, "startup_grace", allow_zero=True),
        nccl_hang_after=_number(options, "nccl_hang_after"),
        min_steps_per_minute=_number(options, "min_steps_per_minute"),
        rate_window=_number(options, "rate_window") or 300.0,
        spin_cpu_percent=_number(options, "spin_cpu_percent") or 50.0,
        include_children=include_children,
    )
