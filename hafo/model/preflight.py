"""A gang's pre-flight (docs/reference/gangs.md, "Pre-flight"): what each member measured in
the short collective test run before its command, and the verdict, as the pre-flight
program (``hafo.agent.preflight``) writes it into the member's progress directory
(``preflight.json``) and its agent reports it (``InstanceStatus.preflight``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from hafo.model.errors import ValidationError
from hafo.model.schema import INTEGER, Record, schema_of

#: The file, in a member's progress directory, that holds its pre-flight's report.
PREFLIGHT_FILE = "preflight.json"
#: The pre-flight's exit status when the gang failed it: the member's command never ran.
EXIT_PREFLIGHT_FAILED = 86
#: A report is read up to this size (a 1,000-member gang's figures fit well below it).
MAX_REPORT_BYTES = 512 * 1024
#: At most this many ranks' figures are kept (a gang's members, hafo.model.spec).
MAX_RANKS = 1024


@dataclass(frozen=True, slots=True)
class RankFigures(Record):
    """What one member measured on its own node."""

    rank: Annotated[int, Field(ge=0), INTEGER]
    """Its member rank (``HAFO_GANG_RANK``)."""
    node: str
    """Its node (``HAFO_NODE``)."""
    compute: Annotated[float, Field(ge=0)]
    """Seconds for the local probe (a fixed matrix product on its first GPU, or on its CPU
    without one): the median of several runs."""
    joined: Annotated[float, Field(ge=0)]
    """Seconds from its pre-flight's start until it had met every other member."""


@dataclass(frozen=True, slots=True)
class Preflight(Record):
    """A member's pre-flight report: every member judges the same figures, so every report of
    one epoch names the same ``blamed`` ranks."""

    passed: bool
    """The gang passed: the member's command runs next (in the same process)."""
    blamed: tuple[Annotated[int, Field(ge=0), INTEGER], ...] = ()
    """The ranks that failed it (did not join, failed, or were much slower than the others):
    their members are replaced before the job starts."""
    why: str = ""
    """Why it failed, in one sentence ("" when it passed)."""
    backend: str = ""
    """The collectives' backend: `nccl` (GPUs) or `gloo`."""
    small_latency: Annotated[float, Field(ge=0)] | None = None
    """Seconds per all-reduce of the small buffer (median); null if not reached."""
    large_bandwidth: Annotated[float, Field(ge=0)] | None = None
    """Bus bandwidth of the large all-reduce, bytes per second (median); null if not
    reached."""
    large_bytes: Annotated[int, Field(ge=0), INTEGER] = 0
    """The large buffer's size in bytes."""
    seconds: Annotated[float, Field(ge=0)] = 0.0
    """How long the whole pre-flight took on this member."""
    ranks: tuple[RankFigures, ...] = ()
    """Every member's figures (empty when it failed before they were exchanged)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Preflight | None:  # type: ignore[override]
        """Inverse of ``to_dict``; None stays None."""
        return schema_of(cls).validate(data) if data else None

    def describe(self) -> str:
        """``passed in 2.1s (gloo): all-reduce 1 KiB 0.4 ms, 16 MiB at 1.2 GB/s; slowest
        compute rank 2 0.031s`` or ``failed in 61.0s: rank 2 did not join within 60s``."""
        if not self.passed:
            return f"failed in {self.seconds:.1f}s: {self.why}"
        parts = []
        if self.small_latency is not None:
            parts.append(f"all-reduce {self.small_latency * 1e3:.2f} ms")
        if self.large_bandwidth is not None:
            parts.append(f"{self.large_bytes / 2**20:.0f} MiB at "
                         f"{self.large_bandwidth / 1e9:.2f} GB/s")
        if self.ranks:
            slowest = max(self.ranks, key=lambda r: r.compute)
            parts.append(f"slowest compute rank {slowest.rank} {slowest.compute:.3f}s")
        figures = ": " + ", ".join(parts) if parts else ""
        return f"passed in {self.seconds:.1f}s ({self.backend or '?'}){figures}"


def parse_preflight(text: str) -> Preflight | None:
    """The report in ``text`` (a ``preflight.json``), or None if it is not one: never
    raises, bounded (``MAX_REPORT_BYTES``, ``MAX_RANKS``)."""
    if len(text) > MAX_REPORT_BYTES:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or len(data.get("ranks") or ()) > MAX_RANKS:
            return None
        return Preflight.from_dict(data)
    except (ValueError, TypeError, ValidationError):
        return None
