"""``hafo lb haproxy``: drive a load balancer from a workload's endpoints
(``hafo.lb.haproxy``), until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError, Parser, store_args
from hafo.stopping import stop_on_signals


def register(sub: Any) -> None:
    """Add the ``lb`` subparser and its kinds."""
    p = sub.add_parser("lb", help="drive a load balancer from a workload's endpoints")
    lb = p.add_subparsers(dest="lb_kind", required=True, parser_class=Parser)
    p = lb.add_parser("haproxy", help="keep an HAProxy backend's server slots in step with "
                                      "the ready replicas (through its runtime API)")
    p.add_argument("--workload", required=True, help="the workload's name or id")
    p.add_argument("--backend", required=True, help="the HAProxy backend (server-template)")
    p.add_argument("--socket", required=True,
                   help="HAProxy's admin socket: a path, or ipv4@HOST:PORT")
    p.add_argument("--port", dest="port_name", metavar="NAME",
                   help="which declared port to send traffic to (default: the only one)")
    store_args(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo lb``."""
    return asyncio.run(_lb(args))


async def _lb(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.lb.haproxy import LbError, run_haproxy_lb

    async def body(store: Any, keys: Any) -> int:
        with stop_on_signals() as stop:  # SIGINT, SIGTERM
            try:
                return await run_haproxy_lb(store, keys, args.workload, args.backend,
                                            args.socket, args.port_name, stop=stop)
            except LbError as exc:
                raise CliError(str(exc), EXIT_USAGE) from None

    return await with_store(args, body)
