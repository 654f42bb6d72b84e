"""The fencing deadline shared by the agent (writer) and its guards (readers).

One small file per node holds the deadline as CLOCK_MONOTONIC seconds (system-wide on one
boot). It is replaced atomically, so a reader sees the old or the new value, never a mix.
A missing or unreadable file reads as "already expired": guards fail safe.
"""

from __future__ import annotations

import os
from pathlib import Path

FENCE_FILE = "fence"


def write_deadline(state_dir: Path, deadline: float) -> None:
    """Atomically publish the deadline."""
    tmp = state_dir / f".{FENCE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(f"{deadline:.6f}\n")
    os.replace(tmp, state_dir / FENCE_FILE)


def read_deadline(path: Path) -> float:
    """The published deadline, or 0.0 (expired) if it cannot be read."""
    try:
        return float(path.read_text().strip() or 0.0)
    except (OSError, ValueError):
        return 0.0
