"""Run a daemon's concurrent loops as one unit: the first failure stops them all."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def run_all(**loops: Coroutine[Any, Any, Any]) -> None:
    """Run the named coroutines until one fails (re-raised) or the caller is cancelled."""
    tasks = [asyncio.create_task(coro, name=name) for name, coro in loops.items()]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
