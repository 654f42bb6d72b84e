"""``hafo node remove NAME [--drain] [--timeout S]``: retire a node for good
(``hafo.store.intents.remove_node``, the call ``DELETE /v1/nodes/{name}`` makes), so no stale
record of it is left: ``hafo nodes``, the failsafe set's acknowledgements, the spares and the
placement reasons stop counting it, and an agent of that name registers later as a new node.

Refused (exit 5) while an assignment holds the node (the workloads are named), unless
``--drain``: then the node is drained first (cordoned, its work moved off checkpoint first:
``hafo drain``), waiting until it is empty for at most ``--timeout`` seconds (default 600;
exit 6 when that passes: the node stays cordoned and its moves go on). Refused (exit 5)
while its agent is alive: stop the agent first, or it registers the node again. Exit 4: no
such node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from hafo.commands.base import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    Parser,
    json_arg,
    store_args,
)

#: Seconds ``--drain`` waits for the node to be empty when no ``--timeout`` is given.
DRAIN_TIMEOUT = 600.0


def register(sub: Any) -> None:
    """Add the ``node`` subparser and its action ``remove``."""
    from hafo.commands.wait import timeout_seconds

    p = sub.add_parser("node", help="retire a node (hafo node remove NAME)")
    actions = p.add_subparsers(dest="node_action", metavar="{remove}", required=True,
                               parser_class=Parser)
    p = actions.add_parser("remove", help="retire a down node with no work: its record, "
                                          "cordon and reports go")
    p.add_argument("node", metavar="NAME", help="the node's name")
    p.add_argument("--drain", action="store_true",
                   help="drain it first (cordon, move its work off checkpoint first) and "
                        "wait until it is empty")
    p.add_argument("--timeout", type=timeout_seconds, default=None, metavar="SECONDS",
                   help=f"with --drain: give up after SECONDS (default {DRAIN_TIMEOUT:g}; "
                        "exit 6, the node stays cordoned)")
    store_args(p)
    json_arg(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo node remove``."""
    if args.timeout is not None and not args.drain:
        raise CliError("hafo node remove: --timeout: only with --drain (see --help)",
                       EXIT_USAGE)
    return asyncio.run(_remove(args))


async def _remove(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store import intents

    async def body(store: Any, keys: Any) -> int:
        moved: list[str] = []
        try:
            try:
                await intents.remove_node(store, keys, args.node)
            except intents.RemovalRefused as exc:
                if exc.refusal.kind != "busy" or not args.drain:
                    raise
                moved = await _drain(store, keys, args)
                await intents.remove_node(store, keys, args.node)
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
        except intents.Refused as exc:
            raise CliError(f"cannot remove node {args.node}: {exc}", EXIT_REFUSED) from None
        if args.json:
            print(json.dumps({"node": args.node, "removed": True, "moved": moved},
                             indent=2, sort_keys=True))
        else:
            print(f"removed node {args.node}")
        return 0

    return await with_store(args, body)


async def _drain(store: Any, keys: Any, args: argparse.Namespace) -> list[str]:
    """Drain the node and wait until it is empty; CliError with the wait's exit code when it
    is not (timed out, a move refused, interrupted)."""
    from hafo.commands.drain import drain_summary
    from hafo.commands.wait import wait_for
    from hafo.decisions.wait_goals import drain_goal
    from hafo.store import intents, read_snapshot

    before = await read_snapshot(store, keys)
    moved = await intents.drain(store, keys, args.node)
    if not args.json:
        print(drain_summary(args.node, moved), flush=True)
    timeout = args.timeout if args.timeout is not None else DRAIN_TIMEOUT
    result = await wait_for(store, keys, drain_goal(before, args.node, moved),
                            subject=f"drain {args.node}", timeout=timeout,
                            keeps=f"{args.node} stays cordoned and its moves go on; not "
                                  "removed")
    if result.result != "done":
        raise CliError(f"hafo node remove: {args.node} not removed: the drain did not end "
                       f"({result.result})", result.exit_code)
    return moved
