"""The agent's hardware and OS health: probes -> classification -> hysteresis -> flags.

Every ``health.interval`` seconds the GPU backend and the OS probe are polled (in threads:
NVML and statvfs may block), each finding is classified (``hafo.decisions.classify``) and
folded into the health state (``hafo.decisions.health``). The result is the inventory with
per-GPU ``healthy``/``degraded``/``reason``, the node's health and reason, and the GPUs
whose application must restart. A fault of the checkpoint filesystem (full, not writable)
does not make the node unhealthy here: it is a resource fault the node record reports, which
the leader finds to be the node's own or shared by most nodes
(``hafo.decisions.shared_faults``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from hafo.checks.os_probes import OsProbe
from hafo.decisions.classify import classify
from hafo.decisions.health import HealthState, apply_to_inventory, assess
from hafo.decisions.shared_faults import Key, hold, split_verdicts
from hafo.gpu import GpuBackend
from hafo.model.cluster import Gpu, ResourceFault
from hafo.model.health_config import HealthConfig

log = structlog.get_logger("hafo.agent")

T = TypeVar("T")
PROBE_TIMEOUT = 10.0  # a probe stuck longer (a hung NFS statvfs) is skipped this cycle


@dataclass
class HealthReport:
    """One cycle's outcome, for the agent to publish."""

    inventory: list[Gpu]
    healthy: bool
    reason: str
    restart_apps: dict[int, str] = field(default_factory=dict)
    changes: tuple[str, ...] = ()
    resource_faults: tuple[ResourceFault, ...] = ()


class NodeHealth:
    """Polls the probes and keeps the hysteresis state of one node."""

    def __init__(self, node: str, gpus: GpuBackend, os_probe: OsProbe, config: HealthConfig,
                 clock: Callable[[], float] = time.monotonic,
                 probe_timeout: float = PROBE_TIMEOUT) -> None:
        self.node = node
        self.probe_timeout = probe_timeout
        self.gpus = gpus
        self.os_probe = os_probe
        self.config = config
        self.clock = clock
        self.state = HealthState()
        self.inventory: list[Gpu] = []
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._logged: set[str] = set()
        self._faults: dict[Key, tuple[ResourceFault, float]] = {}

    async def _poll(self, name: str, probe: Callable[[], list[T]]) -> list[T]:
        """Run a blocking probe in a thread, at most one at a time per ``name``, bounded in
        time; a probe that hangs or fails yields nothing this cycle (logged)."""
        future = self._pending.get(name)
        if future is None or future.done():
            future = asyncio.ensure_future(asyncio.to_thread(probe))
            self._pending[name] = future
        try:
            return list(await asyncio.wait_for(asyncio.shield(future), self.probe_timeout))
        except TimeoutError:
            log.warning("health probe still running; skipped this cycle", node=self.node,
                        probe=name)
            return []
        except Exception as exc:  # a broken probe must not stop the agent
            log.warning("health probe failed", node=self.node, probe=name, error=str(exc))
            return []

    async def cycle(self) -> HealthReport:
        """Poll once and fold the findings in."""
        inventory = await self._poll("inventory", self.gpus.inventory)
        if inventory:  # re-read every cycle: utilization changes (rounded to 10 %)
            self.inventory = inventory
        findings = [*await self._poll("gpu", self.gpus.findings),
                    *await self._poll("os", self.os_probe.findings)]
        verdicts, seen = split_verdicts((classify(f, self.config) for f in findings),
                                        f"checkpoint root {self.os_probe.checkpoint_root}")
        for verdict in verdicts:
            if verdict.action == "ignore" and verdict.reason not in self._logged:
                self._logged.add(verdict.reason)
                log.info("health finding ignored", node=self.node, finding=verdict.reason)
        now = self.clock()
        outcome = assess(self.state, verdicts, [g.index for g in self.inventory],
                         now, self.config.hold_down)
        self.state = outcome.state
        node = outcome.state.node
        before, self._faults = self._faults, hold(self._faults, seen, now,
                                                  self.config.hold_down)
        changes = [*outcome.changes,
                   *(f"{fault.resource}: {fault.message} (reported to the controller)"
                     for key, (fault, _) in sorted(self._faults.items()) if key not in before),
                   *(f"{fault.resource}: {fault.kind.replace('_', ' ')} cleared"
                     for key, (fault, _) in sorted(before.items()) if key not in self._faults)]
        return HealthReport(inventory=apply_to_inventory(self.inventory, outcome.state),
                            healthy=node.level == "ok", reason=node.reason,
                            restart_apps=dict(outcome.restart_apps), changes=tuple(changes),
                            resource_faults=tuple(f for _, (f, _) in
                                                  sorted(self._faults.items())))
