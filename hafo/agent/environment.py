"""The agent and its environment: a state directory that fails under it (remounted read-only
by a failing disk, full, I/O errors).

The agent must not die of such a fault (docs/safety.md, "The agent and its environment"):
it records each write that failed (``StateDirFaults``) so the health probe reports the node
unhealthy with the path and the OS error, while the supervisor keeps in memory what it could
not record (``Supervisor.write_failed``) and still reports and fences its work. The fencing
deadline it no longer publishes runs out in every guard, which then kills its workload by
itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from hafo.checks.os_probes import write_probe
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
            write_probe(root)
        except OSError as exc:
            return f"{root}: {os_error_text(exc)}"
        return ""
