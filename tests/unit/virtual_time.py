"""An asyncio event loop on virtual time: sleeps and timeouts take no real time.

``loop.time()`` starts at 0 and jumps to the next timer whenever nothing is ready, so a test
of a loop that waits for heartbeats, TTLs and backoffs runs in milliseconds and is exact.
Work handed to threads (``asyncio.to_thread``) is waited for in real time, with the virtual
clock stopped: it takes no virtual time. With no timer, no thread and nothing ready, the
test is stuck: ``run`` raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """See the module."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual = 0.0
        self._threads = 0
        self._idle_spins = 0
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> list[Any]:
            if self._threads:
                return real_select(0.05)  # a thread is at work: wait for it, in real time
            events = real_select(0)
            if events:
                return events
            if timeout is None:  # nothing scheduled at all
                self._idle_spins += 1
                if self._idle_spins > 100:
                    raise RuntimeError("virtual-time loop is stuck: nothing to wait for")
                return real_select(0.01)
            self._idle_spins = 0
            self._virtual += max(0.0, timeout)
            return []

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._virtual

    def run_in_executor(self, executor: Executor | None, func: Callable[..., T],
                        *args: Any) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._threads += 1

        def done(_: asyncio.Future[T]) -> None:
            self._threads -= 1

        future.add_done_callback(done)
        return future


async def wait_for(check: Callable[[], Awaitable[Any]], timeout: float,
                   step: float = 0.05) -> Any:
    """Poll ``check`` every ``step`` virtual seconds until it returns something true."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while loop.time() < until:
        found = await check()
        if found:
            return found
        await asyncio.sleep(step)
    raise AssertionError(f"not within {timeout} virtual seconds")


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has stopped."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` on a fresh virtual-time loop."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
