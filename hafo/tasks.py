"""Run a daemon's concurrent loops as one unit: the first failure stops them all.

``restarting`` wraps one loop so that an unexpected exception is logged with the loop's
name and the loop is started again after a jittered, capped backoff (``Backoff``: the one
retry policy of ``hafo.retry``), instead of ending the daemon: only cancellation and the
exceptions it is told are fatal get through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from hafo.lazylog import get_logger
from hafo.retry import Retry, RetryPolicy

log = get_logger("hafo.tasks")  # structlog at the first line (hafo.lazylog)

T = TypeVar("T")


def retrieve_outcome(task: asyncio.Future[Any]) -> None:
    """A done callback for a task nobody awaits any more: its error is retrieved and dropped
    (no "exception was never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


async def bounded(call: Awaitable[T], limit: float) -> T:
    """``call``'s result if it ends within ``limit`` seconds, else TimeoutError at once: a
    call still running is cancelled and left to end in the background (its outcome is
    retrieved and dropped), never waited for. ``asyncio.wait_for`` waits for the
    cancellation to end the call, which an etcd coming back from a stall has made take
    seconds."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except BaseException:  # we are cancelled: so is the call, not waited for either
        task.cancel()
        task.add_done_callback(retrieve_outcome)
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(retrieve_outcome)
    raise TimeoutError(f"no answer in {limit:.2f} s")


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


#: A restarted loop's backoff: ``first`` seconds doubling up to ``cap``, each delay jittered
#: down by up to ``jitter`` of itself (restarted loops of several daemons spread out); the
#: one ``hafo.retry.RetryPolicy``, under the name its callers know. Forever, always.
Backoff = RetryPolicy
#: ``restarting``'s default: 0.1 s doubling up to 5 s, jittered down by up to half.
RESTART_BACKOFF = Backoff()


class LoopFatal(Exception):
    """A loop that cannot be restarted meaningfully failed: the daemon must exit."""


async def restarting(name: str, loop: Callable[[], Awaitable[Any]], *,
                     backoff: Backoff = RESTART_BACKOFF,
                     fatal: tuple[type[BaseException], ...] = (LoopFatal,),
                     logger: Any = None) -> None:
    """Run ``loop()`` forever: when it raises (or returns, which a daemon loop must not), log
    it with ``name`` and call it again after ``backoff``. A loop that ran longer than the
    backoff's cap without failing starts again from the first delay. Cancellation, exceptions
    that are not ``Exception`` (SystemExit, KeyboardInterrupt) and those in ``fatal`` are
    re-raised; a fatal one is logged first as the reason the daemon stops."""
    logger = logger if logger is not None else log
    # The first failure of a streak is logged with its traceback; the retry then warns while
    # they keep coming (rate-limited), and counts each restart in hafo_retries_total.
    retry = Retry(f"loop {name}", replace(backoff, attempts=None, deadline=None,
                                          reset_after=backoff.cap, warn_after=2),
                  logger=logger, loop=name)
    while True:
        try:
            await loop()
        except fatal as exc:
            logger.critical("loop failed and cannot be restarted: stopping", loop=name,
                            error=repr(exc))
            raise
        except Exception as exc:
            delay = retry.note(exc)
            if retry.failures == 1:
                logger.exception("loop failed: restarting it", loop=name, error=repr(exc),
                                 failures=retry.failures, restart_in=round(delay, 3))
        else:
            delay = retry.note("the loop returned")
            if retry.failures == 1:
                logger.error("loop ended unexpectedly: restarting it", loop=name,
                             restart_in=round(delay, 3))
        await retry.pause(delay)
