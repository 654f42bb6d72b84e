"""Writes made on a user's behalf (CLI, HTTP API): submit, delete, migrate, drain, cordon,
uncordon, removing a node, and declaring or deleting a queue (docs/design.md, "Data flow").
Their events share the process's event lease (``EventLog``): a write grants no lease of its
own."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Literal

from hafo.decisions.drain import workloads_to_drain
from hafo.decisions.moves import MoveRefusal, requested_move_refusal
from hafo.decisions.removal import RemovalRefusal, removal_refusal
from hafo.model.cluster import ClusterSnapshot, Event, MoveRequest, Submission
from hafo.model.endpoints import resolve
from hafo.model.queues import DEFAULT_QUEUE, QueueSpec
from hafo.model.spec import WorkloadSpec
from hafo.store import codec
from hafo.store.client import Compare, Delete, Put
from hafo.store.events import EventLog
from hafo.store.keys import Keys
from hafo.store.name_index import is_indexed, workload_name
from hafo.store.protocol import Store
from hafo.store.state import read_snapshot


class NotFound(Exception):
    """The named workload, node or queue does not exist."""


class Refused(Exception):
    """The intent cannot be done as asked, in the current state (the message names the
    field; ``field``: that field, where there is one, for the API's error body)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


Change = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Submitted:
    """What a submit did: ``created`` a workload, ``updated`` the one of that name (a rolling
    update of a service's replicas, a planned move of any other workload), or nothing
    (``unchanged``: the same spec)."""

    submission: Submission
    change: Change
    how: str = ""


def new_workload_id(spec: WorkloadSpec) -> str:
    """``<name>-<6 hex>``: readable and unique."""
    return f"{spec.name}-{os.urandom(3).hex()}"


async def _named(store: Store, keys: Keys, name: str) -> tuple[Submission | None, int, int]:
    """The workload (not a replica) named ``name``: (it or None, its key's mod revision, the
    name key's mod revision (0: none)). A workload without its name key (from before names
    were unique, restored, or recovered) is found by its spec's name (the oldest, if
    several), reading every workload, unless the name index says there is none
    (``hafo.store.name_index``)."""
    name_kv = await store.get(keys.name(name))
    name_rev = name_kv.mod_revision if name_kv is not None else 0
    if name_kv is not None:
        kv = await store.get(keys.workload(name_kv.value.decode()))
        if kv is not None:
            return codec.decode_submission(kv.value), kv.mod_revision, name_rev
    if await is_indexed(store, keys):
        return None, 0, name_rev
    _, kvs = await store.get_prefix(keys.workloads)
    named = [kv for kv in kvs if workload_name(codec.decode(kv.value)) == name]  # JSON: cheap
    found = sorted(((codec.decode_submission(kv.value), kv.mod_revision) for kv in named),
                   key=lambda pair: (pair[0].submitted_at, pair[0].id))
    return (found[0][0], found[0][1], name_rev) if found else (None, 0, name_rev)


def _update_refusal(current: Submission, spec: WorkloadSpec) -> str:
    """Why ``current`` cannot become ``spec`` in place ("" if it can)."""
    if current.spec.is_service != spec.is_service:
        have = "a service (replicas)" if current.spec.is_service else "a single workload"
        return (f"spec.replicas: {current.id} ({spec.name!r}) is {have}; delete it before "
                f"submitting it as {'a service' if spec.is_service else 'a single workload'}")
    return ""


async def submit(store: Store, keys: Keys, spec: WorkloadSpec) -> Submitted:
    """Create the workload named ``spec.name``, or update the one of that name (names are
    identities, docs/reference/workloads.md, "Submit is declarative"). Refused: a change of
    kind, or a queue that is not declared while any is (``queue_guard``)."""
    while True:
        guard = await queue_guard(store, keys, spec.queue)
        current, current_rev, name_rev = await _named(store, keys, spec.name)
        if current is None:
            created = await _create(store, keys, spec, name_rev, guard)
            if created is not None:
                return Submitted(created, "created")
            continue
        if current.spec == spec:
            return Submitted(current, "unchanged", "the same spec: nothing to do")
        refusal = _update_refusal(current, spec)
        if refusal:
            raise Refused(refusal, field="spec.replicas")
        if replace(current.spec, queue=spec.queue) == spec:
            updated = await _requeue(store, keys, current, current_rev, spec, guard)
        else:
            updated = await _update(store, keys, current, current_rev, spec, guard)
        if updated is not None:
            return updated


async def queue_guard(store: Store, keys: Keys, queue: str) -> list[Compare]:
    """The compare that keeps a submit to ``queue`` from landing after the queue is deleted
    (none while no queue is declared: then any queue name is accepted, as before queues).
    Refused, naming ``spec.queue`` and the declared queues, when ``queue`` is not one of
    them."""
    _, kvs = await store.get_prefix(keys.queues)
    declared = {parsed.name: kv for kv in kvs
                if (parsed := keys.parse(kv.key)).kind == "queue" and parsed.name}
    if not declared:
        return []
    kv = declared.get(queue)
    if kv is None:
        names = ", ".join(sorted(str(name) for name in declared))
        hint = (" (a spec without `queue` is in queue 'default', which is not declared "
                "here: name one of those, or declare 'default')" if queue == DEFAULT_QUEUE
                else "")
        raise Refused(f"spec.queue: no queue {queue!r} is declared (queues: {names}){hint}",
                      field="spec.queue")
    return [Compare(kv.key, "mod", "==", kv.mod_revision)]


async def _create(store: Store, keys: Keys, spec: WorkloadSpec, name_rev: int,
                  guard: list[Compare]) -> Submission | None:
    """Write the new workload, its name and its ``submitted`` event in one transaction (the
    event stamped before it: the controller's ``pending`` or ``placed`` sorts after it)."""
    submission = Submission(id=new_workload_id(spec), spec=spec, submitted_at=time.time())
    key, name_key = keys.workload(submission.id), keys.name(spec.name)
    name_guard = (Compare(name_key, "mod", "==", name_rev) if name_rev
                  else Compare(name_key, "create", "==", 0))
    what = (f"{spec.replicas} replica(s) of " if spec.is_service else "") + f"{spec.gpus} GPU(s)"
    event = Event(ts=submission.submitted_at, kind="submitted", workload=submission.id,
                  message=f"workload {submission.id} submitted ({what}"
                  + (f" on each of {spec.nodes} nodes)" if spec.is_gang else ")"))
    result = await EventLog(store, keys).txn(
        [Compare(key, "create", "==", 0), name_guard, *guard],
        [Put(key, codec.encode_submission(submission)), Put(name_key, submission.id.encode())],
        event)
    if not result.succeeded:
        return None  # another submit of this name (or the same id) won: look again
    return submission


async def _requeue(store: Store, keys: Keys, current: Submission, current_rev: int,
                   spec: WorkloadSpec, guard: list[Compare]) -> Submitted | None:
    """Only the queue changed: the new spec is written (a service's replicas' specs too, in
    the same transaction, so no replica is outdated and none is replaced) and nothing
    restarts: the queue is an admission matter, the running instances run on, counted in the
    new queue from now on."""
    updated = Submission(id=current.id, spec=spec, submitted_at=current.submitted_at)
    key = keys.workload(current.id)
    compares = [Compare(key, "mod", "==", current_rev), *guard]
    ops: list[Put | Delete] = [Put(key, codec.encode_submission(updated))]
    if spec.is_service:
        _, replicas = await store.get_prefix(keys.workload(f"{current.id}."))
        for kv in replicas:
            replica = codec.decode_submission(kv.value)
            moved = replace(replica, spec=replace(replica.spec, queue=spec.queue))
            compares.append(Compare(kv.key, "mod", "==", kv.mod_revision))
            ops.append(Put(kv.key, codec.encode_submission(moved)))
    how = (f"queue {current.spec.queue!r} -> {spec.queue!r}: nothing restarts (the queue "
           "decides admission; what runs runs on, counted in the new queue)")
    event = Event(ts=time.time(), kind="updated", workload=current.id,
                  message=f"workload {current.id} updated: {how}")
    result = await EventLog(store, keys).txn(compares, ops, event)
    if not result.succeeded:
        return None
    return Submitted(updated, "updated", how)


async def _update(store: Store, keys: Keys, current: Submission, current_rev: int,
                  spec: WorkloadSpec, guard: list[Compare]) -> Submitted | None:
    """Write the new spec (compare: the workload is as read). A service's controller rolls it
    out (``hafo.decisions.services``); any other workload that runs gets a planned move, so
    its next instance runs the new spec."""
    updated = Submission(id=current.id, spec=spec, submitted_at=current.submitted_at)
    key = keys.workload(current.id)
    ops: list[Put | Delete] = [Put(key, codec.encode_submission(updated)),
                               Put(keys.name(spec.name), current.id.encode())]
    if spec.is_service:
        how = (f"rolling update of the replicas, {spec.update.max_unavailable} at a time"
               if spec.template != current.spec.template else
               f"scaled to {spec.replicas} replica(s)" if spec.replicas != current.spec.replicas
               else "update policy changed")
    else:
        kv = await store.get(keys.assignment(current.id))
        assignment = codec.decode_assignment(kv.value, kv.mod_revision) if kv else None
        if assignment is not None and assignment.phase == "placed":
            request = MoveRequest(current.id, None, "update to the new spec", restart=True)
            ops.append(Put(keys.move(current.id), codec.encode(request.to_dict())))
            how = "planned move: checkpoint, stop, start with the new spec"
        elif assignment is not None and assignment.ended:
            how = (f"the new spec is stored; the workload {assignment.phase} and does not "
                   "start again (delete it, then submit, to run it anew)")
        else:
            how = "the new spec applies to its next start"
    event = Event(ts=time.time(), kind="updated", workload=current.id,
                  message=f"workload {current.id} updated: {how}")
    result = await EventLog(store, keys).txn([Compare(key, "mod", "==", current_rev), *guard],
                                             ops, event)  # before what the controller does next
    if not result.succeeded:
        return None
    return Submitted(updated, "updated", how)


async def resolve_ref(store: Store, keys: Keys, ref: str,
                      snapshot: ClusterSnapshot | None = None) -> str:
    """The workload id of ``ref`` (an id or a name); NotFound says why not."""
    wid, why = resolve(snapshot or await read_snapshot(store, keys), ref)
    if wid is None:
        raise NotFound(why)
    return wid


async def delete(store: Store, keys: Keys, workload_id: str) -> None:
    """Forget a workload (a service: with its replicas, in one transaction): the controller
    then withdraws their assignments and they are stopped."""
    kv = await store.get(keys.workload(workload_id))
    if kv is None:
        raise NotFound(f"no workload {workload_id!r}")
    submission = codec.decode_submission(kv.value)
    ops: list[Put | Delete] = [Delete(keys.workload(workload_id))]
    if submission.spec.is_service:  # its replicas are the keys <id>.<n>
        _, replicas = await store.get_prefix(keys.workload(f"{workload_id}."))
        ops += [Delete(kv.key) for kv in replicas]
    name_key = keys.name(submission.spec.name)
    name_kv = await store.get(name_key)
    if submission.service is None and name_kv is not None \
            and name_kv.value.decode() == workload_id:
        ops.append(Delete(name_key))
    result = await store.txn([Compare(keys.workload(workload_id), "mod", "==", kv.mod_revision)],
                             ops)
    if not result.succeeded:
        raise NotFound(f"workload {workload_id!r} changed meanwhile: try again")
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
                          node: str | None = None,
                          snapshot: ClusterSnapshot | None = None) -> MoveRefusal | None:
    """Why this planned move is not asked for (None: it would start), by the rule the API
    applies too (``hafo.decisions.moves.requested_move_refusal``). ``snapshot``: one just
    read."""
    snapshot = snapshot or await read_snapshot(store, keys)
    return requested_move_refusal(snapshot, workload_id, to, node, time.time())


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


