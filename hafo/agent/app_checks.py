"""Application checks of the instances running on this node (``checks:`` in the spec).

Each running instance whose spec lists checks gets an ``InstanceChecks`` (hafo.checks.runner)
when its process is up; it is stopped when the instance stops. The agent reports an instance
whose checks fail past their threshold as ``failing`` and the controller restarts or moves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hafo.agent.instances import GuardState, InstanceKey
from hafo.agent.ports import port_env
from hafo.checks.api import CheckContext
from hafo.checks.runner import InstanceChecks
from hafo.model.cluster import Submission
from hafo.model.names import checkpoint_dir as workload_checkpoint_dir


class AppChecks:
    """The checks of every running instance of one node."""

    def __init__(self, node: str, checkpoint_root: Path,
                 on_change: Callable[[], None] | None = None) -> None:
        self.node = node
        self.checkpoint_root = checkpoint_root
        self.on_change = on_change
        self.running: dict[InstanceKey, InstanceChecks] = {}

    def context(self, key: InstanceKey, state: GuardState, submission: Submission,
                ports: Mapping[str, int] | None = None) -> CheckContext:
        """What the probes of one instance get."""
        checkpoint_dir = workload_checkpoint_dir(self.checkpoint_root, key.workload)
        env = {**submission.spec.env, "HAFO_WORKLOAD": key.workload,
               "HAFO_EPOCH": str(key.epoch), "HAFO_NODE": self.node,
               "HAFO_CHECKPOINT_DIR": str(checkpoint_dir), **port_env(ports or {})}
        return CheckContext(workload=key.workload, node=self.node, epoch=key.epoch,
                            pid=state.pid, started_at=state.started_at,
                            checkpoint_dir=checkpoint_dir, env=env, ports=dict(ports or {}))

    def ensure(self, key: InstanceKey, state: GuardState, submission: Submission,
               ports: Mapping[str, int] | None = None) -> None:
        """Start the checks of a running instance (once)."""
        if key in self.running or not submission.spec.checks or state.pid is None:
            return
        checks = InstanceChecks(submission.spec.checks,
                                self.context(key, state, submission, ports),
                                on_change=self.on_change)
        checks.start()
        self.running[key] = checks

    async def retire(self, keep: set[InstanceKey]) -> None:
        """Stop the checks of every instance not in ``keep``."""
        for key in [k for k in self.running if k not in keep]:
            await self.running.pop(key).stop()

    def ready(self, key: InstanceKey, submission: Submission | None) -> bool:
        """Every readiness check of the running instance passes (true without checks)."""
        checks = self.running.get(key)
        if checks is None:
            return submission is not None and not submission.spec.checks
        return checks.ready

    def failing(self, key: InstanceKey) -> str | None:
        """Why the instance's checks say it failed, or None."""
        checks = self.running.get(key)
        return checks.failing if checks is not None else None

    def results(self, key: InstanceKey) -> list[dict[str, Any]]:
        """Per-check state for the API."""
        checks = self.running.get(key)
        return checks.results() if checks is not None else []

    async def close(self) -> None:
        """Stop every check."""
        await self.retire(set())
