"""What ``hafo status``, ``hafo nodes`` and ``hafo workloads`` share: their flags, the
snapshot read from etcd with a warning when nobody registered in the cluster, ``--json``, and
``--watch`` (redraw until SIGINT/SIGTERM)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from hafo.commands.base import json_arg, print_json, store_args, watch_arg
from hafo.stopping import stop_on_signals

#: A command's view of one snapshot: ``(store, keys, snapshot, width)`` to its JSON data and
#: its text (``width``: the terminal's columns, None when stdout is not a terminal).
View = Callable[[Any, Any, Any, "int | None"], Awaitable[tuple[Any, str]]]


def add_view_args(p: argparse.ArgumentParser) -> None:
    """The flags every view command takes: the store's, ``--json``, ``--watch``."""
    store_args(p)
    json_arg(p)
    watch_arg(p)


def run_view(args: argparse.Namespace, view: View) -> int:
    """Read the snapshot and print ``view`` of it (again and again with ``--watch``)."""
    return asyncio.run(_read(args, view))


async def _read(args: argparse.Namespace, view: View) -> int:
    import shutil

    from hafo.commands.base import with_store
    from hafo.model import views
    from hafo.store import read_snapshot

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    warned = False

    def warn_if_empty(snapshot: Any, cluster: str) -> None:
        nonlocal warned
        if not warned and views.empty_cluster(snapshot):
            print(f"warning: no node or controller has registered in cluster {cluster!r} "
                  "(check --cluster / $HAFO_CLUSTER)", file=sys.stderr, flush=True)
        warned = True

    async def once(store: Any, keys: Any) -> tuple[Any, str]:
        snapshot = await read_snapshot(store, keys)
        warn_if_empty(snapshot, keys.cluster)
        return await view(store, keys, snapshot, width)

    async def body(store: Any, keys: Any) -> int:
        if getattr(args, "watch", None):
            return await _watch(args, lambda: once(store, keys))
        data, text = await once(store, keys)
        if args.json:
            print_json(data)
        else:
            print(text)
        return 0

    return await with_store(args, body)


async def _watch(args: argparse.Namespace,
                 read: Callable[[], Awaitable[tuple[Any, str]]]) -> int:
    """Redraw until SIGINT/SIGTERM (then exit 0): the screen is cleared between tables on a
    terminal; ``--json`` prints one compact document per line (for ``jq`` and friends)."""
    import time

    clear = sys.stdout.isatty() and not args.json
    with stop_on_signals() as stop:  # SIGINT, SIGTERM
        while not stop.is_set():
            data, text = await read()
            if args.json:
                print(json.dumps(data, sort_keys=True), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S")
                prefix = "\x1b[H\x1b[2J" if clear else ""
                print(f"{prefix}hafo {args.command} every {args.watch:g}s  {stamp}\n{text}\n",
                      flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.watch)
    return 0
