"""The controller API's mutations: submit, delete, migrate, drain, cordon, uncordon, and
removing a node (``DELETE /v1/nodes/{name}``).

Each is a user intent written to etcd through ``hafo.store.intents`` (the same calls the CLI
makes); the leader acts on it. Bodies are validated by the model's parsers, whose errors name
the field (400); unknown names are 404, intents that make no sense in the current state 409.
"""

from __future__ import annotations

import time
from typing import Protocol

from aiohttp import web

from hafo.api.body import MIGRATE, Deleted, Moving, NodeChange, NodeRemoved, json_object
from hafo.api.errors import NotFound, error
from hafo.api.scopes import authorize, authorize_submit
from hafo.checks.registry import available_types
from hafo.decisions.api_scopes import Action
from hafo.decisions.moves import requested_move_refusal
from hafo.model.cluster import ClusterSnapshot
from hafo.model.endpoints import move_target, resolve
from hafo.model.errors import ValidationError
from hafo.model.names import is_node_name, is_workload_id, is_workload_ref
from hafo.model.spec import parse_spec, unknown_check_types
from hafo.model.views import submitted_view
from hafo.store import Keys, Store, intents


class WriteTarget(Protocol):
    """What the mutations need from a controller."""

    store: Store
    keys: Keys

    def snapshot(self) -> ClusterSnapshot:
        """Current cluster state (the watched cache)."""
        ...


def workload_id(request: web.Request) -> str:
    """The ``{id}`` of the path: a workload id or name; 404 for anything that cannot be one
    (no key or path is ever built from it)."""
    wid = request.match_info["id"]
    if not is_workload_ref(wid):
        raise NotFound(f"no workload {wid!r}")
    return wid


def resolved(request: web.Request, snapshot: ClusterSnapshot) -> str:
    """The workload id the ``{id}`` of the path names (an id, or a name); 404 if none. An id
    this controller's cache does not know yet is left to the intent (which reads etcd)."""
    ref = workload_id(request)
    wid, why = resolve(snapshot, ref)
    if wid is not None:
        return wid
    if is_workload_id(ref) and request.method != "GET":
        return ref
    raise NotFound(why)


def node_name(request: web.Request) -> str:
    """The ``{name}`` of the path; 404 for anything that cannot be a node name."""
    name = request.match_info["name"]
    if not is_node_name(name):
        raise NotFound(f"no node {name!r}")
    return name


def _flag(request: web.Request, name: str) -> bool:
    """A boolean query parameter (``true`` or ``false``; absent: false); 400 otherwise."""
    value = request.query.get(name)
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise ValidationError(name, f"must be true or false, got {value!r}")


def write_routes(target: WriteTarget) -> web.RouteTableDef:
    """The mutating routes of a controller."""
    routes = web.RouteTableDef()

    @routes.post("/v1/workloads")
    async def submit(request: web.Request) -> web.Response:
        allow_unknown = _flag(request, "allow_unknown_checks")
        body = await json_object(request, required=True)
        spec = parse_spec(body)
        unknown = unknown_check_types(spec, available_types(), "allow_unknown_checks=true") \
            if spec.checks and not allow_unknown else []
        if unknown:
            raise ValidationError.of(unknown)  # 400, as `hafo submit` refuses it (exit 2)
        await authorize_submit(request, target.store, target.keys, target.snapshot(), spec)
        try:
            done = await intents.submit(target.store, target.keys, spec)
        except intents.Refused as exc:
            return error(409, str(exc), exc.field)
        submission = done.submission
        view = {**submitted_view(submission), "change": done.change, "how": done.how}
        return web.json_response(view, status=201 if done.change == "created" else 200,
                                 headers={"Location": f"/v1/workloads/{submission.id}"})

    @routes.delete("/v1/workloads/{id}")
    async def delete(request: web.Request) -> web.Response:
        snapshot = target.snapshot()
        wid = resolved(request, snapshot)
        authorize(request, Action.DELETE, snapshot, wid)  # 403 for another team's workload
        try:
            await intents.delete(target.store, target.keys, wid)
        except intents.NotFound as exc:
            return error(404, str(exc))
        return web.json_response(Deleted(id=wid, deleted=True))

    @routes.post("/v1/workloads/{id}/migrate")
    async def migrate(request: web.Request) -> web.Response:
        snapshot = target.snapshot()
        wid = resolved(request, snapshot)
        authorize(request, Action.MIGRATE, snapshot, wid)  # 403 for another team's workload
        body = MIGRATE.validate(await json_object(request, required=False) or {})
        to = body.to
        moved, node, why = move_target(snapshot, wid, body.node)  # a service's: a replica
        if moved is None:
            return error(404, why)
        wid = moved
        refusal = requested_move_refusal(snapshot, wid, to, node, time.time())
        if refusal is not None and not refusal.not_found:
            return error(409, refusal.reason)
        # A name this controller's cache does not know yet is left to the intent, which
        # reads etcd itself (404 if it is not there either).
        try:
            await intents.migrate(target.store, target.keys, wid, to, node=node)
        except intents.NotFound as exc:
            return error(404, str(exc))
        moving = Moving(id=wid, to=to)
        if node is not None:
            moving["node"] = node
        return web.json_response(moving, status=202)

    @routes.post("/v1/nodes/{name}/drain")
    async def drain(request: web.Request) -> web.Response:
        name = node_name(request)
        try:
            moving = await intents.drain(target.store, target.keys, name)
        except intents.NotFound as exc:
            return error(404, str(exc))
        return web.json_response(NodeChange(node=name, cordoned=True, moving=moving))

    async def set_cordon(request: web.Request, cordoned: bool) -> web.Response:
        name = node_name(request)
        try:
            await intents.set_cordon(target.store, target.keys, name, cordoned)
        except intents.NotFound as exc:
            return error(404, str(exc))
        return web.json_response(NodeChange(node=name, cordoned=cordoned))

    @routes.delete("/v1/nodes/{name}")
    async def remove_node(request: web.Request) -> web.Response:
        # 200 removed; 409 busy (naming the workloads) or its agent alive; with drain=true a
        # busy node is drained instead (202, what moves): ask again once it is empty.
        drain_first = _flag(request, "drain")
        name = node_name(request)
        try:
            await intents.remove_node(target.store, target.keys, name)
        except intents.NotFound as exc:
            return error(404, str(exc))
        except intents.RemovalRefused as exc:
            if exc.refusal.kind != "busy" or not drain_first:
                return error(409, str(exc))
            moving = await intents.drain(target.store, target.keys, name)
            return web.json_response(NodeRemoved(node=name, removed=False, draining=True,
                                                 moving=moving), status=202)
        except intents.Refused as exc:
            return error(409, str(exc), exc.field)
        return web.json_response(NodeRemoved(node=name, removed=True, draining=False,
                                             moving=[]))

    @routes.post("/v1/nodes/{name}/cordon")
    async def cordon(request: web.Request) -> web.Response:
        return await set_cordon(request, True)

    @routes.post("/v1/nodes/{name}/uncordon")
    async def uncordon(request: web.Request) -> web.Response:
        return await set_cordon(request, False)

    return routes