class RemovalRefused(Refused):
    """A node cannot be removed now (``refusal`` says why: busy, or its agent is alive)."""

    def __init__(self, refusal: RemovalRefusal) -> None:
        super().__init__(refusal.message, field="name")
        self.refusal = refusal


async def remove_node(store: Store, keys: Keys, node: str) -> None:
    """Retire ``node``: delete, in one transaction, its record, its cordon, its per-node
    assignment copies, the instance reports that name it and its recovery report, with a
    ``node-removed`` event; the workloads' histories stay. Guarded: its agent still has no
    liveness key and its record is as read (a down node takes no new work, so none lands
    on it meanwhile). NotFound: no such node; RemovalRefused: an assignment holds it, or its
    agent is alive (``hafo.decisions.removal``)."""
    for _attempt in range(10):
        snapshot = await read_snapshot(store, keys)
        refusal = removal_refusal(snapshot, node)
        if refusal is not None:
            if refusal.kind == "unknown":
                raise NotFound(refusal.message)
            raise RemovalRefused(refusal)
        record = await store.get(keys.node(node))
        compares = [Compare(keys.alive(node), "create", "==", 0)]
        compares.append(Compare(keys.node(node), "mod", "==", record.mod_revision)
                        if record is not None else Compare(keys.node(node), "create", "==", 0))
        ops: list[Put | Delete] = [Delete(keys.node(node)), Delete(keys.cordon(node)),
                                   Delete(keys.node_assignments(node), prefix=True),
                                   Delete(keys.report(node))]
        ops += [Delete(keys.status(wid, name)) for wid, name in sorted(snapshot.statuses)
                if name == node]
        event = Event(ts=time.time(), kind="node-removed", node=node,
                      message=f"node {node} removed: its record, cordon and reports are "
                      "gone; an agent of that name registers as a new node")
        result = await EventLog(store, keys).txn(compares, ops, event)
        if result.succeeded:
            return
    raise Refused(f"node {node} kept changing while it was being removed: try again",
                  field="name")


