"""OS health probes: fake /proc, injected clocks, simulated read-only filesystems."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from hafo.checks.os_probes import LoopLagMonitor, OsProbe
from hafo.decisions.classify import classify
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

PSI_OK = "some avg10=1.50 avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 total=0\n"
PSI_HIGH = "some avg10=75.25 avg60=10.00 avg300=2.00 total=99\nfull avg10=40.00 total=9\n"
MEMINFO_OK = "MemTotal:  1000000 kB\nMemFree: 500000 kB\nMemAvailable:  500000 kB\n"
MEMINFO_LOW = "MemTotal:  1000000 kB\nMemFree: 5000 kB\nMemAvailable:  10000 kB\n"


def make_probe(tmp_path: Path, *, psi: str | None = PSI_OK, meminfo: str | None = MEMINFO_OK,
               root: Path | None = None, clock: list[tuple[float, float]] | None = None,
               **cfg: Any) -> OsProbe:
    """A probe on a fake proc root; ``clock`` lists (wall, mono) readings, one per call."""
    proc = tmp_path / "proc"
    (proc / "pressure").mkdir(parents=True)
    if psi is not None:
        (proc / "pressure" / "memory").write_text(psi)
    if meminfo is not None:
        (proc / "meminfo").write_text(meminfo)
    ticks = iter(clock or [(1000.0 + i, float(i)) for i in range(100)])
    current: list[tuple[float, float]] = []

    def wall() -> float:
        current[:] = [next(ticks)]
        return current[0][0]

    return OsProbe(root or tmp_path / "ckpt", HealthConfig(**cfg), proc_root=proc, wall=wall,
                   mono=lambda: current[0][1])


def kinds(findings: list[Finding]) -> list[str]:
    return sorted(f.kind for f in findings)


def test_healthy_node_has_no_findings(tmp_path: Path) -> None:
    probe = make_probe(tmp_path)
    assert probe.findings() == []
    assert probe.findings() == []
    assert (tmp_path / "ckpt").is_dir()
    assert list((tmp_path / "ckpt").iterdir()) == []  # the write probe cleaned up


@pytest.mark.parametrize(("psi", "meminfo", "expected"), [
    pytest.param(PSI_OK, MEMINFO_LOW, None, id="psi-ok-wins-over-meminfo"),
    pytest.param(PSI_HIGH, MEMINFO_OK, (75.25, "PSI some avg10"), id="psi-high"),
    pytest.param(None, MEMINFO_OK, None, id="no-psi-meminfo-ok"),
    pytest.param(None, MEMINFO_LOW, (1.0, "MemAvailable"), id="no-psi-meminfo-low"),
    pytest.param("garbage\n", MEMINFO_LOW, (1.0, "MemAvailable"), id="bad-psi-falls-back"),
    pytest.param(None, None, None, id="nothing-readable"),
    pytest.param(None, "MemTotal: 10 kB\n", None, id="no-memavailable"),
])
def test_memory(tmp_path: Path, psi: str | None, meminfo: str | None,
                expected: tuple[float, str] | None) -> None:
    found = make_probe(tmp_path, psi=psi, meminfo=meminfo).findings()
    if expected is None:
        assert found == []
    else:
        assert found == [Finding(MEMORY_PRESSURE, value=expected[0], detail=expected[1])]


def test_psi_directory_unreadable_falls_back(tmp_path: Path) -> None:
    probe = make_probe(tmp_path, psi=None, meminfo=MEMINFO_LOW)
    (tmp_path / "proc" / "pressure" / "memory").mkdir()  # read_text -> IsADirectoryError
    assert kinds(probe.findings()) == [MEMORY_PRESSURE]


@pytest.mark.parametrize(("readings", "expected"), [
    pytest.param([(100.0, 5.0), (102.0, 7.0)], None, id="steady"),
    pytest.param([(100.0, 5.0), (145.0, 7.0)], 43.0, id="forward-step"),
    pytest.param([(100.0, 5.0), (60.0, 7.0)], -42.0, id="backward-step"),
    pytest.param([(100.0, 5.0), (120.0, 7.0)], None, id="under-threshold"),
    pytest.param([(100.0, 5.0), (200.0, 7.0), (202.0, 9.0)], 98.0, id="reported-once"),
])
def test_a_clock_step_is_reported(tmp_path: Path, readings: list[tuple[float, float]],
                                  expected: float | None) -> None:
    probe = make_probe(tmp_path, clock=readings, clock_jump=30.0)
    with capture_logs() as logs:
        results = [probe.findings() for _ in readings]
    assert results[0] == []  # the first call only records
    steps = [f.value for r in results for f in r if f.kind == CLOCK_STEP]
    assert steps == ([] if expected is None else [expected])
    assert not any(f.kind == CLOCK_JUMP for r in results for f in r)
    said = [e for e in logs if e["event"] == "wall clock stepped"]
    assert [e["seconds"] for e in said] == steps and all(e["log_level"] == "warning"
                                                       for e in said)


# Issue 28, finding 4: one NTP step of over 30 s drained the node (all of its work moved).
# A step is reported and changes nothing; only a clock that keeps stepping, or runs at a rate
# far from the monotonic clock's, is unusable and drains it.
@pytest.mark.parametrize("step", [600.0, -600.0, 31.0], ids=["10min-ahead", "10min-behind",
                                                             "31s"])
def test_one_step_does_not_drain_the_node(tmp_path: Path, step: float) -> None:
    readings = [(1000.0, 0.0), (1005.0 + step, 5.0), *((1010.0 + step + 5 * i, 10.0 + 5 * i)
                                                        for i in range(200))]
    probe = make_probe(tmp_path, clock=readings, clock_jump=30.0)
    found = [f for _ in readings for f in probe.findings()]
    assert [f.kind for f in found] == [CLOCK_STEP]
    config = HealthConfig()
    assert classify(found[0], config).action == "ignore"


def stepped(steps: list[float]) -> list[tuple[float, float]]:
    """(wall, mono) readings 5 s apart, the wall clock stepped by each of ``steps`` in turn,
    10 s apart."""
    readings, offset = [], 0.0
    for i in range(2 * len(steps) + 3):
        if i % 2 == 1 and i // 2 < len(steps):
            offset += steps[i // 2]
        readings.append((1000.0 + 5.0 * i + offset, 5.0 * i))
    return readings


# A step that puts the clock back where it was (a clock set wrong, then set right) is a
# correction: reported, not counted as evidence that the clock is unusable (a real step of
# +5 min, -10 min and back drained every node: tests/integration/test_clock_step.py).
@pytest.mark.parametrize(("readings", "unusable"), [
    pytest.param([(1000.0 + 5 * i + 60 * (i // 2), 5.0 * i) for i in range(8)], True,
                 id="a-step-every-10s"),
    pytest.param([(1000.0 + 5 * i + (60 if i >= 1 else 0) + (60 if i >= 150 else 0)
                   + (60 if i >= 300 else 0), 5.0 * i) for i in range(310)], False,
                 id="three-steps-over-25-minutes"),
    pytest.param(stepped([300.0, -600.0, 300.0]), False, id="ahead-behind-and-back"),
    pytest.param(stepped([-600.0, 600.0, 45.0]), False, id="behind-back-and-one-step"),
    pytest.param(stepped([300.0, -300.0, 300.0, -300.0, 300.0]), True,
                 id="flipping-between-two-times"),
    pytest.param(stepped([300.0, -600.0, 300.0, 600.0]), True,
                 id="ahead-behind-back-and-away-again"),
    pytest.param([(1000.0 + 5.25 * i, 5.0 * i) for i in range(40)], True,
                 id="runs-5-percent-fast"),
    pytest.param([(1000.0 + 5.0005 * i, 5.0 * i) for i in range(200)], False,
                 id="ntp-slew-0.01-percent"),
])
def test_an_unusable_clock_drains_the_node(tmp_path: Path, readings: list[tuple[float, float]],
                                           unusable: bool) -> None:
    probe = make_probe(tmp_path, clock=readings, clock_jump=30.0)
    found = [f for _ in readings for f in probe.findings()]
    jumps = [f for f in found if f.kind == CLOCK_JUMP]
    assert bool(jumps) == unusable
    if jumps:
        assert classify(jumps[0], HealthConfig()).action == "drain-node"
        assert "wall clock vs monotonic clock" in (jumps[0].detail or "")


@pytest.mark.parametrize(("lag", "found"), [(0.1, False), (2.0, False), (2.5, True)])
def test_loop_lag(tmp_path: Path, lag: float, found: bool) -> None:
    probe = make_probe(tmp_path, loop_lag=2.0)
    probe.set_loop_lag(lag)
    assert probe.findings() == ([Finding(LOOP_LAG, value=lag, detail="agent event loop")]
                                if found else [])


def test_disk_full_on_real_filesystem(tmp_path: Path) -> None:
    [finding] = make_probe(tmp_path, min_free_mib=1e15).findings()
    assert finding.kind == DISK_FULL and finding.value is not None and finding.value > 0


def fake_statvfs(flag: int) -> Any:
    return lambda _path: SimpleNamespace(f_bavail=10, f_frsize=1024 * 1024, f_flag=flag)


@pytest.mark.parametrize(("flag", "expected"), [
    pytest.param(os.ST_RDONLY, [DISK_FULL, DISK_READONLY], id="mounted-ro"),
    pytest.param(0, [DISK_FULL], id="rw"),
])
def test_statvfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: int,
                 expected: list[str]) -> None:
    probe = make_probe(tmp_path, min_free_mib=100)
    monkeypatch.setattr(os, "statvfs", fake_statvfs(flag))
    found = probe.findings()
    assert kinds(found) == expected
    assert found[0] == Finding(DISK_FULL, value=10.0, detail=f"{tmp_path / 'ckpt'}: 10 MiB "
                               "free of 100 MiB required")


def test_a_full_disk_is_said_with_its_units(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28, finding 3: 'disk full 49.9' had no unit."""
    probe = make_probe(tmp_path, min_free_mib=50)
    monkeypatch.setattr(os, "statvfs", lambda _path: SimpleNamespace(
        f_bavail=int(49.9 * 1024), f_frsize=1024, f_flag=0))
    [finding] = probe.findings()
    assert finding.value == 49.9
    text = classify(finding, probe.config).reason
    assert text == (f"disk full ({tmp_path / 'ckpt'}: 49.9 MiB free of 50 MiB required): "
                    "checkpoint filesystem nearly full")
    # a finding from an agent that predates the detail still names the unit
    assert Finding(DISK_FULL, value=49.9, detail="/ckpt").describe() == \
        "disk full 49.9 MiB free (/ckpt)"


