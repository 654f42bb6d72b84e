"""Run a daemon's concurrent loops as one unit: the first failure stops them all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any


async def run_all(**loops: Awaitable[Any]) -> None:
    """Run the named coroutines (or tasks already started) until one fails (re-raised) or
    the caller is cancelled."""
    tasks = [asyncio.ensure_future(loop) for loop in loops.values()]
    for task, name in zip(tasks, loops, strict=True):
        task.set_name(name)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def loop_time() -> float:
    """The running event loop's monotonic clock (``time.monotonic`` on asyncio's loops;
    virtual time on a test's virtual-time loop); ``time.monotonic`` outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` passes; True if it is set.

    ``asyncio.wait_for(event.wait(), timeout)`` can swallow a cancellation on Python 3.11
    when the event is set just as the task is cancelled (CPython gh-86296): a daemon loop
    built on it may never stop. ``asyncio.wait`` lets the cancellation through."""
    if event.is_set():
        await asyncio.sleep(0)  # yield all the same: callers loop on this
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()
