"""The agent's HTTP API: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``,
``/v1/node``. It has no mutations: work reaches a node only through etcd."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from hafo.api.errors import MAX_BODY, json_errors
from hafo.api.openapi import agent_document
from hafo.api.probes import probe_routes


class AgentSource(Protocol):
    """What the API reads from an agent."""

    name: str
    registry: CollectorRegistry

    def ready(self) -> bool:
        """Registered with a valid lease."""
        ...

    def status(self) -> dict[str, Any]:
        """Node record, lease state and instances."""
        ...


def make_agent_app(source: AgentSource) -> web.Application:
    """Build the aiohttp application of one agent."""
    routes = web.RouteTableDef()

    @routes.get("/v1/node")
    async def node(_request: web.Request) -> web.Response:
        return web.json_response(source.status())

    app = web.Application(client_max_size=64 * 1024, middlewares=[json_errors])
    app[MAX_BODY] = 64 * 1024
    app.add_routes(routes)
    app.add_routes(probe_routes("node", source.name, source.ready, source.registry,
                                agent_document()))
    return app
