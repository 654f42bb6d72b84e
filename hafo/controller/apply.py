"""Apply a Plan: fenced compare-and-swap transactions, batched, each decision with its event.

Actions are written ``BATCH`` to a transaction (etcd allows 128 operations per txn by
default; an action is up to three): one compare per action on its assignment's revision,
plus the leadership fence. If any compare fails (a workload's assignment moved on since the
snapshot) the batch is written again one action per txn, so only the stale decisions are
dropped; the next cycle decides those again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import structlog

from hafo.decisions.reconcile import Action, Plan
from hafo.model.cluster import Event
from hafo.store import Compare, Delete, Election, EventLog, Keys, Put, codec

log = structlog.get_logger("hafo.controller")

BATCH = 40


async def _txn_parts(keys: Keys, events: EventLog,
                     action: Action) -> tuple[Compare, list[Put | Delete]]:
    """The compare and the writes of one action."""
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
    elif action.assignment is None:
        ops.append(Delete(key))
    else:
        ops.append(Put(key, codec.encode(action.assignment.to_dict())))
    return guard, ops


def _log_applied(action: Action, revision: int) -> None:
    node = action.assignment.node if action.assignment else None
    epoch = revision if action.kind == "place" else None
    log.info(f"{action.kind}: {action.why}", workload=action.workload, node=node, epoch=epoch,
             action=action.kind)


async def apply_action(election: Election, keys: Keys, events: EventLog,
                       action: Action) -> int | None:
    """Write one action; returns the new revision (the epoch for a placement) or None if the
    assignment changed since the snapshot (the next cycle decides again)."""
    guard, ops = await _txn_parts(keys, events, action)
    result = await election.fenced([guard], ops)
    if not result.succeeded:
        log.info("decision skipped: state moved on", workload=action.workload,
                 action=action.kind)
        return None
    _log_applied(action, result.revision)
    return result.revision


async def _apply_batch(election: Election, keys: Keys, events: EventLog,
                       batch: Sequence[Action]) -> int:
    parts = [await _txn_parts(keys, events, a) for a in batch]
    result = await election.fenced([g for g, _ in parts], [op for _, ops in parts for op in ops])
    if result.succeeded:
        for action in batch:
            _log_applied(action, result.revision)
        return result.revision
    highest = 0
    for action in batch:  # some decision is stale: keep the others
        revision = await apply_action(election, keys, events, action)
        highest = max(highest, revision or 0)
    return highest


async def apply_plan(election: Election, keys: Keys, events: EventLog, plan: Plan) -> int:
    """Apply every action, in order, ``BATCH`` per transaction; returns the highest revision
    written (0 if none). A workload appears at most once in a plan."""
    highest = 0
    actions = list(plan.actions)
    for start in range(0, len(actions), BATCH):
        batch = actions[start:start + BATCH]
        if len(batch) == 1:
            highest = max(highest, await apply_action(election, keys, events, batch[0]) or 0)
        else:
            highest = max(highest, await _apply_batch(election, keys, events, batch))
    return highest
