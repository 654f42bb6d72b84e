"""``GET /v1/demand``: the pending work as shapes and the removable nodes
(``hafo.decisions.demand``; docs/reference/elastic.md, "Elastic capacity"). A read: open to every
caller, served by every controller; the removable nodes are those the answering controller
observed idle while it led (a standby lists none)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from aiohttp import web

from hafo.decisions.demand import demand
from hafo.model.cluster import ClusterSnapshot

__all__ = ["DemandSource", "demand_routes"]


class DemandSource(Protocol):
    """What the route reads: the cluster state (and, from a controller that has it,
    ``demand_view``: the demand with the idle nodes it observed)."""

    def snapshot(self) -> ClusterSnapshot:
        """Current cluster state."""
        ...

    def leading(self) -> bool:
        """This controller is the leader."""
        ...


def _view(source: DemandSource) -> dict[str, Any]:
    view = getattr(source, "demand_view", None)
    if callable(view):
        result: dict[str, Any] = view()
        return result
    now = time.time()  # no idle sightings: pending only
    return {**demand(source.snapshot(), {}, now, 0.0).to_dict(now), "leader": source.leading()}


def demand_routes(source: DemandSource) -> web.RouteTableDef:
    """The demand route of a controller."""
    routes = web.RouteTableDef()

    @routes.get("/v1/demand")
    async def get_demand(_request: web.Request) -> web.Response:
        body = await asyncio.to_thread(lambda: json.dumps(_view(source)).encode())
        return web.Response(body=body, content_type="application/json")

    return routes
