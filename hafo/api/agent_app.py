"""The agent's HTTP API: ``/healthz``, ``/readyz``, ``/v1/node``."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web


class AgentSource(Protocol):
    """What the API reads from an agent."""

    name: str

    def ready(self) -> bool:
        """Registered with a valid lease."""
        ...

    def status(self) -> dict[str, Any]:
        """Node record, lease state and instances."""
        ...


def make_agent_app(source: AgentSource) -> web.Application:
    """Build the aiohttp application of one agent."""
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "node": source.name})

    @routes.get("/readyz")
    async def readyz(_request: web.Request) -> web.Response:
        if source.ready():
            return web.json_response({"status": "ready"})
        return web.json_response({"error": "no valid lease"}, status=503)

    @routes.get("/v1/node")
    async def node(_request: web.Request) -> web.Response:
        return web.json_response(source.status())

    app = web.Application(client_max_size=64 * 1024)
    app.add_routes(routes)
    return app
