"""One agent per state directory: the lock is exclusive and dies with its holder."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hafo.agent.statelock import LOCK_FILE, hold_state_dir, holder, try_lock


def test_a_held_directory_is_refused_until_released(tmp_path: Path) -> None:
    first = try_lock(tmp_path / "state")
    assert first is not None
    assert holder(tmp_path / "state") == str(os.getpid())
    assert try_lock(tmp_path / "state") is None
    os.close(first)
    second = try_lock(tmp_path / "state")
    assert second is not None
    os.close(second)


@pytest.mark.timeout(30)
def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code = ("import sys, time; from pathlib import Path; from hafo.agent.statelock import "
            "try_lock; assert try_lock(Path(sys.argv[1])) is not None; print('held', "
            "flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
        assert try_lock(state) is None

        async def wait_then_kill() -> int:
            waiter = asyncio.create_task(hold_state_dir(state, poll=0.02))
            await asyncio.sleep(0.3)
            assert not waiter.done()
            proc.kill()
            return await asyncio.wait_for(waiter, 10)

        fd = asyncio.run(wait_then_kill())
        assert (state / LOCK_FILE).read_text().strip() == str(os.getpid())
        os.close(fd)
    finally:
        proc.kill()
        proc.wait()


def test_on_wait_is_called_once_and_only_when_the_lock_is_anothers(tmp_path: Path) -> None:
    """A second agent stops its lease bridge when it must wait (hafo.agent.main): the lease
    is the running agent's to renew."""
    state = tmp_path / "state"
    calls: list[int] = []

    async def run() -> None:
        free = await hold_state_dir(state, poll=0.02, on_wait=lambda: calls.append(1))
        assert calls == []  # free at once: not called
        waiter = asyncio.create_task(hold_state_dir(state, poll=0.02,
                                                    on_wait=lambda: calls.append(2)))
        await asyncio.sleep(0.2)  # ten polls
        assert calls == [2] and not waiter.done()
        os.close(free)
        os.close(await asyncio.wait_for(waiter, 5))

    # flock is per open file description: a second one in this process conflicts too
    asyncio.run(run())
    assert calls == [2]
