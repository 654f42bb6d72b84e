"""The OpenAPI 3.1 documents of the controller's and the agent's HTTP APIs.

Served at ``/openapi.json``; a test checks that the documented operations are exactly the
routes the applications serve, and the fuzzing test drives the API from this document. Every
body schema is generated from the declaration the code uses (JSON Schema 2020-12, which is
OpenAPI 3.1's dialect): the workload spec from ``hafo.model.spec.WorkloadSpec``, which
``parse_spec`` validates with (the CLI and the API both call it), so a body this schema
accepts is accepted by the API; the responses from the views, records and bodies that make
them.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from hafo import __version__
from hafo.api.body import (
    MIGRATE,
    Deleted,
    Health,
    Moving,
    NodeChange,
    NodeRemoved,
    QueueDeleted,
    QueueSet,
)
from hafo.api.errors import ErrorBody
from hafo.model.cluster import Event
from hafo.model.endpoints import Endpoints
from hafo.model.history_view import ShowView
from hafo.model.names import NODE_NAME_RE, WORKLOAD_ID_RE, WORKLOAD_NAME
from hafo.model.output import (
    HEADER_DROPPED,
    HEADER_END,
    HEADER_EPOCH,
    HEADER_NEXT,
    HEADER_NODE,
    HEADER_OFFSET,
    HEADER_RUNNING,
    HEADER_START,
    MAX_TAIL_LINES,
    READ_LIMIT,
)
from hafo.model.output_view import OutputLog
from hafo.model.queue_view import QueueView
from hafo.model.queues import QUEUE
from hafo.model.schema import Schema, json_schemas, schema_of
from hafo.model.spec import SPEC
from hafo.model.views import NodeView, StatusView, WorkloadView

JSON = "application/json"
COMPONENTS = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": COMPONENTS.format(model=name)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


ERROR = _json(_ref("Error"), "error")


def _errors(*codes: int) -> dict[str, Any]:
    texts = {400: "bad input; the error names the field", 401: "missing or wrong bearer token",
             403: "a team's token, outside its queues (or on a node, a queue, anything but "
                  "a workload): the error names the team and the queue",
             404: "no such node, workload or queue", 409: "conflicts with the current state",
             413: "body too large",
             503: "etcd unavailable, or not the leader, or (a mutation) this controller's "
                  "API auth differs from the cluster's"}
    return {str(c): {**ERROR, "description": texts[c]} for c in codes}


@functools.cache
def schemas() -> dict[str, Any]:
    """The components' schemas: requests as validated (input), responses as written (made
    once; the documents share it, read-only). ``QueueBody``, the body of ``PUT
    /v1/queues/{name}``, is ``QueueSpec`` with ``name`` optional (the path names the queue)."""
    out = json_schemas({
        "WorkloadSpec": (SPEC, "validation"),
        "QueueSpec": (QUEUE, "validation"),
        "MigrateRequest": (MIGRATE, "validation"),
        "Error": (Schema(ErrorBody, "error"), "serialization"),
        "Workload": (Schema(WorkloadView, "workload"), "serialization"),
        "Node": (Schema(NodeView, "node"), "serialization"),
        "Status": (Schema(StatusView, "status"), "serialization"),
        "Event": (schema_of(Event), "serialization"),
        "Deleted": (Schema(Deleted, "deleted"), "serialization"),
        "Moving": (Schema(Moving, "moving"), "serialization"),
        "NodeChange": (Schema(NodeChange, "node"), "serialization"),
        "NodeRemoved": (Schema(NodeRemoved, "node"), "serialization"),
        "Health": (Schema(Health, "health"), "serialization"),
        "Endpoints": (schema_of(Endpoints), "serialization"),
        "History": (Schema(ShowView, "history"), "serialization"),
        "Queue": (Schema(QueueView, "queue"), "serialization"),
        "QueueSet": (Schema(QueueSet, "queue"), "serialization"),
        "QueueDeleted": (Schema(QueueDeleted, "deleted"), "serialization"),
    }, ref_template=COMPONENTS)
    body = copy.deepcopy(out["QueueSpec"])
    body["required"] = [name for name in body["required"] if name != "name"]
    body["title"] = "QueueBody"
    body["description"] = ("A queue's declaration (QueueSpec); `name` may be left out, else "
                           "it must be the path's.")
    out["QueueBody"] = body
    return out


WORKLOAD_ID = {"name": "id", "in": "path", "required": True,
               "description": "a workload's id, or its name",
               "schema": {"type": "string",
                          "pattern": f"^({WORKLOAD_ID_RE.pattern}|{WORKLOAD_NAME})$"}}
WORKLOAD_REF = {**WORKLOAD_ID, "name": "name"}
SD_TARGETS = {"type": "array", "items": {"type": "object", "required": ["targets", "labels"],
                                         "properties": {
                                             "targets": {"type": "array",
                                                         "items": {"type": "string"}},
                                             "labels": {"type": "object",
                                                        "additionalProperties": {
                                                            "type": "string"}}}}}
NODE_NAME = {"name": "name", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": f"^{NODE_NAME_RE.pattern}$"}}
READY = {"type": "object", "required": ["ready", "node", "reason"], "properties": {
    "ready": {"type": "boolean"}, "node": {"type": "string"}, "reason": {"type": "string"}}}
BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
TEXT = {"text/plain": {"schema": {"type": "string"}}}


def _get(summary: str, schema: dict[str, Any], *errors: int,
         params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "responses": {"200": _json(schema, "OK"), **_errors(*errors)}}
    if params:
        op["parameters"] = params
    return op


def _mutation(summary: str, status: int, schema: dict[str, Any], *errors: int,
              params: list[dict[str, Any]] | None = None,
              body: dict[str, Any] | None = None, body_required: bool = False,
              ) -> dict[str, Any]:
    op = _get(summary, schema, 401, 403, 413, 503, *errors, params=params)
    op["responses"][str(status)] = op["responses"].pop("200")
    op["security"] = BEARER
    if status != 200:
        op["responses"][str(status)]["description"] = "accepted"
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": {JSON: {"schema": body}}}
    return op


def _probes(subject: str) -> dict[str, Any]:
    health = _ref("Health")
    return {
        "/healthz": {"get": _get(f"the {subject} process is alive", health)},
        "/readyz": {"get": _get(f"the {subject} is connected to etcd", health, 503)},
        "/metrics": {"get": {"summary": "Prometheus metrics",
                             "responses": {"200": {"description": "OK", "content": TEXT}}}},
        "/openapi.json": {"get": {"summary": "this document",
                                  "responses": {"200": {"description": "OK", "content": {
                                      JSON: {"schema": {"type": "object"}}}}}}},
    }


def _document(title: str, paths: dict[str, Any]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": __version__,
                 "description": "Errors are JSON {\"error\": \"...\"} (with \"field\" for bad "
                                "input). Mutations need 'Authorization: Bearer <token>' when "
                                "api.token_file is set."},
        "paths": paths,
        "components": {"schemas": schemas(),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _submit() -> dict[str, Any]:
    op = _mutation("submit a workload: create it (201), or update the one of that name "
                   "(200: a rolling update, a planned move, or nothing for the same spec)", 201,
                   _ref("Workload"), 400, 409, body=_ref("WorkloadSpec"), body_required=True,
                   params=[{"name": "allow_unknown_checks", "in": "query", "required": False,
                            "description": "accept checks whose type is not installed on the "
                            "controller (the agents must have its plugin); else 400 naming "
                            "`spec.checks[i].type`", "schema": {"type": "boolean",
                                                                "default": False}}])
    op["responses"]["200"] = _json(_ref("Workload"), "updated, or unchanged")
    return op


QUEUE_PATH_NAME = {"name": "name", "in": "path", "required": True,
                   "description": "a queue's name",
                   "schema": {"type": "string", "pattern": f"^{WORKLOAD_NAME}$"}}


def _queues() -> dict[str, Any]:
    """The queue routes (``hafo.api.queue_routes``)."""
    name = [QUEUE_PATH_NAME]
    put = _mutation("declare the queue (201), or replace its declaration (200: updated, or "
                    "unchanged); the body's `name` may be left out, else it must be the path's",
                    201, _ref("QueueSet"), 400, body=_ref("QueueBody"), body_required=True,
                    params=name)
    put["responses"]["200"] = _json(_ref("QueueSet"), "updated, or unchanged")
    put["responses"]["201"]["description"] = "created"
    return {
        "/v1/queues": {"get": _get("every declared queue, and the workloads naming each",
                                   {"type": "array", "items": _ref("Queue")})},
        "/v1/queues/{name}": {
            "get": _get("one queue", _ref("Queue"), 404, params=name),
            "put": put,
            "delete": _mutation("forget a queue (409 while workloads name it)", 200,
                                _ref("QueueDeleted"), 404, 409, params=name)},
    }


_NULLABLE_TEXT = {"anyOf": [{"type": "string"}, {"type": "null"}]}
DEMAND = {"type": "object", "required": ["pending", "removable", "at"], "properties": {
    "pending": {"type": "array", "items": {
        "type": "object",
        "required": ["queue", "gpu_model", "gpu_profile", "nodes", "gpus_per_node", "count"],
        "properties": {"queue": {"type": "string"}, "gpu_model": _NULLABLE_TEXT,
                       "gpu_profile": _NULLABLE_TEXT, "nodes": {"type": "integer"},
                       "gpus_per_node": {"type": "integer"}, "count": {"type": "integer"}}}},
    "removable": {"type": "array", "items": {
        "type": "object", "required": ["node", "idle_seconds"],
        "properties": {"node": {"type": "string"}, "idle_seconds": {"type": "number"}}}},
    "at": {"type": "number"}, "leader": {"type": "boolean"}}}


def _remove_node(node: list[dict[str, Any]]) -> dict[str, Any]:
    op = _mutation("retire a down node with no work (200): its record, cordon, per-node "
                   "copies and reports go; 409 while an assignment holds it (naming the "
                   "workloads) or its agent is alive; with drain=true a busy node is drained "
                   "instead (202, what moves): ask again once it is empty and its agent "
                   "stopped", 200, _ref("NodeRemoved"), 400, 404, 409,
                   params=[*node, {"name": "drain", "in": "query", "required": False,
                                   "schema": {"type": "boolean", "default": False}}])
    op["responses"]["202"] = _json(_ref("NodeRemoved"), "drain started")
    return op


def controller_document() -> dict[str, Any]:
    """The controller API's OpenAPI document."""
    limit = {"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 100}}
    wid, node = [WORKLOAD_ID], [NODE_NAME]
    return _document("hafo controller API", {
        **_probes("controller"),
        "/": {"get": {"summary": "dashboard page", "responses": {"200": {
            "description": "OK", "content": {"text/html": {"schema": {"type": "string"}}}}}}},
        "/leader": {"get": _get("200 on the leader, 503 elsewhere", {"type": "object"}, 503)},
        "/v1/failsafe": {"get": _get("can this controller reach etcd (asked by agents)",
                                     {"type": "object"})},
        "/v1/status": {"get": _get("cluster summary", _ref("Status"))},
        "/v1/nodes": {"get": _get("every node", {"type": "array", "items": _ref("Node")})},
        "/v1/nodes/{name}": {"get": _get("one node", _ref("Node"), 404, params=node),
                             "delete": _remove_node(node)},
        "/v1/demand": {"get": _get("the pending work more nodes would let run, as shapes "
                                   "(a gang: nodes x GPUs per node), and the nodes idle for "
                                   "longer than autoscale.idle_after", DEMAND)},
        "/v1/nodes/{name}/drain": {"post": _mutation(
            "cordon the node and move its workloads off (checkpoint first)", 200,
            _ref("NodeChange"), 400, 404, params=node)},
        "/v1/nodes/{name}/cordon": {"post": _mutation(
            "allow no new work on the node", 200, _ref("NodeChange"), 400, 404, params=node)},
        "/v1/nodes/{name}/uncordon": {"post": _mutation(
            "allow work on the node again", 200, _ref("NodeChange"), 400, 404, params=node)},
        "/v1/workloads": {
            "get": _get("every workload", {"type": "array", "items": _ref("Workload")}),
            "post": _submit()},
        "/v1/workloads/{id}": {
            "get": _get("one workload", _ref("Workload"), 400, 404, params=wid),
            "delete": _mutation("stop and forget a workload", 200, _ref("Deleted"), 400, 404,
                                params=wid)},
        "/v1/workloads/{id}/endpoints": {"get": _get(
            "where its replicas serve and which are ready", _ref("Endpoints"), 404,
            params=wid)},
        "/v1/workloads/{id}/history": {"get": _get(
            "its spec, where it runs now, every epoch it had (node, start, end, how it "
            "ended, restarts, the checkpoint it resumed from) and its newest events",
            _ref("History"), 404, 503, params=wid)},
        "/v1/sd/prometheus": {"get": _get(
            "Prometheus HTTP service discovery: every running replica's ports",
            SD_TARGETS, 404, params=[
                {"name": "workload", "in": "query", "required": False,
                 "schema": {"type": "string"}},
                {"name": "port", "in": "query", "required": False,
                 "schema": {"type": "string"}}])},
        "/v1/sd/agents": {"get": _get(
            "Prometheus HTTP service discovery: every registered agent (down ones too)",
            SD_TARGETS)},
        "/v1/workloads/{id}/migrate": {"post": _mutation(
            "planned move with a fresh checkpoint (to `to`, or any other node)", 202,
            _ref("Moving"), 400, 404, 409, params=wid, body=_ref("MigrateRequest"))},
        "/v1/events": {"get": _get("newest events, oldest first",
                                   {"type": "array", "items": _ref("Event")}, 400,
                                   params=[limit])},
        **_queues(),
    })


def _output_routes() -> dict[str, Any]:
    """The agent's output routes (bearer token when ``api.token_file`` is set)."""
    wid = {"name": "id", "in": "path", "required": True,
           "description": "a workload's id (a replica's for a service)",
           "schema": {"type": "string", "pattern": f"^{WORKLOAD_ID_RE.pattern}$"}}
    epoch = {"name": "epoch", "in": "path", "required": True,
             "schema": {"type": "integer", "minimum": 0}}

    def whole(name: str, low: int, high: int, text: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "description": text,
                "schema": {"type": "integer", "minimum": low, "maximum": high}}

    listing = {"type": "object", "required": ["workload", "node", "epochs"], "properties": {
        "workload": {"type": "string"}, "node": {"type": "string"},
        "epochs": {"type": "array", "items": schema_of(OutputLog).json_schema()}}}
    number = {"schema": {"type": "integer", "minimum": 0}}
    headers = {
        HEADER_NODE: {"description": "this node", "schema": {"type": "string"}},
        HEADER_EPOCH: {"description": "the instance", **number},
        HEADER_OFFSET: {"description": "logical offset of the body's first byte", **number},
        HEADER_NEXT: {"description": "where to read on from", **number},
        HEADER_DROPPED: {"description": "bytes asked for that rotation dropped", **number},
        HEADER_START: {"description": "logical offset of the first kept byte", **number},
        HEADER_END: {"description": "logical offset of the end", **number},
        HEADER_RUNNING: {"description": "more may come", "schema": {"enum": ["true", "false"]}},
    }
    read = _get("an instance's output bytes: from `offset` (default: the first kept byte), "
                "or the last `tail` lines; at most `limit` bytes", {"type": "string"}, 400,
                401, 404, params=[wid, epoch,
                                  whole("offset", 0, 2**62, "logical offset to read from"),
                                  whole("tail", 1, MAX_TAIL_LINES, "the last N lines instead"),
                                  whole("limit", 1, READ_LIMIT, "most bytes returned")])
    read["responses"]["200"] = {"description": "OK", "headers": headers, "content": TEXT}
    read["security"] = BEARER
    kept = _get("the instances of the workload whose output this node keeps, oldest first",
                listing, 400, 401, params=[wid])
    kept["security"] = BEARER
    return {"/v1/workloads/{id}/logs": {"get": kept},
            "/v1/workloads/{id}/logs/{epoch}": {"get": read}}


def agent_document() -> dict[str, Any]:
    """The agent API's OpenAPI document."""
    return _document("hafo agent API", {
        **_output_routes(),
        **_probes("agent"),
        "/v1/node": {"get": _get("this node: record, lease and instances", {"type": "object"})},
        "/v1/workloads/{name}/ready": {"get": _get(
            "200 while a ready replica of the workload runs on this node, 503 otherwise (for "
            "a load balancer's health check)", READY, 404, params=[WORKLOAD_REF])},
    })
