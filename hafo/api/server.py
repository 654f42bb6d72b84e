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


#: Seconds a connection may stay without a complete request: from its opening until its
#: first request's headers are in, and idle between requests. aiohttp's default (3,630 s)
#: let 300 connections that never finish their headers (slowloris) stay open for an hour.
#: Above aiohttp's client keep-alive (15 s), so a client (an agent's failsafe question) never
#: reuses a connection the server is closing at that moment.
IDLE_TIMEOUT = 30.0


async def serve(app: web.Application, host: str, port: int,
                tls: ssl.SSLContext | None = None,
                idle_timeout: float = IDLE_TIMEOUT) -> web.AppRunner:
    """Start serving; returns the runner (call ``cleanup()`` to stop). A connection without
    a complete request for ``idle_timeout`` seconds is closed; a request body gets
    ``hafo.api.body.BODY_TIMEOUT``."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    return runner