# --- queues ----------------------------------------------------------------------------------

async def set_queue(store: Store, keys: Keys, spec: QueueSpec) -> Change:
    """Declare the queue ``spec.name`` (``created``), or replace its declaration
    (``updated``; ``unchanged`` for the same one). The quota decision reads it from the
    controllers' snapshot (``ClusterSnapshot.queues``)."""
    key, value = keys.queue(spec.name), codec.encode_queue(spec)
    while True:
        kv = await store.get(key)
        if kv is not None and _same_queue(kv.value, spec):
            return "unchanged"
        change: Change = "created" if kv is None else "updated"
        guard = (Compare(key, "create", "==", 0) if kv is None
                 else Compare(key, "mod", "==", kv.mod_revision))
        event = Event(ts=time.time(), kind="queue-set",
                      message=f"queue {spec.name} {change}: {_quota_text(spec)}")
        result = await EventLog(store, keys).txn([guard], [Put(key, value)], event)
        if result.succeeded:
            return change


def _same_queue(value: bytes, spec: QueueSpec) -> bool:
    """Whether a stored value declares ``spec`` (one that does not decode: no)."""
    try:
        return codec.decode_queue(value) == spec
    except ValueError:
        return False


def _quota_text(spec: QueueSpec) -> str:
    """A queue's quota in words, for its event."""
    text = f"{spec.gpus} GPU(s)"
    if spec.models:
        text += " (" + ", ".join(f"{glob}: {n}" for glob, n in spec.models.items()) + ")"
    if spec.cohort is not None:
        text += f", cohort {spec.cohort}"
        if spec.borrowing_limit is not None:
            text += f", borrows at most {spec.borrowing_limit}"
        if spec.lending_limit is not None:
            text += f", lends at most {spec.lending_limit}"
    if spec.weight != 1.0:
        text += f", weight {spec.weight:g}"
    return text


