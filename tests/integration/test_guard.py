"""The guard, as a real process over a real workload process: fencing, stop, parent death."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.fencefile import FENCE_FILE, read_deadline, write_deadline
from hafo.agent.guard import catches
from hafo.agent.instances import read_guard_state, write_json_atomic
from hafo.local.procs import kill_pid, pid_alive, wait_until
from hafo.model.cluster import InstanceEnd

pytestmark = pytest.mark.timeout(30)

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]


def start_guard(tmp_path: Path, deadline_in: float, argv: list[str] | None = None,
                grace: float = 5.0,
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    state_dir = tmp_path / "state"
    path = state_dir / "instances" / "w.7"
    path.mkdir(parents=True)
    write_deadline(state_dir, time.monotonic() + deadline_in)
    write_json_atomic(path / "launch.json", {
        "workload": "w", "epoch": 7, "node": "n", "argv": argv or SLEEPER,
        "env": {**os.environ, **(env or {})}, "cwd": str(tmp_path), "grace": grace,
        "fence_file": str(state_dir / FENCE_FILE)})
    guard = subprocess.Popen([sys.executable, "-m", "hafo", "guard", str(path)],
                             start_new_session=True)
    return guard, path


def running_pid(path: Path) -> int:
    assert wait_until(lambda: (s := read_guard_state(path)) is not None and s.pid, 10)
    state = read_guard_state(path)
    assert state is not None and state.pid
    return state.pid


def test_guard_kills_workload_when_deadline_passes(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, deadline_in=2.0)
    try:
        fence_at = read_deadline(tmp_path / "state" / FENCE_FILE)  # CLOCK_MONOTONIC, as ours
        pid = running_pid(path)
        assert pid_alive(pid)
        assert wait_until(lambda: not pid_alive(pid), 5, interval=0.01)
        died = time.monotonic()
        # not before the deadline; after it within a generous 2 s (a loaded machine)
        assert fence_at <= died < fence_at + 2.0, f"died {died - fence_at:+.3f}s from it"
        assert guard.wait(5) == 0
        state = read_guard_state(path)
        assert state is not None and state.state == "exited"
        assert "fenced" in state.reason and state.ended is InstanceEnd.FENCED
    finally:
        kill_pid(guard.pid)
        guard.wait(5)


def test_renewed_deadline_keeps_workload_alive(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, deadline_in=1.0)
    try:
        pid = running_pid(path)
        for _ in range(10):  # on purpose: 2 s, twice the deadline, renewed every 0.2 s
            write_deadline(tmp_path / "state", time.monotonic() + 1.0)
            time.sleep(0.2)
        assert pid_alive(pid), "renewals must keep the workload running"
    finally:
        kill_pid(guard.pid)
        guard.wait(5)
        assert wait_until(lambda: not pid_alive(pid), 5)


def test_guard_refuses_to_start_past_deadline(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, deadline_in=-1.0)
    assert guard.wait(10) == 0
    state = read_guard_state(path)
    assert state is not None and state.state == "exited" and state.pid is None
    assert "fenced before start" in state.reason


def test_sigterm_stops_workload_and_records_exit(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, deadline_in=60)
    pid = running_pid(path)
    os.kill(guard.pid, signal.SIGTERM)
    assert guard.wait(10) == 0
    assert not pid_alive(pid)
    state = read_guard_state(path)
    assert state is not None and state.state == "exited" and state.exit_code == -signal.SIGTERM


def test_workload_exit_code_is_recorded(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, 60, [sys.executable, "-c", "raise SystemExit(7)"])
    assert guard.wait(10) == 0
    state = read_guard_state(path)
    assert state is not None and state.exit_code == 7
    assert state.state == "exited" and state.ended is InstanceEnd.EXIT  # its own doing


def test_killed_guard_takes_its_workload_along(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, deadline_in=60)
    pid = running_pid(path)
    guard.kill()
    guard.wait(5)
    assert wait_until(lambda: not pid_alive(pid), 5), "PR_SET_PDEATHSIG must kill the workload"


CHECKPOINTING = [sys.executable, "-c", """
import time
from hafo.checkpoint import Checkpointer
ck = Checkpointer()
step = 0
while True:
    step += 1
    time.sleep(0.02)
    if ck.should_checkpoint():
        ck.save({"step": step}, step=step)
        while True:  # keeps running: the guard must SIGTERM it after the commit
            time.sleep(0.05)
