"""The agent's HTTP API: ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``,
``/v1/node``, ``/v1/workloads/{name}/ready`` (for a load balancer's health check), and the
output of the instances this node keeps, ``/v1/workloads/{id}/logs`` and
``/v1/workloads/{id}/logs/{epoch}`` (they need the bearer token when ``api.token_file`` is
set: output may hold secrets). It has no mutations: work reaches a node only through etcd."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from hafo.api.auth import CHALLENGE, token_matches
from hafo.api.errors import MAX_BODY, NotFound, error, json_errors
from hafo.api.openapi import agent_document
from hafo.api.probes import probe_routes
from hafo.model.errors import ValidationError
from hafo.model.names import check_workload_id, is_workload_ref
from hafo.model.output import (
    MAX_TAIL_LINES,
    READ_LIMIT,
    OutputChunk,
    OutputRequest,
    chunk_headers,
)
from hafo.model.output_view import OutputLog


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

    def output_logs(self, workload: str) -> list[OutputLog]:
        """The kept output of each instance of ``workload`` (an id) here, oldest first."""
        ...

    def read_output(self, workload: str, epoch: int,
                    request: OutputRequest) -> OutputChunk | None:
        """Output of ``workload`` at ``epoch`` (None: this node keeps none)."""
        ...


def _whole(request: web.Request, name: str, low: int, high: int) -> int | None:
    """Query parameter ``name`` as a whole number from ``low`` to ``high`` (None: absent)."""
    text = request.query.get(name)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 19) \
            or not low <= int(text) <= high:
        raise ValidationError(name, f"must be a whole number from {low} to {high}, "
                                    f"got {text!r}")
    return int(text)


def _output_request(request: web.Request) -> OutputRequest:
    offset = _whole(request, "offset", 0, 2**62)
    tail = _whole(request, "tail", 1, MAX_TAIL_LINES)
    limit = _whole(request, "limit", 1, READ_LIMIT)
    if offset is not None and tail is not None:
        raise ValidationError("tail", "give offset or tail, not both")
    return OutputRequest(offset=offset, tail=tail, limit=limit or READ_LIMIT)


def make_agent_app(source: AgentSource, token: str | None = None) -> web.Application:
    """Build the aiohttp application of one agent; ``token``: what the output routes need
    (``Authorization: Bearer <token>``; None: they are open)."""
    routes = web.RouteTableDef()

    def refused(request: web.Request) -> web.Response | None:
        if token is None or token_matches(request.headers.get("Authorization"), token):
            return None
        why = "missing" if "Authorization" not in request.headers else "wrong"
        return error(401, f"{why} bearer token: a workload's output needs "
                          "'Authorization: Bearer <token>'", headers=CHALLENGE)

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

    @routes.get("/v1/workloads/{id}/logs")
    async def logs(request: web.Request) -> web.Response:
        if (denied := refused(request)) is not None:
            return denied
        wid = check_workload_id(request.match_info["id"])
        return web.json_response({"workload": wid, "node": source.name, "epochs": [
            log.to_dict() for log in source.output_logs(wid)]})

    @routes.get("/v1/workloads/{id}/logs/{epoch}")
    async def output(request: web.Request) -> web.Response:
        if (denied := refused(request)) is not None:
            return denied
        wid = check_workload_id(request.match_info["id"])
        text = request.match_info["epoch"]
        if not (text.isascii() and text.isdigit() and len(text) <= 18):
            raise ValidationError("epoch", f"must be a whole number, got {text!r}")
        chunk = source.read_output(wid, int(text), _output_request(request))
        if chunk is None:
            raise NotFound(f"no output of {wid} epoch {text} on {source.name}")
        return web.Response(body=chunk.data, content_type="text/plain",
                            headers=chunk_headers(chunk))

    app = web.Application(client_max_size=64 * 1024, middlewares=[json_errors])
    app[MAX_BODY] = 64 * 1024
    app.add_routes(routes)
    app.add_routes(probe_routes("node", source.name, source.ready, source.registry,
                                agent_document()))
    return app
