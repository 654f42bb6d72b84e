"""``hafo nodes [NODE]``: the nodes and their GPUs, or one node in detail (every GPU, its
workloads); exit 4 for a node that is not registered."""

from __future__ import annotations

import argparse
from typing import Any

from hafo.commands.base import EXIT_NOT_FOUND, CliError
from hafo.commands.reading import add_view_args, run_view


def register(sub: Any) -> None:
    """Add the ``nodes`` subparser."""
    p = sub.add_parser("nodes", help="nodes and their GPUs")
    add_view_args(p)
    p.add_argument("node", nargs="?", metavar="NODE",
                   help="show this node in detail: every GPU, its workloads")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo nodes``."""
    from hafo import render
    from hafo.model import views

    async def view(store: Any, keys: Any, snapshot: Any, width: int | None) -> tuple[Any, str]:
        data: Any
        if args.node is not None:
            if args.node not in snapshot.nodes:
                raise no_node(snapshot, args.node)
            data = views.node_view(snapshot, args.node)
            here = [views.workload_view(snapshot, w) for w in data["workloads"]
                    if w in snapshot.workloads]
            return data, render.render_node(data, here)
        data = views.all_nodes(snapshot)
        return data, render.render_nodes(data) if data else "no nodes"

    return run_view(args, view)


def no_node(snapshot: Any, name: str) -> CliError:
    """``hafo nodes NAME`` for a node that is not registered: exit 4, naming a few that are."""
    known = sorted(snapshot.nodes)
    some = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return CliError(f"no node {name!r}" + (f" (nodes: {some})" if known else ""),
                    EXIT_NOT_FOUND)
