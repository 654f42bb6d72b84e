"""The output of a reconcile cycle: actions on assignments, and the needs behind them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hafo.decisions.placement import PlacementRequest
from hafo.model.cluster import Assignment

ActionKind = Literal["place", "pending", "finish", "forget", "move", "refuse-move"]
FAILED_NODE_COOLDOWN = 60.0


@dataclass(frozen=True)
class Action:
    """One change to one workload's assignment."""

    kind: ActionKind
    workload: str
    why: str
    expected_revision: int
    assignment: Assignment | None
    event: str
    clear_move: bool = False


@dataclass(frozen=True)
class Plan:
    """Everything decided in one cycle."""

    actions: tuple[Action, ...]

    def __bool__(self) -> bool:
        return bool(self.actions)


@dataclass(frozen=True)
class Need:
    """Why a workload needs a (new) placement, and with which history. ``avoid``: the
    cool-downs the new assignment keeps (None: those of the request; a planned move avoids
    its old node for this placement only)."""

    request: PlacementRequest
    previous: Assignment | None
    restarts: int
    restart_times: tuple[float, ...]
    event: str
    why: str
    avoid: Mapping[str, float] | None = None
