"""Processes on the simulated nodes that hafo did not start, watched through a chaos run:
nothing of them may be signalled (docs/safety.md, rule 8).

On every node, at its first boot and after every power-on, a few bystanders start in the node's
own namespaces, each in a session of its own as a daemon would, adopted by the node's PID 1: an
ordinary program that logs every catchable signal it receives. A bystander may die only with its
node's power; a signal logged, a death while its node stays powered, or a bystander found
stopped (SIGSTOP, which no program can catch) is a violation.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hafo.local.cluster import LocalCluster
from hafo.local.procs import kill_pid, wait_until

#: The bystander program: logs each catchable signal it gets, and lives on.
PROGRAM = """
import os, signal, sys, time
log = sys.argv[1]
def got(sig, _frame):
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} got {signal.Signals(sig).name}\\n")
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGCONT, signal.SIGALRM, signal.SIGPIPE):
    signal.signal(sig, got)
while True:
    time.sleep(1)
"""


@dataclass(frozen=True)
class Bystander:
    """One watched process: its node, host pid, host-side start time and signal log."""

    node: str
    pid: int
    start: str
    log: Path


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


@dataclass
class Bystanders:
    """Start, watch and finally stop the bystanders of a local cluster's nodes."""

    cluster: LocalCluster
    per_node: int = 2
    watched: list[Bystander] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    started: int = 0

    def start(self, node: str) -> None:
        """Start ``per_node`` bystanders on the (powered) node, in its own namespaces."""
        handle = self.cluster.node_handles[node]
        init = handle.processes().get(1) if handle.isolated else None
        if init is None:
            return  # a node in the host's namespaces: its processes are the host's
        for _ in range(self.per_node):
            self.started += 1
            log = self.cluster.base / "bystanders" / f"{node}.{self.started}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.touch()
            subprocess.run(["nsenter", "-t", str(init), "-p", "-m", "--", "setsid", "-f",
                            sys.executable, "-I", "-S", "-c", PROGRAM, str(log)],  # light
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True,
                           timeout=10)
            mark = str(log).encode()

            def found(mark: bytes = mark) -> int | None:
                for pid in self.cluster.node_pids(node):
                    try:
                        if mark in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                            return pid
                    except OSError:
                        continue
                return None

            wait_until(lambda found=found: found() is not None, 5)
            pid = found()
            if pid is None:
                self.violations.append(f"bystander on {node} did not start")
                continue
            self.watched.append(Bystander(node, pid, _stat(pid)[19], log))

    def powered_off(self, node: str) -> None:
        """The node lost power: its bystanders died with it, as they may."""
        self.watched = [b for b in self.watched if b.node != node]

    def check(self) -> None:
        """One look: every bystander alive, the same process, not stopped, never signalled."""
        for bystander in self.watched:
            fields = _stat(bystander.pid)
            if not fields or fields[19] != bystander.start or fields[0] == "Z":
                self._violation(bystander, "killed")
            elif fields[0] in ("T", "t"):
                self._violation(bystander, "stopped")
            elif logged := self._logged(bystander):
                self._violation(bystander, logged)

    @staticmethod
    def _logged(bystander: Bystander) -> str:
        """What the bystander logged (a signal it got), or "" (an unreadable log is said:
        the watch must not end of it)."""
        try:
            return bystander.log.read_text().strip()[:200]
        except OSError as exc:
            return f"its log is unreadable: {exc}"

    def _violation(self, bystander: Bystander, what: str) -> None:
        text = f"bystander {bystander.pid} on {bystander.node}: {what}"
        if text not in self.violations:
            self.violations.append(text)

    def stop(self) -> None:
        """Kill every bystander still watched (by pid, identity checked)."""
        for bystander in self.watched:
            fields = _stat(bystander.pid)
            if fields and fields[19] == bystander.start:
                kill_pid(bystander.pid)
        self.watched = []
