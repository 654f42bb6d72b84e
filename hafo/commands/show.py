"""``hafo show WORKLOAD``: a workload's spec, where it runs now, every epoch it had (node,
started, ended, how it ended, restarts, the checkpoint it resumed from) and its recent
events, read straight from etcd (the JSON is the one of ``GET /v1/workloads/{id}/history``:
``hafo.model.history_view.show_view``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError, json_arg, print_json, store_args

#: How many of the workload's newest events are shown.
EVENTS_SHOWN = 20


def register(sub: Any) -> None:
    """Add the ``show`` subparser."""
    p = sub.add_parser("show", help="a workload's spec, where it runs, every epoch it had "
                                    "and its recent events")
    p.add_argument("workload", metavar="WORKLOAD", help="the workload's name or id")
    store_args(p)
    json_arg(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo show``."""
    return asyncio.run(_show(args))


async def _show(args: argparse.Namespace) -> int:
    import time

    from hafo import render
    from hafo.commands.base import with_store
    from hafo.model.endpoints import resolve
    from hafo.model.history_view import show_view
    from hafo.store import read_snapshot
    from hafo.store.history import read_history, read_workload_events

    async def body(store: Any, keys: Any) -> int:
        snapshot = await read_snapshot(store, keys)
        wid, why = resolve(snapshot, args.workload)
        if wid is None:
            raise CliError(why, EXIT_NOT_FOUND)
        history = await read_history(store, keys, wid)
        events = await read_workload_events(store, keys, wid, EVENTS_SHOWN)
        view = show_view(snapshot, wid, history, events, time.time())
        if args.json:
            print_json(view)
        else:
            print(render.render_show(view))
        return 0

    return await with_store(args, body)
