"""``hafo recover --from-agents``: rebuild the cluster's specs and assignments from what its
agents run, for the operator whose etcd lost its data and who has no (recent) backup
(docs/safety.md, "etcd losing its data"). While etcd is not the cluster they knew, the
agents publish recovery reports into it (``hafo.agent.recovery_report``); this reads them,
prints what it would rebuild (``hafo.decisions.recovery``) and, with ``--yes``, writes it,
then the next generation of the identity record: the agents fence what they ran and the
controllers place the recovered workloads again, where they ran, at new, higher epochs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from hafo.commands.base import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    print_json,
    store_args,
)


def register(sub: Any) -> None:
    """Add the ``recover`` subparser."""
    p = sub.add_parser("recover", help="rebuild specs and assignments from the running "
                       "agents' reports after etcd lost its data (--from-agents)")
    store_args(p)
    p.add_argument("--from-agents", action="store_true",
                   help="from the recovery reports the agents publish while etcd is not "
                        "the cluster they knew (the one source so far)")
    p.add_argument("--yes", action="store_true",
                   help="write what it would rebuild (without it: print the plan, write "
                        "nothing)")
    p.add_argument("--replace", action="store_true",
                   help="write over a store that still holds keys of the cluster")
    p.add_argument("--json", action="store_true", help="the plan as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo recover``."""
    if not args.from_agents:
        raise CliError("hafo recover: give --from-agents (see --help)", EXIT_USAGE)
    return asyncio.run(_recover(args))


def _plan_lines(cluster: str, plan: Any) -> list[str]:
    lines = [f"cluster {cluster!r}: from the reports of {len(plan.nodes)} node(s) "
             f"({', '.join(plan.nodes)}), cluster id {plan.cluster_id}, generation(s) "
             f"{', '.join(str(g) for g in plan.generations)}:"]
    replicas: dict[str, list[str]] = {}
    for rebuilt in plan.workloads:
        if rebuilt.submission.service is not None:
            replicas.setdefault(rebuilt.submission.service, []).append(rebuilt.workload)
    for service in plan.services:
        lines.append(f"  service {service.spec.name} ({service.id}): replicas "
                     f"{', '.join(replicas.get(service.id, []))}")
    for rebuilt in plan.workloads:
        name = rebuilt.submission.spec.name
        lines.append(f"  {name} ({rebuilt.workload}) on {rebuilt.where()}; it ran instance "
                     f"{rebuilt.epoch}")
    if not plan.workloads:
        lines.append("  no workload (the reports name none)")
    for said in plan.dropped:
        lines.append(f"  not rebuilt: {said}")
    lines.append(f"new epochs from {plan.epoch_base} on (past every epoch reported); the "
                 "identity record's next generation last")
    return lines


def _plan_json(cluster: str, plan: Any) -> dict[str, Any]:
    return {"cluster": cluster, "cluster_id": plan.cluster_id, "nodes": list(plan.nodes),
            "generations": list(plan.generations), "epoch_base": plan.epoch_base,
            "services": [s.to_dict() for s in plan.services],
            "workloads": [{"id": r.workload, "name": r.submission.spec.name,
                           "epoch": r.epoch, "submission": r.submission.to_dict(),
                           "assignment": r.assignment.to_dict()} for r in plan.workloads],
            "names": dict(plan.names), "dropped": list(plan.dropped)}


async def _recover(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.decisions.recovery import plan_recovery
    from hafo.store.backup import holds_cluster
    from hafo.store.recovery import read_reports, write_recovery

    async def body(store: Any, keys: Any) -> int:
        reports, skipped, store_highest = await read_reports(store, keys)
        for line in skipped:
            print(f"hafo recover: {line}", file=sys.stderr)
        held = await holds_cluster(store, keys)
        refusal = ""
        if held and not args.replace:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3
                                           else "")
            refusal = (f"etcd holds {len(held)} keys of cluster {keys.cluster!r} ({shown}): "
                       "recover over them with --replace")
            if args.yes:
                raise CliError(refusal, EXIT_REFUSED)
        if not reports:
            raise CliError(f"no recovery report of cluster {keys.cluster!r} in etcd (the "
                           "agents publish one while etcd is not the cluster they knew)",
                           EXIT_NOT_FOUND)
        plan = plan_recovery(reports, store_highest)
        if args.json:
            print_json({**_plan_json(keys.cluster, plan), "written": bool(args.yes),
                        "held_keys": held})
        else:
            print("\n".join(_plan_lines(keys.cluster, plan)))
        if refusal:
            print(f"hafo recover: {refusal}", file=sys.stderr)
        if not args.yes:
            if not args.json:
                print("nothing written: run again with --yes to write it")
            return 0
        record = await write_recovery(store, keys, plan, replace=args.replace)
        if not args.json:
            print(f"cluster {keys.cluster!r}: {len(plan.workloads)} workload(s) and "
                  f"{len(plan.services)} service(s) recovered from the agents' reports "
                  f"(generation {record.generation})")
        return 0

    return await with_store(args, body)
