"""Services: keep ``replicas`` replicas of each service, replace them one at a time when its
spec changes, and replace a replica before it is drained or moved. Pure and deterministic
(docs/design.md, "Services"; docs/safety.md, "Services").

A replica is an ordinary workload of its own (id ``<service id>.<n>``, its own assignment,
epoch and fencing): it is placed, failed over and restarted like any other, on a node no
other replica of its service uses (``spec.distinct_nodes``). What this module adds is the
set: which replicas to create, which to take out of rotation (``retiring``) and which to
delete once out of rotation for ``update.drain_delay`` seconds (deleting one stops its
instance, with ``stop_grace``).

The rules, one line each in the log (``ReplicaChange.why``):

1. A retiring replica is deleted ``drain_delay`` after it left rotation (at once if it does
   not run).
2. A replacement that has been ready ``min_ready_seconds`` retires the replica it replaces;
   so does one whose old replica is not ready anyway. How long is timed from when this
   controller first saw it ready (``ready_seen``, ``hafo.decisions.observed``), never from
   its agent's ``ready_since`` (another machine's clock).
3. A replacement for an older spec that is not ready yet is retired (a newer submit, or a
   rollback, supersedes it).
4. A replica asked to move (``hafo drain``, ``hafo migrate``) gets a replacement at once.
5. Replicas of an older spec get replacements, ``max_unavailable`` at a time, while no
   replacement has been not ready for longer than ``progress_deadline`` (else the rollout
   stops there; the old replicas keep serving).
6. Fewer replicas than ``replicas``: new ones; more: the least useful retire (not ready
   first, then of an older spec, then the newest).
7. Replicas of a service that is gone, or that finished (failed or completed), are retired.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from hafo.model.cluster import ClusterSnapshot, Submission, replica_serial
from hafo.model.endpoints import instance_ready, ready_for
from hafo.model.service_state import stalled_replacements

ChangeKind = Literal["create", "retire", "delete"]

__all__ = ["ChangeKind", "ReplicaChange", "apart_from", "decide_services"]

#: An instance: (workload, node, epoch).
InstanceRef = tuple[str, str, int]


@dataclass(frozen=True, kw_only=True)
class ReplicaChange:
    """One change to a service's set of replicas: ``create`` writes ``submission`` (a new
    replica), ``retire`` rewrites it with ``retiring`` set (out of rotation), ``delete``
    removes it (its instance is then stopped) and any move request for it."""

    kind: ChangeKind
    service: str
    replica: str
    why: str
    submission: Submission | None = None


def _running(snapshot: ClusterSnapshot, wid: str) -> bool:
    assignment = snapshot.assignments.get(wid)
    return assignment is not None and assignment.holds_node


def _finished(snapshot: ClusterSnapshot, wid: str) -> bool:
    assignment = snapshot.assignments.get(wid)
    return assignment is not None and assignment.phase in ("failed", "completed")


class _Service:
    """The decisions for one service in one cycle."""

    def __init__(self, snapshot: ClusterSnapshot, service: Submission, now: float,
                 ready_seen: Mapping[InstanceRef, float]) -> None:
        self.snapshot = snapshot
        self.service = service
        self.now = now
        self.ready_seen = ready_seen
        self.spec = service.spec
        self.template = service.spec.template
        self.update = service.spec.update
        ids = snapshot.replicas.get(service.id, ())
        self.replicas = [snapshot.workloads[r] for r in ids]
        self.next_serial = max((replica_serial(r) for r in ids), default=-1) + 1
        self.changes: list[ReplicaChange] = []
        self.retired: set[str] = set()
        self.replaced_now: set[str] = set()

    # -- changes ---------------------------------------------------------------------------

    def _create(self, why: str, replaces: str | None = None) -> None:
        rid = f"{self.service.id}.{self.next_serial}"
        self.next_serial += 1
        new = Submission(id=rid, spec=self.template, submitted_at=self.now,
                         service=self.service.id, replaces=replaces)
        self.changes.append(ReplicaChange(kind="create", service=self.service.id, replica=rid,
                                          why=why, submission=new))

    def _retire(self, replica: Submission, why: str) -> None:
        if replica.id in self.retired:
            return
        self.retired.add(replica.id)
        self.changes.append(ReplicaChange(
            kind="retire", service=self.service.id, replica=replica.id, why=why,
            submission=replace(replica, retiring=self.now)))

    # -- the rules ---------------------------------------------------------------------------

    def decide(self) -> list[ReplicaChange]:
        snapshot, now = self.snapshot, self.now
        for replica in self.replicas:  # rule 1
            if replica.retiring is not None and (
                    now >= replica.retiring + self.update.drain_delay
                    or not _running(snapshot, replica.id)):
                self.changes.append(ReplicaChange(
                    kind="delete", service=self.service.id, replica=replica.id,
                    why=f"replica {replica.id} out of rotation since "
                        f"{now - replica.retiring:.1f}s: stop it"))
        active = [r for r in self.replicas if r.retiring is None]
        for replica in active:  # rule 7 (finished)
            if _finished(snapshot, replica.id):
                self._retire(replica, f"replica {replica.id} ended "
                             f"({snapshot.assignments[replica.id].phase}): replace it")
        active = [r for r in active if r.id not in self.retired]
        by_id = {r.id: r for r in active}
        replacing = {r.replaces: r for r in active
                     if r.replaces is not None and r.replaces in by_id}
        for old_id, new in sorted(replacing.items()):  # rules 2 and 3
            old = by_id[old_id]
            if ready_for(snapshot, new.id, self.update.min_ready_seconds, now,
                         self.ready_seen):
                self._retire(old, f"replica {new.id} is ready: {old.id}, which it "
                             "replaces, leaves rotation")
            elif new.spec != self.template and not instance_ready(snapshot, new.id):
                self._retire(new, f"replica {new.id} runs a superseded spec and is not "
                             "ready: withdrawn")
            elif not instance_ready(snapshot, old.id):
                self._retire(old, f"replica {old.id} is not ready: its replacement "
                             f"{new.id} takes its place")
        replaced = {old for old, new in replacing.items() if new.id not in self.retired}
        slots = [r for r in active if r.id not in self.retired and r.id not in replaced]
        self._moves(slots, replacing)
        self._rollout(slots, replacing)
        self._scale(slots)
        return self.changes

    def _moves(self, slots: list[Submission], replacing: dict[str, Submission]) -> None:
        """Rule 4."""
        for replica in slots:
            move = self.snapshot.moves.get(replica.id)
            if move is not None and replica.id not in replacing:
                self._create(f"replica {replica.id} is to move ({move.reason or 'moved'}): "
                             "its replacement starts first", replaces=replica.id)
                self.replaced_now.add(replica.id)  # one replacement, whatever follows

    def _rollout(self, slots: list[Submission],
                 replacing: dict[str, Submission]) -> None:
        """Rule 5."""
        in_flight = [new for old, new in replacing.items()
                     if new.id not in self.retired and old not in self.retired
                     and not ready_for(self.snapshot, new.id, self.update.min_ready_seconds,
                                        self.now, self.ready_seen)]
        stalled = [r for r in stalled_replacements(self.snapshot, self.service.id, self.now)
                   if r.id not in self.retired and r.replaces not in self.retired]
        if stalled:
            return  # rollout stopped (service_state says so); the old replicas serve on
        budget = self.update.max_unavailable - len(in_flight)
        outdated = [r for r in slots if r.spec != self.template and r.id not in replacing
                    and r.id not in self.replaced_now]
        outdated.sort(key=lambda r: (instance_ready(self.snapshot, r.id), replica_serial(r.id)))
        for replica in outdated[:max(budget, 0)]:
            self._create(f"rolling update: replica {replica.id} runs an older spec; its "
                         "replacement starts first", replaces=replica.id)

    def _scale(self, slots: list[Submission]) -> None:
        """Rule 6."""
        want = self.spec.replicas or 0
        if len(slots) < want:
            for _ in range(want - len(slots)):
                self._create(f"{len(slots)} of {want} replicas: one more")
        elif len(slots) > want:
            extra = sorted(slots, key=lambda r: (instance_ready(self.snapshot, r.id),
                                                 r.spec == self.template,
                                                 -replica_serial(r.id)))
            for replica in extra[:len(slots) - want]:
                self._retire(replica, f"{len(slots)} replicas for {want}: {replica.id} "
                             "leaves rotation")


def decide_services(snapshot: ClusterSnapshot, now: float,
                    ready_seen: Mapping[InstanceRef, float] | None = None) -> list[ReplicaChange]:
    """Every service's replica changes for this cycle (rules in the module docstring).
    ``ready_seen``: instance -> when this controller first saw it ready
    (``Observations.ready``); None: every ready instance seen first ``now``."""
    seen = ready_seen if ready_seen is not None else {}
    changes: list[ReplicaChange] = []
    for sid in sorted(snapshot.workloads):
        submission = snapshot.workloads[sid]
        if submission.spec.is_service and submission.service is None:
            changes += _Service(snapshot, submission, now, seen).decide()
    for sid, replicas in sorted(snapshot.replicas.items()):  # rule 7 (service gone)
        service = snapshot.workloads.get(sid)
        if service is None or not service.spec.is_service:
            for rid in replicas:
                changes.append(ReplicaChange(kind="delete", service=sid, replica=rid,
                                             why=f"service {sid} is gone: stop {rid}"))
    return changes


def apart_from(snapshot: ClusterSnapshot, replica: Submission) -> frozenset[str]:
    """The nodes a replica must not be placed on: those of the other replicas of its service
    that are not retiring (with ``spec.distinct_nodes``). The node of the replica it replaces
    is allowed when every declared port is chosen by hafo (two instances cannot then clash
    on a port), so a rolling update needs no spare node."""
    if replica.service is None or not replica.spec.distinct_nodes:
        return frozenset()
    shared_ok = all(port == 0 for port in replica.spec.ports.values())
    nodes: set[str] = set()
    for rid in snapshot.replicas.get(replica.service, ()):
        other = snapshot.workloads[rid]
        if rid == replica.id or other.retiring is not None:
            continue
        if shared_ok and rid == replica.replaces:
            continue
        assignment = snapshot.assignments.get(rid)
        if assignment is not None and assignment.holds_node:
            nodes.update(assignment.nodes)
    return frozenset(nodes)
