"""The one client of hafo's own HTTP API (agents' and controllers'), on aiohttp.

``ApiClient`` owns what every caller shares: the bearer token (``Authorization: Bearer``,
the file read by ``hafo.api.auth.load_token``), TLS (a CA to trust, the client side of
``hafo.api.server.server_tls``), a timeout per request, and failures as typed exceptions
(``ApiError`` and its kinds). ``cli_error`` is the one mapping of those to the CLI's one-line
errors and exit codes (``hafo.exits``).

Kinds of failure:

- ``ApiUnavailable``: no usable answer. ``ApiUnreachable`` (nothing answered: refused
  connection, TLS failure, reset), ``ApiTimeout`` (no answer in time, a kind of
  unreachable), ``ApiBadAnswer`` (an answer that cannot be read). Exit 3.
- ``ApiRefused``: 401, the token is missing or wrong. Exit 5.
- ``ApiForbidden``: 403, the token may not do this (a team's token, on another team's
  workload, a node or a queue: ``hafo.api.scopes``). Exit 5, with the server's message.
- ``ApiStatusError``: any other answer that is not 2xx. Exit 1.
- ``ApiSetupError``: the token file or the CA cannot be loaded. Exit 2.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp

from hafo.exits import EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE, CliError

__all__ = ["DEFAULT_TIMEOUT", "ApiBadAnswer", "ApiClient", "ApiError", "ApiForbidden",
           "ApiRefused",
           "ApiResponse", "ApiSetupError", "ApiStatusError", "ApiTimeout", "ApiUnavailable",
           "ApiUnreachable", "cli_error", "client_tls", "error_text", "load_access"]

#: Seconds one request may take, unless the client or the call says otherwise.
DEFAULT_TIMEOUT = 5.0


# -- errors -------------------------------------------------------------------------------


class ApiError(Exception):
    """A call to hafo's API failed; ``who`` names the server (``node-1's agent``)."""

    def __init__(self, message: str, who: str = "") -> None:
        super().__init__(message)
        self.who = who


class ApiSetupError(ApiError):
    """The client cannot be set up: its token file or its CA cannot be loaded."""


class ApiUnavailable(ApiError):
    """No usable answer (nothing answered, not in time, or not readable)."""


class ApiUnreachable(ApiUnavailable):
    """Nothing answered: ``who at URL does not answer (WHY)``."""

    def __init__(self, who: str, url: str, why: str) -> None:
        super().__init__(f"{who} at {url} does not answer ({why})", who)
        self.url = url
        self.why = why


class ApiTimeout(ApiUnreachable):
    """No answer within the request's timeout."""


class ApiBadAnswer(ApiUnavailable):
    """An answer that cannot be read: ``who sent an unreadable WHAT (WHY)``."""

    def __init__(self, who: str, what: str, why: str) -> None:
        super().__init__(f"{who} sent an unreadable {what} ({why})", who)


class ApiStatusError(ApiError):
    """An answer that is not 2xx: ``who answered STATUS: ERROR`` (the body's ``error``)."""

    def __init__(self, who: str, status: int, why: str) -> None:
        super().__init__(self.describe(who, status, why), who)
        self.status = status
        self.why = why

    @staticmethod
    def describe(who: str, status: int, why: str) -> str:
        """The one-line message."""
        return f"{who} answered {status}: {why}"


class ApiRefused(ApiStatusError):
    """401: the bearer token is missing or wrong: ``who refused: ERROR``."""

    @staticmethod
    def describe(who: str, status: int, why: str) -> str:
        """The one-line message."""
        return f"{who} refused: {why}"


class ApiForbidden(ApiStatusError):
    """403: the token is right but may not do this (a team's token outside its queues):
    ``who refused: ERROR`` (the server's reason, naming the queue)."""

    @staticmethod
    def describe(who: str, status: int, why: str) -> str:
        """The one-line message."""
        return f"{who} refused: {why}"


def cli_error(exc: ApiError, token_flag: str = "--api-token-file") -> CliError:
    """The CLI's one-line error and exit code for a failed call (the only place that maps
    them): unavailable 3, refused 5 (401: the message says to give the token with
    ``token_flag``; 403: the server's reason), bad setup 2, any other answer 1."""
    if isinstance(exc, ApiRefused):
        return CliError(f"{exc} (give the token with {token_flag})", EXIT_REFUSED)
    if isinstance(exc, ApiForbidden):
        return CliError(str(exc), EXIT_REFUSED)
    if isinstance(exc, ApiUnavailable):
        return CliError(str(exc), EXIT_UNAVAILABLE)
    if isinstance(exc, ApiSetupError):
        return CliError(str(exc), EXIT_USAGE)
    return CliError(str(exc))


