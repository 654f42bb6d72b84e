"""examples/ddp_train.py as a gang, started by hand the way hafo starts one (one ``torchrun``
per "node", each in its own session, with hafo's environment): it trains, resumes from the
gang's checkpoint in the next epoch, stops for a planned move with no step lost, and exits
(never hangs) when a member dies."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo.agent.guard import catches
from hafo.checkpoint.format import list_checkpoints
from hafo.local.procs import descendants, free_port, pid_alive, spawn, wait_until
from hafo.local.progress import overlaps, read_progress

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SCRIPT = "examples/ddp_train.py"
FAST = ["--sleep", "0.02"]
pytestmark = pytest.mark.timeout(150)


class Gang:
    """One epoch of a gang: ``nodes`` torchrun processes on 127.0.0.1, as hafo starts them."""

    def __init__(self, base: Path, nodes: int, epoch: int, args: list[str],
                 ddp_timeout: float = 15.0) -> None:
        self.base, self.nodes, self.epoch, self.args = base, nodes, epoch, args
        self.ddp_timeout = ddp_timeout
        self.checkpoints = base / "ck"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        """Start every member, each in a session of its own."""
        base, nodes, epoch, ddp_timeout = self.base, self.nodes, self.epoch, self.ddp_timeout
        port = free_port()
        clean = {k: v for k, v in os.environ.items()
                 if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
                 and not k.startswith(("PET_", "TORCHELASTIC_"))}
        for rank in range(nodes):
            env = {**clean, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "",
                   "OMP_NUM_THREADS": "1", "HAFO_DDP_TIMEOUT": str(ddp_timeout),
                   "HAFO_WORKLOAD": "ddp", "HAFO_EPOCH": str(epoch), "HAFO_NODE": f"n{rank + 1}",
                   "HAFO_CHECKPOINT_DIR": str(self.checkpoints),
                   "HAFO_GANG_SIZE": str(nodes), "HAFO_GANG_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "NNODES": str(nodes), "NODE_RANK": str(rank), "WORLD_SIZE": str(nodes),
                   "RANK": str(rank), "PET_NNODES": str(nodes), "PET_NODE_RANK": str(rank),
                   "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port),
                   "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "0",
                   "TMPDIR": str(base)}  # as hafo gives each instance its own
            log = base / "logs" / f"e{epoch}-n{rank + 1}.log"
            self.logs.append(log)
            self.procs.append(spawn([TORCHRUN, SCRIPT, *self.args], log, env=env,
                                    cwd=str(ROOT)))

    def tree(self, member: int) -> list[int]:
        """The member's torchrun and all its descendants (its workers)."""
        pid = self.procs[member].pid
        return [pid, *descendants(pid)] if self.procs[member].poll() is None else []

    def workers(self) -> list[int]:
        """The training processes (torchrun's children) of every member."""
        return [pid for member in range(len(self.procs)) for pid in self.tree(member)[1:]]

    def signal_tree(self, member: int, sig: int) -> None:
        """Send ``sig`` to the member's whole process tree at once: torchrun starts each worker
        in a session (process group) of its own, so to every group of the tree."""
        for pid in self.tree(member):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # each process of the tree leads its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill(self, member: int) -> None:
        """SIGKILL the member's process tree (a power loss, as seen from this machine)."""
        self.signal_tree(member, signal.SIGKILL)
        self.procs[member].wait(10)

    def wait(self, timeout: float) -> list[int | None]:
        """Every member's exit status once all have exited, or None for those still running
        after ``timeout`` seconds."""
        wait_until(lambda: all(p.poll() is not None for p in self.procs), timeout, 0.1)
        return [p.poll() for p in self.procs]

    def strays(self) -> list[int]:
        """Live workers of this gang (found by their checkpoint directory), even orphans."""
        marker = f"HAFO_CHECKPOINT_DIR={self.checkpoints}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if (SCRIPT.encode() in (entry / "cmdline").read_bytes()
                            and marker in (entry / "environ").read_bytes().split(b"\0")
                            and pid_alive(int(entry.name))):
                        found.append(int(entry.name))
        return found

    def close(self) -> None:
        """Kill whatever is left, by process group and pid, and reap."""
        for member, proc in enumerate(self.procs):
            if proc.poll() is None:
                self.kill(member)
        for pid in self.strays():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def output(self) -> str:
        """Every member's output, for assertion messages."""
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs
                         if log.exists())


@contextlib.contextmanager
def gang(base: Path, nodes: int, epoch: int, args: list[str],
         ddp_timeout: float = 15.0) -> Iterator[Gang]:
    """A running gang, always killed on the way out."""
    running = Gang(base, nodes, epoch, args, ddp_timeout)
    try:
        running.start()
        yield running
    finally:
        running.close()


def lines(base: Path, epoch: int, event: str) -> list[dict[str, Any]]:
    """The progress lines of ``epoch`` with ``event``."""
    return [line for line in read_progress(base / "ck" / "progress.jsonl")
            if line["epoch"] == epoch and line["event"] == event]


def losses(base: Path, epoch: int) -> dict[int, float]:
    """The gang's mean loss by step (every rank logs the same all-reduced value)."""
    return {line["step"]: line["loss"] for line in lines(base, epoch, "step")}


