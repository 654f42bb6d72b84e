"""Node-wide OS health probes: checkpoint filesystem, memory pressure, clock, event-loop lag,
and (given one) the agent's state directory (``hafo.agent.environment.StateDirFaults``).

``OsProbe.findings()`` is blocking (statvfs, a small fsync'ed write, /proc reads); the agent
runs it in a thread every health cycle. It returns a ``Finding`` only when a threshold of the
``HealthConfig`` is crossed. Each sub-probe is guarded: an unexpected error is logged once per
distinct error and skipped, so one broken probe never hides the others nor raises.

``LoopLagMonitor`` runs on the agent's event loop and measures how late its own wake-ups are;
the agent feeds the result to ``OsProbe.set_loop_lag``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path

import structlog

from hafo.model.health import (
    CLOCK_JUMP,
    CLOCK_STEP,
    DISK_FULL,
    DISK_READONLY,
    LOOP_LAG,
    MEMORY_PRESSURE,
    Finding,
)
from hafo.model.health_config import HealthConfig

log = structlog.get_logger("hafo.checks")

_MIB = 1024 * 1024
# Errors of the write probe that mean "checkpoints cannot be written here".
_UNWRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.ENOSPC, errno.EIO, errno.EDQUOT})

# The wall clock is unusable (finding ``clock_jump``, which drains the node) only on evidence:
# CLOCK_STEPS steps over ``health.clock_jump`` within CLOCK_WINDOW seconds of the monotonic
# clock, or, over at least CLOCK_RATE_SPAN seconds, a rate off the monotonic clock's by more
# than CLOCK_RATE (NTP slews by 0.05 % at most). One step (an NTP step, a VM resumed) is
# reported (``clock_step``: logged, no action): no decision reads the wall clock. A step
# that puts the clock back where it was before the window's first step (within
# ``health.clock_jump``) is a correction, reported but not counted: a clock set wrong and
# set right again is usable (a real step +5 min, -10 min and back drained every node:
# tests/integration/test_clock_step.py); one that keeps flipping between two times still
# counts every step away.
CLOCK_STEPS = 3
CLOCK_WINDOW = 600.0
CLOCK_RATE = 0.01
CLOCK_RATE_SPAN = 60.0


def write_probe(root: Path) -> None:
    """Write, fsync and remove a small file in ``root`` (OSError if the filesystem refuses).
    Its name is unique to this probe: the directory may be shared by many nodes, whose agents
    may well have the same pid (every machine numbers its processes from 1)."""
    probe = root / f".hafo-probe-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"hafo")
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


class OsProbe:
    """Probes the agent's machine; see the module docstring."""

    def __init__(self, checkpoint_root: Path, config: HealthConfig,
                 proc_root: Path = Path("/proc"), wall: Callable[[], float] = time.time,
                 mono: Callable[[], float] = time.monotonic,
                 state_dir: Callable[[], list[Finding]] | None = None) -> None:
        self.state_dir = state_dir
        self.checkpoint_root = Path(checkpoint_root)
        self.config = config
        self.proc_root = Path(proc_root)
        self._wall = wall
        self._mono = mono
        self._lock = threading.Lock()
        self._last_clock: tuple[float, float] | None = None
        # (mono, step, the offset wall - mono before it, counted) within the window
        self._steps: deque[tuple[float, float, float, bool]] = deque()
        self._drift: deque[tuple[float, float]] = deque()  # (mono, drift) under the threshold
        self._loop_lag = 0.0
        self._logged: set[str] = set()

    def set_loop_lag(self, seconds: float) -> None:
        """Record the event loop's recent lag (called from the agent's loop; thread-safe)."""
        with self._lock:
            self._loop_lag = float(seconds)

    def findings(self) -> list[Finding]:
        """Run every sub-probe and return the findings over threshold (never raises)."""
        out: list[Finding] = []
        for name, probe in (("clock", self._clock), ("disk", self._disk),
                            ("memory", self._memory), ("loop", self._loop),
                            ("state_dir", self._state_dir)):
            try:
                out.extend(probe())
            except Exception as exc:  # guarded: log once, skip this probe
                self._log_once(name, exc)
        return out

    def _log_once(self, probe: str, exc: BaseException) -> None:
        key = f"{probe}:{type(exc).__name__}:{exc}"
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning("os probe failed", probe=probe, error=str(exc), error_type=type(exc).__name__)

    # -- sub-probes ---------------------------------------------------------------------------

    def _state_dir(self) -> list[Finding]:
        return self.state_dir() if self.state_dir is not None else []

    def _clock(self) -> list[Finding]:
        """The wall clock against the monotonic clock since the last poll: a step is
        reported (``clock_step``), an unusable clock found (``clock_jump``: see
        ``CLOCK_STEPS``)."""
        now = (self._wall(), self._mono())
        with self._lock:
            last, self._last_clock = self._last_clock, now
            if last is None:
                return []
            mono = now[1]
            jump = (now[0] - last[0]) - (now[1] - last[1])
            stepped = abs(jump) > self.config.clock_jump
            for window in (self._steps, self._drift):
                while window and window[0][0] < mono - CLOCK_WINDOW:
                    window.popleft()
            correction = False
            if stepped:
                before = last[0] - last[1]
                baseline = self._steps[0][2] if self._steps else before
                correction = abs(before + jump - baseline) <= self.config.clock_jump
                self._steps.append((mono, jump, before, not correction))
            else:
                self._drift.append((mono, jump))
            steps = sum(counted for *_, counted in self._steps)
            span = mono - self._drift[0][0] if self._drift else 0.0
            drift = sum(d for _, d in self._drift)
            last_step = self._steps[-1][1] if self._steps else jump
        if steps >= CLOCK_STEPS:
            return [Finding(CLOCK_JUMP, value=round(last_step, 3),
                            detail=f"wall clock vs monotonic clock: {steps} steps over "
                            f"{self.config.clock_jump:g}s within {CLOCK_WINDOW:g}s")]
        if span >= CLOCK_RATE_SPAN and abs(drift) > CLOCK_RATE * span:
            return [Finding(CLOCK_JUMP, value=round(drift, 3),
                            detail=f"wall clock vs monotonic clock: {drift:+.1f}s off in "
                            f"{span:.0f}s (more than {CLOCK_RATE:.0%})")]
        if stepped:
            log.warning("wall clock stepped", seconds=round(jump, 3),
                        detail="no decision reads the wall clock; log timestamps only",
                        **({"back": True} if correction else {}))
            return [Finding(CLOCK_STEP, value=round(jump, 3),
                            detail="wall clock vs monotonic clock" + (
                                ": back where it was" if correction else ""))]
        return []

    def _disk(self) -> list[Finding]:
        root = self.checkpoint_root
        if not root.is_dir():
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                return [Finding(DISK_READONLY, detail=f"cannot create {root}: {exc}")]
        st = os.statvfs(root)
        out: list[Finding] = []
        free_mib = st.f_bavail * st.f_frsize / _MIB
        if free_mib < self.config.min_free_mib:
            free = round(free_mib, 1)
            out.append(Finding(DISK_FULL, value=free, detail=f"{root}: {free:g} MiB free of "
                               f"{self.config.min_free_mib:g} MiB required"))
        if st.f_flag & os.ST_RDONLY:
            out.append(Finding(DISK_READONLY, detail=f"{root} mounted read-only"))
            return out
        try:
            write_probe(root)
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise
            out.append(Finding(DISK_READONLY, detail=f"write probe in {root}: {exc}"))
        return out

    def _memory(self) -> list[Finding]:
        avg10 = self._psi_some_avg10()
        if avg10 is not None:
            if avg10 > self.config.memory_psi_avg10:
                return [Finding(MEMORY_PRESSURE, value=avg10, detail="PSI some avg10")]
            return []
        fields: dict[str, int] = {}
        for line in (self.proc_root / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                fields[key] = int(rest.split()[0])
        if "MemAvailable" not in fields or not fields.get("MemTotal"):
            raise ValueError("meminfo lacks MemTotal/MemAvailable")
        pct = fields["MemAvailable"] / fields["MemTotal"] * 100
        if pct < self.config.min_mem_available_pct:
            return [Finding(MEMORY_PRESSURE, value=round(pct, 2), detail="MemAvailable")]
        return []

    def _psi_some_avg10(self) -> float | None:
        """PSI memory ``some avg10``, or None when PSI is absent, disabled or unparsable."""
        try:
            text = (self.proc_root / "pressure" / "memory").read_text()
        except OSError:  # no PSI (old kernel, psi=0: EOPNOTSUPP): fall back to meminfo
            return None
        for line in text.splitlines():
            kind, *pairs = line.split()
            if kind == "some":
                for pair in pairs:
                    name, _, value = pair.partition("=")
                    if name == "avg10":
                        try:
                            return float(value)
                        except ValueError:
                            return None
        return None

    def _loop(self) -> list[Finding]:
        with self._lock:
            lag = self._loop_lag
        if lag > self.config.loop_lag:
            return [Finding(LOOP_LAG, value=round(lag, 3), detail="agent event loop")]
        return []


class LoopLagMonitor:
    """Measures the running event loop's lag: how late each periodic wake-up is.

    ``on_lag`` receives the *maximum* lag seen over the last ``window`` seconds (not just the
    latest), so a single stall stays visible to the next few health polls.
    """

    def __init__(self, window: float = 10.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, float]] = deque()

    @property
    def max_recent(self) -> float:
        """The largest lag (seconds) in the window as of the last measurement; 0.0 if none."""
        return max((lag for _, lag in self._samples), default=0.0)

    async def run(self, on_lag: Callable[[float], None], period: float = 0.5) -> None:
        """Sleep ``period`` repeatedly, forever (cancel the task to stop); after each wake-up
        call ``on_lag(max_recent)``. ``on_lag`` must be cheap and must not raise."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + period
            await asyncio.sleep(period)
            now = loop.time()
            self._samples.append((now, max(0.0, now - due)))
            while self._samples and self._samples[0][0] < now - self.window:
                self._samples.popleft()
            on_lag(self.max_recent)
