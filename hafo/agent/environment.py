"""The agent and its environment: a state directory that fails under it (remounted read-only
by a failing disk, full, I/O errors).

The agent must not die of such a fault (docs/safety.md, "The agent and its environment"):
it records each write that failed (``StateDirFaults``) so the health probe reports the node
unhealthy with the path and the OS error, and falls back to reading the instance records
without writing them (``read_states``, ``fence_without_records``) so it can still report and
fence its work. The fencing deadline it no longer publishes runs out in every guard, which
then kills its workload by itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from hafo.agent.instances import (
    GuardState,
    InstanceKey,
    instance_dir,
    list_instances,
    read_guard_state,
)
from hafo.agent.proctree import kill_instance, pid_alive
from hafo.model.ends import InstanceEnd
from hafo.model.health import STATE_DIR, Finding

#: How long a guard may take to write its first state before it counts as not started
#: (the same as ``Supervisor.states``).
GUARD_START = 10.0


def os_error_text(exc: OSError) -> str:
    """The OS error in words, lower case: ``read-only file system``, ``no space left on
    device`` (the exception's text when it has no errno)."""
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


class StateDirFaults:
    """What failed in the state directory, for the health probe (thread-safe: the probe runs
    in a thread).

    ``findings()`` reports, at most one finding (kind ``state_dir``, detail ``PATH: ERROR``):
    the state directory's own write probe failing (it is mounted read-only, or a small
    fsync'ed write fails); else the fencing deadline not published (sticky until a write of
    it succeeds); else any other write that failed since the last probe (launch files, an
    instance record): reported once, the health hysteresis keeps the node unhealthy."""

    FENCE = "fence"

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self._lock = threading.Lock()
        self._fence = ""
        self._other = ""

    def failed(self, what: str, path: Path, exc: OSError) -> str:
        """Record a write of ``what`` to ``path`` that failed; returns the detail."""
        detail = f"{path}: {os_error_text(exc)}"
        with self._lock:
            if what == self.FENCE:
                self._fence = detail
            else:
                self._other = detail
        return detail

    def succeeded(self, what: str) -> bool:
        """A write of ``what`` worked again; True if it had failed before."""
        with self._lock:
            if what == self.FENCE:
                was, self._fence = self._fence, ""
                return bool(was)
        return False

    @property
    def fence_failing(self) -> str:
        """Why the last fencing deadline could not be published ("" when it was)."""
        with self._lock:
            return self._fence

    def findings(self) -> list[Finding]:
        """See the class docstring; blocking (statvfs, a small write), never raises."""
        detail = self.probe()
        with self._lock:
            detail = detail or self._fence or self._other
            self._other = ""
        return [Finding(STATE_DIR, detail=detail)] if detail else []

    def probe(self) -> str:
        """Whether the state directory takes a small, fsync'ed write: "" or ``PATH: ERROR``."""
        root = self.state_dir
        try:
            if os.statvfs(root).f_flag & os.ST_RDONLY:
                return f"{root}: read-only file system"
            probe = root / f".hafo-probe-{os.getpid()}"
            try:
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, b"hafo")
                    os.fsync(fd)
                finally:
                    os.close(fd)
            finally:
                with contextlib.suppress(OSError):
                    probe.unlink()
        except OSError as exc:
            return f"{root}: {os_error_text(exc)}"
        return ""


def read_states(state_dir: Path, node: str,
                known: Mapping[InstanceKey, GuardState] | None = None
                ) -> dict[InstanceKey, GuardState]:
    """``Supervisor.states`` without writing anything: for when the state directory cannot be
    written. A guard that died (or never started) is reported exited, and the rest of its
    instance is killed, as there; its record stays as it is on disk. ``known``: exited
    states of an earlier call, used as they are (not killed again)."""
    out: dict[InstanceKey, GuardState] = {}
    for key in list_instances(state_dir):
        if known and key in known:
            out[key] = known[key]
            continue
        path = instance_dir(state_dir, key)
        state = read_guard_state(path)
        now = time.time()
        if state is None:
            try:
                launched = (path / "launch.json").exists()
                age = now - path.stat().st_mtime if launched else 0.0
            except OSError:
                continue  # removed meanwhile
            state = (GuardState(None, None, "starting", None, None, None, "")
                     if age < GUARD_START else
                     GuardState(None, None, "exited", None, None, now, "guard did not start",
                                ended=InstanceEnd.GUARD_LOST))
        elif state.state != "exited" and not pid_alive(state.guard_pid):
            _kill(key, state, node)
            state = GuardState(state.guard_pid, state.pid, "exited", -9, state.started_at, now,
                               "guard died", ended=InstanceEnd.GUARD_LOST)
        out[key] = state
    return out


def fence_without_records(state_dir: Path, node: str, why: str) -> list[InstanceKey]:
    """``Supervisor.kill_all`` without writing anything: kill every instance that may still
    run (workload, its process tree, its guard). Returns the instances killed."""
    killed = []
    for key in list_instances(state_dir):
        state = read_guard_state(instance_dir(state_dir, key))
        if state is not None and state.state == "exited":
            continue
        _kill(key, state, node)
        killed.append(key)
    return killed


def _kill(key: InstanceKey, state: GuardState | None, node: str) -> None:
    """SIGKILL whatever of one instance may still run (never raises for a gone process)."""
    if state is not None and state.pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(state.pid, signal.SIGKILL)
    guard = state.guard_pid if state is not None else None
    kill_instance(key.workload, key.epoch, node, guard)
    if guard:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(guard, signal.SIGKILL)
