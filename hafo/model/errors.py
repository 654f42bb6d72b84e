"""The one error type for bad input: it names the offending field."""

from __future__ import annotations


class ValidationError(ValueError):
    """Bad user input (config, workload spec, HTTP body, CLI argument).

    ``field`` is a dotted path such as ``spec.restart.max_restarts``; ``str(err)`` is the one
    line shown to the user.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
