"""A fault shared by many nodes is not a node fault: cluster conditions. Pure.

Some findings are about a resource, not about the node that saw it: the checkpoint
filesystem full or not writable (``disk_full``, ``disk_readonly``). With ``checkpoint.root``
on shared storage every node sees the same fault within a health interval, and treating each
as a node fault would mark every node unhealthy and stop every workload, including those that
never checkpoint. So the agent does not mark its node unhealthy for such a finding: it
reports it in its node record (``NodeRecord.resource_faults``, held like its health by
``hold``), and the leader decides here, each cycle:

- A fault (kind + resource) reported by at least ``MIN_NODES`` nodes and by more than half
  of the live nodes is a **cluster condition**: reported once (an event on set and on clear,
  the ``hafo_cluster_condition`` metric), and no node is marked unhealthy for it. Moving work
  cannot help when most nodes share the fault; only a workload that needs the resource is
  affected (its checkpoint write fails and raises, ``hafo.checkpoint``).
- A condition stays set while any node still reports the fault and for ``settle`` seconds
  after its count falls below that quorum (nodes recover one health cycle apart: the last
  ones are not drained for being the last); it clears when no node reports it.
- Any other fault is the node's own once the leader has seen it for ``settle`` seconds (the
  other nodes of a shared fault report it within that time): the node is then unhealthy, as
  before, with the fault's message as its reason. Until then the node stays schedulable.

The rule only ever keeps a node schedulable for a resource fault; it never touches leases,
liveness or any other finding: a dead node still loses its lease and its work is failed over
(docs/safety.md, rule 3), a GPU fault still drains its GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from hafo.decisions.classify import Verdict
from hafo.model import health as h
from hafo.model.cluster import ClusterSnapshot, ResourceFault

#: Finding kinds about a resource many nodes may share (the checkpoint filesystem).
SHAREABLE_KINDS = frozenset({h.DISK_FULL, h.DISK_READONLY})
MIN_NODES = 2  # a cluster condition needs at least this many nodes reporting it
SETTLE = 10.0  # seconds: a lone fault waits this long before it is the node's own

Key = tuple[str, str]  # (kind, resource)


def split_verdicts(verdicts: Iterable[Verdict], resource: str
                   ) -> tuple[tuple[Verdict, ...], tuple[ResourceFault, ...]]:
    """The agent's side: ``drain-node`` verdicts of a shareable kind become resource faults
    about ``resource`` (e.g. ``checkpoint root /ckpt``); everything else stays a verdict for
    the node's health. A kind set to a milder action by ``health.actions`` stays a verdict."""
    kept: list[Verdict] = []
    faults: dict[Key, ResourceFault] = {}
    for verdict in verdicts:
        finding = verdict.finding
        if finding.kind in SHAREABLE_KINDS and finding.gpu is None \
                and verdict.action == "drain-node":
            faults.setdefault((finding.kind, resource),
                              ResourceFault(finding.kind, resource, verdict.reason))
        else:
            kept.append(verdict)
    return tuple(kept), tuple(faults.values())


def hold(previous: Mapping[Key, tuple[ResourceFault, float]], seen: Iterable[ResourceFault],
         now: float, hold_down: float) -> dict[Key, tuple[ResourceFault, float]]:
    """The agent's hysteresis for resource faults, like its node health's: a fault seen now
    is kept (with its latest message) until ``hold_down`` seconds pass without it.
    Returns key -> (fault, last seen)."""
    held = {key: (fault, last) for key, (fault, last) in previous.items()
            if now - last < hold_down}
    for fault in seen:
        held[(fault.kind, fault.resource)] = (fault, now)
    return held


@dataclass(frozen=True)
class ClusterCondition:
    """One fault shared by most nodes: ``nodes`` report it, of ``population`` live nodes."""

    kind: str
    resource: str
    message: str
    nodes: tuple[str, ...]
    population: int
    since: float

    @property
    def key(self) -> Key:
        """(kind, resource)."""
        return (self.kind, self.resource)

    def describe(self) -> str:
        """One line, e.g. ``disk full on checkpoint root /ckpt: 4 of 4 nodes (...)``."""
        return (f"{self.kind.replace('_', ' ')} on {self.resource}: {len(self.nodes)} of "
                f"{self.population} nodes ({self.message}); a cluster condition: no node is "
                "marked unhealthy for it")


