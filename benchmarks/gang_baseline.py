"""Baseline of the "gang failover" benchmark: the same DDP job under plain elastic torchrun,
no hafo. How long until a gang that lost a node trains again, and how many steps it lost?

Three "nodes" are three ``torchrun --nnodes 2:3 --max-restarts 3 --rdzv-backend c10d``
processes on 127.0.0.1, each in a session of its own; node 1 hosts the c10d rendezvous
(``is_host=true``: its torchrun serves the TCPStore on the rendezvous port), the other two
connect to it. They run examples/ddp_train.py (``--steps 0 --every 10 --sleep 0.05``, a
temporary checkpoint directory, a fixed HAFO_EPOCH) until it trains steadily, then one node
is powered off: SIGKILL of its whole process tree at once (torchrun and its workers, which
torchrun starts in sessions of their own). Measured from the kill:

- ``time_to_train``: seconds until the surviving gang logs its first step (None: not within
  the timeout);
- ``steps_lost``: the last step logged before the kill minus the step the restarted workers
  resumed from (torchrun restarts them; they reload the newest checkpoint).

Scenarios: ``worker`` (node 3 dies, the rendezvous host survives) and ``rendezvous-host``
(node 1 dies, and with it the rendezvous store).

    python benchmarks/gang_baseline.py

The environment passes through to torchrun: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives the
workers a store of their own per round instead of the rendezvous store, which torchrun shares
with them by default and where a restarted round can read the previous round's addresses
(pytorch/pytorch#135712): with it the "worker" scenario recovers every time, without it often
only after further restarts, or never.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hafo.local.procs import descendants, free_port, pid_alive, spawn
from hafo.local.progress import read_progress

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SCRIPT = "examples/ddp_train.py"
NODES = 3
STEADY_STEP = 25  # trains steadily: checkpoints at 10 and 20 exist
STARTUP_TIMEOUT = 120.0
POLL = 0.05
SCENARIOS = {"worker": 2, "rendezvous-host": 0}  # which node is killed


@dataclass
class BaselineResult:
    """One scenario: recovery time and steps lost after a node's power loss, plain torchrun."""

    scenario: str
    time_to_train: float | None
    steps_lost: int | None
    startup: float
    detail: str

    def line(self) -> str:
        """The result as one line."""
        ttt = "never" if self.time_to_train is None else f"{self.time_to_train:.2f}s"
        lost = "n/a" if self.steps_lost is None else str(self.steps_lost)
        return (f"torchrun baseline, lost {self.scenario}: time_to_train {ttt}, steps_lost "
                f"{lost}, startup {self.startup:.2f}s ({self.detail})")


class TorchrunGang:
    """Three elastic torchrun "nodes" on this machine; stops everything it started."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.checkpoints = base / "ck"
        self.port = free_port()
        self.run_id = f"baseline-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, node: int) -> dict[str, str]:
        """The environment of node ``node``: no torchrun or hafo gang variables inherited."""
        clean = {k: v for k, v in os.environ.items()
                 if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                              "NODE_RANK", "NNODES"}
                 and not k.startswith(("PET_", "TORCHELASTIC_", "HAFO_"))}
        return {**clean, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                "CUDA_VISIBLE_DEVICES": "", "HAFO_WORKLOAD": "ddp-baseline", "HAFO_EPOCH": "1",
                "HAFO_NODE": f"n{node + 1}", "HAFO_CHECKPOINT_DIR": str(self.checkpoints),
                "TMPDIR": str(self.base)}  # torchrun's torchelastic_* go with the run

    def start(self) -> None:
        """Launch the three nodes, the rendezvous host first."""
        for node in range(NODES):
            argv = [TORCHRUN, "--nnodes", f"2:{NODES}", "--nproc-per-node", "1",
                    "--max-restarts", "3", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", self.run_id,
                    "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
                    "--local-addr", "127.0.0.1",
                    SCRIPT, "--steps", "0", "--every", "10", "--sleep", "0.05"]
            self.procs.append(spawn(argv, self.base / "logs" / f"n{node + 1}.log",
                                    env=self.env(node), cwd=str(ROOT)))

    def tree(self, node: int) -> list[int]:
        """Node ``node``'s torchrun and its descendants."""
        pid = self.procs[node].pid
        return [pid, *descendants(pid)] if self.procs[node].poll() is None else []

    def power_off(self, node: int) -> None:
        """SIGKILL every process of the node's tree at once, every process group of it."""
        for pid in self.tree(node):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # torchrun and each worker lead a group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.procs[node].wait(10)

    def strays(self) -> list[int]:
        """Live processes of this gang, orphans included: every process it started (torchrun,
        its workers) carries this run's checkpoint directory in its environment."""
        marker = f"HAFO_CHECKPOINT_DIR={self.checkpoints}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if marker in (entry / "environ").read_bytes().split(b"\0") and pid_alive(
                            int(entry.name)):
                        found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Kill everything this gang started, by process group and pid, and reap."""
        for node in range(len(self.procs)):
            self.power_off(node)
        for pid in self.strays():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def progress(self) -> list[dict[str, Any]]:
        """The job's progress log so far."""
        return read_progress(self.checkpoints / "progress.jsonl")


