"""Reading a request's JSON body: one clear 400 naming ``body`` for anything malformed."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from hafo.model.errors import ValidationError


async def json_object(request: web.Request, required: bool) -> dict[str, Any] | None:
    """The body as a JSON object; None when it is empty and not ``required``.

    Raises ValidationError("body", ...) for a wrong content type, bad UTF-8, bad JSON or a
    JSON value that is not an object. aiohttp enforces the size limit while reading.
    """
    raw = await request.read()
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
