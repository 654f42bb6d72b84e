"""Rebuilding a cluster from its agents' recovery reports (``hafo recover --from-agents``,
docs/safety.md, "etcd losing its data"). Pure.

While the store is not the cluster it knew, each agent publishes what it runs
(``Keys.report``): the identity it knows and, for each instance whose guard still runs (or
that its guard fenced meanwhile), the submission it launched it for, a replica's service's
submission, and the assignment as that node runs it. From those reports ``plan_recovery``
decides what to write back:

- every workload reported, with its submission and name, each service a replica names
  (from the newest replica that reported it), and an assignment placing the workload where
  it ran: its node and GPUs, a gang's members with their ranks and GPUs;
- conflicts resolved towards the newest epoch: two nodes claiming one workload at
  different epochs, gang members that disagree, two workloads of one name; whatever is
  dropped is said, with why;
- no node that did not report is placed on: a gang one of whose members' nodes did not
  report is written ``pending``, remembering the members that did, and the controllers place
  it again;
- every assignment of the new generation's ``epoch_base`` (``next_epoch_base`` of every
  epoch the reports and the store know), so that every recovered epoch is higher than any
  epoch before the loss (checkpoints sort by epoch).

A report that is not one (not JSON, the wrong shape) is skipped with one line naming its
node and the field; so is one instance entry of a report.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hafo.decisions.store_trust import Known, next_epoch_base
from hafo.model.cluster import Assignment, Submission
from hafo.model.errors import ValidationError
from hafo.model.schema import schema_of

#: the report's format (``hafo.agent.recovery_report``)
REPORT_FORMAT = "hafo-report/1"


@dataclass(frozen=True)
class ReportedInstance:
    """One instance a node reported."""

    node: str
    workload: str
    epoch: int
    submission: Submission
    service: Submission | None
    #: as the node runs it (a gang's: with every member, ``node`` and ``gpus`` this node's)
    assignment: Assignment
    running: bool = True


@dataclass(frozen=True)
class NodeReport:
    """One node's report."""

    node: str
    known: Known
    instances: tuple[ReportedInstance, ...] = ()
    #: instances the agent left out of its report (too big to publish)
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rebuilt:
    """One workload as it will be written back."""

    submission: Submission
    assignment: Assignment
    #: the epoch it ran at before the loss (the newest reported)
    epoch: int

    @property
    def workload(self) -> str:
        """Its id."""
        return self.submission.id

    def where(self) -> str:
        """Where it is placed, for people."""
        a = self.assignment
        if a.members:
            members = ", ".join(f"{m.node} (rank {m.rank}, GPUs {_gpus(m.gpus)})"
                                for m in sorted(a.members, key=lambda m: m.rank))
            if a.phase == "pending":
                return f"pending, for the controllers to place (remembered: {members})"
            return members
        return f"{a.node} (GPUs {_gpus(a.gpus)})"


def _gpus(gpus: Iterable[int]) -> str:
    listed = ",".join(str(g) for g in gpus)
    return listed or "none"


@dataclass(frozen=True)
class RecoveryPlan:
    """What ``hafo recover --from-agents`` writes back."""

    #: the cluster id the reports know (the most common; None: no usable report)
    cluster_id: str | None
    #: the generations the kept reports know
    generations: tuple[int, ...]
    #: the epoch base of every assignment written (``next_epoch_base``)
    epoch_base: int
    workloads: tuple[Rebuilt, ...]
    services: tuple[Submission, ...]
    #: name -> workload id (workloads that are not replicas, and services)
    names: Mapping[str, str]
    #: the nodes whose reports were kept
    nodes: tuple[str, ...]
    #: what was not rebuilt and why, one line each
    dropped: tuple[str, ...]


def _submission(data: Any, where: str) -> Submission:
    if not isinstance(data, dict):
        raise ValidationError(where, "must be a workload's record")
    return schema_of(Submission).validate(data, prefix=where)


