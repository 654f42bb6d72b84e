"""hafo.stopping: one way to stop on SIGTERM/SIGINT, handlers removed afterwards."""

from __future__ import annotations

import asyncio
import os
import signal

from hafo.stopping import cancel_on_signals, stop_on_signals


async def test_a_signal_sets_the_stop_event_and_the_handler_goes_afterwards() -> None:
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 5)
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None, signal.default_int_handler)


async def test_a_signal_cancels_the_task() -> None:
    task = asyncio.ensure_future(asyncio.sleep(30))
    with cancel_on_signals(task, [signal.SIGUSR2]):
        os.kill(os.getpid(), signal.SIGUSR2)
        await asyncio.wait([task], timeout=5)
    assert task.cancelled()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
