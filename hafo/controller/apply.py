"""Apply a Plan: fenced compare-and-swap transactions, batched, each decision with its event.

An action is one compare (on its assignment's revision; a refused move: on its move request),
one more for each node it takes work off that its snapshot saw down (that node still has no
liveness key: docs/safety.md, "An etcd stall"), and its writes: its event, the removal of
the move request it serves, the assignment's put or delete, and the per-node copies: deleted
from the nodes it named and no longer does, put under every node it names (one per gang
member). Actions are written up to ``BATCH`` and
``MAX_OPS`` writes to a transaction (etcd allows 128 operations per txn by default). The
transaction adds the leadership fence. If any compare fails (a workload's assignment moved on
since the snapshot) the batch is written again one action per txn, so only the stale
decisions are dropped; the next cycle decides those again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence

import structlog

from hafo.decisions.reconcile import Action, Plan, ReplicaChange
from hafo.model.cluster import ClusterSnapshot, Event, StandbyRecord
from hafo.store import Compare, Delete, Election, EventLog, Keys, Put, codec

log = structlog.get_logger("hafo.controller")

BATCH = 24  # decisions per transaction
MAX_OPS = 120  # writes per transaction, under etcd's default limit of 128


def _mirror_ops(keys: Keys, action: Action,
                previous_nodes: tuple[str, ...]) -> list[Put | Delete]:
    """Keep the per-node copies of the assignment (``Keys.node_assignment``) in step: written
    under every node the new assignment names (each member's, for a gang), removed from the
    nodes it named before and no longer does."""
    new = action.assignment
    new_nodes = new.copy_nodes if new is not None else ()
    ops: list[Put | Delete] = [Delete(keys.node_assignment(node, action.workload))
                               for node in previous_nodes if node not in new_nodes]
    if new is not None and new_nodes:
        value = codec.encode(new.to_dict())
        ops += [Put(keys.node_assignment(node, action.workload), value) for node in new_nodes]
    return ops


async def _txn_parts(keys: Keys, events: EventLog, action: Action,
                     previous_nodes: tuple[str, ...] = (),
                     down: Collection[str] = ()) -> tuple[list[Compare], list[Put | Delete]]:
    """The compares and the writes of one action (``previous_nodes``: the nodes the current
    assignment names, from the snapshot the action was decided on; ``down``: the nodes that
    snapshot saw without a liveness key). A decision about work on a node seen down holds
    only while that node is still without one: an agent whose lease expired in an etcd
    stall may hold its node again with a new lease and keep its work
    (``hafo.agent.claim.NodeClaim.resume``), and one of the two transactions then fails."""
    key = keys.assignment(action.workload)
    if action.expected_revision:
        guard = Compare(key, "mod", "==", action.expected_revision)
    else:
        guard = Compare(key, "create", "==", 0)
    node = action.assignment.node if action.assignment else None
    event = Event(ts=time.time(), kind=action.event, workload=action.workload, node=node,
                  message=action.why)
    ops: list[Put | Delete] = [await events.put_op(event)]
    if action.clear_move:
        ops.append(Delete(keys.move(action.workload)))
    if action.kind == "refuse-move":
        guard = Compare(keys.move(action.workload), "version", ">", 0)
    elif action.kind == "standby":
        ops += _standby_ops(keys, action, previous_nodes)
        return [guard], ops
    elif action.assignment is None:
        ops.append(Delete(key))
        ops += _mirror_ops(keys, action, previous_nodes)
        ops.append(Delete(keys.standby(action.workload)))
    else:
        ops.append(Put(key, codec.encode(action.assignment.to_dict())))
        ops += _mirror_ops(keys, action, previous_nodes)
        if action.assignment.is_gang:  # a standby record is for one assignment only
            ops.append(Delete(keys.standby(action.workload)))
    unheld = [Compare(keys.alive(node), "create", "==", 0)
              for node in previous_nodes if node in down and action.kind != "refuse-move"]
    return [guard, *unheld], ops


def _standby_ops(keys: Keys, action: Action,
                 previous_nodes: tuple[str, ...]) -> list[Put | Delete]:
    """A standby chosen for a placed gang, its assignment (so its epoch) unchanged: the
    record, a copy of the assignment naming it under the standby's node (``revision_of``:
    the revision it copies), and the copy under the node of a standby it replaces removed.
    The members' copies are not rewritten: their mod revision is their epoch."""
    assert action.assignment is not None
    new = action.assignment
    record = StandbyRecord(revision=action.expected_revision, members=new.standby)
    copy = dataclasses.replace(new, revision_of=action.expected_revision)
    ops: list[Put | Delete] = [Put(keys.standby(action.workload),
                                   codec.encode(record.to_dict()))]
    ops += [Put(keys.node_assignment(s.node, action.workload), codec.encode(copy.to_dict()))
            for s in new.standby]
    ops += [Delete(keys.node_assignment(node, action.workload)) for node in previous_nodes
            if node not in new.copy_nodes]
    return ops


def _log_applied(action: Action, revision: int) -> None:
    """The controller's one line per decision (docs/design.md, "Rules of the house"): what
    (``action``), the cause it was taken for (``cause``, as in the data: ``Cause``), why in words
    (``why``), and where."""
    node = action.assignment.node if action.assignment else None
    base = action.assignment.epoch_base if action.assignment else 0
    epoch = revision + base if action.kind == "place" else None
    log.info("decision", action=action.kind, cause=str(action.cause), why=action.why,
             workload=action.workload, node=node, epoch=epoch)


