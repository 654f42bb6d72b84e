"""``hafo drain NODE``: cordon a node and request a planned move of each workload on it
(``hafo.store.intents.drain``); ``--wait`` blocks until the node is empty."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError, json_arg, store_args


def register(sub: Any) -> None:
    """Add the ``drain`` subparser."""
    from hafo.commands.wait import add_wait_args

    p = sub.add_parser("drain", help="cordon a node and move its work off (with checkpoints)")
    p.add_argument("node", help="the node's name")
    store_args(p)
    json_arg(p)
    add_wait_args(p, "the node is empty")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo drain``."""
    return asyncio.run(_drain(args))


async def _drain(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.commands.wait import check_wait_args, wait_and_report
    from hafo.decisions.wait_goals import drain_goal
    from hafo.store import intents, read_snapshot

    check_wait_args(args)

    async def body(store: Any, keys: Any) -> int:
        try:
            before = await read_snapshot(store, keys) if args.wait else None
            moved = await intents.drain(store, keys, args.node)
            if not args.json:
                print(drain_summary(args.node, moved), flush=True)
            goal = drain_goal(before, args.node, moved) if before is not None else None
            return await wait_and_report(
                store, keys, goal, args, subject=f"drain {args.node}",
                keeps=f"{args.node} stays cordoned and its moves go on",
                data={"node": args.node, "moving": moved})
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None

    return await with_store(args, body)


def drain_summary(node: str, moving: list[str]) -> str:
    """What ``hafo drain`` did, said as such (the moves are requested, not done yet)."""
    if not moving:
        return f"cordoned {node}; nothing to move"
    plural = "move" if len(moving) == 1 else "moves"
    return f"cordoned {node}; {len(moving)} planned {plural} requested: {', '.join(moving)}"
