"""The etcd key schema: every key hafo reads or writes is spelled here and nowhere else."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Keys of one cluster. State lives under ``state``; events apart, so watches skip them."""

    cluster: str

    @property
    def root(self) -> str:
        """Prefix of everything of this cluster."""
        return f"/hafo/{self.cluster}/"

    @property
    def state(self) -> str:
        """Prefix of all state the controller and the CLI read as a snapshot."""
        return f"{self.root}s/"

    @property
    def events(self) -> str:
        """Prefix of the event log."""
        return f"{self.root}events/"

    @property
    def leader(self) -> str:
        """The leader key: value is the controller's name, bound to its lease."""
        return f"{self.state}leader"

    @property
    def failsafe(self) -> str:
        """The failsafe set: controllers every agent must hear from to keep work without
        etcd (written by the leader)."""
        return f"{self.state}failsafe"

    def node(self, name: str) -> str:
        """A node's inventory and health (no lease: outlives the agent)."""
        return f"{self.state}nodes/{name}"

    def alive(self, name: str) -> str:
        """A node's liveness key, bound to its agent's lease."""
        return f"{self.state}alive/{name}"

    def cordon(self, name: str) -> str:
        """Present while an operator has cordoned the node."""
        return f"{self.state}cordon/{name}"

    def workload(self, workload_id: str) -> str:
        """A submitted workload's spec."""
        return f"{self.state}workloads/{workload_id}"

    def assignment(self, workload_id: str) -> str:
        """The controller's assignment of a workload; its mod_revision is the epoch."""
        return f"{self.state}assign/{workload_id}"

    @property
    def assignments(self) -> str:
        """Prefix of all assignments."""
        return f"{self.state}assign/"

    @property
    def by_node(self) -> str:
        """Prefix of the per-node copies of assignments (outside ``state``: the controller's
        watch does not see them). An agent watches only its own node's copies, so etcd sends
        each assignment change to one agent, not to every agent of the cluster."""
        return f"{self.root}byn/"

    def node_assignments(self, node: str) -> str:
        """Prefix of the copies of the assignments that name ``node``."""
        return f"{self.by_node}{node}/"

    def node_assignment(self, node: str, workload_id: str) -> str:
        """The copy of a workload's assignment under the node it names (written in the same
        transaction as the assignment, so its mod_revision is the same epoch)."""
        return f"{self.node_assignments(node)}{workload_id}"

    def move(self, workload_id: str) -> str:
        """An operator's pending request to move a workload (consumed by the controller)."""
        return f"{self.state}moves/{workload_id}"

    def status(self, workload_id: str, node: str) -> str:
        """An agent's report of the instance it runs, bound to that agent's lease."""
        return f"{self.state}status/{workload_id}/{node}"

    def controller(self, name: str) -> str:
        """A controller's presence, bound to its lease."""
        return f"{self.state}controllers/{name}"

    def new_event(self, now: float | None = None) -> str:
        """A fresh, time-ordered event key."""
        ts = int((now if now is not None else time.time()) * 1e9)
        return f"{self.events}{ts:020d}-{os.urandom(3).hex()}"