async def apply_action(election: Election, keys: Keys, events: EventLog, action: Action,
                       previous_nodes: tuple[str, ...] = (),
                       down: Collection[str] = ()) -> int | None:
    """Write one action; returns the new revision (the epoch for a placement) or None if the
    assignment changed since the snapshot (the next cycle decides again)."""
    guards, ops = await _txn_parts(keys, events, action, previous_nodes, down)
    result = await election.fenced(guards, ops)
    if not result.succeeded:
        log.info("decision skipped: state moved on", action=action.kind,
                 cause=str(action.cause), workload=action.workload)
        return None
    _log_applied(action, result.revision)
    return result.revision


async def _apply_batch(election: Election, keys: Keys, events: EventLog,
                       batch: Sequence[Action], previous: Mapping[str, tuple[str, ...]],
                       down: Collection[str]) -> int:
    parts = [await _txn_parts(keys, events, a, previous.get(a.workload, ()), down)
             for a in batch]
    result = await election.fenced([g for gs, _ in parts for g in gs],
                                   [op for _, ops in parts for op in ops])
    if result.succeeded:
        for action in batch:
            _log_applied(action, result.revision)
        return result.revision
    highest = 0
    for action in batch:  # some decision is stale: keep the others
        revision = await apply_action(election, keys, events, action,
                                      previous.get(action.workload, ()), down)
        highest = max(highest, revision or 0)
    return highest


def _ops(action: Action, previous: tuple[str, ...]) -> int:
    """An upper bound on the writes of one action."""
    new = action.assignment.copy_nodes if action.assignment is not None else ()
    return 4 + len(new) + len(previous)


def _batches(actions: Sequence[Action],
             previous: Mapping[str, tuple[str, ...]]) -> list[list[Action]]:
    """Actions in order, grouped into transactions of at most ``BATCH`` actions and
    ``MAX_OPS`` writes."""
    batches: list[list[Action]] = []
    current: list[Action] = []
    ops = 0
    for action in actions:
        cost = _ops(action, previous.get(action.workload, ()))
        if current and (len(current) >= BATCH or ops + cost > MAX_OPS):
            batches.append(current)
            current, ops = [], 0
        current.append(action)
        ops += cost
    if current:
        batches.append(current)
    return batches


def with_epoch_base(action: Action, epoch_base: int) -> Action:
    """The action with its new assignment stamped with the cluster's ``epoch_base`` (its
    epoch is then the revision that writes it plus that base: ``hafo.model.cluster``)."""
    new = action.assignment
    if new is None or new.epoch_base == epoch_base:
        return action
    return dataclasses.replace(action, assignment=dataclasses.replace(new,
                                                                      epoch_base=epoch_base))


async def apply_plan(election: Election, keys: Keys, events: EventLog, plan: Plan,
                     snapshot: ClusterSnapshot | None = None, epoch_base: int = 0) -> int:
    """Apply every action, in order, ``BATCH`` per transaction; returns the highest revision
    written (0 if none). ``snapshot``: the one the plan was decided on (for the per-node
    copies); ``epoch_base``: the cluster identity's, written into every assignment. A
    workload's assignment appears at most once in a plan."""
    plan = dataclasses.replace(plan, actions=tuple(with_epoch_base(a, epoch_base)
                                                   for a in plan.actions))
    previous: dict[str, tuple[str, ...]] = {}
    down: frozenset[str] = frozenset()
    if snapshot is not None:
        for action in plan.actions:
            current = snapshot.assignments.get(action.workload)
            previous[action.workload] = current.copy_nodes if current is not None else ()
        down = frozenset(node for nodes in previous.values() for node in nodes
                         if snapshot.node_state(node) == "down")
    highest = await apply_replica_changes(election, keys, events, plan.replicas)
    for batch in _batches(plan.actions, previous):
        if len(batch) == 1:
            revision = await apply_action(election, keys, events, batch[0],
                                          previous.get(batch[0].workload, ()), down)
            highest = max(highest, revision or 0)
        else:
            highest = max(highest, await _apply_batch(election, keys, events, batch, previous,
                                                      down))
    return highest


_REPLICA_EVENTS = {"create": "replica-created", "retire": "replica-retiring",
                   "delete": "replica-deleted"}


def _replica_ops(keys: Keys, change: ReplicaChange) -> tuple[list[Compare], list[Put | Delete]]:
    """A replica change's compare and writes: a new replica's key must not exist; a retired
    one must still exist; a deleted one takes its move request with it."""
    key = keys.workload(change.replica)
    if change.kind == "delete":
        return [], [Delete(key), Delete(keys.move(change.replica))]
    assert change.submission is not None
    value = codec.encode_submission(change.submission)
    compare = Compare(key, "create", "==", 0) if change.kind == "create" else \
        Compare(key, "version", ">", 0)
    return [compare], [Put(key, value)]


async def apply_replica_changes(election: Election, keys: Keys, events: EventLog,
                                changes: Sequence[ReplicaChange]) -> int:
    """Write the replica changes of a plan, each with its event, one transaction each (a
    stale one fails alone; the next cycle decides again). Returns the highest revision."""
    highest = 0
    for change in changes:
        compares, ops = _replica_ops(keys, change)
        event = Event(ts=time.time(), kind=_REPLICA_EVENTS[change.kind],
                      workload=change.replica, message=change.why)
        result = await election.fenced(compares, [await events.put_op(event), *ops])
        if result.succeeded:
            log.info("replica change", action=f"replica-{change.kind}", why=change.why,
                     workload=change.replica, service=change.service)
            highest = max(highest, result.revision)
        else:
            log.info("replica change skipped: state moved on", action=f"replica-{change.kind}",
                     workload=change.replica, service=change.service)
    return highest
