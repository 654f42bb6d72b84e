"""Writes made on a user's behalf (CLI, HTTP API): submit, delete, migrate, drain, cordon and
uncordon (docs/design.md, "Data flow"). Their events share the process's event lease
(``EventLog``): a write grants no lease of its own."""

from __future__ import annotations

import os
import time

from hafo.decisions.drain import workloads_to_drain
from hafo.decisions.moves import move_refusal
from hafo.model.cluster import Event, MoveRequest, Submission
from hafo.model.spec import WorkloadSpec
from hafo.store import codec
from hafo.store.client import Compare, Put
from hafo.store.events import EventLog
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.state import read_snapshot


class NotFound(Exception):
    """The named workload or node does not exist."""


def new_workload_id(spec: WorkloadSpec) -> str:
    """``<name>-<6 hex>``: readable and unique."""
    return f"{spec.name}-{os.urandom(3).hex()}"


async def submit(store: Store, keys: Keys, spec: WorkloadSpec) -> Submission:
    """Store a new workload; the controller places it."""
    while True:
        submission = Submission(id=new_workload_id(spec), spec=spec, submitted_at=time.time())
        key = keys.workload(submission.id)
        result = await store.txn([Compare(key, "create", "==", 0)],
                                 [Put(key, codec.encode_submission(submission))])
        if result.succeeded:
            await EventLog(store, keys).append(Event(
                ts=time.time(), kind="submitted", workload=submission.id,
                message=f"workload {submission.id} submitted ({spec.gpus} GPU(s)"
                + (f" on each of {spec.nodes} nodes)" if spec.is_gang else ")")))
            return submission


async def delete(store: Store, keys: Keys, workload_id: str) -> None:
    """Forget a workload: the controller then withdraws its assignment and it is stopped."""
    if not await store.delete(keys.workload(workload_id)):
        raise NotFound(f"no workload {workload_id!r}")
    await EventLog(store, keys).append(Event(ts=time.time(), kind="delete-requested",
                                             workload=workload_id,
                                             message=f"workload {workload_id} deleted"))


async def migrate(store: Store, keys: Keys, workload_id: str, to: str | None = None,
                  reason: str = "", node: str | None = None) -> None:
    """Ask for a planned move: checkpoint, stop, run elsewhere (on ``to`` if given); for a
    gang, of its member on ``node``."""
    if await store.get(keys.workload(workload_id)) is None:
        raise NotFound(f"no workload {workload_id!r}")
    for name in (to, node):
        if name is not None and await store.get(keys.node(name)) is None:
            raise NotFound(f"no node {name!r}")
    request = MoveRequest(workload_id, to, reason or (f"migrate to {to}" if to else "migrate"),
                          node=node)
    await store.put(keys.move(workload_id), codec.encode(request.to_dict()))


async def migrate_refusal(store: Store, keys: Keys, workload_id: str, to: str | None = None,
                          node: str | None = None) -> str:
    """Why the controller would refuse this planned move now ("" if it would start, or if
    the workload or a node is unknown: ``migrate`` says so)."""
    snapshot = await read_snapshot(store, keys)
    names = [n for n in (to, node) if n is not None]
    if workload_id not in snapshot.workloads or any(n not in snapshot.nodes for n in names):
        return ""
    return move_refusal(snapshot, workload_id, to, time.time(), node)


async def drain(store: Store, keys: Keys, node: str) -> list[str]:
    """Cordon ``node`` and ask for a planned move of every workload on it; returns their ids."""
    await set_cordon(store, keys, node, True)
    requests = workloads_to_drain(await read_snapshot(store, keys), node)
    for request in requests:
        await store.put(keys.move(request.workload), codec.encode(request.to_dict()))
    return [request.workload for request in requests]


async def set_cordon(store: Store, keys: Keys, node: str, cordoned: bool) -> None:
    """Cordon (no new work) or uncordon a node."""
    if await store.get(keys.node(node)) is None:
        raise NotFound(f"no node {node!r}")
    if cordoned:
        await store.put(keys.cordon(node), b"{}")
    else:
        await store.delete(keys.cordon(node))
    await EventLog(store, keys).append(Event(ts=time.time(),
                                             kind="cordoned" if cordoned else "uncordoned",
                                             node=node, message=f"node {node} "
                                             f"{'cordoned' if cordoned else 'uncordoned'}"))
