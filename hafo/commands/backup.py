"""``hafo backup FILE``: a backup of the cluster's keys (``hafo.store.backup``), to put back
with ``hafo restore FILE`` after etcd lost its data. Run it on a schedule (the Ansible
controller role installs a timer: ``hafo_backup_schedule``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError, store_args


def register(sub: Any) -> None:
    """Add the ``backup`` subparser."""
    p = sub.add_parser("backup", help="write a backup of the cluster's keys to FILE")
    store_args(p)
    p.add_argument("file", metavar="FILE", help="where to write it (replaced atomically; "
                   "'-': standard output)")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo backup``."""
    return asyncio.run(_backup(args))


async def _backup(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store.backup import take_backup

    async def body(store: Any, keys: Any) -> int:
        backup = await take_backup(store, keys)
        text = json.dumps(backup.to_dict(), indent=1) + "\n"
        if args.file == "-":
            print(text, end="")
            return 0
        path = Path(args.file)
        temp = path.with_name(f".{path.name}.tmp")
        try:
            temp.write_text(text)
            os.replace(temp, path)
        except OSError as exc:
            raise CliError(f"FILE: cannot write {path}: {exc.strerror}", EXIT_USAGE) from None
        print(f"backup of cluster {keys.cluster!r}: {len(backup.keys)} keys at revision "
              f"{backup.revision} written to {path}")
        return 0

    return await with_store(args, body)
