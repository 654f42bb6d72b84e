"""hafo.daemon_start.serve_until_signal: SIGTERM cancels the daemon, its clean-up runs after,
still under the handlers (a second SIGTERM meanwhile changes nothing), which go afterwards."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from hafo.daemon_start import serve_until_signal


async def test_sigterm_stops_the_daemon_then_its_clean_up_runs_under_the_handlers() -> None:
    ready = asyncio.Event()
    seen: list[str] = []

    async def daemon() -> None:
        ready.set()
        try:
            await asyncio.sleep(30)
        finally:
            seen.append("cancelled")

    async def close() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored, not the default (death)
        await asyncio.sleep(0.05)
        seen.append("cleaned up")

    async def send_when_ready() -> None:
        await ready.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    sender = asyncio.ensure_future(send_when_ready())
    await asyncio.wait_for(serve_until_signal(daemon(), ready, "test", then=close), 5)
    await sender
    assert seen == ["cancelled", "cleaned up"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


async def test_the_clean_up_runs_when_the_daemon_fails() -> None:
    seen: list[str] = []

    async def daemon() -> None:
        raise RuntimeError("boom")

    async def close() -> None:
        seen.append("cleaned up")

    with pytest.raises(RuntimeError):
        await serve_until_signal(daemon(), asyncio.Event(), "test", then=close)
    assert seen == ["cleaned up"]
