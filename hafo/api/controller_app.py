"""The controller's HTTP API (read side): health, leadership, status, nodes, workloads, events.

Served by every controller from its watched cache, so standbys answer reads too; ``/leader``
tells load balancers which one leads.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from hafo.api.dashboard import add_dashboard
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.views import all_nodes, all_workloads, node_view, status_view, workload_view


class ControllerSource(Protocol):
    """What the API reads from a controller."""

    name: str

    def snapshot(self) -> ClusterSnapshot:
        """Current cluster state."""
        ...

    def ready(self) -> bool:
        """Connected to etcd."""
        ...

    def leading(self) -> bool:
        """This controller is the leader."""
        ...

    async def recent_events(self, limit: int = 100) -> list[Event]:
        """The newest events."""
        ...

    async def failsafe_probe(self) -> str:
        """'available' or 'unavailable': can this controller reach etcd right now."""
        ...


def error(status: int, message: str) -> web.Response:
    """The contract's error body."""
    return web.json_response({"error": message}, status=status)


def make_controller_app(source: ControllerSource) -> web.Application:
    """Build the aiohttp application of one controller."""
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "controller": source.name})

    @routes.get("/readyz")
    async def readyz(_request: web.Request) -> web.Response:
        if source.ready():
            return web.json_response({"status": "ready"})
        return error(503, "not connected to etcd")

    @routes.get("/leader")
    async def leader(_request: web.Request) -> web.Response:
        if source.leading():
            return web.json_response({"leader": source.name})
        return error(503, f"{source.name} is not the leader")

    @routes.get("/v1/failsafe")
    async def failsafe(_request: web.Request) -> web.Response:
        # An agent that cannot reach etcd asks every controller; "unavailable" is a promise
        # to make no failover decision for TTL + margin (see hafo.decisions.failsafe).
        return web.json_response({"controller": source.name,
                                  "etcd": await source.failsafe_probe()})

    @routes.get("/v1/status")
    async def status(_request: web.Request) -> web.Response:
        return web.json_response(status_view(source.snapshot()))

    @routes.get("/v1/nodes")
    async def nodes(_request: web.Request) -> web.Response:
        return web.json_response(all_nodes(source.snapshot()))

    @routes.get("/v1/nodes/{name}")
    async def node(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        name = request.match_info["name"]
        if name not in snapshot.nodes:
            return error(404, f"no node {name!r}")
        return web.json_response(node_view(snapshot, name))

    @routes.get("/v1/workloads")
    async def workloads(_request: web.Request) -> web.Response:
        return web.json_response(all_workloads(source.snapshot()))

    @routes.get("/v1/workloads/{id}")
    async def workload(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        wid = request.match_info["id"]
        if wid not in snapshot.workloads:
            return error(404, f"no workload {wid!r}")
        return web.json_response(workload_view(snapshot, wid))

    @routes.get("/v1/events")
    async def events(request: web.Request) -> web.Response:
        raw = request.query.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 10000:
            return error(400, "limit: must be an integer from 1 to 10000")
        items: list[dict[str, Any]] = [e.to_dict() for e in
                                       await source.recent_events(int(raw))]
        return web.json_response(items)

    app = web.Application(client_max_size=1024 * 1024)
    app.add_routes(routes)
    add_dashboard(app)
    return app