@pytest.mark.parametrize(("err", "readonly"), [
    (errno.EROFS, True), (errno.EACCES, True), (errno.ENOSPC, True), (errno.EIO, True),
    (errno.EDQUOT, True), (errno.EINTR, False),
])
def test_write_probe_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int,
                             readonly: bool) -> None:
    def failing_fsync(_fd: int) -> None:
        raise OSError(err, os.strerror(err))

    probe = make_probe(tmp_path)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with capture_logs() as logs:
        found = probe.findings()
        probe.findings()
    monkeypatch.undo()
    assert kinds(found) == ([DISK_READONLY] if readonly else [])
    if readonly:
        assert os.strerror(err) in found[0].detail
    assert len(logs) == (0 if readonly else 1)  # an unexpected error is logged once
    assert list((tmp_path / "ckpt").iterdir()) == []  # the probe file is gone


@pytest.mark.parametrize("layout", ["root-is-a-file", "parent-is-a-file"])
def test_uncreatable_root(tmp_path: Path, layout: str) -> None:
    (tmp_path / "f").write_text("x")
    root = tmp_path / "f" if layout == "root-is-a-file" else tmp_path / "f" / "ckpt"
    [finding] = make_probe(tmp_path, root=root).findings()
    assert finding.kind == DISK_READONLY and "cannot create" in finding.detail


