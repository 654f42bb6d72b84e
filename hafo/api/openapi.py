"""The OpenAPI 3.1 documents of the controller's and the agent's HTTP APIs.

Served at ``/openapi.json``; a test checks that the documented operations are exactly the
routes the applications serve, and the fuzzing test drives the API from this document. The
workload-spec schema mirrors ``hafo.model.spec.parse_spec``, which is the one validator of a
spec (the CLI and the API both call it), so a body this schema accepts is accepted by the API.
"""

from __future__ import annotations

from typing import Any

from hafo import __version__
from hafo.model.names import NODE_NAME_RE, WORKLOAD_ID_RE, WORKLOAD_NAME
from hafo.model.views import NODE_STATES, WORKLOAD_STATES

JSON = "application/json"
NO_NUL = "^[^\\u0000]+$"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


ERROR = _json(_ref("Error"), "error")


def _errors(*codes: int) -> dict[str, Any]:
    texts = {400: "bad input; the error names the field", 401: "missing or wrong bearer token",
             404: "no such node or workload", 409: "conflicts with the current state",
             413: "body too large", 503: "etcd unavailable, or not the leader"}
    return {str(c): {**ERROR, "description": texts[c]} for c in codes}


def _number(minimum: float, exclusive: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number", "minimum": minimum, "nullable": True}
    if exclusive:
        schema["exclusiveMinimum"] = True
    return schema


def _str_map() -> dict[str, Any]:
    value = {"oneOf": [{"type": "string", "pattern": "^[^\\u0000]*$"}, {"type": "number"},
                       {"type": "boolean"}]}
    return {"type": "object", "nullable": True, "additionalProperties": value,
            "propertyNames": {"minLength": 1, "pattern": "^[^=\\u0000]+$"}}


WORKLOAD_SPEC: dict[str, Any] = {
    "type": "object",
    "description": "A workload spec (the YAML of `hafo submit`, as JSON).",
    "required": ["name", "command"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": f"^{WORKLOAD_NAME}$"},
        "command": {"type": "array", "minItems": 1,
                    "items": {"type": "string", "pattern": NO_NUL}},
        "gpus": {"type": "integer", "minimum": 0, "maximum": 64, "nullable": True},
        "gpu_model": {"type": "string", "minLength": 1, "nullable": True},
        "gpu_memory_mib": {"type": "integer", "minimum": 1, "nullable": True},
        "env": _str_map(),
        "restart": {"type": "object", "nullable": True, "additionalProperties": False,
                    "properties": {
                        "max_restarts": {"type": "integer", "minimum": 0, "nullable": True},
                        "window": _number(0, exclusive=True),
                        "backoff": _number(0), "max_backoff": _number(0)}},
        "checks": {"type": "array", "nullable": True, "items": _ref("CheckSpec")},
        "stop_grace": _number(0),
        "workdir": {"type": "string", "minLength": 1, "nullable": True},
        "priority": {"type": "integer", "minimum": -1000, "maximum": 1000, "nullable": True},
        "node_selector": _str_map(),
        "checkpoint": {"type": "object", "nullable": True, "additionalProperties": False,
                       "properties": {"mode": {"type": "string", "nullable": True,
                                               "enum": ["cooperative", "transparent", None]}}},
        "gpu_profile": {"type": "string", "nullable": True,
                        "pattern": "^[1-8]g\\.[1-9][0-9]{0,3}gb(\\+[a-z]+)?$"},
        "placement": {"type": "string", "nullable": True,
                      "enum": ["spread", "binpack", None]},
        "preempt": {"type": "boolean", "nullable": True},
    },
}

CHECK_SPEC: dict[str, Any] = {
    "type": "object",
    "description": "An application check: `type` (built in: http, tcp, exec, process, "
                   "progress; plugins add more) and the type's own fields.",
    "required": ["type"],
    "additionalProperties": True,
    "properties": {
        "type": {"type": "string", "minLength": 1},
        "interval": _number(0, exclusive=True),
        "timeout": _number(0, exclusive=True),
        "failure_threshold": {"type": "integer", "minimum": 1, "nullable": True},
        "initial_delay": _number(0),
    },
}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"],
              "properties": {"error": {"type": "string"}, "field": {"type": "string"}}},
    "WorkloadSpec": WORKLOAD_SPEC,
    "CheckSpec": CHECK_SPEC,
    "Checkpoint": {"type": "object", "nullable": True, "required": ["step", "epoch", "path"],
                   "properties": {"step": {"type": "integer"}, "epoch": {"type": "integer"},
                                  "path": {"type": "string"}}},
    "Workload": {
        "type": "object",
        "required": ["id", "name", "state", "node", "epoch", "restarts", "gpus", "checkpoint"],
        "properties": {
            "id": {"type": "string"}, "name": {"type": "string"},
            "state": {"type": "string", "enum": list(WORKLOAD_STATES)},
            "node": {"type": "string", "nullable": True},
            "epoch": {"type": "integer", "nullable": True},
            "restarts": {"type": "integer"},
            "gpus": {"type": "array", "items": {"type": "string"}},
            "checkpoint": _ref("Checkpoint"),
            "priority": {"type": "integer"}, "submitted_at": {"type": "number"},
            "reason": {"type": "string"}}},
    "Gpu": {"type": "object",
            "required": ["index", "uuid", "model", "memory_mib", "healthy", "allocated_to"],
            "properties": {"index": {"type": "integer"}, "uuid": {"type": "string"},
                           "model": {"type": "string"}, "memory_mib": {"type": "integer"},
                           "healthy": {"type": "boolean"},
                           "allocated_to": {"type": "string", "nullable": True}}},
    "Node": {"type": "object", "required": ["name", "state", "labels", "gpus", "workloads"],
             "properties": {"name": {"type": "string"},
                            "state": {"type": "string", "enum": list(NODE_STATES)},
                            "labels": {"type": "object",
                                       "additionalProperties": {"type": "string"}},
                            "gpus": {"type": "array", "items": _ref("Gpu")},
                            "workloads": {"type": "array", "items": {"type": "string"}}}},
    "Status": {"type": "object", "required": ["leader", "controllers", "nodes", "workloads"],
               "properties": {
                   "leader": {"type": "string", "nullable": True},
                   "controllers": {"type": "array", "items": {"type": "string"}},
                   "nodes": {"type": "object", "additionalProperties": {"type": "integer"}},
                   "workloads": {"type": "object",
                                 "additionalProperties": {"type": "integer"}},
                   "stale": {"type": "boolean"},
                   "stale_seconds": {"type": "number", "nullable": True},
                   "etcd_contact_age": {"type": "number"}}},
    "Event": {"type": "object", "required": ["ts", "kind", "message"],
              "properties": {"ts": {"type": "number"}, "kind": {"type": "string"},
                             "message": {"type": "string"}}},
    "Deleted": {"type": "object", "required": ["id", "deleted"],
                "properties": {"id": {"type": "string"}, "deleted": {"type": "boolean"}}},
    "Moving": {"type": "object", "required": ["id", "to"],
               "properties": {"id": {"type": "string"},
                              "to": {"type": "string", "nullable": True}}},
    "MigrateRequest": {"type": "object", "additionalProperties": False,
                       "properties": {"to": {"type": "string", "nullable": True,
                                             "pattern": f"^{NODE_NAME_RE.pattern}$"}}},
    "NodeChange": {"type": "object", "required": ["node", "cordoned"],
                   "properties": {"node": {"type": "string"}, "cordoned": {"type": "boolean"},
                                  "moving": {"type": "array", "items": {"type": "string"}}}},
    "Health": {"type": "object", "properties": {"status": {"type": "string"}}},
}

