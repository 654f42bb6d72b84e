"""What the two daemons' start-ups share (``hafo.agent.main``, ``hafo.controller.main``):
the API's token and TLS from the config, listening, the one start-up line, and serving until
SIGTERM/SIGINT while telling systemd. Heavy imports stay inside the functions: the agent
renews its lease before any of them (docs/safety.md, "Hitless agent restarts")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from hafo.exits import EXIT_USAGE, CliError
from hafo.stopping import cancel_on_signals


async def serve_until_signal(main: Coroutine[Any, Any, None], ready: asyncio.Event,
                             what: str, *, then: Callable[[], Awaitable[object]]) -> None:
    """Run a daemon until SIGTERM/SIGINT (``hafo.stopping``), telling systemd when it is
    ready, pinging the watchdog from this event loop, and saying when it stops; then ``then``
    (the daemon's own clean-up: its API, its store), whatever happened. The handlers stay
    until ``then`` is done: a second signal while the daemon cleans up changes nothing."""
    from hafo.notify import Notifier

    notifier = Notifier()  # reads the environment only
    task = asyncio.ensure_future(main)

    async def tell_systemd() -> None:
        await ready.wait()
        notifier.ready(f"{what}: serving")
        await notifier.keep_watchdog()

    with cancel_on_signals(task):  # SIGTERM, SIGINT
        try:
            helper = asyncio.ensure_future(tell_systemd())
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            finally:
                helper.cancel()
                notifier.stopping(f"{what}: stopping")
        finally:
            await then()


def api_settings(config: Any) -> tuple[str | None, Any]:
    """The API's bearer token and TLS context from ``api.token_file`` / ``api.tls_*``."""
    from hafo.api.auth import load_token
    from hafo.api.server import server_tls
    from hafo.model import ValidationError

    try:
        token = load_token(config.api.token_file) if config.api.token_file else None
    except ValidationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    tls = None
    if config.api.tls_cert:
        try:
            tls = server_tls(config.api.tls_cert, config.api.tls_key)
        except (OSError, ValueError) as exc:
            raise CliError(f"api.tls_cert: cannot load {config.api.tls_cert} with "
                           f"{config.api.tls_key}: {exc}", EXIT_USAGE) from None
    return token, tls


def api_teams(config: Any, token: str | None) -> Any:
    """The controller's team tokens from ``api.team_tokens_file`` (``hafo.model.teams``;
    None when unset), checked against the admin ``token``; CliError (exit 2) naming the
    field when the file cannot be used."""
    from hafo.api.auth import load_team_tokens
    from hafo.model import ValidationError

    path = config.api.team_tokens_file
    if not path:
        return None
    try:
        return load_team_tokens(path, token)
    except ValidationError as exc:
        raise CliError("\n".join(exc.lines()), EXIT_USAGE) from None


async def listen(app: Any, config: Any, tls: Any) -> Any:
    """Serve ``app`` on ``api.listen``; CliError (exit 2) naming it if that fails."""
    from hafo.api import serve

    try:
        return await serve(app, config.api.host, config.api.port, tls)
    except OSError as exc:
        raise CliError(f"api.listen: cannot listen on {config.api.listen}: "
                       f"{exc.strerror or exc}", EXIT_USAGE) from None


def announce(role: Any, name: str, config: Any, runner: Any, token: str | None) -> None:
    """Log the daemon's one start-up line (once it listens: the port it got for port 0), and
    a warning when its API is open to other hosts without a token (hafo.model.exposure)."""
    import structlog

    from hafo import __version__
    from hafo.model.exposure import api_url, open_api, serving_line

    port = config.api.port or next(
        (a[1] for a in runner.addresses if isinstance(a, tuple) and len(a) > 1), 0)
    line = serving_line(role, name, api_url(config.api.scheme, config.api.host, port))
    log = structlog.get_logger(f"hafo.{role}")
    log.info("serving API", **line.fields(), version=__version__)
    exposed = open_api(role, config.api.listen, config.api.host, token is not None)
    if exposed is not None:
        log.warning("API open without a token to anyone who can reach it: set "
                    "api.token_file, or listen on 127.0.0.1", **exposed.fields())
