"""Rebuilding a cluster from its agents' recovery reports: the I/O of
``hafo.decisions.recovery`` (``hafo recover --from-agents``; docs/safety.md, "etcd losing
its data").

``read_reports`` reads every node's report (``Keys.report``); ``write_recovery`` writes a
plan back: each service's and workload's submission and name, each workload's assignment
with its per-node copies (one transaction per workload, so the copies have the
assignment's revision), then, last, the next generation of the identity record with the
plan's ``epoch_base``: every daemon takes that as an operator's decision, agents fence what
they ran and claim their nodes afresh, and the controllers place the recovered assignments
again, resuming from their checkpoints.
"""

from __future__ import annotations

import time
import uuid

from hafo.decisions.recovery import NodeReport, RecoveryPlan, parse_report
from hafo.decisions.store_trust import IdentityRecord, accepted_generation
from hafo.store import codec
from hafo.store.identity import read_identity
from hafo.store.keys import Keys
from hafo.store.protocol import Store
from hafo.store.records import Delete, Put


async def read_reports(store: Store, keys: Keys) -> tuple[list[NodeReport], list[str], int]:
    """Every node's report that can be used, one line for each thing skipped, and the
    highest epoch the store itself knows (its identity record's ``epoch_base`` plus its
    revision)."""
    revision, kvs = await store.get_prefix(keys.reports)
    record, _ = await read_identity(store, keys)
    reports: list[NodeReport] = []
    lines: list[str] = []
    for kv in sorted(kvs, key=lambda kv: kv.key):
        parsed = keys.parse(kv.key)
        if parsed.kind != "report" or parsed.node is None:
            continue
        report, said = parse_report(parsed.node, kv.value)
        lines += said
        if report is not None:
            reports.append(report)
    return reports, lines, revision + (record.epoch_base if record is not None else 0)


async def write_recovery(store: Store, keys: Keys, plan: RecoveryPlan,
                         replace: bool = False) -> IdentityRecord:
    """Write ``plan`` (refused by the caller unless the store holds nothing of the cluster,
    or ``replace``: then the cluster's state is deleted first), then the identity record's
    next generation."""
    # It may write a workload without its name key (two of one name): no index until the
    # leader's next look (hafo.store.name_index).
    await store.txn([], [Delete(keys.names_indexed)])
    if replace:
        await store.txn([], [Delete(prefix_, prefix=True) for prefix_ in (
            keys.state, keys.by_node, keys.histories)])
    for service in plan.services:
        ops: list[Put | Delete] = [Put(keys.workload(service.id),
                                       codec.encode_submission(service))]
        if plan.names.get(service.spec.name) == service.id:
            ops.append(Put(keys.name(service.spec.name), service.id.encode()))
        await store.txn([], ops)
    for rebuilt in plan.workloads:
        submission, assignment = rebuilt.submission, rebuilt.assignment
        ops = [Put(keys.workload(submission.id), codec.encode_submission(submission))]
        if submission.service is None and plan.names.get(submission.spec.name) == submission.id:
            ops.append(Put(keys.name(submission.spec.name), submission.id.encode()))
        value = codec.encode(assignment.to_dict())
        ops.append(Put(keys.assignment(submission.id), value))
        ops += [Put(keys.node_assignment(node, submission.id), value)
                for node in assignment.copy_nodes]
        await store.txn([], ops)
    current, revision = await read_identity(store, keys)
    generation = accepted_generation(*plan.generations,
                                     current.generation if current is not None else 0,
                                     now=time.time())
    ident = plan.cluster_id or (current.id if current is not None else uuid.uuid4().hex)
    new = IdentityRecord(ident, generation, revision + 1, time.time(), plan.epoch_base)
    # One write, whatever raced it: the record is the operator's decision.
    await store.txn([], [Put(keys.identity, codec.encode(new.to_dict()))])
    return new
