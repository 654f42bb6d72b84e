"""Writes made on a user's behalf (CLI, HTTP API): submit, delete, cordon, uncordon."""

from __future__ import annotations

import os
import time

from hafo.model.cluster import Event, Submission
from hafo.model.spec import WorkloadSpec
from hafo.store import codec
from hafo.store.client import Compare, EtcdStore, Put
from hafo.store.events import EventLog
from hafo.store.keys import Keys


class NotFound(Exception):
    """The named workload or node does not exist."""


def new_workload_id(spec: WorkloadSpec) -> str:
    """``<name>-<6 hex>``: readable and unique."""
    return f"{spec.name}-{os.urandom(3).hex()}"


async def submit(store: EtcdStore, keys: Keys, spec: WorkloadSpec) -> Submission:
    """Store a new workload; the controller places it."""
    while True:
        submission = Submission(id=new_workload_id(spec), spec=spec, submitted_at=time.time())
        key = keys.workload(submission.id)
        result = await store.txn([Compare(key, "create", "==", 0)],
                                 [Put(key, codec.encode_submission(submission))])
        if result.succeeded:
            await EventLog(store, keys).append(Event(
                ts=time.time(), kind="submitted", workload=submission.id,
                message=f"workload {submission.id} submitted ({spec.gpus} GPU(s))"))
            return submission


async def delete(store: EtcdStore, keys: Keys, workload_id: str) -> None:
    """Forget a workload: the controller then withdraws its assignment and it is stopped."""
    if not await store.delete(keys.workload(workload_id)):
        raise NotFound(f"no workload {workload_id!r}")
    await EventLog(store, keys).append(Event(ts=time.time(), kind="delete-requested",
                                             workload=workload_id,
                                             message=f"workload {workload_id} deleted"))


async def set_cordon(store: EtcdStore, keys: Keys, node: str, cordoned: bool) -> None:
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
