"""Loggers that import structlog at their first use, for the modules on a restarted agent's
path to its first keepalive (``hafo.agent.early_renewal``: ``hafo.store.client``,
``hafo.retry``, ``hafo.tasks``). Importing structlog (and the rich it pulls in for
tracebacks) costs 0.1 s, a sixth of the fast timing profile's slack after a crash
(docs/safety.md, "Hitless agent restarts")."""

from __future__ import annotations

from typing import Any

__all__ = ["LazyLogger", "get_logger"]


class LazyLogger:
    """``structlog.get_logger(name)``, created at the first attribute looked up."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        logger = self._logger
        if logger is None:
            import structlog

            logger = self._logger = structlog.get_logger(self._name)
        return getattr(logger, attr)


def get_logger(name: str) -> Any:
    """A logger named ``name`` (structlog's, once used)."""
    return LazyLogger(name)
