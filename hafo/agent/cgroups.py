"""A cgroup (v2) for each instance: its processes are the cgroup's (docs/safety.md, rule 7).

A process cannot leave its cgroup by forking, by starting a new session, by re-executing with
an empty environment or by outliving its parent: only a write to another cgroup's
``cgroup.procs`` moves it. So every process of an instance is the population of the
instance's cgroup, "alive" means the cgroup is not empty, and killing the instance is one
write to ``cgroup.kill`` (Linux 5.14+; before that: freeze, SIGKILL every member, thaw), done
when ``cgroup.events`` reads ``populated 0``.

The instances' cgroups are children of the agent's own cgroup: under systemd the agent's unit
delegates its subtree (``Delegate=yes``); on a simulated node the local cluster gives each
node a cgroup of its own. No controller is enabled, so the agent's cgroup may hold processes
and children both. Where no cgroup v2 hierarchy is mounted or the agent's cgroup is not
writable, ``CgroupRoot.detect`` says why and the agent falls back to finding processes by
their tree and environment (``hafo.agent.proctree``), a weaker guarantee (docs/safety.md).
Standard library only: guards import it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PROC_SELF = Path("/proc/self")
WAIT_EMPTY = 5.0  # seconds a kill waits for the cgroup to empty


def cgroup2_mount(mountinfo: str) -> Path | None:
    """The mount point of the cgroup v2 hierarchy in ``/proc/self/mountinfo``'s text (the
    first whose root is ``/``), or None."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5 and fields[3] == "/":
            return Path(fields[4].replace("\\040", " "))
    return None


def own_cgroup(cgroup_file: str) -> str | None:
    """This process's cgroup v2 path from ``/proc/self/cgroup``'s text (``0::/path``)."""
    for line in cgroup_file.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


@dataclass(frozen=True)
class CgroupRoot:
    """Where the agent makes its instances' cgroups (``path``), or why it cannot (``path``
    None, ``reason`` set)."""

    path: Path | None
    reason: str = ""

    @property
    def contained(self) -> bool:
        """True if instances get cgroups of their own."""
        return self.path is not None

    @classmethod
    def detect(cls) -> CgroupRoot:
        """The agent's own cgroup, if it is a writable cgroup v2 directory."""
        try:
            mount = cgroup2_mount((PROC_SELF / "mountinfo").read_text())
            own = own_cgroup((PROC_SELF / "cgroup").read_text())
        except OSError as exc:
            return cls(None, f"cannot read /proc/self: {exc.strerror or exc}")
        if mount is None:
            return cls(None, "no cgroup v2 hierarchy is mounted")
        if own is None:
            return cls(None, "this process is in no cgroup v2 group")
        path = mount / own.lstrip("/")
        probe = path / f"hafo-probe.{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return cls(None, f"cgroup {path} is not writable: {exc.strerror or exc} "
                             "(the agent's unit needs Delegate=yes)")
        return cls(path)

    def of(self, node: str, dirname: str) -> Path | None:
        """The cgroup of node ``node``'s instance named ``dirname`` (None without
        containment). The node is in the name: a gang's members share workload and epoch,
        and test hosts may run several nodes' agents in one cgroup."""
        return self.path / f"hafo.{node}.{dirname}" if self.path is not None else None


def make(path: Path) -> None:
    """Create an instance's cgroup (an empty one left over is reused)."""
    path.mkdir(exist_ok=True)


def join(path: Path) -> None:
    """Move the calling process into the cgroup at ``path`` (a workload's first act, between
    fork and exec: everything it starts is born there)."""
    with open(path / "cgroup.procs", "w") as procs:
        procs.write("0")


def populated(path: Path) -> bool:
    """True while a process lives in the cgroup or below it (a missing cgroup is empty)."""
    try:
        for line in (path / "cgroup.events").read_text().splitlines():
            if line.startswith("populated "):
                return line.split()[1] != "0"
    except OSError:
        return False
    return False


def members(path: Path) -> list[int]:
    """The pids in the cgroup itself (not below it)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_each(path: Path) -> None:
    """Without ``cgroup.kill``: freeze the cgroup (no member can fork meanwhile), SIGKILL
    each member, thaw (a frozen process dies of SIGKILL once thawed)."""
    freeze = path / "cgroup.freeze"
    with contextlib.suppress(OSError):
        freeze.write_text("1")
    for pid in members(path):  # members of the cgroup, so ours: not recycled while frozen
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        freeze.write_text("0")


def kill(path: Path, wait: float = WAIT_EMPTY) -> bool:
    """SIGKILL every process in the cgroup and wait until it is empty; True once empty."""
    deadline = time.monotonic() + wait
    while populated(path):
        try:
            (path / "cgroup.kill").write_text("1")
        except FileNotFoundError:
            if not (path / "cgroup.procs").exists():
                return True  # the cgroup itself is gone
            _kill_each(path)
        except OSError:
            _kill_each(path)
        if time.monotonic() >= deadline:
            return not populated(path)
        time.sleep(0.005)
    return True


def remove(path: Path) -> None:
    """Remove an empty cgroup (kept if still populated or already gone)."""
    with contextlib.suppress(OSError):
        path.rmdir()


def move(source: Path, target: Path, rounds: int = 50) -> bool:
    """Move every process of the cgroup ``source`` into ``target`` (made if missing): a warm
    gang member handed to its next instance goes on in that instance's cgroup. Repeated
    while processes remain (one may fork meanwhile); True once ``source`` holds none."""
    make(target)
    for _ in range(rounds):
        pids = members(source)
        if not pids:
            return not populated(source)
        for pid in pids:
            try:
                with open(target / "cgroup.procs", "w") as procs:
                    procs.write(str(pid))
            except ProcessLookupError:
                continue  # it exited meanwhile
            except OSError:
                return False
    return not members(source)
