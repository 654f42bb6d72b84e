"""JSON errors for every HTTP failure: ``{"error": "..."}`` (and ``"field"`` for bad input).

One middleware turns whatever goes wrong into the contract's error body: aiohttp's own
responses (unknown route, wrong method, body too large), etcd being unreachable (503), and
anything unexpected (500, logged with its traceback; the fuzzing tests expect none).
"""

from __future__ import annotations

from typing import NotRequired

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from typing_extensions import TypedDict  # pydantic reads this one on Python 3.11

from hafo.model.errors import ValidationError
from hafo.store import TRANSIENT, StoreError

log = structlog.get_logger("hafo.api")


#: The application's request body limit, in bytes (for the 413 message).
MAX_BODY = web.AppKey("max_body_bytes", int)


class NotFound(Exception):
    """A path names a node or workload that does not exist (404 with this message)."""


class Forbidden(Exception):
    """The caller's token may not do this (403 with this message; ``hafo.api.scopes``)."""


class FieldErrorBody(TypedDict):
    """One bad field of the input."""

    field: str
    error: str


class ErrorBody(TypedDict):
    """Every error response: what went wrong, and the field at fault for bad input (the
    first one; ``errors``: every bad field, the first one included)."""

    error: str
    field: NotRequired[str]
    errors: NotRequired[list[FieldErrorBody]]


def error(status: int, message: str, field: str | None = None,
          headers: dict[str, str] | None = None) -> web.Response:
    """The contract's error body, with the offending field when there is one."""
    body: ErrorBody = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status, headers=headers)


def bad_input(exc: ValidationError) -> web.Response:
    """400 naming the field (the first bad one), with every bad field in ``errors``."""
    body: ErrorBody = {"error": str(exc), "field": exc.field,
                       "errors": [FieldErrorBody(field=e.field, error=e.message)
                                  for e in exc.errors]}
    return web.json_response(body, status=400)


def _http_error(exc: web.HTTPException, request: web.Request) -> web.Response:
    headers = {k: v for k, v in exc.headers.items()
               if k.lower() in ("allow", "www-authenticate", "connection")}
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app[MAX_BODY]
        return error(413, f"body: larger than the limit of {limit} bytes", "body")
    if isinstance(exc, web.HTTPNotFound):
        return error(404, f"no route {request.path!r}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return error(405, f"{request.method} is not allowed on {request.path!r}",
                     headers=headers)
    return error(exc.status, exc.reason or "request refused", headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure of a handler to a JSON error response."""
    try:
        return await handler(request)
    except ValidationError as exc:
        return bad_input(exc)
    except NotFound as exc:
        return error(404, str(exc))
    except Forbidden as exc:
        return error(403, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc, request)
    except TRANSIENT as exc:
        return error(503, f"etcd is unavailable ({type(exc).__name__}); try again")
    except StoreError as exc:
        return error(503, f"etcd refused the request: {exc}")
    except Exception:
        log.exception("API handler failed", method=request.method, path=request.path)
        return error(500, "internal error (logged by the server)")
