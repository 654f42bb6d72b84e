"""GPU and node health from classified findings, with hysteresis. Pure.

Each health cycle the agent classifies its findings (``hafo.decisions.classify``) and calls
``assess``. A GPU or the node gets worse at once; it gets better only after ``hold_down``
seconds without a finding at its current level (a fault that flaps keeps it down). A GPU
whose fault persists (a volatile ECC count, a lost GPU) therefore stays down until it is
reset. ``restart-app`` verdicts do not change health: they name GPUs whose application must
restart, and ``assess`` returns them separately.

Findings name physical GPUs. A GPU in MIG mode is listed as its MIG devices (see
``hafo.model.cluster.mig_index``): its condition is kept under its physical index and applies
to each of its MIG devices, and a ``restart-app`` verdict for it names each of them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from hafo.decisions.classify import Verdict
from hafo.model import health as h
from hafo.model.cluster import Gpu, physical_of

Level = Literal["ok", "degraded", "unhealthy"]
_RANK: Mapping[Level, int] = {"ok": 0, "degraded": 1, "unhealthy": 2}


@dataclass(frozen=True)
class Condition:
    """The health of one GPU or of the node. ``since``: when the level was entered;
    ``last_seen``: the last finding at this level (the hold-down counts from it)."""

    level: Level = "ok"
    reason: str = ""
    since: float = 0.0
    last_seen: float = 0.0
    lost: bool = False


@dataclass(frozen=True)
class HealthState:
    """Everything the hysteresis remembers between cycles."""

    gpus: Mapping[int, Condition] = field(default_factory=dict)
    node: Condition = Condition()


@dataclass(frozen=True)
class Assessment:
    """The outcome of one cycle."""

    state: HealthState
    restart_apps: Mapping[int, str]  # GPU index -> why its application must restart
    changes: tuple[str, ...]         # human lines for what changed (for the log and events)


def physical_index(gpu: Gpu) -> int:
    """The physical GPU a listed GPU is (a whole GPU) or is part of (a MIG device): the index
    health findings use."""
    return gpu.physical


def _level_of(verdict: Verdict) -> Level:
    if verdict.action in ("drain-gpu", "drain-node"):
        return "unhealthy"
    if verdict.action == "degraded":
        return "degraded"
    return "ok"


def _step(previous: Condition, level: Level, reason: str, lost: bool, now: float,
          hold_down: float) -> Condition:
    if level != "ok" and _RANK[level] >= _RANK[previous.level]:
        since = previous.since if level == previous.level else now
        return Condition(level, reason, since, now, lost or (previous.lost and level ==
                                                             previous.level))
    if previous.level == "ok" or now - previous.last_seen < hold_down:
        return previous  # better now, but the hold-down has not passed
    if level == "ok":
        return Condition()
    return Condition(level, reason, now, now, lost)


def assess(previous: HealthState, verdicts: Iterable[Verdict], gpu_indices: Iterable[int],
           now: float, hold_down: float) -> Assessment:
    """Fold one cycle's verdicts into the health state."""
    worst_gpu: dict[int, tuple[Level, str, bool]] = {}
    worst_node: tuple[Level, str] = ("ok", "")
    restart_apps: dict[int, str] = {}
    for verdict in verdicts:
        gpu, level = verdict.finding.gpu, _level_of(verdict)
        lost = verdict.finding.kind == h.LOST or (verdict.finding.kind == h.XID
                                                  and verdict.finding.code == 79)
        if verdict.action == "restart-app" and gpu is not None:
            restart_apps.setdefault(gpu, verdict.reason)
        if gpu is not None and level != "ok":
            current = worst_gpu.get(gpu, ("ok", "", False))
            if _RANK[level] > _RANK[current[0]]:
                worst_gpu[gpu] = (level, verdict.reason, lost or current[2])
            elif lost:
                worst_gpu[gpu] = (current[0], current[1], True)
        if verdict.action == "drain-node" and worst_node[0] == "ok":
            worst_node = ("unhealthy", verdict.reason)
    listed = set(gpu_indices)
    for index in listed:
        physical = physical_of(index)
        if index != physical and physical in restart_apps:
            restart_apps.setdefault(index, restart_apps[physical])
    gpus: dict[int, Condition] = {}
    changes: list[str] = []
    for index in sorted({physical_of(i) for i in listed}):
        before = previous.gpus.get(index, Condition())
        level, reason, lost = worst_gpu.get(index, ("ok", "", False))
        after = _step(before, level, reason, lost, now, hold_down)
        gpus[index] = after
        if after.level != before.level:
            changes.append(f"GPU {index}: {before.level} -> {after.level}"
                           + (f" ({after.reason})" if after.reason else ""))
    node = _step(previous.node, worst_node[0], worst_node[1], False, now, hold_down)
    if node.level != previous.node.level:
        changes.append(f"node: {previous.node.level} -> {node.level}"
                       + (f" ({node.reason})" if node.reason else ""))
    return Assessment(HealthState(gpus, node), restart_apps, tuple(changes))


def apply_to_inventory(inventory: Iterable[Gpu], state: HealthState) -> list[Gpu]:
    """The inventory with each GPU's health flags set from ``state`` (a MIG device gets its
    physical GPU's)."""
    out = []
    for gpu in inventory:
        cond = state.gpus.get(physical_index(gpu), Condition())
        out.append(replace(gpu, healthy=cond.level != "unhealthy", reason=cond.reason,
                           degraded=cond.level == "degraded", lost=cond.lost))
    return out
