"""The ``training`` check against real heartbeat files and real (spinning / sleeping) processes."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from hafo_check_training import ProcessCPU, TrainingCheck, make_check

from hafo.checks.api import ENTRY_POINT_GROUP, CheckContext, CheckOptionError
from hafo.model.progress import HEARTBEAT_FILE, Heartbeat, encode_heartbeat

# The children exit by themselves once the test process is gone (their parent changes).
SPIN = ("import os\nppid = os.getppid()\nprint('ready', flush=True)\n"
        "while os.getppid() == ppid:\n    pass\n")
SLEEP = "import time\nprint('ready', flush=True)\ntime.sleep(30)\n"
PARENT_OF_SPINNER = (
    "import subprocess, sys, time\n"
    f"c = subprocess.Popen([sys.executable, '-c', {SPIN!r}], stdout=subprocess.PIPE)\n"
    "c.stdout.readline()\n"
    "print(c.pid, flush=True)\n"
    "time.sleep(30)\n"
)
CPU_INTERVAL = 0.3  # real seconds between the two CPU samples
SPIN_PERCENT = 20  # well below a spinner's ~100%, so a busy test machine does not flake


class Clock:
    """An injected wall clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def beat(directory: Path, step: int, t: float, epoch: int = 1) -> None:
    """Write a heartbeat file as the checkpoint SDK does."""
    tmp = directory / ".hb.tmp"
    tmp.write_text(encode_heartbeat(Heartbeat(step=step, epoch=epoch, t=t, pid=os.getpid())))
    os.replace(tmp, directory / HEARTBEAT_FILE)


def ctx(directory: Path, started_at: float | None = 1000.0, pid: int | None = None,
        epoch: int = 1) -> CheckContext:
    """A probe context for a training workload."""
    return CheckContext(workload="train", node="node-a", epoch=epoch, pid=pid,
                        started_at=started_at, checkpoint_dir=directory)


def check(clock: Clock, **options: Any) -> TrainingCheck:
    """A check built through the factory's validation, with an injected clock."""
    built = make_check(options)
    built.clock = clock
    return built