@dataclass(frozen=True)
class SharedState:
    """What the leader remembers between cycles: when it first saw each (node, fault); each
    condition set; and since when a set condition is below its quorum."""

    first_seen: Mapping[tuple[str, Key], float] = field(default_factory=dict)
    conditions: Mapping[Key, ClusterCondition] = field(default_factory=dict)
    below_since: Mapping[Key, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    """A condition set or cleared (``set`` False), for the ``cluster-condition`` event."""

    condition: ClusterCondition
    set: bool

    @property
    def message(self) -> str:
        """The event's message."""
        c = self.condition
        if self.set:
            return f"cluster condition set: {c.describe()}"
        return (f"cluster condition cleared: {c.kind.replace('_', ' ')} on {c.resource} "
                "is reported by no node now")


@dataclass(frozen=True)
class SharedOutcome:
    """One cycle: the new state, the conditions in force, the nodes the leader treats as
    unhealthy for a fault of their own (node -> reason), and what changed."""

    state: SharedState
    conditions: tuple[ClusterCondition, ...]
    node_faults: Mapping[str, str]
    changes: tuple[Change, ...]


def assess_shared(previous: SharedState, snapshot: ClusterSnapshot, now: float,
                  settle: float = SETTLE, min_nodes: int = MIN_NODES) -> SharedOutcome:
    """Classify every resource fault the live nodes report (see the module docstring)."""
    live = sorted(n for n in snapshot.alive if n in snapshot.nodes)
    reporters: dict[Key, list[str]] = {}
    messages: dict[Key, str] = {}
    for node in live:
        for fault in snapshot.nodes[node].resource_faults:
            key = (fault.kind, fault.resource)
            reporters.setdefault(key, []).append(node)
            messages.setdefault(key, fault.message)
    first_seen = {(node, key): previous.first_seen.get((node, key), now)
                  for key, nodes in reporters.items() for node in nodes}
    conditions: dict[Key, ClusterCondition] = {}
    below_since: dict[Key, float] = {}
    changes: list[Change] = []
    for key in sorted(reporters):
        nodes = tuple(reporters[key])
        quorum = len(nodes) >= min_nodes and 2 * len(nodes) > len(live)
        before = previous.conditions.get(key)
        if quorum:
            since = before.since if before is not None else now
        elif before is not None:
            below = previous.below_since.get(key, now)
            if now - below >= settle:
                changes.append(Change(before, set=False))
                continue
            below_since[key] = below
            since = before.since
        else:
            continue
        condition = ClusterCondition(key[0], key[1], messages[key], nodes, len(live), since)
        conditions[key] = condition
        if before is None:
            changes.append(Change(condition, set=True))
    for key, before in sorted(previous.conditions.items()):
        if key not in reporters:
            changes.append(Change(before, set=False))
    node_faults: dict[str, str] = {}
    for (node, key), seen in sorted(first_seen.items()):
        if key not in conditions and now - seen >= settle and node not in node_faults:
            node_faults[node] = messages_of(snapshot, node, key)
    return SharedOutcome(SharedState(first_seen, conditions, below_since),
                         tuple(conditions[k] for k in sorted(conditions)), node_faults,
                         tuple(changes))


def messages_of(snapshot: ClusterSnapshot, node: str, key: Key) -> str:
    """The node's own message for a fault (its reason once it is the node's own)."""
    for fault in snapshot.nodes[node].resource_faults:
        if (fault.kind, fault.resource) == key:
            return fault.message
    return f"{key[0].replace('_', ' ')} on {key[1]}"  # pragma: no cover - always found


def with_node_faults(snapshot: ClusterSnapshot, node_faults: Mapping[str, str]
                     ) -> ClusterSnapshot:
    """The snapshot as decisions see it: each node with a fault of its own unhealthy, with
    the fault as its reason (unless it is unhealthy already). The same snapshot if none."""
    changed = {}
    for node, reason in node_faults.items():
        record = snapshot.nodes.get(node)
        if record is not None and record.healthy:
            changed[node] = replace(record, healthy=False, reason=reason)
    if not changed:
        return snapshot
    return replace(snapshot, nodes={**snapshot.nodes, **changed})
