"""Every process of one instance, and killing them all at once (docs/safety.md, rule 7).

A workload may start processes outside its own process group and session: torchrun starts
each worker in a new session. Killing the workload's process group alone would leave those
running. An instance's processes are found two ways, both by pid:

- the descendants of its guard: the guard is a child subreaper, so a worker whose parent died
  is re-parented to the guard and stays its descendant;
- every process whose environment carries the instance's ``HAFO_WORKLOAD``, ``HAFO_EPOCH``
  and ``HAFO_NODE`` (inherited by all it starts), which finds them even once the guard itself
  is gone.

A kill freezes them all first (SIGSTOP, until no new one appears), then SIGKILLs them, so
none can fork its way out in between.

This is the fallback where the agent can make no cgroup (``hafo.agent.cgroups``): a process
that leaves the guard's tree (a double fork whose parent died before the guard became its
reaper cannot, but one re-parented elsewhere can) and clears its environment (``env -i``) is
found by neither way. docs/safety.md, "Without cgroups", says what is then not guaranteed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

from hafo.agent import procid
from hafo.agent.procid import ProcessId

PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it (Linux 3.4+)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(entry.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def children_map() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (one look at /proc)."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every live descendant of ``pid`` (not ``pid`` itself); ``children``: a
    ``children_map()`` already taken, to look at several trees at one moment."""
    if children is None:
        children = children_map()
    found: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return sorted(found)


def instance_processes(workload: str, epoch: int, node: str) -> list[int]:
    """Every process whose environment names this instance (``HAFO_WORKLOAD``,
    ``HAFO_EPOCH``, ``HAFO_NODE``: a gang's members share the first two, and a test machine
    may carry several nodes)."""
    marks = (f"HAFO_WORKLOAD={workload}".encode(), f"HAFO_EPOCH={epoch}".encode(),
             f"HAFO_NODE={node}".encode())
    me = os.getpid()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(mark in environ for mark in marks):
            found.append(int(entry.name))
    return sorted(found)


def _stopped_state(pid: int) -> bool:
    """True if ``/proc/<pid>/stat`` says stopped (``T``, or ``t``: traced); False when it
    cannot be read."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


def any_stopped(pids: list[int]) -> bool:
    """True if any of ``pids`` is stopped (reads ``/proc`` only)."""
    return any(_stopped_state(pid) for pid in pids)


def process_stopped(pid: int, workload: str, epoch: int, node: str) -> bool:
    """True if ``pid`` is a process of this instance (its environment names it, as
    ``instance_processes`` reads it) and is stopped (state ``T`` or ``t``: SIGSTOP, a
    debugger). Reads ``/proc`` only; False when it cannot tell."""
    marks = (f"HAFO_WORKLOAD={workload}".encode(), f"HAFO_EPOCH={epoch}".encode(),
             f"HAFO_NODE={node}".encode())
    try:
        environ = (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return all(mark in environ for mark in marks) and _stopped_state(pid)


def kill_instance(workload: str, epoch: int, node: str, root: int | None = None) -> list[int]:
    """Freeze, then SIGKILL, every process of the instance (``root``'s descendants and those
    its environment names); returns their pids. Each is signalled by the identity it had
    when found (hafo.agent.procid), so a number recycled meanwhile is never hit."""
    frozen: dict[int, ProcessId] = {}
    for _ in range(50):  # until no new process appears
        found = set(instance_processes(workload, epoch, node))
        if root is not None:
            found.update(descendants(root))
        new = [identity for identity in (procid.identify(pid) for pid in sorted(found)
                                         if pid not in frozen) if identity is not None]
        if not new:
            break
        for identity in new:
            procid.send(identity, signal.SIGSTOP)
            frozen[identity.pid] = identity
    for identity in frozen.values():
        procid.send(identity, signal.SIGKILL)
    return sorted(frozen)


def pid_alive(pid: int | None) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