"""]


def test_stop_asks_for_a_checkpoint_first_then_terminates(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, 60, CHECKPOINTING, grace=10,
                              env={"HAFO_CHECKPOINT_DIR": str(tmp_path / "ck"),
                                   "HAFO_EPOCH": "7"})
    pid = running_pid(path)
    assert wait_until(lambda: catches(pid, signal.SIGUSR1), 10), "the SDK never listened"
    started = time.monotonic()
    os.kill(guard.pid, signal.SIGTERM)
    assert guard.wait(15) == 0
    assert time.monotonic() - started < 5, "stopped right after the commit, not at the grace"
    state = json.loads((path / "state.json").read_text())
    assert state["stop_checkpoint"] is not None and state["stop_checkpoint"] > 0
    assert "checkpoint step" in state["reason"] and not pid_alive(pid)
    from hafo.checkpoint import list_checkpoints

    assert list_checkpoints(tmp_path / "ck")[0].step == state["stop_checkpoint"]


CHECKPOINTS_THEN_EXITS = [sys.executable, "-c", """
import os, pathlib, sys, time
from hafo.checkpoint import Checkpointer
ck = Checkpointer()
step = 0
while True:
    step += 1
    time.sleep(0.02)
    if ck.should_checkpoint():
        ck.save({"step": step}, step=step)
        time.sleep(0.5)  # closing files, flushing logs after the commit
        pathlib.Path(os.environ["HAFO_CHECKPOINT_DIR"], "after-commit").write_text("ok")
        sys.exit(0)
"""]


def test_stop_lets_the_workload_exit_by_itself_after_its_commit(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, 60, CHECKPOINTS_THEN_EXITS, grace=10,
                              env={"HAFO_CHECKPOINT_DIR": str(tmp_path / "ck"),
                                   "HAFO_EPOCH": "7"})
    pid = running_pid(path)
    assert wait_until(lambda: catches(pid, signal.SIGUSR1), 10), "the SDK never listened"
    os.kill(guard.pid, signal.SIGTERM)
    assert guard.wait(15) == 0
    state = json.loads((path / "state.json").read_text())
    assert state["exit_code"] == 0, "not terminated between its commit and its own exit"
    assert (tmp_path / "ck" / "after-commit").read_text() == "ok"
    assert "checkpoint step" in state["reason"]


def test_urgent_stop_skips_the_checkpoint(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, 60, CHECKPOINTING, grace=30,
                              env={"HAFO_CHECKPOINT_DIR": str(tmp_path / "ck"),
                                   "HAFO_EPOCH": "7"})
    pid = running_pid(path)
    # it could checkpoint (the SDK listens): an urgent stop must not ask it to
    assert wait_until(lambda: catches(pid, signal.SIGUSR1), 10), "the SDK never listened"
    started = time.monotonic()
    os.kill(guard.pid, signal.SIGUSR2)  # stop now: the application failed
    assert guard.wait(15) == 0
    assert time.monotonic() - started < 3, "no checkpoint wait, no grace period"
    state = json.loads((path / "state.json").read_text())
    assert state["reason"] == "stopped at once by the agent" and not pid_alive(pid)
    assert state.get("stop_checkpoint") is None
    from hafo.checkpoint import list_checkpoints

    assert list_checkpoints(tmp_path / "ck") == [], "a checkpoint was asked for"


LISTENS_NEVER_SAVES = [sys.executable, "-c", """
import signal, time
signal.signal(signal.SIGUSR1, lambda *a: None)  # takes the request, never commits
while True:
    time.sleep(0.05)