@contextmanager
def child(code: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A Python child running ``code``; yields it and the first line it printed. Killed by pid."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "child did not start"
        yield proc, proc.stdout.readline().decode().strip()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()


def test_progress_passes_and_a_stall_fails(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    c = check(clock, stall_after=60)
    beat(tmp_path, 1, 1005.0)
    clock.now = 1010.0
    assert c.probe(ctx(tmp_path)).ok
    beat(tmp_path, 2, 1050.0)
    clock.now = 1100.0
    result = c.probe(ctx(tmp_path))
    assert result.ok and "last step 2, 50s ago" in result.detail
    beat(tmp_path, 2, 1105.0)  # the same step again is not progress
    clock.now = 1111.0
    result = c.probe(ctx(tmp_path))
    assert not result.ok
    assert result.detail.startswith("stalled: no new step for 61s (last step 2")


def test_startup_grace_then_no_heartbeat_fails(tmp_path: Path) -> None:
    clock = Clock(1100.0)
    c = check(clock, stall_after=60, startup_grace=120)
    result = c.probe(ctx(tmp_path))
    assert result.ok and "startup grace 20s left" in result.detail
    clock.now = 1121.0
    result = c.probe(ctx(tmp_path))
    assert not result.ok and "no heartbeat since start" in result.detail


def test_a_previous_instance_heartbeat_is_ignored(tmp_path: Path) -> None:
    beat(tmp_path, 500, 990.0)  # written before this instance started at 1000
    clock = Clock(1061.0)
    result = check(clock, stall_after=60).probe(ctx(tmp_path))
    assert not result.ok and "no heartbeat since start" in result.detail
    # without started_at, the epoch tells: an older epoch's heartbeat is not this instance's
    clock.now = 2000.0
    c = check(clock, stall_after=60, startup_grace=0)
    assert "no heartbeat" in c.probe(ctx(tmp_path, started_at=None, epoch=2)).detail


def test_reads_the_checkpoint_sdk_heartbeat(tmp_path: Path) -> None:
    from hafo.checkpoint import Checkpointer

    started = time.time() - 1
    Checkpointer(tmp_path, epoch=3, handle_signal=False).heartbeat(7)
    result = make_check({"stall_after": 60, "startup_grace": 0}).probe(
        ctx(tmp_path, started_at=started, epoch=3))
    assert result.ok and "last step 7" in result.detail


def test_nccl_hang_spinning_process_fails(tmp_path: Path) -> None:
    clock = Clock(1040.0)
    c = check(clock, stall_after=600, startup_grace=10, nccl_hang_after=30,
              spin_cpu_percent=SPIN_PERCENT)
    beat(tmp_path, 5, 1001.0)
    with child(SPIN) as (proc, _):
        first = c.probe(ctx(tmp_path, pid=proc.pid))
        assert first.ok  # no CPU baseline yet
        time.sleep(CPU_INTERVAL)  # on purpose: CPU time accrues between the samples
        clock.now = 1041.0
        result = c.probe(ctx(tmp_path, pid=proc.pid))
    assert not result.ok
    assert re.fullmatch(r"NCCL hang suspected: no step for 40s while the process spins at "
                        r"\d+% CPU", result.detail), result.detail


def test_nccl_hang_sleeping_process_is_only_a_stall(tmp_path: Path) -> None:
    clock = Clock(1040.0)
    c = check(clock, stall_after=600, startup_grace=10, nccl_hang_after=30)
    beat(tmp_path, 5, 1001.0)
    with child(SLEEP) as (proc, _):
        c.probe(ctx(tmp_path, pid=proc.pid))
        time.sleep(CPU_INTERVAL)  # on purpose: CPU time accrues between the samples
        clock.now = 1041.0
        result = c.probe(ctx(tmp_path, pid=proc.pid))
        assert result.ok and "cpu 0%" in result.detail, result.detail
        clock.now = 1602.0
        result = c.probe(ctx(tmp_path, pid=proc.pid))
    assert not result.ok and result.detail.startswith("stalled: no new step for 601s")


def test_nccl_hang_in_a_child_process_is_found(tmp_path: Path) -> None:
    clock = Clock(1040.0)
    c = check(clock, stall_after=600, startup_grace=10, nccl_hang_after=30,
              spin_cpu_percent=SPIN_PERCENT)
    beat(tmp_path, 5, 1001.0)
    spinner: int | None = None
    try:
        with child(PARENT_OF_SPINNER) as (parent, line):
            spinner = int(line)
            c.probe(ctx(tmp_path, pid=parent.pid))
            time.sleep(CPU_INTERVAL)  # on purpose: CPU time accrues between the samples
            clock.now = 1041.0
            result = c.probe(ctx(tmp_path, pid=parent.pid))
    finally:
        if spinner is not None:
            with suppress(ProcessLookupError):
                os.kill(spinner, signal.SIGKILL)
    assert not result.ok
    assert result.detail.startswith("NCCL hang suspected") and f"(pid {spinner})" in result.detail


def test_process_cpu_finds_descendants_without_children_files(tmp_path: Path) -> None:
    cpu = ProcessCPU()
    with child(SLEEP) as (proc, _):
        assert proc.pid in cpu.tree(os.getpid())
        assert proc.pid in cpu._scan_children().get(os.getpid(), [])
        assert cpu.sample(proc.pid) is None  # the first call only takes the baseline
        time.sleep(0.05)  # on purpose: some time between the two samples
        sample = cpu.sample(proc.pid)
    assert sample is not None and sample[1] == proc.pid and sample[0] < 50


def fake_proc(root: Path, pid: int, ppid: int, ticks: int, start: int,
              children: list[int] | None) -> None:
    """A /proc/<pid> entry: a stat line (a comm with spaces and parentheses) and, unless
    ``children`` is None, the kernel's task/<pid>/children file."""
    task = root / str(pid) / "task" / str(pid)
    task.mkdir(parents=True, exist_ok=True)
    fields = ["S", str(ppid), *["0"] * 9, str(ticks - ticks // 3), str(ticks // 3),
              *["0"] * 6, str(start), "0"]
    (root / str(pid) / "stat").write_text(f"{pid} (py (worker) 1) {' '.join(fields)}\n")
    if children is not None:
        (task / "children").write_text("".join(f"{c} " for c in children))


@pytest.mark.parametrize("children_files", [True, False])
def test_process_cpu_on_a_fake_proc(tmp_path: Path, children_files: bool) -> None:
    mono = Clock(0.0)
    cpu = ProcessCPU(proc_root=tmp_path, monotonic=mono)
    tck = cpu._tck

    def state(worker_ticks: int, worker_start: int) -> None:
        fake_proc(tmp_path, 10, 1, 0, 5, [11] if children_files else None)
        fake_proc(tmp_path, 11, 10, worker_ticks, worker_start, [] if children_files else None)
        fake_proc(tmp_path, 12, 1, 10**6, 5, [] if children_files else None)  # not ours

    state(0, 7)
    assert cpu.tree(10) == [10, 11]
    assert cpu.sample(10) is None
    mono.now = 2.0
    state(tck * 3 // 2, 7)  # 1.5 s of CPU in 2 s: 75 %
    assert cpu.sample(10) == (75.0, 11)
    mono.now = 4.0
    state(tck * 100, 8)  # pid 11 was reused by a new process: not comparable
    assert cpu.sample(10) == (0.0, 10)
    assert ProcessCPU(proc_root=tmp_path, include_children=False).tree(10) == [10]


def test_min_steps_per_minute(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    c = check(clock, stall_after=600, startup_grace=0, min_steps_per_minute=10, rate_window=60)
    for t, step, ok, rate in [(1000, 0, True, None), (1030, 10, True, None),
                              (1060, 20, True, "20.0"), (1090, 21, True, "11.0"),
                              (1120, 22, False, "2.0")]:
        beat(tmp_path, step, float(t))
        clock.now = float(t)
        result = c.probe(ctx(tmp_path))
        assert result.ok is ok, (t, result.detail)
        if rate is not None:
            assert f"{rate} steps/min" in result.detail, result.detail
    assert result.detail == ("slow: 2.0 steps/min over the last 60s < min_steps_per_minute 10")


def test_step_going_back_restarts_the_history(tmp_path: Path) -> None:
    clock = Clock(1000.0)
    c = check(clock, stall_after=60, startup_grace=0)
    beat(tmp_path, 100, 1000.0)
    assert c.probe(ctx(tmp_path)).ok
    beat(tmp_path, 40, 1050.0)  # restored from an older checkpoint
    clock.now = 1100.0
    result = c.probe(ctx(tmp_path))
    assert result.ok and "last step 40, 50s ago" in result.detail


@pytest.mark.parametrize(("options", "bad_field"), [
    ({}, "stall_after"),
    ({"stall_after": 0}, "stall_after"),
    ({"stall_after": "60"}, "stall_after"),
    ({"stall_after": True}, "stall_after"),
    ({"stall_after": 60, "startup_grace": -1}, "startup_grace"),
    ({"stall_after": 60, "nccl_hang_after": float("nan")}, "nccl_hang_after"),
    ({"stall_after": 60, "min_steps_per_minute": 0}, "min_steps_per_minute"),
    ({"stall_after": 60, "include_children": "no"}, "include_children"),
    ({"stall_after": 60, "stall_afer": 1}, "stall_afer"),
])
def test_bad_options_name_the_field(options: dict[str, Any], bad_field: str) -> None:
    with pytest.raises(CheckOptionError) as err:
        make_check(options)
    assert err.value.field == bad_field


def test_defaults() -> None:
    c = make_check({"stall_after": 90})
    assert (c.startup_grace, c.nccl_hang_after, c.min_steps_per_minute) == (90.0, None, None)
    assert make_check({"stall_after": 90, "startup_grace": 0}).startup_grace == 0.0


def test_registered_as_entry_point() -> None:
    eps = entry_points(group=ENTRY_POINT_GROUP).select(name="training")
    if not eps:
        pytest.skip("hafo-check-training is not installed")
    assert next(iter(eps)).load() is make_check
