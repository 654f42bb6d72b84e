"""``hafo completion bash|zsh``: the shell completion script, and the completers it calls.

Completion is argcomplete's: the script makes the shell run ``hafo`` with ``_ARGCOMPLETE``
set, and ``hafo.cli.main`` answers from its own argument parser before parsing anything
(docs/reference/commands.md, "Shell completion"). Node, workload and queue names are completed
from etcd (``$HAFO_ETCD``/``$HAFO_CLUSTER``/``$HAFO_CONFIG``, as every command reads them), within
``NAME_TIMEOUT`` seconds; when etcd cannot be reached, names are simply not offered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError

#: The shells a script is printed for.
SHELLS = ("bash", "zsh")
#: How long a completer waits for etcd (a shell waits for it: keep it short).
NAME_TIMEOUT = 1.5


def register(sub: Any) -> None:
    """Add the ``completion`` subparser."""
    p = sub.add_parser(
        "completion", help="print the shell completion script (bash or zsh)",
        description="Print a completion script. bash: `source <(hafo completion bash)` (or save "
                    "it as /etc/bash_completion.d/hafo); zsh: `source <(hafo completion zsh)`, "
                    "or save it as _hafo in a directory of $fpath.")
    p.add_argument("shell", choices=SHELLS, help="the shell")


def run(args: argparse.Namespace) -> int:
    """Print the script for ``args.shell``."""
    try:
        from argcomplete.shell_integration import shellcode
    except ImportError:  # pragma: no cover - a declared dependency
        raise CliError("completion needs the argcomplete package", EXIT_USAGE) from None
    print(shellcode(["hafo"], True, args.shell), end="")  # use_defaults, shell
    return 0


def complete_if_asked(parser: argparse.ArgumentParser) -> None:
    """Answer a completion request (the shell sets ``_ARGCOMPLETE``) and exit; otherwise
    return at once without importing argcomplete."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def _names(kind: str, args: argparse.Namespace) -> list[str]:
    from hafo.commands.base import etcd_settings
    from hafo.store import EtcdStore, Keys, read_snapshot

    async def read() -> list[str]:
        settings, cluster = etcd_settings(args)
        store = EtcdStore.from_config(settings, retry_budget=0.5)
        try:
            snapshot = await read_snapshot(store, Keys(cluster))
        finally:
            await store.close()
        if kind == "node":
            return sorted(snapshot.nodes)
        if kind == "queue":
            return sorted(snapshot.queues)
        return sorted({s.spec.name for s in snapshot.workloads.values()})

    async def bounded() -> list[str]:
        return await asyncio.wait_for(read(), NAME_TIMEOUT)

    try:
        return asyncio.run(bounded())
    except Exception:  # completion never fails loudly
        return []


def names_of(kind: str) -> Callable[..., list[str]]:
    """An argcomplete completer offering the cluster's node (``"node"``), workload
    (``"workload"``) or queue (``"queue"``) names that start with what was typed."""

    def completer(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
        return [name for name in _names(kind, parsed_args) if name.startswith(prefix)]

    return completer


def attach_name_completers(parser: argparse.ArgumentParser) -> None:
    """Give every ``node``/``workload``/``queue`` positional (and ``--to``/``--from``/
    ``--workload``) of every subcommand a name completer."""
    for action in parser._actions:  # argparse keeps no public list
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                attach_name_completers(child)
            continue
        kind = {"node": "node", "to": "node", "member_node": "node",
                "workload": "workload", "queue": "queue"}.get(action.dest)
        if kind is not None:
            action.completer = names_of(kind)  # type: ignore[attr-defined]
