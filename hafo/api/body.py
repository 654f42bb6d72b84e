"""Request and response bodies: reading a request's JSON (one clear 400 naming ``body`` for
anything malformed), and the declarations of the API's own bodies."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, NotRequired

from aiohttp import web
from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.errors import ValidationError
from hafo.model.schema import NodeName, Schema, Section

#: Seconds a client has to send a request's whole body (a body limit is 256 KiB: on any real
#: link, well under a second); a slower one gets a 408 and its connection closed.
BODY_TIMEOUT = 10.0


async def json_object(request: web.Request, required: bool,
                      timeout: float | None = None) -> dict[str, Any] | None:
    """The body as a JSON object; None when it is empty and not ``required``.

    Raises ValidationError("body", ...) for a wrong content type, bad UTF-8, bad JSON or a
    JSON value that is not an object; HTTPRequestTimeout when the body takes longer than
    ``timeout`` (default ``BODY_TIMEOUT``) to arrive. aiohttp enforces the size limit while
    reading.
    """
    timeout = BODY_TIMEOUT if timeout is None else timeout
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise web.HTTPRequestTimeout(reason=f"body: not received within {timeout:g} s",
                                     headers={"Connection": "close"}) from None
    if not raw.strip():
        if required:
            raise ValidationError("body", "is required (a JSON object)")
        return None
    if request.content_type not in ("application/json", "application/octet-stream"):
        raise ValidationError("body", f"Content-Type must be application/json, "
                              f"got {request.content_type!r}")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValidationError("body", "is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ValidationError("body", f"invalid JSON at line {exc.lineno} column "
                              f"{exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise ValidationError("body", "JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ValidationError("body", f"must be a JSON object, got {type(value).__name__}")
    return value


# --- the API's own bodies (the OpenAPI document's schemas come from these) -------------------

@dataclass(frozen=True)
class MigrateRequest(Section):
    """The optional body of ``POST /v1/workloads/{id}/migrate``: the node to move to
    (default: any other); for a gang, ``node``: the node of the member that moves."""

    to: NodeName | None = None
    node: NodeName | None = None


MIGRATE: Schema[MigrateRequest] = Schema(MigrateRequest, "body")


class Deleted(TypedDict):
    """A workload deleted (its instance is stopped)."""

    id: str
    deleted: bool


class Moving(TypedDict):
    """A planned move asked for (``to``: null for any other node; ``node``: a gang's member
    node that moves, null otherwise)."""

    id: str
    to: str | None
    node: NotRequired[str | None]


class NodeChange(TypedDict):
    """A node cordoned, uncordoned or drained (``moving``: the workloads moved off)."""

    node: str
    cordoned: bool
    moving: NotRequired[list[str]]


class NodeRemoved(TypedDict):
    """``DELETE /v1/nodes/{name}``: the node was ``removed`` (200), or (with ``drain=true``,
    202) a drain started: ``moving``, the workloads asked to move off it; remove it again
    once it is empty and its agent stopped."""

    node: str
    removed: bool
    draining: bool
    moving: list[str]


class QueueSet(TypedDict):
    """A queue declared (``PUT /v1/queues/{name}``): its declaration, every field present,
    and what the write did (``created``, ``updated`` or ``unchanged``)."""

    name: str
    gpus: int | None
    cohort: str | None
    borrowing_limit: int | None
    lending_limit: int | None
    weight: float
    change: str
    models: NotRequired[dict[str, int]]


class QueueDeleted(TypedDict):
    """A queue deleted."""

    name: str
    deleted: bool


class Health(TypedDict):
    """A probe's answer; the daemon's role is a key too (``{"status": "ok", "agent": "n1"}``).
    ``version``: the hafo version the daemon runs (a rolling upgrade waits for it)."""

    status: str
    version: NotRequired[str]
