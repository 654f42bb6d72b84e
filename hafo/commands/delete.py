"""``hafo delete WORKLOAD``: stop and forget a workload (``hafo.store.intents.delete``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError, store_args


def register(sub: Any) -> None:
    """Add the ``delete`` subparser."""
    p = sub.add_parser("delete", help="stop and forget a workload")
    p.add_argument("workload", help="a workload's name or id")
    store_args(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo delete``."""
    return asyncio.run(_delete(args))


async def _delete(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store import intents

    async def body(store: Any, keys: Any) -> int:
        try:
            wid = await intents.resolve_ref(store, keys, args.workload)
            await intents.delete(store, keys, wid)
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
        print(f"deleted {wid}" + (f" ({args.workload})" if wid != args.workload else ""))
        return 0

    return await with_store(args, body)
