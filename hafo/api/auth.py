"""Bearer-token authentication of mutating HTTP calls (``api.token_file``).

Reads stay open (load balancers, dashboards, Prometheus); POST, PUT, PATCH and DELETE need
``Authorization: Bearer <token>`` when a token is configured. The comparison takes the same
time whatever the guess (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import os
import stat
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hafo.api.errors import error
from hafo.model.errors import ValidationError

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hafo"'}


def load_token(path: str, field: str = "api.token_file") -> str:
    """The token in ``path`` (surrounding whitespace removed); ValidationError naming
    ``field`` when the file is missing, unreadable, empty, or readable by other users."""
    try:
        info = os.stat(path)
        text = Path(path).read_text()
    except OSError as exc:
        raise ValidationError(field, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValidationError(field, f"{path} is not text") from None
    if info.st_mode & stat.S_IROTH:
        raise ValidationError(field, f"{path} is readable by every user; chmod 600 it")
    token = text.strip()
    if len(token) < 16 or any(c.isspace() for c in token):
        raise ValidationError(field, f"{path} must hold one token of at least 16 "
                              "characters without spaces")
    return token


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant-time compare)."""
    if not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def bearer_auth(token: str | None) -> Middleware:
    """Middleware: 401 for a mutating call without the right token (none set: all pass)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        unrouted = request.match_info.http_exception is not None  # 404/405 come first
        if token is not None and request.method in MUTATING and not unrouted:
            header = request.headers.get("Authorization")
            if not token_matches(header, token):
                why = "missing bearer token" if not header else "wrong bearer token"
                return error(401, f"{why}: mutating calls need 'Authorization: Bearer <token>'",
                             headers=CHALLENGE)
        return await handler(request)

    return check


def agreed_auth(refusal: Callable[[], str] | None) -> Middleware:
    """Middleware: 503 with the reason for every mutation while ``refusal`` says why this
    controller's API auth is not the cluster's (``hafo.store.api_auth``); reads pass."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        unrouted = request.match_info.http_exception is not None
        if refusal is not None and request.method in MUTATING and not unrouted:
            why = refusal()
            if why:
                return error(503, why)
        return await handler(request)

    return check