WORKLOAD_ID = {"name": "id", "in": "path", "required": True,
               "schema": {"type": "string", "pattern": f"^{WORKLOAD_ID_RE.pattern}$"}}
NODE_NAME = {"name": "name", "in": "path", "required": True,
             "schema": {"type": "string", "pattern": f"^{NODE_NAME_RE.pattern}$"}}
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
    op = _get(summary, schema, 401, 413, 503, *errors, params=params)
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


def as_openapi_31(schema: Any) -> Any:
    """The schemas above are written with OpenAPI 3.0's ``nullable`` and boolean
    ``exclusiveMinimum``; OpenAPI 3.1 is plain JSON Schema 2020-12 (which also has
    ``propertyNames``), so rewrite them into that form."""
    if isinstance(schema, list):
        return [as_openapi_31(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: as_openapi_31(value) for key, value in schema.items()}
    if out.pop("exclusiveMinimum", False) is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if out.pop("nullable", False):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


def _document(title: str, paths: dict[str, Any]) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": __version__,
                 "description": "Errors are JSON {\"error\": \"...\"} (with \"field\" for bad "
                                "input). Mutations need 'Authorization: Bearer <token>' when "
                                "api.token_file is set."},
        "paths": as_openapi_31(paths),
        "components": {"schemas": as_openapi_31(SCHEMAS),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


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
        "/v1/nodes/{name}": {"get": _get("one node", _ref("Node"), 400, 404, params=node)},
        "/v1/nodes/{name}/drain": {"post": _mutation(
            "cordon the node and move its workloads off (checkpoint first)", 200,
            _ref("NodeChange"), 400, 404, params=node)},
        "/v1/nodes/{name}/cordon": {"post": _mutation(
            "allow no new work on the node", 200, _ref("NodeChange"), 400, 404, params=node)},
        "/v1/nodes/{name}/uncordon": {"post": _mutation(
            "allow work on the node again", 200, _ref("NodeChange"), 400, 404, params=node)},
        "/v1/workloads": {
            "get": _get("every workload", {"type": "array", "items": _ref("Workload")}),
            "post": _mutation("submit a workload", 201, _ref("Workload"), 400,
                              body=_ref("WorkloadSpec"), body_required=True)},
        "/v1/workloads/{id}": {
            "get": _get("one workload", _ref("Workload"), 400, 404, params=wid),
            "delete": _mutation("stop and forget a workload", 200, _ref("Deleted"), 400, 404,
                                params=wid)},
        "/v1/workloads/{id}/migrate": {"post": _mutation(
            "planned move with a fresh checkpoint (to `to`, or any other node)", 202,
            _ref("Moving"), 400, 404, 409, params=wid, body=_ref("MigrateRequest"))},
        "/v1/events": {"get": _get("newest events, oldest first",
                                   {"type": "array", "items": _ref("Event")}, 400,
                                   params=[limit])},
    })


def agent_document() -> dict[str, Any]:
    """The agent API's OpenAPI document."""
    return _document("hafo agent API", {
        **_probes("agent"),
        "/v1/node": {"get": _get("this node: record, lease and instances", {"type": "object"})},
    })
