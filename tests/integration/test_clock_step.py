"""A real step of this machine's wall clock, minutes either way, under a running cluster
(issue 28, finding 4: "one clock per decision"; docs/safety.md, "One clock per decision").

Realtime clocks are not namespaced on Linux: the test steps the host's ``CLOCK_REALTIME``
(root, ``clock_settime``), which every process on the machine sees. So the stepped windows
are short (about 10 s each) and the clock is put back exactly, on the monotonic clock's
count of the time that passed: in a ``finally``, in the fixture's finalizer, on SIGTERM, at
exit, and by a watchdog process should this one die without doing it. The local cluster
serves no TLS (no certificate is created, and none is checked, while the clock is off).

Stepped +5 min, then -10 min (5 min behind), then back: every workload stays on its node,
epoch and process, unrestarted; no node is drained or fenced or loses its lease; every agent
reports each step (``clock_step``, logged "wall clock stepped" with its size) and no agent
finds its clock unusable (``clock_jump``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from hafo.local.cluster import LocalCluster
from hafo.store import read_events

from .conftest import ClusterFactory
from .helpers import HostProcess, view
from .test_etcd_restart import five_workloads, why_changed

AHEAD = 300.0  # the first step: 5 minutes ahead
BEHIND = -600.0  # the second: 10 minutes back, so 5 minutes behind the true time
HOLD = 10.0  # seconds in each stepped state
QUIET = ("fenced", "restarted", "failover", "moved", "node-reregistered", "node-resumed",
         "node-unhealthy", "gpu-unhealthy", "health", "member-lost", "gang-restart")

# The watchdog: told the true time as (wall, monotonic) readings of one instant, it puts
# the wall clock back when its stdin ends without "restored" (the test process died).
WATCHDOG = """
import sys, time
wall0, mono0 = float(sys.argv[1]), float(sys.argv[2])
said = sys.stdin.read()
if "restored" not in said:
    time.clock_settime(time.CLOCK_REALTIME, wall0 + (time.monotonic() - mono0))
"""


class WallClock:
    """Steps this machine's wall clock and puts it back exactly (see the module docstring)."""

    def __init__(self) -> None:
        self.mono0 = time.monotonic()
        self.wall0 = time.time()
        self.offset = 0.0
        self.watchdog: subprocess.Popen[bytes] | None = None

    def true_time(self) -> float:
        """The wall clock as it would read had it not been stepped."""
        return self.wall0 + (time.monotonic() - self.mono0)

    def _set(self, offset: float) -> None:
        time.clock_settime(time.CLOCK_REALTIME, self.true_time() + offset)
        self.offset = offset

    def step(self, offset: float) -> None:
        """Set the clock ``offset`` seconds off the true time."""
        if self.watchdog is None:
            self.watchdog = subprocess.Popen(
                [sys.executable, "-c", WATCHDOG, repr(self.wall0), repr(self.mono0)],
                stdin=subprocess.PIPE)
        self._set(offset)

    def restore(self) -> None:
        """Put the clock back on the true time (idempotent; never raises)."""
        if self.offset != 0.0:
            with contextlib.suppress(OSError):
                self._set(0.0)
        if self.watchdog is not None and self.offset == 0.0:
            watchdog, self.watchdog = self.watchdog, None
            with contextlib.suppress(OSError, ValueError):
                assert watchdog.stdin is not None
                watchdog.stdin.write(b"restored\n")
                watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(5)

    def error(self) -> float:
        """How far the wall clock is from the true time now (seconds)."""
        return time.time() - self.true_time()


@pytest.fixture
def wall_clock() -> Iterator[WallClock]:
    """A ``WallClock``; the test is skipped where this machine cannot set its clock."""
    try:
        time.clock_settime(time.CLOCK_REALTIME, time.time())  # the same time: no step
    except PermissionError as exc:
        pytest.skip(f"this machine cannot set its wall clock (clock_settime: {exc})")
    clock = WallClock()
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        clock.restore()
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    atexit.register(clock.restore)
    try:
        yield clock
    finally:
        clock.restore()
        signal.signal(signal.SIGTERM, previous)
        atexit.unregister(clock.restore)
        assert abs(clock.error()) < 0.5, f"wall clock {clock.error():+.3f}s off the true time"


