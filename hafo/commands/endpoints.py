"""``hafo endpoints WORKLOAD``: where a workload's replicas serve and which are ready
(``hafo.model.endpoints``); ``--watch`` prints again on every change."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError, json_arg, store_args
from hafo.stopping import STOP_SIGNALS, stop_on_signals


def register(sub: Any) -> None:
    """Add the ``endpoints`` subparser."""
    p = sub.add_parser("endpoints", help="where a workload's replicas serve, and which are "
                                         "ready")
    p.add_argument("workload", help="a workload's name or id")
    store_args(p)
    json_arg(p)
    p.add_argument("--watch", action="store_true",
                   help="print again on every change (until interrupted)")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo endpoints``."""
    return asyncio.run(_endpoints(args))


async def _endpoints(args: argparse.Namespace) -> int:
    from hafo import render
    from hafo.commands.base import with_store
    from hafo.model.endpoints import endpoints_of, resolve
    from hafo.store import ClusterCache
    from hafo.tasks import wait_event

    async def body(store: Any, keys: Any) -> int:
        cache = ClusterCache(store, keys)
        await cache.load()
        follow = asyncio.ensure_future(cache.follow()) if args.watch else None
        # --watch: until SIGINT or SIGTERM
        with stop_on_signals(STOP_SIGNALS if args.watch else ()) as stop:
            last: Any = None
            try:
                while True:
                    cache.changed.clear()
                    snapshot = cache.snapshot()
                    wid, why = resolve(snapshot, args.workload)
                    if wid is None:
                        raise CliError(why, EXIT_NOT_FOUND)
                    data = endpoints_of(snapshot, wid).to_dict()
                    if data != last:
                        if args.json:
                            print(json.dumps(data, sort_keys=True) if args.watch
                                  else json.dumps(data, indent=2, sort_keys=True), flush=True)
                        else:
                            print(render.render_endpoints(data) + ("\n" if args.watch else ""),
                                  flush=True)
                        last = data
                    if not args.watch:
                        return 0
                    waiter = asyncio.ensure_future(stop.wait())
                    await wait_event(cache.changed, 5.0)
                    waiter.cancel()
                    if stop.is_set():
                        return 0
            finally:
                if follow is not None:
                    follow.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await follow

    return await with_store(args, body)
