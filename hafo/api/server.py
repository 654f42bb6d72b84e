"""Run an aiohttp application on a host:port inside an existing event loop."""

from __future__ import annotations

from aiohttp import web


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving; returns the runner (call ``cleanup()`` to stop)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