"""]


def test_urgent_stop_escalates_a_pending_checkpoint_request(tmp_path: Path) -> None:
    guard, path = start_guard(tmp_path, 60, LISTENS_NEVER_SAVES, grace=30)
    pid = running_pid(path)
    assert wait_until(lambda: catches(pid, signal.SIGUSR1), 10)
    os.kill(guard.pid, signal.SIGTERM)  # a planned stop: checkpoint first, for up to 30 s
    assert wait_until(lambda: (s := read_guard_state(path)) is not None
                      and s.reason == "stopping: checkpoint requested", 10)
    started = time.monotonic()
    os.kill(guard.pid, signal.SIGUSR2)  # then the application fails: stop now
    assert guard.wait(15) == 0
    assert time.monotonic() - started < 3, "the pending checkpoint wait was not cut short"
    state = read_guard_state(path)
    assert state is not None and state.reason == "stopped at once by the agent"
    assert state.stop_checkpoint is None and not pid_alive(pid)


def test_an_urgent_stop_of_a_stopped_process_kills_it_at_once(tmp_path: Path) -> None:
    """A hung rank SIGSTOPped (hang_timeout) cannot act on SIGTERM: the guard does not wait
    URGENT_TERM_GRACE (5 s) for it before the next epoch may start."""
    guard, path = start_guard(tmp_path, 60, SLEEPER, grace=30)
    pid = running_pid(path)
    try:
        os.kill(pid, signal.SIGSTOP)  # the workload the guard started for this test
        started = time.monotonic()
        os.kill(guard.pid, signal.SIGUSR2)
        assert guard.wait(15) == 0
        assert time.monotonic() - started < 2.5, "waited the urgent grace for a stopped process"
        state = read_guard_state(path)
        assert state is not None and not pid_alive(pid)
        assert state.reason == "killed at once by the agent: a process of it was stopped"
    finally:
        kill_pid(pid)
        if guard.poll() is None:
            kill_pid(guard.pid)


def test_a_stop_asked_for_right_after_launch_is_delivered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor asks again each cycle until the guard has written its pid: a stop
    decided before that moment is not lost (it used to be marked sent and never sent)."""
    from hafo.agent.instances import InstanceKey
    from hafo.agent.supervisor import Supervisor
    from hafo.model.cluster import Assignment, Submission
    from hafo.model.spec import parse_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its TMPDIR, as the agent's
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    write_deadline(state_dir, time.monotonic() + 60)
    supervisor = Supervisor("n1", state_dir, tmp_path / "ck")
    spec = parse_spec({"name": "job", "command": SLEEPER, "stop_grace": 1})
    key = InstanceKey("job-0a1b2c", 5)
    supervisor.launch(Assignment(workload=key.workload, phase="placed", node="n1", epoch=5),
                      Submission(key.workload, spec, 0.0), [])
    first = supervisor.states()[key]
    assert first.guard_pid is None  # the guard has not written its state yet
    supervisor.stop(key, first, "moved away", urgent=True)
    deadline = time.monotonic() + 15
    while (state := supervisor.states()[key]).state != "exited":
        assert time.monotonic() < deadline, state
        supervisor.stop(key, state, "moved away", urgent=True)  # as each supervise cycle does
        time.sleep(0.2)
    assert state.ended is not None and state.ended.value == "stopped"
    assert state.pid is not None and not pid_alive(state.pid)


#: A launcher like torchrun: starts its worker in a new session (out of the workload's
#: process group) and writes the worker's pid.
LAUNCHER = [sys.executable, "-c", (
    "import subprocess, sys, time, pathlib\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)'],"
    " start_new_session=True)\n"
    "pathlib.Path('worker.pid').write_text(str(w.pid))\n"
    "while True: time.sleep(0.05)\n")]


def _worker_pid(tmp_path: Path) -> int:
    pid_file = tmp_path / "worker.pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 10)
    return int(pid_file.read_text())


def test_fencing_kills_workers_in_other_sessions(tmp_path: Path) -> None:
    """torchrun starts each worker in a new session: killing the workload's process group
    alone would leave it running past the lease."""
    guard, path = start_guard(tmp_path, deadline_in=2.0, argv=LAUNCHER,
                              env={"HAFO_WORKLOAD": "w", "HAFO_EPOCH": "7", "HAFO_NODE": "n"})
    worker = 0
    try:
        launcher = running_pid(path)
        worker = _worker_pid(tmp_path)
        assert os.getsid(worker) != os.getsid(launcher)
        assert wait_until(lambda: not pid_alive(worker) and not pid_alive(launcher), 6,
                          interval=0.01)
        assert guard.wait(5) == 0
    finally:
        for pid in (worker, guard.pid):
            if pid:
                kill_pid(pid)
        guard.wait(5)


def test_a_killed_guard_leaves_no_worker_once_the_agent_looks(tmp_path: Path) -> None:
    """The guard SIGKILLed: its launcher dies with it (PDEATHSIG); the agent's supervisor
    finds the orphaned worker by its instance environment and kills it."""
    from hafo.agent.supervisor import Supervisor

    guard, path = start_guard(tmp_path, deadline_in=60.0, argv=LAUNCHER,
                              env={"HAFO_WORKLOAD": "w", "HAFO_EPOCH": "7", "HAFO_NODE": "n"})
    worker = 0
    try:
        running_pid(path)
        worker = _worker_pid(tmp_path)
        kill_pid(guard.pid)
        guard.wait(5)
        assert pid_alive(worker)  # orphaned, in its own session
        Supervisor("n", tmp_path / "state", tmp_path / "ck").states()
        assert wait_until(lambda: not pid_alive(worker), 5, interval=0.01)
    finally:
        if worker:
            kill_pid(worker)


