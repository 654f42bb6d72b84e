"""One-line failures with an exit code (docs/reference/commands.md, "Commands"), shared by the
``hafo`` commands (``hafo.commands``) and the daemons' start-up (``hafo.agent.main``,
``hafo.controller.main``); ``hafo.cli.main`` prints them. Imports nothing: the agent's
start-up must stay fast."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5
EXIT_TIMEOUT = 6


class CliError(Exception):
    """A failure explained in one line, with an exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
