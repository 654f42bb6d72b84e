"""One clock per decision (issue 28, finding 4): a step of a machine's wall clock changes no
decision, and no rule compares two machines' clocks. Injected clocks, no sleeping."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hafo.agent import procid
from hafo.agent import supervisor as supervisor_module
from hafo.agent.instances import InstanceKey, instance_dir, write_json_atomic
from hafo.agent.supervisor import GUARD_START_WAIT, Supervisor
from hafo.model.clocks import SteadyClock, since_boot
from hafo.model.ends import InstanceEnd


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("step", [600.0, -600.0, 3600.0])
def test_the_steady_clock_ignores_a_wall_clock_step(step: float) -> None:
    wall, mono = Clock(1_700_000_000.0), Clock(50.0)
    clock = SteadyClock(wall, mono)
    assert clock() == 1_700_000_000.0
    mono.now += 2.0
    wall.now += 2.0 + step  # NTP steps the wall clock
    assert clock() == 1_700_000_002.0


def test_since_boot_is_monotonic() -> None:
    first = since_boot()
    assert 0.0 < first <= since_boot()


KEY = InstanceKey("job-0a1b2c", 5)


def launched(state_dir: Path, **stamp: object) -> Path:
    """An instance whose guard has not written its state yet (launched by this or another
    agent process)."""
    path = instance_dir(state_dir, KEY)
    path.mkdir(parents=True)
    write_json_atomic(path / "launch.json", {"workload": KEY.workload, "epoch": KEY.epoch,
                                             "node": "node-a", "argv": ["true"],
                                             "launched_at": time.time(), **stamp})
    return path


# The supervisor compared time.time() with launch.json's mtime: a forward step of the wall
# clock while a guard started marked it "guard did not start" (restarted, uncounted, for
# ever: 100 epochs in 8 s).
@pytest.mark.parametrize("step", [600.0, -600.0], ids=["10min-ahead", "10min-behind"])
def test_a_wall_clock_step_while_a_guard_starts_is_not_a_guard_that_did_not_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    launched(tmp_path, launched_boottime=since_boot(), boot=procid.boot_id())
    real = time.time
    monkeypatch.setattr(supervisor_module.time, "time", lambda: real() + step)
    supervisor = Supervisor("node-a", tmp_path, tmp_path / "ck")
    assert supervisor.states()[KEY].state == "starting"


@pytest.mark.parametrize("old_mtime", [3600.0, 0.0])
def test_an_older_agent_s_launch_file_waits_from_its_first_sight(
        tmp_path: Path, old_mtime: float) -> None:
    path = launched(tmp_path)  # no launched_boottime: written by an older agent
    os.utime(path / "launch.json", (time.time() - old_mtime,) * 2)
    os.utime(path, (time.time() - old_mtime,) * 2)
    boot = Clock(1000.0)
    supervisor = Supervisor("node-a", tmp_path, tmp_path / "ck", boot_clock=boot)
    assert supervisor.states()[KEY].state == "starting"
    boot.now += GUARD_START_WAIT - 0.1
    assert supervisor.states()[KEY].state == "starting"
    boot.now += 0.2
    state = supervisor.states()[KEY]
    assert (state.state, state.reason, state.ended) == ("exited", "guard did not start",
                                                        InstanceEnd.GUARD_LOST)


@pytest.mark.parametrize(("age", "boot", "started"), [
    pytest.param(GUARD_START_WAIT - 1, None, True, id="launched-9s-ago-by-a-previous-agent"),
    pytest.param(GUARD_START_WAIT + 1, None, False, id="launched-11s-ago"),
    pytest.param(1.0, "another-boot", False, id="launched-in-another-boot"),
])
def test_a_restarted_agent_times_a_guard_s_start_on_the_boot_clock(
        tmp_path: Path, age: float, boot: str | None, started: bool) -> None:
    clock = Clock(5000.0)
    launched(tmp_path, launched_boottime=clock.now - age, boot=boot or procid.boot_id())
    state = Supervisor("node-a", tmp_path, tmp_path / "ck", boot_clock=clock).states()[KEY]
    assert state.state == ("starting" if started else "exited")
    if not started:
        assert state.reason == "guard did not start"
