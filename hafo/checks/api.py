"""The check plugin API: what a check type is, what it gets, what it returns.

A check type is registered under the entry-point group ``hafo.checks``; the entry-point name
is the ``type`` used in workload specs, the object it points to is a *factory*: called once
per workload instance with the check's options (the spec's check mapping without ``type``,
``interval``, ``timeout``, ``failure_threshold`` and ``initial_delay``), it returns an object
with a ``probe(ctx)`` method. ``probe`` may be a plain function (it then runs in a thread) or
a coroutine function; it returns a ``CheckResult`` (or a bool). A factory rejects bad options
by raising ``CheckOptionError(field, message)``.

The agent contains every probe: it runs under the check's ``timeout``; an exception, a hang
or a result of the wrong type counts as one failure of that check only, with the reason logged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

ENTRY_POINT_GROUP = "hafo.checks"


@dataclass(frozen=True)
class CheckContext:
    """What a probe knows about the instance it checks."""

    workload: str
    node: str
    epoch: int
    pid: int | None
    started_at: float | None
    checkpoint_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    #: The instance's ports by name (``ports`` of the spec, each 0 resolved to the port hafo
    #: chose on this node).
    ports: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    """One probe's outcome; ``detail`` says why it failed (or what it saw)."""

    ok: bool
    detail: str = ""


class CheckOptionError(ValueError):
    """A check's options are invalid; ``field`` names the option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Check(Protocol):
    """A configured check: ``probe`` is called every ``interval`` seconds."""

    def probe(self, ctx: CheckContext) -> CheckResult | bool | Awaitable[CheckResult | bool]:
        """Look at the instance once."""
        ...


CheckFactory = Callable[[Mapping[str, Any]], Check]