#: Writes into its TMPDIR (as torchrun does: a torchelastic_* directory per run) and reports
#: which directory that was.
TMP_WRITER = [sys.executable, "-c", (
    "import os, pathlib, tempfile, time\n"
    "d = pathlib.Path(tempfile.mkdtemp(prefix='torchelastic_'))\n"
    "(d / 'log').write_text('x')\n"
    "pathlib.Path(os.environ['OUT']).write_text(os.environ['TMPDIR'])\n"
    "while True: time.sleep(0.05)\n")]


def _tmp_writer_supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from hafo.agent.supervisor import Supervisor

    agent_tmp = tmp_path / "agent-tmp"
    agent_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(agent_tmp))  # the agent's own TMPDIR
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    write_deadline(state_dir, time.monotonic() + 60)
    return Supervisor("n1", state_dir, tmp_path / "ck")


def _launch_tmp_writer(supervisor: Any, tmp_path: Path, epoch: int,
                       env: dict[str, str]) -> tuple[Any, Path]:
    from hafo.agent.instances import InstanceKey
    from hafo.model.cluster import Assignment, Submission
    from hafo.model.spec import parse_spec

    out = tmp_path / f"tmpdir-{epoch}.txt"
    spec = parse_spec({"name": "job", "command": TMP_WRITER,
                       "env": {"OUT": str(out), **env}})
    key = InstanceKey("job-0a1b2c", epoch)
    supervisor.launch(Assignment(workload=key.workload, phase="placed", node="n1",
                                 epoch=epoch), Submission(key.workload, spec, 0.0), [])
    assert wait_until(lambda: out.exists() and out.read_text(), 10)
    return key, Path(out.read_text())


def test_a_workloads_tmpdir_is_kept_across_its_epochs_and_removed_with_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a killed workload leaves in its TMPDIR (torchrun's torchelastic_* directories)
    goes when the workload leaves the node, not into the node's /tmp forever; a restart in
    place finds what the previous epoch left (torch.compile's cache)."""
    supervisor = _tmp_writer_supervisor(tmp_path, monkeypatch)
    try:
        first, tmpdir = _launch_tmp_writer(supervisor, tmp_path, 3, {})
        assert tmpdir == tmp_path / "agent-tmp" / "hafo-tmp.job-0a1b2c"
        assert stat.S_IMODE(tmpdir.stat().st_mode) == 0o700
        launch = json.loads((tmp_path / "state" / "instances" / "job-0a1b2c.3" /
                             "launch.json").read_text())
        assert launch["tmpdir"] == str(tmpdir)
        if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # torch.compile's cache stays shared
            assert launch["env"]["TORCHINDUCTOR_CACHE_DIR"].startswith(
                str(tmp_path / "agent-tmp" / "torchinductor_"))
        supervisor.kill_all("test: lease lost")  # fenced
        second, again = _launch_tmp_writer(supervisor, tmp_path, 4, {})  # restarted here
        assert again == tmpdir
        supervisor.forget(first)
        assert len(list(tmpdir.glob("torchelastic_*"))) == 2  # kept: epoch 4 runs here
        supervisor.kill_all("test: lease lost")
        supervisor.forget(second)
        assert list((tmp_path / "agent-tmp").iterdir()) == []
    finally:
        supervisor.kill_all("test cleanup")


def test_a_tmpdir_set_in_the_spec_is_used_and_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "scratch"
    mine.mkdir()
    supervisor = _tmp_writer_supervisor(tmp_path, monkeypatch)
    try:
        key, tmpdir = _launch_tmp_writer(supervisor, tmp_path, 3, {"TMPDIR": str(mine)})
        assert tmpdir == mine
        assert list((tmp_path / "agent-tmp").iterdir()) == []  # none made for it
        supervisor.kill_all("test: lease lost")
        supervisor.forget(key)
        assert [p.name.startswith("torchelastic_") for p in mine.iterdir()] == [True]
    finally:
        supervisor.kill_all("test cleanup")