# -- setup --------------------------------------------------------------------------------


def client_tls(ca: str | None) -> ssl.SSLContext | None:
    """A client TLS context trusting the CA in ``ca`` (PEM), or None for plain http
    (OSError or ssl.SSLError when it cannot be loaded)."""
    return ssl.create_default_context(cafile=ca) if ca else None


def load_access(token_file: str | None, token_field: str, ca: str | None,
                ca_field: str) -> tuple[str | None, ssl.SSLContext | None]:
    """(the bearer token in ``token_file``, the TLS context trusting ``ca``), each None when
    not given. ApiSetupError names ``token_field`` or ``ca_field``."""
    from hafo.api.auth import load_token
    from hafo.model.errors import ValidationError

    token = None
    if token_file:
        try:
            token = load_token(token_file, token_field)
        except ValidationError as exc:
            raise ApiSetupError(str(exc)) from None
    try:
        context = client_tls(ca)
    except (OSError, ssl.SSLError) as exc:
        raise ApiSetupError(f"{ca_field}: cannot load {ca}: {exc}") from None
    return token, context


# -- answers ------------------------------------------------------------------------------


def error_text(body: bytes) -> str:
    """What an error answer says: its JSON ``error``, else its first 200 bytes."""
    try:
        return str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")


@dataclass(frozen=True)
class ApiResponse:
    """One answer, read in full: its status, body and headers; ``who`` answered it."""

    who: str
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300

    def raise_for_status(self) -> Self:
        """Itself when 2xx; else ApiRefused (401), ApiForbidden (403) or ApiStatusError."""
        if self.ok:
            return self
        kind = {401: ApiRefused, 403: ApiForbidden}.get(self.status, ApiStatusError)
        raise kind(self.who, self.status, error_text(self.body))

    def json(self, what: str = "answer") -> Any:
        """The body as JSON; ApiBadAnswer (naming ``what``) when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise ApiBadAnswer(self.who, what, str(exc)) from None


# -- the client ---------------------------------------------------------------------------


class ApiClient:
    """Calls to hafo's API servers, over one connection pool (``async with``).

    ``token``: sent as ``Authorization: Bearer`` with every call (None: none sent). ``tls``:
    the context that verifies the servers (None: plain http); ``scheme`` says which.
    ``timeout``: seconds each call may take, unless the call gives its own.
    """

    def __init__(self, token: str | None = None, tls: ssl.SSLContext | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.token = token
        self.tls = tls
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def scheme(self) -> str:
        """``https`` when the client talks TLS, else ``http``."""
        return "https" if self.tls is not None else "http"

    async def __aenter__(self) -> Self:
        connector = aiohttp.TCPConnector(ssl=self.tls) if self.tls is not None else None
        self._session = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def headers(self) -> dict[str, str]:
        """The headers every call carries (the bearer token, when there is one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def request(self, method: str, base: str, path: str, *,
                      params: Mapping[str, str] | None = None, body: Any = None,
                      timeout: float | None = None, who: str | None = None) -> ApiResponse:
        """``method`` ``base`` + ``path`` (``body``: sent as JSON), read in full, whatever
        its status (see ``ApiResponse.raise_for_status``). ApiTimeout or ApiUnreachable
        when no answer comes; ``who`` (default ``base``) names the server in errors."""
        if self._session is None:
            raise RuntimeError("ApiClient used outside 'async with'")
        name = who or base
        seconds = self.timeout if timeout is None else timeout
        try:
            async with self._session.request(
                    method, f"{base}{path}", params=params, json=body, headers=self.headers(),
                    timeout=aiohttp.ClientTimeout(total=seconds)) as resp:
                return ApiResponse(name, resp.status, await resp.read(), dict(resp.headers))
        except TimeoutError as exc:
            raise ApiTimeout(name, base, _why(exc)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiUnreachable(name, base, _why(exc)) from None

    async def get(self, base: str, path: str, *, params: Mapping[str, str] | None = None,
                  timeout: float | None = None, who: str | None = None) -> ApiResponse:
        """``GET`` (see ``request``)."""
        return await self.request("GET", base, path, params=params, timeout=timeout, who=who)


def _why(exc: BaseException) -> str:
    """``TypeName: text`` (the text left out when there is none)."""
    text = str(exc)
    return f"{type(exc).__name__}{': ' + text if text else ''}"
