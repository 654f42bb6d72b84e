"""The controller's HTTP API: health, leadership, status, nodes, workloads, events, the
mutations (``hafo.api.write_routes``), the queues (``hafo.api.queue_routes``), ``/metrics``,
``/openapi.json`` and the dashboard.

Served by every controller from its watched cache, so standbys answer reads too (and accept
mutations, which are intents in etcd); ``/leader`` tells load balancers which one leads.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from hafo.api.auth import agreed_auth, bearer_auth
from hafo.api.dashboard import add_dashboard
from hafo.api.demand_routes import demand_routes
from hafo.api.errors import MAX_BODY, error, json_errors
from hafo.api.openapi import controller_document
from hafo.api.probes import probe_routes
from hafo.api.queue_routes import queue_routes
from hafo.api.scopes import route_scopes
from hafo.api.write_routes import node_name, resolved, write_routes
from hafo.decisions.pending_reasons import with_live_reasons
from hafo.model.cluster import ClusterSnapshot, Event
from hafo.model.endpoints import agent_targets, endpoints_of, prometheus_targets, resolve
from hafo.model.history_view import show_view
from hafo.model.teams import TeamTokensFile
from hafo.model.views import all_nodes, all_workloads, node_view, status_view, workload_view
from hafo.store import Keys, Store
from hafo.store.history import read_history, read_workload_events

#: Header on every ``/v1/`` read answered while etcd does not answer this controller: how
#: old, in seconds, the cached state may be.
STALE_HEADER = "Hafo-Stale-Seconds"

#: Largest request body accepted (a workload spec with a generous environment).
MAX_BODY_BYTES = 256 * 1024


class ControllerSource(Protocol):
    """What the API reads from a controller."""

    name: str
    store: Store
    keys: Keys
    registry: CollectorRegistry

    def snapshot(self) -> ClusterSnapshot:
        """Current cluster state."""
        ...

    def ready(self) -> bool:
        """Connected to etcd."""
        ...

    def stale_seconds(self) -> float | None:
        """Age of the cache while etcd does not answer; None while fresh."""
        ...

    def not_ready_reason(self) -> str:
        """Why ``ready`` is False, for people."""
        ...

    def etcd_contact_age(self) -> float:
        """Seconds since etcd last acknowledged this controller's keepalive."""
        ...

    def leading(self) -> bool:
        """This controller is the leader."""
        ...

    async def recent_events(self, limit: int = 100) -> list[Event]:
        """The newest events."""
        ...

    async def failsafe_probe(self, cluster: str | None = None) -> str:
        """'available', 'unavailable' or 'recovering' (see hafo.decisions.failsafe);
        ``cluster``: the store identity the asking agent knows."""
        ...

    @property
    def failsafe_hold(self) -> float:
        """Seconds a promise in ``failsafe_probe``'s answer holds this controller's failovers."""
        ...


def make_controller_app(source: ControllerSource, token: str | None = None,
                        max_body_bytes: int = MAX_BODY_BYTES,
                        auth_refusal: Callable[[], str] | None = None,
                        teams: TeamTokensFile | None = None) -> web.Application:
    """Build the aiohttp application of one controller; with ``token``, mutations need it
    (or, with ``teams``, one team's token, for the workloads of its queues:
    ``hafo.api.scopes``). ``auth_refusal``: why this controller's API auth is not the
    cluster's ('' while it is; ``hafo.store.api_auth``): mutations are refused (503) and
    ``/readyz`` is not ready."""
    if teams is not None and teams.teams and token is None:
        raise ValueError("team tokens need the admin token")
    app = web.Application(client_max_size=max_body_bytes,
                          middlewares=[json_errors, agreed_auth(auth_refusal),
                                       bearer_auth(token, teams), route_scopes()])
    app[MAX_BODY] = max_body_bytes
    app.add_routes(read_routes(source))
    app.add_routes(write_routes(source))
    app.add_routes(queue_routes(source))
    app.add_routes(demand_routes(source))
    ready, not_ready = source.ready, source.not_ready_reason
    if auth_refusal is not None:
        refusal = auth_refusal

        def ready() -> bool:
            return source.ready() and not refusal()

        def not_ready() -> str:
            return source.not_ready_reason() if not source.ready() else refusal()
    app.add_routes(probe_routes("controller", source.name, ready, source.registry,
                                controller_document(), not_ready))
    add_dashboard(app)

    async def mark_stale(request: web.Request, response: web.StreamResponse) -> None:
        # Reads answered from a cache that etcd has not refreshed say how old it may be.
        stale = source.stale_seconds()
        if stale is not None and request.method == "GET" and request.path.startswith("/v1/"):
            response.headers[STALE_HEADER] = f"{stale:.1f}"

    app.on_response_prepare.append(mark_stale)
    return app