def _instance(node: str, data: Any, where: str) -> ReportedInstance:
    """One instance entry; ValidationError names its field (``where`` its place)."""
    if not isinstance(data, dict):
        raise ValidationError(where, "must be an object")
    workload, epoch = data.get("workload"), data.get("epoch")
    if not isinstance(workload, str) or not workload:
        raise ValidationError(f"{where}.workload", "must be a workload id")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch <= 0:
        raise ValidationError(f"{where}.epoch", "must be a positive whole number")
    submission = _submission(data.get("submission"), f"{where}.submission")
    if submission.id != workload:
        raise ValidationError(f"{where}.submission.id",
                              f"is {submission.id!r}, not the instance's {workload!r}")
    service = None
    if data.get("service") is not None:
        service = _submission(data["service"], f"{where}.service")
        if submission.service != service.id:
            raise ValidationError(f"{where}.service.id", f"is {service.id!r}, not the "
                                  f"replica's service {submission.service!r}")
    raw = data.get("assignment")
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}.assignment", "must be an assignment")
    assignment = dataclasses.replace(
        schema_of(Assignment).validate(raw, prefix=f"{where}.assignment"), epoch=epoch)
    if assignment.workload != workload:
        raise ValidationError(f"{where}.assignment.workload",
                              f"is {assignment.workload!r}, not {workload!r}")
    if assignment.on_node(node) is None or assignment.phase not in ("placed", "moving"):
        raise ValidationError(f"{where}.assignment", f"does not place it on {node}")
    running = data.get("running", True)
    return ReportedInstance(node, workload, epoch, submission, service, assignment,
                            running is not False)


def parse_report(node: str, raw: bytes) -> tuple[NodeReport | None, list[str]]:
    """One node's report (the value of ``Keys.report(node)``): the report, or None when it
    cannot be used at all, and one line for each thing skipped (naming the node and the
    field)."""
    head = f"report of node {node}"
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, [f"{head}: not JSON: skipped"]
    if not isinstance(data, dict):
        return None, [f"{head}: not a JSON object: skipped"]
    if data.get("format", REPORT_FORMAT) != REPORT_FORMAT:
        return None, [f"{head}: format: {str(data.get('format'))[:40]!r} is not "
                      f"{REPORT_FORMAT!r}: skipped"]
    if data.get("node") != node:
        return None, [f"{head}: node: names {str(data.get('node'))[:80]!r}, not the node of "
                      "its key: skipped"]
    known = Known.from_dict(data.get("known"))
    if known is None:
        return None, [f"{head}: known: not a cluster identity (id, generation, revision): "
                      "skipped"]
    entries = data.get("instances", [])
    if not isinstance(entries, list):
        return None, [f"{head}: instances: must be a list: skipped"]
    lines: list[str] = []
    instances: list[ReportedInstance] = []
    for index, entry in enumerate(entries):
        try:
            instances.append(_instance(node, entry, f"instances[{index}]"))
        except ValidationError as exc:
            lines.append(f"{head}: {exc.field}: {exc.message}: that instance skipped")
    left_out = data.get("left_out", [])
    left = tuple(str(w) for w in left_out) if isinstance(left_out, list) else ()
    for workload in left:
        lines.append(f"{head}: {workload} was left out of the report (too big to "
                     "publish): not rebuilt")
    return NodeReport(node, known, tuple(instances), left), lines


def _order(instance: ReportedInstance) -> tuple[int, bool, str]:
    """Newest epoch first; at one epoch a running instance before a fenced one, then by
    node name (deterministic)."""
    return (-instance.epoch, not instance.running, instance.node)


def _rebuilt_assignment(chosen: Assignment, epoch_base: int,
                        reported: set[str]) -> tuple[Assignment, str]:
    """The assignment written back for the newest reported one (and what to say about it):
    placed where it ran, of ``epoch_base``; a gang with a member on a node that did not
    report: pending, remembering the members on nodes that did."""
    base = Assignment(workload=chosen.workload, phase="placed", restarts=chosen.restarts,
                      restart_times=chosen.restart_times,
                      quick_restarts=chosen.quick_restarts, epoch_base=epoch_base,
                      reason="recovered from the agents' reports")
    if not chosen.members:
        return dataclasses.replace(base, node=chosen.node, gpus=chosen.gpus), ""
    members = tuple(sorted(chosen.members, key=lambda m: m.rank))
    missing = [m.node for m in members if m.node not in reported]
    if missing:
        remembered = tuple(m for m in members if m.node in reported)
        return (dataclasses.replace(base, phase="pending", members=remembered),
                f"{chosen.workload}: gang member node(s) {', '.join(missing)} did not report: "
                "written pending, for the controllers to place again (its other members "
                "remembered)")
    return dataclasses.replace(base, node=members[0].node, gpus=members[0].gpus,
                               members=members, master_port=chosen.master_port), ""


def _same_members(a: Assignment, b: Assignment) -> bool:
    return sorted(a.members, key=lambda m: m.rank) == sorted(b.members, key=lambda m: m.rank)


