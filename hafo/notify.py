"""systemd's notification protocol (sd_notify), without libsystemd.

Under ``Type=notify`` a daemon tells systemd ``READY=1`` once it serves, ``STATUS=...`` for
``systemctl status``, ``STOPPING=1`` on the way out, and, with ``WatchdogSec=``, pings
``WATCHDOG=1`` more often than the watchdog interval. The pings come from a task on the
daemon's own event loop, so a stuck loop stops them and systemd restarts the daemon.
Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends notifications to the socket systemd names in ``NOTIFY_SOCKET``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        self.address = address if address.startswith(("/", "\0")) else ""
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        """Whether systemd listens (``NOTIFY_SOCKET`` is set)."""
        return bool(self.address)

    def notify(self, *lines: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; False when not under systemd or the send
        failed (a notification is never worth crashing the daemon for)."""
        if not self.address:
            return False
        payload = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(payload, self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> bool:
        """``READY=1`` with a status line."""
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def stopping(self, status: str = "stopping") -> bool:
        """``STOPPING=1`` with a status line."""
        return self.notify("STOPPING=1", f"STATUS={status}")

    async def keep_watchdog(self) -> None:
        """Ping ``WATCHDOG=1`` at half the watchdog interval until cancelled (returns at once
        when no watchdog is configured)."""
        if self.watchdog_interval is None or not self.address:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval / 2)


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds of ``WATCHDOG_USEC``, if it is meant for this process (``WATCHDOG_PID``)."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid != str(os.getpid()):
        return None
    return int(usec) / 1_000_000