class Trained:
    """Epoch 1 of a gang trained to step 30, run once per gang size for the whole module."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.bases: dict[int, Path] = {}

    def __call__(self, nodes: int) -> Path:
        """The base directory of the finished run with ``nodes`` members."""
        if nodes not in self.bases:
            base = self.factory.mktemp(f"trained{nodes}")
            with gang(base, nodes, 1, ["--steps", "30", "--every", "10", *FAST]) as first:
                codes = first.wait(60)
                assert codes == [0] * nodes, first.output()
            self.bases[nodes] = base
        return self.bases[nodes]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Gangs trained to step 30 (epoch 1), by size."""
    return Trained(tmp_path_factory)


@pytest.mark.parametrize("nodes", [2, 3])
def test_trains_to_the_last_step_and_checkpoints_it(trained: Trained, nodes: int) -> None:
    base = trained(nodes)
    steps = lines(base, 1, "step")
    assert sorted(line["step"] for line in steps) == sorted(list(range(1, 31)) * nodes)
    assert sorted({line["rank"] for line in steps}) == list(range(nodes))
    assert len(lines(base, 1, "done")) == nodes
    newest = list_checkpoints(base / "ck")[0]
    assert (newest.epoch, newest.step) == (1, 30)
    loss = losses(base, 1)
    assert loss[30] < loss[1] / 4, loss


def test_next_epoch_resumes_from_the_gang_checkpoint(trained: Trained, tmp_path: Path) -> None:
    shutil.copytree(trained(2) / "ck", tmp_path / "ck")
    before = losses(tmp_path, 1)
    with gang(tmp_path, 2, 2, ["--steps", "45", "--every", "10", *FAST]) as second:
        codes = second.wait(60)
        assert codes == [0, 0], second.output()
    starts = lines(tmp_path, 2, "start")
    assert len(starts) == 2
    assert all(line["resumed_from"] == 30 for line in starts), starts
    assert all(line["loss"] == pytest.approx(before[30]) for line in starts), starts
    after = losses(tmp_path, 2)
    assert min(after) == 31 and max(after) == 45
    # the first step after the resume continues the curve: nowhere near the initial loss
    assert abs(after[31] - before[30]) < 0.25 * (before[1] - before[30]), (before, after)
    newest = list_checkpoints(tmp_path / "ck")[0]
    assert (newest.epoch, newest.step) == (2, 45)
    assert overlaps(read_progress(tmp_path / "ck" / "progress.jsonl")) == []


def test_planned_stop_checkpoints_the_last_step(tmp_path: Path) -> None:
    with gang(tmp_path, 2, 1, ["--steps", "0", "--every", "10", *FAST]) as running:
        assert wait_until(lambda: max(losses(tmp_path, 1), default=0) >= 5, 45, 0.1), \
            running.output()
        workers = [pid for pid in running.workers() if catches(pid, signal.SIGUSR1)]
        assert len(workers) == 2, running.output()
        for pid in workers:  # what hafo does: SIGUSR1 to every process that catches it
            os.kill(pid, signal.SIGUSR1)
        signalled = time.monotonic()
        codes = running.wait(20)
        assert codes == [0, 0], running.output()
        assert time.monotonic() - signalled < 20
    last = max(losses(tmp_path, 1))
    newest = list_checkpoints(tmp_path / "ck")[0]
    assert newest.step == last, "steps lost in the planned stop"
    preempted = lines(tmp_path, 1, "preempted")
    assert sorted(line["rank"] for line in preempted) == [0, 1]
    assert all(line["step"] == last for line in preempted)


@pytest.mark.parametrize(("nodes", "victim", "how"),
                         [(3, 0, signal.SIGKILL), (2, 1, signal.SIGSTOP)],
                         ids=["rendezvous-host-killed", "member-frozen"])
def test_survivors_exit_when_a_member_dies(tmp_path: Path, nodes: int, victim: int,
                                           how: int) -> None:
    """Killed on this machine, the member's sockets are reset and the survivors fail at once;
    frozen (as a powered-off remote node looks: no reset), their collective times out."""
    with gang(tmp_path, nodes, 1, ["--steps", "0", "--every", "10", *FAST],
              ddp_timeout=3) as running:
        assert wait_until(lambda: max(losses(tmp_path, 1), default=0) >= 3, 45, 0.1), \
            running.output()
        if how == signal.SIGKILL:
            running.kill(victim)
        else:
            running.signal_tree(victim, how)
        killed = time.monotonic()
        wait_until(lambda: all(p.poll() is not None for member, p in enumerate(running.procs)
                               if member != victim), 30, 0.1)
        codes = [p.poll() for p in running.procs]
        survivors = [code for member, code in enumerate(codes) if member != victim]
        assert all(code is not None and code != 0 for code in survivors), \
            f"{codes} after {time.monotonic() - killed:.1f} s\n{running.output()}"
        running.close()
        assert running.strays() == []
    errors = lines(tmp_path, 1, "error")  # each survivor saw the loss and said so
    assert {line["rank"] for line in errors} == set(range(nodes)) - {victim}, errors