def steps_logged(cluster: LocalCluster) -> dict[str, list[tuple[float, bool]]]:
    """Per node: the wall-clock steps its agent logged (seconds, and whether it put the
    clock back where it was), in order."""
    found: dict[str, list[tuple[float, bool]]] = {}
    for name, node in cluster.node_handles.items():
        steps = found.setdefault(name, [])
        for line in Path(node.log_path).read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == "wall clock stepped":
                    steps.append((float(record["seconds"]), bool(record.get("back"))))
    return found


def clock_unusable_said(cluster: LocalCluster) -> list[str]:
    """The agents' log lines that speak of an unusable clock (finding ``clock_jump``)."""
    return [f"{name}: {line[:300]}" for name, node in cluster.node_handles.items()
            for line in Path(node.log_path).read_text(errors="replace").splitlines()
            if "clock_jump" in line or "wall clock unusable" in line]


async def check_nothing_moved(cluster: LocalCluster, wids: list[str],
                              before: dict[str, tuple[str, int, HostProcess]],
                              known: set[tuple[float, str, str]], when: str) -> None:
    snapshot = await cluster.wait_for(lambda s: s.leader is not None and len(s.alive) == 3,
                                      20, what="cluster whole")
    events = await read_events(cluster.store, cluster.keys, 0)
    new = [e for e in events if (e.ts, e.kind, e.message) not in known]
    for wid in wids:
        node, epoch, process = before[wid]
        now = (view(snapshot, wid)["node"], view(snapshot, wid)["epoch"])
        assert now == (node, epoch) and view(snapshot, wid)["restarts"] == 0 \
            and process.alive(), f"{when}: " + why_changed(cluster, wid, node, events)
    assert not [e for e in new if e.kind in QUIET], \
        f"{when}: " + "; ".join(f"{e.kind}: {e.message}" for e in new if e.kind in QUIET)
    states = {n: snapshot.node_state(n) for n in sorted(cluster.node_handles)}
    assert set(states.values()) == {"ready"}, f"{when}: nodes {states}"
    assert not clock_unusable_said(cluster), f"{when}: {clock_unusable_said(cluster)}"


async def hold(cluster: LocalCluster, seconds: float) -> None:
    """Wait ``seconds`` (monotonic), checking every half second that every node stays
    ready (a drain or a lost lease in the window fails at once)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        snapshot = await cluster.snapshot()
        states = {n: snapshot.node_state(n) for n in sorted(cluster.node_handles)}
        assert set(states.values()) == {"ready"}, f"nodes {states}"
        await asyncio.sleep(0.5)


def near(steps: list[tuple[float, bool]], expected: list[tuple[float, bool]],
         slack: float = 5.0) -> bool:
    """The logged steps are the expected ones, each within ``slack`` seconds."""
    return len(steps) == len(expected) and all(
        abs(v - want) <= slack and back == want_back
        for (v, back), (want, want_back) in zip(steps, expected, strict=True))


@pytest.mark.timeout(150)
async def test_a_wall_clock_step_either_way_changes_nothing(
        local_cluster: ClusterFactory, wall_clock: WallClock) -> None:
    cluster = await local_cluster.start(nodes=3, controllers=2, etcd_members=1)
    wids, before = await five_workloads(cluster)
    await asyncio.sleep(2.0)  # every agent's clock probe has a reading before the step
    known = {(e.ts, e.kind, e.message) for e in await read_events(cluster.store,
                                                                   cluster.keys, 0)}
    result: dict[str, Any] = {}
    try:
        wall_clock.step(AHEAD)
        await hold(cluster, HOLD)
        await check_nothing_moved(cluster, wids, before, known, "5 min ahead")
        wall_clock.step(AHEAD + BEHIND)
        await hold(cluster, HOLD)
        await check_nothing_moved(cluster, wids, before, known, "5 min behind")
    finally:
        wall_clock.restore()
        result["error"] = wall_clock.error()
    assert abs(result["error"]) < 0.5, f"wall clock {result['error']:+.3f}s off after restore"
    await hold(cluster, 5.0)
    await check_nothing_moved(cluster, wids, before, known, "after the clock was put back")
    logged = steps_logged(cluster)
    print("wall clock steps the agents logged (s): " + ", ".join(
        f"{n} {v}" for n, v in sorted(logged.items())))
    # Each step reported (finding clock_step, "wall clock stepped"), the last one as the
    # clock put back where it was; none found the clock unusable (checked above).
    expected = [(AHEAD, False), (BEHIND, False), (-(AHEAD + BEHIND), True)]
    for name, steps in logged.items():
        assert near(steps, expected), f"{name} logged steps {steps}, expected {expected}"
