"""Run an aiohttp application on a host:port inside an existing event loop, optionally TLS."""

from __future__ import annotations

import ssl

from aiohttp import web


def server_tls(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or newer) from PEM certificate chain and key files."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


async def serve(app: web.Application, host: str, port: int,
                tls: ssl.SSLContext | None = None) -> web.AppRunner:
    """Start serving; returns the runner (call ``cleanup()`` to stop)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    return runner
