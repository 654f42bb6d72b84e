"""``hafo cordon NODE`` / ``hafo uncordon NODE``: allow no new work on a node, or allow it
again (``hafo.store.intents.set_cordon``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError, store_args


def register(sub: Any) -> None:
    """Add the ``cordon`` and ``uncordon`` subparsers."""
    for name, text in (("cordon", "allow no new work on a node"),
                       ("uncordon", "allow work on a node again")):
        p = sub.add_parser(name, help=text)
        p.add_argument("node", help="the node's name")
        store_args(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo cordon`` or ``hafo uncordon``."""
    return asyncio.run(_set_cordon(args, on=args.command == "cordon"))


async def _set_cordon(args: argparse.Namespace, on: bool) -> int:
    from hafo.commands.base import with_store
    from hafo.store import intents

    async def body(store: Any, keys: Any) -> int:
        try:
            await intents.set_cordon(store, keys, args.node, on)
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
        print(f"{args.command}ed {args.node}")
        return 0

    return await with_store(args, body)
