"""One agent per state directory: an exclusive ``flock`` on ``STATE_DIR/.agent.lock``.

Two agent processes on one state directory (a second ``hafo agent`` started by hand beside the
service, or a unit file copied twice) would both adopt the same lease and both launch guards
for the same instances. The second one waits here, saying so, until the first one exits: the
kernel drops the lock with its holder's last descriptor, so a killed agent never leaves it held.
The descriptor is not inherited by guards or workloads (Python opens files non-inheritable).
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import structlog

log = structlog.get_logger("hafo.agent")

LOCK_FILE = ".agent.lock"
WAIT_LOG_EVERY = 30.0


def try_lock(state_dir: Path) -> int | None:
    """The locked descriptor, or None when another process holds the lock."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def holder(state_dir: Path) -> str:
    """The pid written by the lock's holder ("?" if unreadable)."""
    try:
        return (state_dir / LOCK_FILE).read_text().strip() or "?"
    except OSError:
        return "?"


async def hold_state_dir(state_dir: Path, poll: float = 0.1,
                         on_wait: Callable[[], None] | None = None) -> int:
    """Wait until this process alone holds ``state_dir``; returns the descriptor to keep.
    ``on_wait`` is called once, before the first wait (the lock is another agent's)."""
    said = -math.inf  # said at once: a monotonic clock may be young (a fresh boot)
    while True:
        fd = try_lock(state_dir)
        if fd is not None:
            return fd
        if on_wait is not None:
            on_wait()
            on_wait = None
        if time.monotonic() - said >= WAIT_LOG_EVERY:
            said = time.monotonic()
            log.warning("state directory is in use by another agent: waiting until it exits",
                        state_dir=str(state_dir), pid=holder(state_dir))
        await asyncio.sleep(poll)
