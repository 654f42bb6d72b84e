"""Routes every hafo daemon serves: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hafo import __version__
from hafo.api.errors import error


def probe_routes(role: str, name: str, ready: Callable[[], bool], registry: CollectorRegistry,
                 document: dict[str, Any],
                 not_ready: Callable[[], str] | None = None) -> web.RouteTableDef:
    """Liveness, readiness (connected to etcd / holding a lease), metrics and the API's
    OpenAPI document, for a daemon of ``role`` ('controller' or 'agent') called ``name``."""
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", role: name, "version": __version__})

    @routes.get("/readyz")
    async def readyz(_request: web.Request) -> web.Response:
        if ready():
            return web.json_response({"status": "ready", role: name, "version": __version__})
        if not_ready is not None:
            return error(503, not_ready())
        return error(503, "not connected to etcd" if role == "controller"
                     else "no valid lease")

    @routes.get("/metrics")
    async def metrics(_request: web.Request) -> web.Response:
        # In a thread: the controller's collectors walk the whole cluster snapshot.
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    @routes.get("/openapi.json")
    async def openapi(_request: web.Request) -> web.Response:
        return web.json_response(document)

    return routes
