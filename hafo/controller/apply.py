"""Apply a Plan: each action is one fenced compare-and-swap txn with its event."""

from __future__ import annotations

import time

import structlog

from hafo.decisions.reconcile import Action, Plan
from hafo.model.cluster import Event
from hafo.store import Compare, Delete, Election, EventLog, Keys, Put, codec

log = structlog.get_logger("hafo.controller")


async def apply_action(election: Election, keys: Keys, events: EventLog,
                       action: Action) -> int | None:
    """Write one action; returns the new revision (the epoch for a placement) or None if the
    assignment changed since the snapshot (the next cycle decides again)."""
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
    result = await election.fenced([guard], ops)
    if not result.succeeded:
        log.info("decision skipped: state moved on", workload=action.workload,
                 action=action.kind)
        return None
    epoch = result.revision if action.kind == "place" else None
    log.info(f"{action.kind}: {action.why}", workload=action.workload, node=node, epoch=epoch,
             action=action.kind)
    return result.revision


async def apply_plan(election: Election, keys: Keys, events: EventLog, plan: Plan) -> int:
    """Apply every action in order; returns the highest revision written (0 if none)."""
    highest = 0
    for action in plan.actions:
        revision = await apply_action(election, keys, events, action)
        if revision:
            highest = max(highest, revision)
    return highest