def _steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == "step"]


def run_torchrun_baseline(lost: str, timeout: float = 90.0,
                          workdir: Path | None = None) -> BaselineResult:
    """Run one scenario (``lost``: "worker" or "rendezvous-host") and measure it.

    ``timeout``: how long after the kill the survivors may take to train again.
    ``workdir``: where the checkpoints and logs go (default: a temporary directory, removed).
    """
    if lost not in SCENARIOS:
        raise ValueError(f"lost must be one of {sorted(SCENARIOS)}, not {lost!r}")
    victim = SCENARIOS[lost]
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix="gang-baseline-")) if workdir is None else workdir
    base.mkdir(parents=True, exist_ok=True)
    gang = TorchrunGang(base)
    try:
        launched = time.time()
        gang.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while max((s["step"] for s in _steps(gang.progress())), default=0) < STEADY_STEP:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the torchrun gang did not reach step {STEADY_STEP} in "
                                   f"{STARTUP_TIMEOUT:.0f} s (logs in {base / 'logs'})")
            if all(p.poll() is not None for p in gang.procs):
                raise RuntimeError(f"every torchrun exited before training (logs in "
                                   f"{base / 'logs'})")
            time.sleep(POLL)
        steps = _steps(gang.progress())
        startup = min(s["t"] for s in steps) - launched
        world = max(s.get("world", 0) for s in gang.progress() if s.get("event") == "start")
        killed = time.time()
        gang.power_off(victim)
        last_before = max(s["step"] for s in _steps(gang.progress()) if s["t"] <= killed)

        survivors = [n for n in range(NODES) if n != victim]
        exits: dict[int, tuple[int, float]] = {}
        first: dict[str, Any] | None = None
        restart: dict[str, Any] | None = None
        end = time.monotonic() + timeout
        while time.monotonic() < end and first is None:
            lines = gang.progress()
            starts = {line["pid"]: line for line in lines
                      if line.get("event") == "start" and line["t"] > killed}
            after = [s for s in _steps(lines) if s["pid"] in starts]
            if after:
                first = min(after, key=lambda s: s["t"])
                restart = starts[first["pid"]]
                break
            for node in survivors:
                code = gang.procs[node].poll()
                if code is not None and node not in exits:
                    exits[node] = (code, time.time() - killed)
            if len(exits) == len(survivors):
                break  # every survivor gave up: it will never train again
            time.sleep(POLL)

        if first is None or restart is None:
            after = [line for line in gang.progress() if line["t"] > killed]
            parts = [f"world {world}, killed n{victim + 1} at step {last_before}",
                     f"no step in {timeout:.0f}s",
                     f"{sum(1 for x in after if x.get('event') == 'start')} workers started and "
                     f"{sum(1 for x in after if x.get('event') == 'error')} failed after the kill"]
            parts += [f"n{n + 1} exited {code} after {t:.1f}s"
                      for n, (code, t) in sorted(exits.items())]
            running = [f"n{n + 1}" for n in survivors if n not in exits]
            if running:
                parts.append(f"still running: {', '.join(running)}")
            return BaselineResult(lost, None, None, startup, "; ".join(parts))
        resumed = int(restart["resumed_from"])
        lines = [line for line in gang.progress() if line["t"] > killed]
        detected = min((e["t"] for e in lines if e.get("event") == "error"), default=None)
        started = sum(1 for line in lines if line.get("event") == "start"
                      and line["t"] <= first["t"])
        detail = (f"world {world} -> {restart.get('world')}, killed n{victim + 1} at step "
                  f"{last_before}, resumed from {resumed}; peer loss seen by workers after "
                  + ("n/a" if detected is None else f"{detected - killed:.2f}s")
                  + f"; {started} workers started before the gang trained again, the "
                  f"successful ones after {restart['t'] - killed:.2f}s")
        return BaselineResult(lost, first["t"] - killed, last_before - resumed, startup, detail)
    finally:
        gang.stop()
        if own:
            shutil.rmtree(base, ignore_errors=True)


def main() -> int:
    """Both scenarios, one line each."""
    for lost in ("worker", "rendezvous-host"):
        print(run_torchrun_baseline(lost).line(), flush=True)
    return 0


if __name__ == "__main__":
    from bench_main import run_main

    run_main(main)
