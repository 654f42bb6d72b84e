"""Bearer-token authentication of mutating HTTP calls (``api.token_file``, and the team
tokens of ``api.team_tokens_file``).

Reads stay open (load balancers, dashboards, Prometheus); POST, PUT, PATCH and DELETE need
``Authorization: Bearer <token>`` when a token is configured: the admin token, or (on a
controller) one team's token, whose scope ``hafo.api.scopes`` checks. The middleware puts
who called (``hafo.decisions.api_scopes.Caller``) in the request under ``CALLER``. Every
comparison takes the same time whatever the guess (``hmac.compare_digest``, against every
token).
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
from hafo.decisions.api_scopes import ADMIN, ANONYMOUS, Caller, team
from hafo.model.errors import FieldError, ValidationError
from hafo.model.teams import TeamTokensFile, parse_team_tokens
from hafo.model.yaml_text import MAX_FILE_BYTES, YamlRefused, load_yaml_text

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hafo"'}
#: Who made a mutating call (set by ``bearer_auth`` on every routed mutation).
CALLER = web.RequestKey("hafo_caller", Caller)


def _read_secret(path: str, field: str) -> str:
    """The text of a file of secrets; ValidationError naming ``field`` when it is missing,
    unreadable, not text, too big, or readable by every user."""
    try:
        info = os.stat(path)
        if info.st_size > MAX_FILE_BYTES:
            raise ValidationError(field, f"{path} is over {MAX_FILE_BYTES // 2 ** 20} MiB")
        text = Path(path).read_text()
    except OSError as exc:
        raise ValidationError(field, f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValidationError(field, f"{path} is not text") from None
    if info.st_mode & stat.S_IROTH:
        raise ValidationError(field, f"{path} is readable by every user; chmod 600 it")
    return text


def load_token(path: str, field: str = "api.token_file") -> str:
    """The token in ``path`` (surrounding whitespace removed); ValidationError naming
    ``field`` when the file is missing, unreadable, empty, or readable by other users."""
    token = _read_secret(path, field).strip()
    if len(token) < 16 or any(c.isspace() for c in token):
        raise ValidationError(field, f"{path} must hold one token of at least 16 "
                              "characters without spaces")
    return token


def load_team_tokens(path: str, admin_token: str | None,
                     field: str = "api.team_tokens_file") -> TeamTokensFile:
    """The team tokens in ``path`` (``hafo.model.teams``), checked against the admin token;
    ValidationError naming ``field`` (and, inside it, the file's field: ``field:
    teams.team-a.queues[0]: ...``) when the file cannot be read (as ``load_token``'s), is
    not YAML, or does not validate. No error shows a token."""
    text = _read_secret(path, field)
    try:
        raw = load_yaml_text(text)
    except YamlRefused as exc:
        raise ValidationError(field, f"{path}: {exc}") from None
    try:
        return parse_team_tokens(raw, admin_token)
    except ValidationError as exc:
        raise ValidationError.of([FieldError(field, f"{e} (in {path})")
                                  for e in exc.errors]) from None


def _bearer(header: str | None) -> bytes | None:
    """The token an ``Authorization: Bearer`` header carries (None: none)."""
    if not header:
        return None
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return given.strip().encode()


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant-time compare)."""
    given = _bearer(header)
    return given is not None and hmac.compare_digest(given, token.encode())


def identify(header: str | None, token: str | None,
             teams: TeamTokensFile | None = None) -> Caller | None:
    """Who an ``Authorization`` header says the caller is: the admin (``token``), one of
    ``teams``, anonymous when no token is configured at all; None for a missing or wrong
    token. Compared with every token, each in constant time, whichever matches."""
    if token is None:
        return ANONYMOUS
    given = _bearer(header)
    if given is None:
        return None
    found: Caller | None = ADMIN if hmac.compare_digest(given, token.encode()) else None
    for name, entry in (teams.teams.items() if teams is not None else ()):
        if hmac.compare_digest(given, entry.token.encode()) and found is None:
            found = team(name, entry.queues)
    return found


def bearer_auth(token: str | None, teams: TeamTokensFile | None = None) -> Middleware:
    """Middleware: 401 for a mutating call without the right token (none set: all pass);
    who called is put under ``CALLER`` (``teams``: the team tokens also accepted, whose
    scope ``hafo.api.scopes`` checks)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        unrouted = request.match_info.http_exception is not None  # 404/405 come first
        if request.method in MUTATING and not unrouted:
            header = request.headers.get("Authorization")
            caller = identify(header, token, teams)
            if caller is None:
                why = "missing bearer token" if not header else "wrong bearer token"
                return error(401, f"{why}: mutating calls need 'Authorization: Bearer <token>'",
                             headers=CHALLENGE)
            request[CALLER] = caller
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
