"""The controller API's queue routes: list and read the declared queues (from the watched
cache), declare (``PUT``) or delete one (intents in etcd, ``hafo.store.intents``: the same
calls ``hafo queue set`` and ``hafo queue delete`` make).

Bodies are validated by ``hafo.model.queues.parse_queue`` (400 naming the field, as the CLI's
flags are); an unknown queue is 404, deleting a queue that workloads name is 409.
"""

from __future__ import annotations

from aiohttp import web

from hafo.api.body import QueueDeleted, QueueSet, json_object
from hafo.api.errors import NotFound, error
from hafo.api.write_routes import WriteTarget
from hafo.decisions.queue_standings import usage_views
from hafo.model.errors import ValidationError
from hafo.model.names import WORKLOAD_NAME_RE
from hafo.model.queue_view import all_queues, queue_view
from hafo.model.queues import parse_queue
from hafo.store import intents

__all__ = ["queue_name", "queue_routes"]


def queue_name(request: web.Request) -> str:
    """The ``{name}`` of the path; 404 for anything that cannot be a queue's name (no key is
    ever built from it)."""
    name = request.match_info["name"]
    if WORKLOAD_NAME_RE.fullmatch(name) is None:
        raise NotFound(f"no queue {name!r}")
    return name


def queue_routes(target: WriteTarget) -> web.RouteTableDef:
    """The queue routes of a controller: reads from its cache, mutations as intents."""
    routes = web.RouteTableDef()

    @routes.get("/v1/queues")
    async def queues(_request: web.Request) -> web.Response:
        snapshot = target.snapshot()
        return web.json_response(all_queues(snapshot, usage_views(snapshot)))

    @routes.get("/v1/queues/{name}")
    async def queue(request: web.Request) -> web.Response:
        name = queue_name(request)
        snapshot = target.snapshot()
        if name not in snapshot.queues:
            return error(404, f"no queue {name!r}")
        return web.json_response(queue_view(snapshot, name, usage_views(snapshot)))

    @routes.put("/v1/queues/{name}")
    async def set_queue(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if WORKLOAD_NAME_RE.fullmatch(name) is None:
            raise ValidationError("name", f"{name[:60]!r} cannot be a queue's name: lowercase "
                                  "letters, digits and '-', 1-52 characters")
        body = await json_object(request, required=True) or {}
        named = body.get("name", name)
        if named != name:
            raise ValidationError("queue.name", f"is {named!r}, but the path names {name!r} "
                                  "(leave it out, or make them equal)")
        spec = parse_queue({**body, "name": name})
        change = await intents.set_queue(target.store, target.keys, spec)
        done = QueueSet(name=spec.name, gpus=spec.gpus, cohort=spec.cohort,
                        borrowing_limit=spec.borrowing_limit, lending_limit=spec.lending_limit,
                        weight=spec.weight, change=change)
        if spec.models:
            done["models"] = dict(spec.models)
        return web.json_response(done,
                                 status=201 if change == "created" else 200,
                                 headers={"Location": f"/v1/queues/{name}"})

    @routes.delete("/v1/queues/{name}")
    async def delete_queue(request: web.Request) -> web.Response:
        name = queue_name(request)
        try:
            await intents.delete_queue(target.store, target.keys, name)
        except intents.NotFound as exc:
            return error(404, str(exc))
        except intents.Refused as exc:
            return error(409, str(exc), exc.field)
        return web.json_response(QueueDeleted(name=name, deleted=True))

    return routes