def plan_recovery(reports: Sequence[NodeReport], store_highest_epoch: int = 0) -> RecoveryPlan:
    """What to write back from ``reports`` (see the module). ``store_highest_epoch``: the
    store's own (its identity record's ``epoch_base`` plus its revision), so that the new
    epochs are past it too."""
    dropped: list[str] = []
    ids = Counter(r.known.id for r in reports)
    cluster_id = max(sorted(ids), key=lambda i: ids[i]) if ids else None
    kept_reports: list[NodeReport] = []
    for report in sorted(reports, key=lambda r: r.node):
        if report.known.id != cluster_id:
            dropped.append(f"report of node {report.node}: knows cluster {report.known.id}, "
                           f"not {cluster_id} (most reports'): skipped")
            continue
        kept_reports.append(report)
    reported = {r.node for r in kept_reports}
    epoch_base = next_epoch_base(*(r.known.highest_epoch for r in kept_reports),
                                 *(i.epoch for r in kept_reports for i in r.instances),
                                 store_highest_epoch)
    by_workload: dict[str, list[ReportedInstance]] = {}
    for report in kept_reports:
        for instance in report.instances:
            by_workload.setdefault(instance.workload, []).append(instance)

    chosen: dict[str, ReportedInstance] = {}
    for workload, instances in sorted(by_workload.items()):
        ordered = sorted(instances, key=_order)
        newest = ordered[0]
        chosen[workload] = newest
        for other in ordered[1:]:
            if other.epoch < newest.epoch:
                dropped.append(f"{workload}: instance {other.epoch} on {other.node} dropped: "
                               f"older than instance {newest.epoch} on {newest.node}")
            elif newest.assignment.members and other.node in newest.assignment.nodes \
                    and _same_members(other.assignment, newest.assignment):
                continue  # another member of the same gang instance: agreed
            elif newest.assignment.members:
                dropped.append(f"{workload}: gang members disagree at instance "
                               f"{newest.epoch}: {other.node}'s members dropped, "
                               f"{newest.node}'s kept")
            else:
                dropped.append(f"{workload}: instance {other.epoch} on {other.node} dropped: "
                               f"{newest.node} reports the same instance")

    # Services: the newest replica's report of it.
    services: dict[str, tuple[int, Submission]] = {}
    for instance in chosen.values():
        if instance.service is not None:
            held = services.get(instance.service.id)
            if held is None or instance.epoch > held[0]:
                services[instance.service.id] = (instance.epoch, instance.service)
    for workload, instance in sorted(chosen.items()):
        owner = instance.submission.service
        if owner is not None and owner not in services:
            dropped.append(f"{workload}: a replica of service {owner}, which no report "
                           "holds: dropped")
            del chosen[workload]
    # Names: one workload (or service) per name, the newest.
    claims: dict[str, list[tuple[int, str]]] = {}
    for workload, instance in chosen.items():
        if instance.submission.service is None:
            claims.setdefault(instance.submission.spec.name, []).append(
                (instance.epoch, workload))
    for service_id, (epoch, record) in services.items():
        claims.setdefault(record.spec.name, []).append((epoch, service_id))
    names: dict[str, str] = {}
    for name, holders in sorted(claims.items()):
        holders.sort(reverse=True)
        names[name] = holders[0][1]
        for _, loser in holders[1:]:
            dropped.append(f"{loser}: named {name!r} like {holders[0][1]}, which ran a newer "
                           "instance: dropped")
            if loser in services:
                del services[loser]
                for workload in [w for w, i in chosen.items()
                                 if i.submission.service == loser]:
                    dropped.append(f"{workload}: a replica of dropped service {loser}: "
                                   "dropped")
                    del chosen[workload]
            else:
                del chosen[loser]

    rebuilt: list[Rebuilt] = []
    for _, instance in sorted(chosen.items()):
        assignment, said = _rebuilt_assignment(instance.assignment, epoch_base, reported)
        if said:
            dropped.append(said)
        rebuilt.append(Rebuilt(instance.submission, assignment, instance.epoch))
    return RecoveryPlan(
        cluster_id=cluster_id,
        generations=tuple(sorted({r.known.generation for r in kept_reports})),
        epoch_base=epoch_base, workloads=tuple(rebuilt),
        services=tuple(s for _, (_, s) in sorted(services.items())), names=names,
        nodes=tuple(sorted(reported)), dropped=tuple(dropped))
