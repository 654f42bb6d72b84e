"""The agent's HTTP API: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``,
``/v1/node``, ``/v1/workloads/{name}/ready`` (for a load balancer's health check). It has no
mutations: work reaches a node only through etcd."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from hafo.api.errors import MAX_BODY, json_errors
from hafo.api.openapi import agent_document
from hafo.api.probes import probe_routes
from hafo.model.names import is_workload_ref


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

    async def serving(self, ref: str) -> tuple[bool, str]:
        """Whether a ready instance of workload ``ref`` is in rotation here, and why."""
        ...


def make_agent_app(source: AgentSource) -> web.Application:
    """Build the aiohttp application of one agent."""
    routes = web.RouteTableDef()

    @routes.get("/v1/node")
    async def node(_request: web.Request) -> web.Response:
        return web.json_response(source.status())

    @routes.get("/v1/workloads/{name}/ready")
    async def ready(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not is_workload_ref(name):
            return web.json_response({"ready": False, "node": source.name,
                                      "reason": f"not a workload name or id: {name!r}"},
                                     status=404)
        ok, why = await source.serving(name)
        return web.json_response({"ready": ok, "node": source.name, "reason": why},
                                 status=200 if ok else 503)

    app = web.Application(client_max_size=64 * 1024, middlewares=[json_errors])
    app[MAX_BODY] = 64 * 1024
    app.add_routes(routes)
    app.add_routes(probe_routes("node", source.name, source.ready, source.registry,
                                agent_document()))
    return app
