"""hafo.tasks: daemon loops stop when cancelled, whatever the timing."""

from __future__ import annotations

import asyncio
import contextlib

from hafo.tasks import run_all, wait_event


async def _stops_when_cancelled(wait: object, rounds: int = 200) -> int:
    """Cancel a loop just as its event is set, ``rounds`` times; how many loops stopped."""
    stopped = 0
    for _ in range(rounds):
        event = asyncio.Event()

        async def loop(event: asyncio.Event = event) -> None:
            while True:
                await wait(event, 0.2)  # type: ignore[operator]
                event.clear()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        event.set()  # the waiter becomes ready ...
        task.cancel()  # ... and the cancellation arrives in the same loop iteration
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            stopped += 1
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 1.0)
    return stopped


async def test_a_loop_on_wait_event_always_stops_when_cancelled() -> None:
    assert await _stops_when_cancelled(wait_event) == 200


async def test_wait_event_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_event(event, 5.0) is True
    assert await wait_event(event, 5.0) is True  # already set: at once


async def test_run_all_stops_every_loop_when_one_fails() -> None:
    stopped = []

    async def forever(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.append(name)

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise RuntimeError("boom")

    started = asyncio.create_task(forever("started"))
    try:
        await run_all(a=forever("a"), b=fails(), c=started)
    except RuntimeError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("run_all swallowed the failure")
    assert sorted(stopped) == ["a", "started"]
