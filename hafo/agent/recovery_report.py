"""The agent's recovery report: what this node runs, published while the store is not the
cluster the agent knew (docs/safety.md, "etcd losing its data"), so that an operator without
a (recent) backup can rebuild the cluster's specs and assignments from the running agents
(``hafo recover --from-agents``, ``hafo.decisions.recovery``).

The report (``Keys.report(node)``, JSON): ``format``, ``node``, ``known`` (the identity the
agent trusts: id, generation, the highest revision it saw, ``epoch_base``), ``at`` (wall
clock, for people) and ``instances``: for each instance whose guard still runs, or that its
guard fenced (``running`` false), its ``workload``, ``epoch``, and what the agent launched it
for (the instance's ``submission.json``): ``submission``, ``service`` (a replica's service's
submission, else null) and ``assignment``. At most ``MAX_REPORT_BYTES``: instances that do
not fit are named in ``left_out`` (and logged). It claims nothing and decides nothing.

Read without side effects: no instance is marked, stopped or killed here (the agent starts
and stops nothing on a store that is not its cluster).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hafo.agent import procid
from hafo.agent.instances import (
    instance_dir,
    list_instances,
    read_guard_state,
    read_submission_file,
)
from hafo.decisions.recovery import REPORT_FORMAT
from hafo.decisions.store_trust import Known
from hafo.model.ends import InstanceEnd

#: the most one report may take in etcd (etcd refuses requests over 1.5 MiB by default)
MAX_REPORT_BYTES = 1024 * 1024


def reported_instances(state_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The report's entries for the instances on disk whose guard still runs or that their
    guard fenced, and the instances left out because they have no ``submission.json`` (an
    agent before it launched them)."""
    entries: list[dict[str, Any]] = []
    unrecorded: list[str] = []
    for key in sorted(list_instances(state_dir), key=lambda k: k.dirname):
        path = instance_dir(state_dir, key)
        state = read_guard_state(path)
        if state is None:
            continue  # not started (or not yet): nothing runs
        running = state.state != "exited" and procid.is_alive(state.guard)
        if not running and not (state.state == "exited" and state.ended is InstanceEnd.FENCED):
            continue
        record = read_submission_file(path)
        if record is None:
            unrecorded.append(key.dirname)
            continue
        entries.append({"workload": key.workload, "epoch": key.epoch, "running": running,
                        "submission": record.get("submission"),
                        "service": record.get("service"),
                        "assignment": record.get("assignment")})
    return entries, unrecorded


def _encoded(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def build_report(node: str, known: Known, entries: list[dict[str, Any]],
                 limit: int = MAX_REPORT_BYTES) -> tuple[dict[str, Any], list[str]]:
    """The report (less ``at``) and the workloads left out of it to keep it within
    ``limit`` bytes (instances are kept in order while they fit)."""
    report: dict[str, Any] = {"format": REPORT_FORMAT, "node": node,
                              "known": known.to_dict(), "instances": [], "left_out": []}
    names = [f"{entry['workload']}.{entry['epoch']}" for entry in entries]
    # room for every name in ``left_out``, should none fit, and for "at"
    room = limit - len(_encoded(report)) - 64 - sum(len(_encoded(n)) + 1 for n in names)
    left_out: list[str] = []
    for entry, name in zip(entries, names, strict=True):
        size = len(_encoded(entry)) + 1
        if size > room:
            left_out.append(name)
            continue
        report["instances"].append(entry)
        room -= size
    report["left_out"] = left_out
    return report, left_out


def encode_report(report: dict[str, Any], at: float) -> bytes:
    """The report's value in etcd."""
    return _encoded({**report, "at": at})