def test_missing_root_is_created(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "ckpt"
    assert make_probe(tmp_path, root=root).findings() == []
    assert root.is_dir()


async def test_loop_lag_monitor_sees_a_blocked_loop() -> None:
    monitor = LoopLagMonitor()
    seen: list[float] = []

    async def measurements(count: int) -> None:
        deadline = time.monotonic() + 5
        while len(seen) < count:
            assert time.monotonic() < deadline, f"only {len(seen)} measurements"
            await asyncio.sleep(0.01)

    task = asyncio.create_task(monitor.run(seen.append, period=0.05))
    try:
        await measurements(2)  # a free loop, measured twice
        assert monitor.max_recent < 0.2
        before = len(seen)
        time.sleep(0.3)  # block the loop: the lag to be measured
        await measurements(before + 2)  # the late wake-up, then one on time again
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert monitor.max_recent >= 0.2
    assert seen[-1] >= 0.2  # the window keeps the max, not just the latest


def test_a_step_back_is_reported_as_one(tmp_path: Path) -> None:
    readings = stepped([300.0, -600.0, 300.0])
    probe = make_probe(tmp_path, clock=readings, clock_jump=30.0)
    with capture_logs() as logs:
        found = [f for _ in readings for f in probe.findings()]
    assert [(f.kind, f.value) for f in found] == [(CLOCK_STEP, 300.0), (CLOCK_STEP, -600.0),
                                                 (CLOCK_STEP, 300.0)]
    assert found[2].detail == "wall clock vs monotonic clock: back where it was"
    said = [e for e in logs if e["event"] == "wall clock stepped"]
    assert [e.get("back", False) for e in said] == [False, False, True]
