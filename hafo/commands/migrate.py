"""``hafo migrate WORKLOAD``: a planned move with a fresh checkpoint
(``hafo.store.intents.migrate``), refused with the reason where the controller would refuse
it; ``--wait`` blocks until it runs on another node."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, EXIT_REFUSED, CliError, json_arg, store_args


def register(sub: Any) -> None:
    """Add the ``migrate`` subparser."""
    from hafo.commands.wait import add_wait_args

    p = sub.add_parser("migrate", help="planned move of a workload, with a fresh checkpoint")
    p.add_argument("workload", help="a workload's name or id")
    p.add_argument("--to", metavar="NODE", help="the node to move it to (default: any other)")
    p.add_argument("--from", dest="member_node", metavar="NODE",
                   help="for a gang: the node of the member that moves")
    store_args(p)
    json_arg(p)
    add_wait_args(p, "it runs on another node")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo migrate``."""
    return asyncio.run(_migrate(args))


async def _migrate(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.commands.wait import check_wait_args, wait_and_report
    from hafo.decisions.wait_goals import migrate_goal
    from hafo.model.endpoints import move_target
    from hafo.store import intents, read_snapshot

    check_wait_args(args)

    async def body(store: Any, keys: Any) -> int:
        try:
            snapshot = await read_snapshot(store, keys)
            target, member, why = move_target(
                snapshot, await intents.resolve_ref(store, keys, args.workload, snapshot),
                args.member_node)
            if target is None:
                raise intents.NotFound(why)
            wid = target
            replica = snapshot.workloads[wid].service is not None
            refusal = await intents.migrate_refusal(store, keys, wid, args.to, member,
                                                    snapshot)
            if refusal is not None and refusal.not_found:
                raise intents.NotFound(refusal.reason)
            if refusal is not None:
                raise CliError(f"cannot move {args.workload}: {refusal.reason}",
                               EXIT_REFUSED)
            await intents.migrate(store, keys, wid, args.to, node=member)
            if not args.json:
                print(f"replacing {wid}, a replica of a service: its replacement starts "
                      "and is ready first; see `hafo events`" if replica else
                      f"moving {wid}" + (f" (its member on {member})" if member else "")
                      + (f" to {args.to}" if args.to else "")
                      + " (checkpoint, stop, resume); see `hafo events`", flush=True)
            return await wait_and_report(
                store, keys, migrate_goal(snapshot, wid, member, args.to), args,
                subject=wid, keeps="the move goes on", why_not="it is not placed",
                data={"id": wid, "member_node": member, "to": args.to, "replica": replica})
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None

    return await with_store(args, body)