async def queue_users(store: Store, keys: Keys, name: str) -> list[str]:
    """The ids of the workloads (not replicas: a service counts once) whose spec names the
    queue ``name``, sorted."""
    _, kvs = await store.get_prefix(keys.workloads)
    users = []
    for kv in kvs:
        record = codec.decode(kv.value)  # JSON only: cheap
        if not isinstance(record, dict) or record.get("service") is not None:
            continue
        spec = record.get("spec")
        if isinstance(spec, dict) and spec.get("queue", DEFAULT_QUEUE) == name:
            users.append(str(record.get("id", kv.key.rsplit("/", 1)[-1])))
    return sorted(users)


async def delete_queue(store: Store, keys: Keys, name: str) -> None:
    """Forget the queue ``name``. NotFound: no such queue; Refused: workloads still name it
    (how many, and one of them)."""
    key = keys.queue(name)
    while True:
        kv = await store.get(key)
        if kv is None:
            raise NotFound(f"no queue {name!r}")
        users = await queue_users(store, keys, name)
        if users:
            raise Refused(f"queue {name!r} is in use: {len(users)} workload(s) name it "
                          f"(e.g. {users[0]}); delete them, or submit them to another "
                          "queue, first", field="name")
        event = Event(ts=time.time(), kind="queue-deleted", message=f"queue {name} deleted")
        result = await EventLog(store, keys).txn([Compare(key, "mod", "==", kv.mod_revision)],
                                                 [Delete(key)], event)
        if result.succeeded:
            return
