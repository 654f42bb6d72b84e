"""Instances (one workload at one epoch) on disk: what the agent launched, what each guard
reports. Each lives in ``<state_dir>/instances/<workload>.<epoch>/`` so a restarted agent
finds its guards again (docs/reference/files.md, "Files on a node"):

    launch.json   written by the agent: workload, epoch, node, argv, env, cwd, grace,
                  fence_file, checkpoint_mode, launched_at
    state.json    written by the guard (by the agent once the guard is gone): guard_pid, pid,
                  guard and workload (their identities: pid, start, boot; see
                  hafo.agent.procid), state, exit_code, started_at, finished_at, reason,
                  ended (how it ended: hafo.model.ends.InstanceEnd), stop_checkpoint,
                  transparent, stderr_tail (the last lines of the workload's stderr, once it
                  exited)
    submission.json  written by the agent before launch.json: what it launched the
                  instance for, for ``hafo recover --from-agents`` (hafo.agent.recovery_report):
                  submission (the workload's record as in etcd), service (a replica's
                  service's record, else null), assignment (as this node runs it: node,
                  GPUs, a gang's members and ranks), epoch
    output.log    the workload's stdout and stderr
    guard.log     the guard's own stderr

Beside them, ``<state_dir>/instances/.lease.json`` is the agent's lease record (see
hafo.agent.claim): kept with the instance records, so that one cannot survive without the
other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hafo.agent.procid import ProcessId
from hafo.model.ends import InstanceEnd, instance_end

INSTANCES = "instances"


@dataclass(frozen=True)
class InstanceKey:
    """Identity of an instance."""

    workload: str
    epoch: int

    @property
    def dirname(self) -> str:
        """Directory name under ``instances/``."""
        return f"{self.workload}.{self.epoch}"


@dataclass(frozen=True)
class GuardState:
    """What the guard last wrote about its instance."""

    guard_pid: int | None
    pid: int | None
    state: str
    exit_code: int | None
    started_at: float | None
    finished_at: float | None
    reason: str
    transparent: str | None = None  # why a transparent checkpoint was refused
    ended: InstanceEnd | None = None  # how it ended (exited instances)
    stop_checkpoint: int | None = None  # the step committed for a stop (None: none)
    stderr_tail: str = ""  # the last lines of the workload's stderr, once it exited
    guard: ProcessId | None = None  # the guard's identity (None: an older guard's record)
    workload: ProcessId | None = None  # the workload's first process's identity

    @property
    def never_started(self) -> bool:
        """It exited by itself without ever having a process: its command could not be
        started (no such file, not executable, the launch failed); ``reason`` says why."""
        return self.state == "exited" and self.pid is None and self.ended is InstanceEnd.EXIT

    @property
    def last_words(self) -> str:
        """What the workload said last, for its report's ``stderr_tail``: its stderr's last
        lines; for one that never started, the reason why not."""
        return self.stderr_tail or (self.reason if self.never_started else "")


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def progress_dir(instance_path: Path) -> Path:
    """The progress directory of the instance whose directory is ``instance_path``
    (``$HAFO_PROGRESS_DIR``: each rank's heartbeat, ``hafo.model.progress``)."""
    return instance_path / "progress"


def instance_dir(state_dir: Path, key: InstanceKey) -> Path:
    """The instance's directory."""
    return state_dir / INSTANCES / key.dirname


def list_instances(state_dir: Path) -> list[InstanceKey]:
    """Every instance directory present."""
    root = state_dir / INSTANCES
    keys: list[InstanceKey] = []
    if not root.is_dir():
        return keys
    for entry in root.iterdir():
        workload, _, epoch = entry.name.rpartition(".")
        if workload and epoch.isdigit():
            keys.append(InstanceKey(workload, int(epoch)))
    return keys


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically with ``data`` as JSON."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_launch(path: Path) -> dict[str, Any] | None:
    """The agent's launch.json of the instance at ``path``, or None if not written yet (or
    unreadable, or not a JSON object)."""
    try:
        data = json.loads((path / "launch.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


SUBMISSION_FILE = "submission.json"


def read_submission_file(path: Path) -> dict[str, Any] | None:
    """The agent's submission.json of the instance at ``path``, or None (none: launched by
    an agent before it; unreadable, or not a JSON object)."""
    try:
        data = json.loads((path / SUBMISSION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_guard_state(path: Path) -> GuardState | None:
    """The guard's state.json, or None if not written yet (or unreadable)."""
    try:
        data = json.loads((path / "state.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return GuardState(guard_pid=_int_or_none(data.get("guard_pid")),
                      pid=_int_or_none(data.get("pid")),
                      state=str(data.get("state", "starting")), exit_code=data.get("exit_code"),
                      started_at=data.get("started_at"), finished_at=data.get("finished_at"),
                      reason=str(data.get("reason", "")), transparent=data.get("transparent"),
                      ended=instance_end(data.get("ended")),
                      stop_checkpoint=_int_or_none(data.get("stop_checkpoint")),
                      stderr_tail=_text(data.get("stderr_tail")),
                      guard=ProcessId.from_dict(data.get("guard")),
                      workload=ProcessId.from_dict(data.get("workload")))
