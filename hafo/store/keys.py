"""The etcd key schema: every key of a cluster is built here, and taken apart here
(``Keys.parse``) (docs/reference/etcd.md, "etcd keys").

Outside this module only the root prefix ``/hafo/`` is spelled: in the probe key of
``EtcdStore.revision`` (``hafo/store/client.py``) and in the etcd role granted to hafo
(``hafo/local/etcd.py``, ``ansible/roles/etcd``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, NamedTuple

#: What a key is. ``node-assignment`` is the per-node copy of an assignment
#: (``Keys.node_assignment``); ``unknown`` is any key that is not one of this cluster's.
KeyKind = Literal["leader", "failsafe", "node", "alive", "cordon", "workload", "assignment",
                  "node-assignment", "move", "status", "controller", "event", "history",
                  "identity", "api-auth", "report", "queue", "fair-share", "names-indexed",
                  "standby", "unknown"]


class ParsedKey(NamedTuple):
    """A key taken apart (``Keys.parse``): its kind and the names in it. ``node`` and
    ``workload`` are set for the kinds whose key names them; ``name`` is a controller's name
    or an event's id or a queue's name. (A named tuple: watches parse every key they see.)"""

    kind: KeyKind
    node: str | None = None
    workload: str | None = None
    name: str | None = None


UNKNOWN = ParsedKey("unknown")

# Keys of the state prefix with no name in them: the key less that prefix -> what it is.
_SINGLE: dict[str, ParsedKey] = {"leader": ParsedKey("leader"), "failsafe": ParsedKey("failsafe")}

# Kinds under the state prefix named by one path segment: the segment -> (kind, part).
_NAMED: dict[str, tuple[KeyKind, Literal["node", "workload", "name"]]] = {
    "nodes": ("node", "node"),
    "alive": ("alive", "node"),
    "cordon": ("cordon", "node"),
    "workloads": ("workload", "workload"),
    "assign": ("assignment", "workload"),
    "moves": ("move", "workload"),
    "controllers": ("controller", "name"),
    "queues": ("queue", "name"),
    "standby": ("standby", "workload"),
}
# Of those named by ``name``: the kinds whose name is free-form (the whole rest of the key).
_FREE_FORM = frozenset({"controller"})


@dataclass(frozen=True)
class Keys:
    """Keys of one cluster. State lives under ``state``; events apart, so watches skip them."""

    cluster: str

    @cached_property
    def root(self) -> str:
        """Prefix of everything of this cluster."""
        return f"/hafo/{self.cluster}/"

    @cached_property
    def state(self) -> str:
        """Prefix of all state the controller and the CLI read as a snapshot."""
        return f"{self.root}s/"

    @property
    def events(self) -> str:
        """Prefix of the event log."""
        return f"{self.root}events/"

    @property
    def identity(self) -> str:
        """The cluster's identity record (``hafo.store.identity``): which store this is. Apart
        from the state prefix: it is read on its own, never as part of a snapshot."""
        return f"{self.root}identity"

    @property
    def api_auth(self) -> str:
        """The API auth settings the cluster's controllers run with (``hafo.store.api_auth``):
        written by the first controller to find none; no token in it, a slow hash."""
        return f"{self.root}api-auth"

    @property
    def fair_share(self) -> str:
        """The queues' decayed usage history (``fair_sharing.usage_half_life``;
        ``hafo.store.fair_share``), written by the leader at most every few seconds so that
        a new leader goes on from it. Apart from the state prefix: no watch reads it."""
        return f"{self.root}fair-share"

    @property
    def names_indexed(self) -> str:
        """Present once every workload (not a replica) is the one its name key names
        (``hafo.store.name_index``): a submit of a new name then needs no scan for a
        workload without its name key. Written by the leader; deleted by a restore or a
        recovery, which may write workloads without their name keys."""
        return f"{self.root}names-indexed"

    def report(self, node: str) -> str:
        """A node's recovery report (``hafo.agent.recovery_report``): what its agent runs,
        published while the store is not the cluster it knew, for ``hafo recover
        --from-agents``. No lease (the store's leases are not the agent's); outside the state
        prefix: no decision reads it."""
        return f"{self.reports}{node}"

    @property
    def reports(self) -> str:
        """Prefix of the nodes' recovery reports."""
        return f"{self.root}reports/"

    @property
    def controllers(self) -> str:
        """Prefix of the controllers' presence keys."""
        return f"{self.state}controllers/"

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

    @property
    def workloads(self) -> str:
        """Prefix of all submitted workloads (and replicas)."""
        return f"{self.state}workloads/"

    def name(self, name: str) -> str:
        """Which workload id holds a name (outside ``state``: written by submit, so that two
        submits of one name can never both create a workload)."""
        return f"{self.root}names/{name}"

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

    def standby(self, workload_id: str) -> str:
        """A warm gang's standby chosen after its placement (``StandbyRecord``), written by
        the leader with a copy of the assignment under the standby's node; deleted with the
        gang's next assignment write."""
        return f"{self.state}standby/{workload_id}"

    def move(self, workload_id: str) -> str:
        """An operator's pending request to move a workload (consumed by the controller)."""
        return f"{self.state}moves/{workload_id}"

    def status(self, workload_id: str, node: str) -> str:
        """An agent's report of the instance it runs, bound to that agent's lease."""
        return f"{self.state}status/{workload_id}/{node}"

    def controller(self, name: str) -> str:
        """A controller's presence, bound to its lease."""
        return f"{self.state}controllers/{name}"

    def queue(self, name: str) -> str:
        """A declared queue (``hafo.model.queues.QueueSpec``'s JSON), written by ``hafo queue
        set`` and ``PUT /v1/queues/{name}``; under ``state``: the controllers' watched
        snapshot holds every queue (``ClusterSnapshot.queues``)."""
        return f"{self.state}queues/{name}"

    @property
    def queues(self) -> str:
        """Prefix of all declared queues."""
        return f"{self.state}queues/"

    def history(self, workload_id: str) -> str:
        """A workload's history of epochs (written by the leader when an epoch is placed,
        starts, is stopped or ends; outside ``state``: the controllers' watch and the CLI's
        snapshot skip it)."""
        return f"{self.histories}{workload_id}"

    @property
    def histories(self) -> str:
        """Prefix of the workloads' histories."""
        return f"{self.root}history/"

    def new_event(self, now: float | None = None) -> str:
        """A fresh, time-ordered event key."""
        ts = int((now if now is not None else time.time()) * 1e9)
        return f"{self.events}{ts:020d}-{os.urandom(3).hex()}"

    def parse(self, key: str) -> ParsedKey:
        """What ``key`` is, and the names in it: the inverse of the builders above.
        ``UNKNOWN`` for a key that is not one of this cluster's (another cluster's, a prefix,
        an empty or extra path segment). Node names, workload ids and queue names never
        contain '/'; a controller's name is free-form: the whole rest of its key."""
        root = self.root
        if not key.startswith(root):
            return UNKNOWN
        parts = key[len(root):].split("/")
        if "" in parts:
            return UNKNOWN
        area, count = parts[0], len(parts)
        if area == "s" and count >= 2:
            if count == 2:
                return _SINGLE.get(parts[1], UNKNOWN)
            if parts[1] == "status":
                if count != 4:
                    return UNKNOWN
                return ParsedKey("status", node=parts[3], workload=parts[2])
            named = _NAMED.get(parts[1])
            if named is None:
                return UNKNOWN
            kind, part = named
            if kind in _FREE_FORM:
                return ParsedKey(kind, name="/".join(parts[2:]))
            if count != 3:
                return UNKNOWN
            if part == "name":
                return ParsedKey(kind, name=parts[2])
            if part == "node":
                return ParsedKey(kind, node=parts[2])
            return ParsedKey(kind, workload=parts[2])
        if area == "byn" and count == 3:
            return ParsedKey("node-assignment", node=parts[1], workload=parts[2])
        if area == "history" and count == 2:
            return ParsedKey("history", workload=parts[1])
        if area == "reports" and count == 2:
            return ParsedKey("report", node=parts[1])
        if area == "identity" and count == 1:
            return ParsedKey("identity")
        if area == "api-auth" and count == 1:
            return ParsedKey("api-auth")
        if area == "fair-share" and count == 1:
            return ParsedKey("fair-share")
        if area == "names-indexed" and count == 1:
            return ParsedKey("names-indexed")
        if area == "events" and count == 2:
            return ParsedKey("event", name=parts[1])
        return UNKNOWN
