"""Process identity (hafo.agent.procid) and the fence file's boot: a signal only to a process
whose identity was recorded, in this boot (docs/safety.md, rule 8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from hafo.agent import procid
from hafo.agent.fencefile import FENCE_FILE, parse_deadline, read_deadline, write_deadline
from hafo.agent.procid import ProcessId

OTHER_BOOT = "00000000-0000-4000-8000-000000000000"


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(5)


def test_identify_is_stable_and_dead_is_none(sleeper: subprocess.Popen[bytes]) -> None:
    first = procid.identify(sleeper.pid)
    assert first is not None and first == procid.identify(sleeper.pid)
    assert first.boot == procid.boot_id() and procid.is_alive(first)
    sleeper.kill()
    sleeper.wait(5)
    assert procid.identify(sleeper.pid) is None and not procid.is_alive(first)


@pytest.mark.parametrize("data", [
    None, [], "12", {"pid": 12}, {"pid": "12", "start": 1, "boot": "b"},
    {"pid": True, "start": 1, "boot": "b"}, {"pid": 0, "start": 1, "boot": "b"},
    {"pid": 12, "start": 1.5, "boot": "b"}, {"pid": 12, "start": 1, "boot": ""},
])
def test_a_malformed_record_is_no_identity(data: object) -> None:
    assert ProcessId.from_dict(data) is None


def test_round_trip() -> None:
    me = procid.myself()
    assert ProcessId.from_dict(me.to_dict()) == me


def test_no_signal_to_a_record_of_another_boot(sleeper: subprocess.Popen[bytes]) -> None:
    live = procid.identify(sleeper.pid)
    assert live is not None
    old = ProcessId(live.pid, live.start, OTHER_BOOT)
    assert not old.this_boot and not procid.is_alive(old)
    assert not procid.send(old, signal.SIGKILL)
    time.sleep(0.1)
    assert sleeper.poll() is None


def test_no_signal_to_a_recycled_number(sleeper: subprocess.Popen[bytes]) -> None:
    live = procid.identify(sleeper.pid)
    assert live is not None
    earlier = ProcessId(live.pid, live.start - 1, live.boot)  # another process, same number
    assert not procid.is_alive(earlier)
    assert not procid.send(earlier, signal.SIGKILL)
    time.sleep(0.1)
    assert sleeper.poll() is None
    assert procid.send(live, signal.SIGKILL)
    assert sleeper.wait(5) == -signal.SIGKILL


def test_never_this_process_nor_its_threads() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        tid = thread.native_id
        assert tid is not None and tid != os.getpid()
        as_recorded = procid.identify(tid)  # /proc/TID exists for a thread: an identity
        assert as_recorded is not None
        assert not procid.send(as_recorded, signal.SIGKILL)
        assert not procid.send(procid.myself(), signal.SIGKILL)
    finally:
        stop.set()
        thread.join()


def test_a_zombie_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = procid.identify(proc.pid)
    assert identity is not None
    deadline = time.monotonic() + 10
    while procid.is_alive(identity) and time.monotonic() < deadline:
        time.sleep(0.01)  # exited, not reaped: a zombie
    assert not procid.is_alive(identity)
    proc.wait(5)


def test_a_deadline_of_another_boot_is_expired(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert parse_deadline("123.5 boot-a\n", "boot-a") == 123.5
    assert parse_deadline("123.5 boot-a\n", "boot-b") == 0.0  # a previous boot's: expired
    assert parse_deadline("123.5\n", "boot-a") == 0.0  # no boot: cannot be trusted
    assert parse_deadline("soon boot-a", "boot-a") == 0.0
    assert parse_deadline("", "boot-a") == 0.0
    assert parse_deadline("123.5 boot-a", "") == 0.0
    write_deadline(tmp_path, 42.25)
    assert read_deadline(tmp_path / FENCE_FILE) == 42.25
    assert (tmp_path / "fence").read_text() == "42.250000\n"  # for guards of older versions
    (tmp_path / FENCE_FILE).write_text(f"99999999.0 {OTHER_BOOT}\n")
    assert read_deadline(tmp_path / FENCE_FILE) == 0.0
