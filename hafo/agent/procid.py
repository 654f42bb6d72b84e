"""Process identity: a pid is a number, a process is (pid, start time, boot) (docs/safety.md,
rule 8).

A pid names a process only while that process lives: once it exits the number is handed to the
next process the kernel starts, and after a reboot every recorded number belongs to someone
else (one of the agent's own threads, an unrelated daemon, a new guard). So whatever hafo
records about a process carries its identity:

- ``pid``: the number, in the node's PID namespace;
- ``start``: its start time, field 22 of ``/proc/PID/stat`` (clock ticks since boot), which
  differs between any two processes that held the same number;
- ``boot``: the boot id (``/proc/sys/kernel/random/boot_id``), new at every boot.

A record from another boot is dead by definition. A signal goes only to a process whose
identity matches the record, through a pidfd (``os.pidfd_open``, then the identity checked,
then ``signal.pidfd_send_signal``): the pidfd pins the process, so its number cannot be
recycled between the check and the signal. This process and its own threads are never
signalled. Standard library only: guards import it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PROC = Path("/proc")

_boot_cache: dict[str, str] = {}


def boot_id() -> str:
    """This boot's id (read once per process; "" if the kernel does not tell)."""
    cached = _boot_cache.get("id")
    if cached is None:
        try:
            cached = BOOT_ID.read_text().strip()
        except OSError:
            cached = ""
        _boot_cache["id"] = cached
    return cached


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it does not exist."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat; fields[0] is field 3
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessId:
    """One process, as hafo records it."""

    pid: int
    start: int
    boot: str

    def to_dict(self) -> dict[str, Any]:
        """As recorded in an instance's ``state.json``."""
        return {"pid": self.pid, "start": self.start, "boot": self.boot}

    @classmethod
    def from_dict(cls, data: object) -> ProcessId | None:
        """A recorded identity, or None when absent or malformed (a file on disk: never
        trusted to be well formed)."""
        if not isinstance(data, dict):
            return None
        pid, start, boot = data.get("pid"), data.get("start"), data.get("boot")
        if (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
                and isinstance(start, int) and not isinstance(start, bool)
                and isinstance(boot, str) and boot):
            return cls(pid, start, boot)
        return None

    @property
    def this_boot(self) -> bool:
        """Recorded in this boot (a record of another boot names a process that is gone)."""
        return self.boot == boot_id()


def identify(pid: int) -> ProcessId | None:
    """The identity of the live process ``pid`` now, or None if there is none."""
    start = start_time(pid)
    return ProcessId(pid, start, boot_id()) if start is not None else None


def myself() -> ProcessId:
    """This process's identity."""
    me = identify(os.getpid())
    assert me is not None  # /proc/self exists while we run
    return me


def _own_threads() -> set[int]:
    """This process's id and its threads' ids (a thread id is a pid to ``kill``)."""
    own = {os.getpid()}
    with contextlib.suppress(OSError):
        own.update(int(t.name) for t in (PROC / "self" / "task").iterdir() if t.name.isdigit())
    return own


def is_alive(recorded: ProcessId | None) -> bool:
    """True if the recorded process still runs (same boot, same start time, not a zombie)."""
    if recorded is None or not recorded.this_boot:
        return False
    fields = _stat_fields(recorded.pid)
    if not fields or fields[0] == "Z":
        return False
    try:
        return int(fields[19]) == recorded.start
    except (ValueError, IndexError):
        return False


def send(recorded: ProcessId | None, sig: int) -> bool:
    """Send ``sig`` to the recorded process if it is still that process; True if sent.

    Never to a record of another boot, to a pid now held by another process, to this process
    or to one of its threads. Through a pidfd where the kernel has them (Linux 5.3+), so the
    identity checked is the identity signalled."""
    if recorded is None or not recorded.this_boot or recorded.pid in _own_threads():
        return False
    try:
        fd = os.pidfd_open(recorded.pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):  # no pidfds: check, then signal by number
        if not is_alive(recorded):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(recorded.pid, sig)
            return True
        return False
    try:
        if start_time(recorded.pid) != recorded.start:  # the fd pins whoever holds it now
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        os.close(fd)
