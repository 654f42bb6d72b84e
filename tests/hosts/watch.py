"""Where every workload instance runs, seen from the host: the machines' processes are the
host's processes too (nested PID namespaces), so one thread reads /proc every 50 ms and maps
each workload process (by its ``HAFO_WORKLOAD``/``HAFO_EPOCH``/``HAFO_NODE`` environment) to
its machine by PID namespace. Start times come from /proc/PID/stat (CLOCK_BOOTTIME ticks of
the one kernel all machines share): exact, whatever the polling.

Two copies of a workload alive at once is recorded as an overlap when either (a) one scan sees
both, or (b) an instance started before the last time its predecessor (on any machine) was
seen alive. Nothing is ever signalled from here: it only reads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def boottime() -> float:
    """Now, on the clock /proc's start times use."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class Instance:
    """One workload process (the workload itself, not its guard) as seen from the host."""

    workload: str
    epoch: int
    node: str
    machine: str
    pid: int  # the host's pid
    started: float  # CLOCK_BOOTTIME seconds
    last_seen: float
    ended: bool = False


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key.startswith(b"HAFO_"):
            env[key.decode()] = value.decode(errors="replace")
    return env


def _started(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19]) / TICKS


@dataclass
class Watcher:
    """Scans /proc for processes named ``comm`` in the given machines' PID namespaces."""

    namespaces: Callable[[], Mapping[int, str]]  # pid-namespace inode -> machine name
    comm: str = "sleep"
    interval: float = 0.05
    instances: dict[tuple[str, str, int], Instance] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)
    #: Scans that raised (the last few): a scan that fails is retried at the next interval,
    #: and a wait that times out says so (the thread never dies silently).
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start scanning in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="instance-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scanning."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception as exc:  # any failure of one scan: say it, scan again
                with self._lock:
                    self.errors = [*self.errors[-4:], f"{type(exc).__name__}: {exc}"]
            self._stop.wait(self.interval)

    def scan(self) -> None:
        """One pass over /proc."""
        machines = self.namespaces()
        now = boottime()
        seen: set[tuple[str, str, int]] = set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != self.comm:
                    continue
                machine = machines.get(os.stat(f"/proc/{pid}/ns/pid").st_ino)
            except OSError:
                continue
            if machine is None:
                continue
            env = _environ(pid)
            if not env or "HAFO_WORKLOAD" not in env:
                continue
            key = (machine, env["HAFO_WORKLOAD"], pid)
            seen.add(key)
            with self._lock:
                known = self.instances.get(key)
                if known is None:
                    started = _started(pid)
                    if started is None:
                        continue
                    known = Instance(env["HAFO_WORKLOAD"], int(env.get("HAFO_EPOCH", "0")),
                                     env.get("HAFO_NODE", ""), machine, pid, started, now)
                    self._check_new(known)
                    self.instances[key] = known
                known.last_seen = now
        with self._lock:
            for key, instance in self.instances.items():
                if not instance.ended and key not in seen:
                    instance.ended = True
            live: dict[str, list[Instance]] = {}
            for instance in self.instances.values():
                if not instance.ended:
                    live.setdefault(instance.workload, []).append(instance)
            for workload, copies in live.items():
                if len(copies) > 1:
                    self._overlap(f"{workload}: {len(copies)} copies alive in one scan: "
                                  + ", ".join(f"{c.machine} pid {c.pid} epoch {c.epoch}"
                                              for c in copies))

    def _check_new(self, new: Instance) -> None:
        for old in self.instances.values():
            if old.workload == new.workload and old.pid != new.pid \
                    and new.started < old.last_seen - self.interval:
                self._overlap(f"{new.workload}: epoch {new.epoch} on {new.machine} started "
                              f"{old.last_seen - new.started:.2f} s before epoch {old.epoch} "
                              f"on {old.machine} was last seen alive")

    def _overlap(self, text: str) -> None:
        if text not in self.overlaps:
            self.overlaps.append(text)

    # --- queries ------------------------------------------------------------------------------
    def live(self, workload: str) -> list[Instance]:
        """The instances of ``workload`` alive at the last scan."""
        with self._lock:
            return [i for i in self.instances.values()
                    if i.workload == workload and not i.ended]

    def history(self, workload: str) -> list[Instance]:
        """Every instance of ``workload`` seen, oldest first."""
        with self._lock:
            return sorted((i for i in self.instances.values() if i.workload == workload),
                          key=lambda i: i.started)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``predicate()`` holds, or fail naming ``what``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                alive = self._thread is not None and self._thread.is_alive()
                with self._lock:
                    errors = list(self.errors)
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                                     + ("" if alive else " (the watcher thread is not running)")
                                     + (f"; scans failed: {errors}" if errors else ""))
            time.sleep(0.05)

    def one_live(self, workload: str, timeout: float = 60,
                 where: Callable[[Instance], bool] = lambda _i: True) -> Instance:
        """Wait for exactly one live instance of ``workload`` that satisfies ``where``."""
        found: list[Instance] = []

        def check() -> bool:
            found[:] = [i for i in self.live(workload) if where(i)]
            return len(found) == 1 and len(self.live(workload)) == 1

        self.wait(check, timeout, f"one running instance of {workload}")
        return found[0]