async def json_off_loop(view: Callable[[ClusterSnapshot], Any],
                        snapshot: ClusterSnapshot) -> web.Response:
    """A whole-cluster view as a JSON response, computed and encoded in a thread: at 10,000
    nodes ``/v1/nodes`` takes a few hundred milliseconds, which must not delay the lease
    keepalives on the event loop (the snapshot is frozen, so the thread may read it)."""
    body = await asyncio.to_thread(lambda: json.dumps(view(snapshot)).encode())
    return web.Response(body=body, content_type="application/json")


def read_routes(source: ControllerSource) -> web.RouteTableDef:
    """The controller's reads (every controller answers them from its cache)."""
    routes = web.RouteTableDef()

    @routes.get("/leader")
    async def leader(_request: web.Request) -> web.Response:
        if source.leading():
            return web.json_response({"leader": source.name})
        return error(503, f"{source.name} is not the leader")

    @routes.get("/v1/failsafe")
    async def failsafe(request: web.Request) -> web.Response:
        # An agent that cannot reach etcd asks every controller; "unavailable" and
        # "recovering" are promises to make no failover decision for ``hold`` seconds (see
        # hafo.decisions.failsafe). ``cluster``: the store identity the agent knows.
        return web.json_response({"controller": source.name,
                                  "etcd": await source.failsafe_probe(
                                      request.query.get("cluster")),
                                  "hold": source.failsafe_hold})

    @routes.get("/v1/status")
    async def status(_request: web.Request) -> web.Response:
        stale = source.stale_seconds()
        return await json_off_loop(
            lambda snapshot: {**status_view(snapshot), "stale": stale is not None,
                              "stale_seconds": stale,
                              "etcd_contact_age": source.etcd_contact_age()},
            source.snapshot())

    @routes.get("/v1/nodes")
    async def nodes(_request: web.Request) -> web.Response:
        return await json_off_loop(all_nodes, source.snapshot())

    @routes.get("/v1/nodes/{name}")
    async def node(request: web.Request) -> web.Response:
        name = node_name(request)
        snapshot = source.snapshot()
        if name not in snapshot.nodes:
            return error(404, f"no node {name!r}")
        return web.json_response(node_view(snapshot, name))

    @routes.get("/v1/workloads")
    async def workloads(_request: web.Request) -> web.Response:
        now = time.time()
        return await json_off_loop(lambda s: with_live_reasons(all_workloads(s, now), s),
                                   source.snapshot())

    @routes.get("/v1/workloads/{id}")
    async def workload(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        wid = resolved(request, snapshot)
        return web.json_response(with_live_reasons(workload_view(snapshot, wid, time.time()),
                                                   snapshot))

    @routes.get("/v1/workloads/{id}/endpoints")
    async def endpoints(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        return web.json_response(endpoints_of(snapshot, resolved(request, snapshot)).to_dict())

    @routes.get("/v1/workloads/{id}/history")
    async def history(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        wid = resolved(request, snapshot)
        record = await read_history(source.store, source.keys, wid)
        events = await read_workload_events(source.store, source.keys, wid)
        return web.json_response(show_view(snapshot, wid, record, events, time.time()))

    @routes.get("/v1/sd/prometheus")
    async def prometheus_sd(request: web.Request) -> web.Response:
        snapshot = source.snapshot()
        port = request.query.get("port")
        ref = request.query.get("workload")
        if ref is not None:
            wid, why = resolve(snapshot, ref)
            if wid is None:
                return error(404, why)
            wids = [wid]
        else:
            wids = sorted(w for w, sub in snapshot.workloads.items()
                          if sub.service is None and (sub.spec.ports or sub.spec.is_service))
        return web.json_response(prometheus_targets(snapshot, wids, port))

    @routes.get("/v1/sd/agents")
    async def agents_sd(request: web.Request) -> web.Response:
        return web.json_response(agent_targets(source.snapshot()))

    @routes.get("/v1/events")
    async def events(request: web.Request) -> web.Response:
        raw = request.query.get("limit", "100")
        if not raw.isdigit() or not 1 <= int(raw) <= 10000:
            return error(400, "limit: must be an integer from 1 to 10000", "limit")
        items: list[dict[str, Any]] = [e.to_dict() for e in
                                       await source.recent_events(int(raw))]
        return web.json_response(items)

    return routes
