"""``hafo sim --nodes N``: many simulated agents in one process, for scale tests
(``hafo.sim.run``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError, positive_int, store_args


def register(sub: Any) -> None:
    """Add the ``sim`` subparser."""
    p = sub.add_parser("sim", help="many simulated agents in one process (scale tests)")
    p.add_argument("--nodes", type=positive_int, required=True, help="how many nodes")
    p.add_argument("--gpus-per-node", type=positive_int, default=8,
                   help="simulated GPUs of each node (default 8)")
    p.add_argument("--lease-ttl", type=positive_int, default=3, help="seconds")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds")
    p.add_argument("--kill-fraction", type=float, default=0.1,
                   help="share of nodes crashed by --kill-after or SIGUSR1 (default 0.1)")
    p.add_argument("--kill-after", type=float, help="crash --kill-fraction after S seconds")
    p.add_argument("--duration", type=float, help="stop after S seconds (default: run)")
    p.add_argument("--prefix", default="sim", help="node name prefix")
    store_args(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo sim``."""
    return asyncio.run(_sim(args))


async def _sim(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.sim.run import run_sim

    if not 0 <= args.kill_fraction <= 1:
        raise CliError("--kill-fraction: must be between 0 and 1", EXIT_USAGE)
    if args.heartbeat <= 0 or args.heartbeat * 2 > args.lease_ttl:
        raise CliError("--heartbeat: must be positive and at most half of --lease-ttl",
                       EXIT_USAGE)

    async def body(store: Any, keys: Any) -> int:
        return await run_sim(store, keys, args.nodes, args.gpus_per_node, args.lease_ttl,
                             args.heartbeat, args.kill_fraction, args.kill_after,
                             args.duration, args.prefix)

    return await with_store(args, body)
