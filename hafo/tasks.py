"""Run a daemon's concurrent loops as one unit: the first failure stops them all."""

from __future__ import annotations

import asyncio
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
