"""``hafo workloads [WORKLOAD]``: the workloads, or one in detail (its reason in full); exit
4 for a name or id that matches none."""

from __future__ import annotations

import argparse
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError
from hafo.commands.reading import add_view_args, run_view


def register(sub: Any) -> None:
    """Add the ``workloads`` subparser."""
    p = sub.add_parser("workloads", help="workloads")
    add_view_args(p)
    p.add_argument("workload", nargs="?", metavar="WORKLOAD",
                   help="show this workload (name or id) in detail, its reason in full")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo workloads``."""
    import time

    from hafo import render
    from hafo.decisions.pending_reasons import with_live_reasons
    from hafo.model import views
    from hafo.model.endpoints import resolve

    async def view(store: Any, keys: Any, snapshot: Any, width: int | None) -> tuple[Any, str]:
        data: Any
        if args.workload is not None:
            wid, why = resolve(snapshot, args.workload)
            if wid is None:
                raise CliError(why, EXIT_NOT_FOUND)
            # now: the restart policy's count is of the restarts within its window
            data = with_live_reasons(views.workload_view(snapshot, wid, time.time()),
                                     snapshot)
            return data, render.render_workload(data)
        data = with_live_reasons(views.all_workloads(snapshot, time.time()), snapshot)
        return data, render.render_workloads(data, width) if data else "no workloads"

    return run_view(args, view)
