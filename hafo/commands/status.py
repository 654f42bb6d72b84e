"""``hafo status``: the cluster summary (``hafo.model.views.status_view``); exit 3 when the
daemons found etcd not to be the cluster they knew."""

from __future__ import annotations

import argparse
from typing import Any

from hafo.commands.base import EXIT_UNAVAILABLE, CliError
from hafo.commands.reading import add_view_args, run_view


def register(sub: Any) -> None:
    """Add the ``status`` subparser."""
    add_view_args(sub.add_parser("status", help="cluster summary"))


def run(args: argparse.Namespace) -> int:
    """Run ``hafo status``."""
    from hafo import render
    from hafo.model import views

    async def view(store: Any, keys: Any, snapshot: Any, width: int | None) -> tuple[Any, str]:
        problem = await store_problem(store, keys)
        if problem:
            raise CliError(problem, EXIT_UNAVAILABLE)
        data: Any = views.status_view(snapshot)
        return data, render.render_status(data)

    return run_view(args, view)


async def store_problem(store: Any, keys: Any) -> str:
    """What the daemons said last about the store's identity, if it is that etcd is not
    the cluster they knew (their newest ``store-untrusted`` event, not followed by a
    ``store-trusted`` one), else ''."""
    from hafo.store import read_events

    said = [e for e in await read_events(store, keys, 500)
            if e.kind in ("store-untrusted", "store-trusted")]
    if said and said[-1].kind == "store-untrusted":
        return f"etcd is not the cluster its daemons knew: {said[-1].message}"
    return ""
