"""A tiny HTTP service that behaves like a well-run inference server replica (aiohttp only).

    GET /health      503 "starting" during ``--startup-delay`` (a model loading), then 200
                     "ok", 503 "stopping" once it drains
    GET /<anything>  200 {"replica", "node", "epoch", "pid", "requests", "path"}; 503 while
                     starting; ``?sleep=SECONDS`` (0 to 5) answers that much later, a slow
                     request

It listens on ``--host`` (0.0.0.0) port ``--port``, else ``$HAFO_PORT_HTTP``, else ``$PORT``
(hafo sets both for a spec with ``ports: {http: 0}``), else 8080; 0 lets the kernel choose.
``HAFO_WORKLOAD`` (the replica), ``HAFO_NODE`` and ``HAFO_EPOCH`` name it in every answer.

SIGTERM (or SIGINT) drains it: the listening socket is closed at once (a new connection is
refused), idle keep-alive connections are closed, every request in flight is answered (with
``Connection: close``) and the process exits 0; requests still running after
``--drain-timeout`` seconds are cancelled. Keep ``--drain-timeout`` below the spec's
``stop_grace``, after which hafo sends SIGKILL. It prints one line when it starts serving,
one when it becomes ready, one when the drain starts and one when it stops.

Under hafo: ``hafo submit examples/service.yaml``. By hand:

    PORT=8080 python3 examples/http_service.py --startup-delay 2
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

MAX_SLEEP = 5.0
NAME = "http_service"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def log(message: str) -> None:
    """One line on stdout, at once."""
    print(f"{NAME}: {message}", flush=True)


class Service:
    """The state of the replica: ``starting`` -> ``ready`` -> ``stopping``."""

    def __init__(self) -> None:
        self.state = "starting"
        self.requests = 0
        self.in_flight = 0
        epoch = os.environ.get("HAFO_EPOCH", "")
        self.identity: dict[str, Any] = {
            "replica": os.environ.get("HAFO_WORKLOAD", "local"),
            "node": os.environ.get("HAFO_NODE", socket.gethostname()),
            "epoch": int(epoch) if epoch.isdigit() else None,
            "pid": os.getpid(),
        }

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count the requests in flight; once stopping, every answer closes its connection
        (``Connection: close``), so no client reuses a connection that is about to close."""
        self.in_flight += 1
        try:
            response = await handler(request)
        finally:
            self.in_flight -= 1
        if self.state == "stopping" and not response.prepared:
            response.force_close()
        return response

    async def health(self, _: web.Request) -> web.Response:
        """200 when ready, else 503 with the state."""
        if self.state == "ready":
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"{self.state}\n")

    async def answer(self, request: web.Request) -> web.Response:
        """The replica's identity and request count, after ``?sleep=SECONDS``."""
        raw = request.query.get("sleep")
        delay = 0.0
        if raw is not None:
            try:
                delay = float(raw)
            except ValueError:
                delay = math.nan
            if not 0.0 <= delay <= MAX_SLEEP:  # NaN fails too
                return web.json_response(
                    {"error": f"sleep must be a number of seconds from 0 to {MAX_SLEEP:g}"},
                    status=400)
        if self.state == "starting":
            return web.json_response({"error": "starting", **self.identity}, status=503)
        self.requests += 1
        count = self.requests
        if delay:
            await asyncio.sleep(delay)
        return web.json_response({**self.identity, "requests": count, "path": request.path})

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self.track])
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.answer)
        return app


async def serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain; the exit status."""
    service = Service()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(service.app(), handle_signals=False, access_log=None,
                           shutdown_timeout=args.drain_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as exc:
        await runner.cleanup()
        log(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port
    who = " ".join(f"{k}={v}" for k, v in service.identity.items())
    log(f"serving on {args.host}:{port} ({who}), ready in {args.startup_delay:g}s")

    async def become_ready() -> None:
        await asyncio.sleep(args.startup_delay)
        if service.state == "starting":
            service.state = "ready"
            log("ready")

    ready = asyncio.create_task(become_ready())
    await stop.wait()
    ready.cancel()
    service.state = "stopping"
    started = time.monotonic()
    log(f"draining: {service.in_flight} request(s) in flight, "
        f"up to {args.drain_timeout:g}s")
    # closes the listening socket, then idle keep-alive connections, then waits for the
    # requests in flight (each up to drain_timeout, then cancelled)
    await runner.cleanup()
    log(f"stopped after {time.monotonic() - started:.2f}s of drain; "
        f"{service.requests} request(s) served")
    return 0


def non_negative(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="http_service.py", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default: $HAFO_PORT_HTTP, $PORT, else 8080)")
    parser.add_argument("--startup-delay", type=non_negative, default=0.0, metavar="SECONDS",
                        help="answer 503 this long after start, as a model loading (0)")
    parser.add_argument("--drain-timeout", type=non_negative, default=25.0, metavar="SECONDS",
                        help="on SIGTERM, wait this long for requests in flight (25)")
    args = parser.parse_args(argv)
    if args.port is None:
        args.port = 8080
        for var in ("HAFO_PORT_HTTP", "PORT"):
            value = os.environ.get(var, "").strip()
            if value:
                if not value.isdigit():
                    parser.error(f"${var} is not a port number: {value!r}")
                args.port = int(value)
                break
    if not 0 <= args.port <= 65535:
        parser.error(f"port out of range: {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the service; the exit status."""
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
