"""The fencing deadline shared by the agent (writer) and its guards (readers).

One small file per node holds the deadline as CLOCK_MONOTONIC seconds and the boot id
(``hafo.agent.procid.boot_id``): the monotonic clock counts from the boot, so a deadline of a
previous boot means nothing in this one (after a power cut, an old deadline can lie far in the
new boot's future). A deadline of another boot reads as "already expired". The file is
replaced atomically, so a reader sees the old or the new value, never a mix. A missing or
unreadable file reads as "already expired": guards fail safe.

``FENCE_FILE`` (``deadline``) is the one guards read. The agent also writes the bare number to
``LEGACY_FENCE_FILE`` (``fence``), for guards started by an earlier version of hafo that are
still running during an upgrade (they read that file, and only a number).
"""

from __future__ import annotations

import os
from pathlib import Path

from hafo.agent.procid import boot_id

FENCE_FILE = "deadline"
LEGACY_FENCE_FILE = "fence"


def _write(state_dir: Path, name: str, text: str) -> None:
    tmp = state_dir / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, state_dir / name)


def write_deadline(state_dir: Path, deadline: float) -> None:
    """Atomically publish the deadline, with this boot's id (OSError when the directory
    cannot be written: the guards then keep the last deadline published, and fence)."""
    _write(state_dir, FENCE_FILE, f"{deadline:.6f} {boot_id()}\n")
    _write(state_dir, LEGACY_FENCE_FILE, f"{deadline:.6f}\n")


def parse_deadline(text: str, boot: str) -> float:
    """The deadline in a fence file's ``text``: 0.0 (expired) unless it was written in the
    boot ``boot`` and is a number."""
    fields = text.split()
    if len(fields) != 2 or not boot or fields[1] != boot:
        return 0.0
    try:
        return float(fields[0])
    except ValueError:
        return 0.0


def read_deadline(path: Path) -> float:
    """The published deadline, or 0.0 (expired) if it cannot be read or is of another boot."""
    try:
        text = path.read_text()
    except OSError:
        return 0.0
    return parse_deadline(text, boot_id())
