"""hafo.notify: the sd_notify protocol against a real datagram socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

import pytest

from hafo.notify import Notifier


@pytest.mark.parametrize(("env", "interval"), [
    ({}, None), ({"WATCHDOG_USEC": "0"}, None), ({"WATCHDOG_USEC": "x"}, None),
    ({"WATCHDOG_USEC": "15000000"}, 15.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}, 2.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
])
def test_watchdog_interval(env: dict[str, str], interval: float | None) -> None:
    assert Notifier(env).watchdog_interval == interval


def test_outside_systemd_everything_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready("x") is False
    assert notifier.notify("WATCHDOG=1") is False
    assert Notifier({"NOTIFY_SOCKET": "relative/path"}).enabled is False


def test_messages_reach_the_socket(tmp_path: Path) -> None:
    address = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": address})
        assert notifier.ready("serving")
        assert sock.recv(1024).decode().split("\n")[:2] == ["READY=1", "STATUS=serving"]
        assert notifier.stopping()
        assert sock.recv(1024).decode().startswith("STOPPING=1")


def test_abstract_socket_address() -> None:
    name = f"hafo-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("WATCHDOG=1")
        assert sock.recv(64) == b"WATCHDOG=1"


def test_a_vanished_socket_is_not_an_error(tmp_path: Path) -> None:
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).notify("READY=1") is False


async def test_watchdog_pings_at_half_the_interval(tmp_path: Path) -> None:
    address = str(tmp_path / "w.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.setblocking(False)
        notifier = Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"})
        task = asyncio.create_task(notifier.keep_watchdog())
        await asyncio.sleep(0.45)  # on purpose: a span of time whose pings are counted
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        pings = []
        with contextlib.suppress(BlockingIOError):
            while True:
                pings.append(sock.recv(64))
        assert 3 <= len(pings) <= 6 and set(pings) == {b"WATCHDOG=1"}
