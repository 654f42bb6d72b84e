"""``hafo restore FILE``: put a backup (``hafo backup``) back into an etcd that lost its
data; ``hafo restore --as-is``: accept the store as it is as the cluster. Either is the
operator's decision that daemons which found etcd not to be the cluster they knew wait for
(docs/safety.md, "etcd losing its data"): agents fence what they ran and claim their nodes
afresh, and the controllers place the restored workloads again."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from hafo.commands.base import EXIT_REFUSED, EXIT_USAGE, CliError, store_args

MAX_BACKUP_BYTES = 256 * 1024 * 1024


def register(sub: Any) -> None:
    """Add the ``restore`` subparser."""
    p = sub.add_parser("restore", help="put a backup back into etcd (or accept etcd as it "
                       "is: --as-is)")
    store_args(p)
    p.add_argument("file", metavar="FILE", nargs="?", help="a file written by hafo backup")
    p.add_argument("--as-is", action="store_true",
                   help="no file: accept the store as it is now as the cluster")
    p.add_argument("--replace", action="store_true",
                   help="restore over a store that still holds keys of the cluster")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo restore``."""
    if bool(args.file) == bool(args.as_is):
        raise CliError("hafo restore: give FILE, or --as-is (see --help)", EXIT_USAGE)
    return asyncio.run(_restore(args))


def _read(path_text: str) -> Any:
    from hafo.store.backup import Backup, BackupError

    path = Path(path_text)
    try:
        if path.stat().st_size > MAX_BACKUP_BYTES:
            raise CliError(f"FILE: {path} is over {MAX_BACKUP_BYTES >> 20} MiB: not a hafo "
                           "backup", EXIT_USAGE)
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CliError(f"FILE: {path} not found", EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"FILE: cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CliError(f"FILE: {path} is not JSON ({exc})", EXIT_USAGE) from None
    try:
        return Backup.from_dict(data)
    except BackupError as exc:
        raise CliError(f"FILE: {path}: {exc}", EXIT_USAGE) from None


async def _restore(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store.backup import BackupError, holds_cluster, restore_backup
    from hafo.store.identity import accept_store
    from hafo.store.recovery import read_reports

    backup = _read(args.file) if args.file else None

    async def body(store: Any, keys: Any) -> int:
        # What the agents' reports say they knew: the new generation and its epoch base
        # past theirs (epochs, and checkpoints, never go backwards).
        reports, _skipped, _ = await read_reports(store, keys)
        known = [report.known for report in reports]
        if backup is None:
            record = await accept_store(store, keys, known)
            print(f"cluster {keys.cluster!r}: the store as it is accepted as the cluster "
                  f"(generation {record.generation})")
            return 0
        held = await holds_cluster(store, keys)
        if held and not args.replace:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3
                                           else "")
            raise CliError(f"etcd holds {len(held)} keys of cluster {keys.cluster!r} "
                           f"({shown}): restore over them with --replace", EXIT_REFUSED)
        try:
            record = await restore_backup(store, keys, backup, replace=args.replace,
                                          known=known)
        except BackupError as exc:
            raise CliError(f"FILE: {exc}", EXIT_USAGE) from None
        print(f"cluster {keys.cluster!r}: {len(backup.keys)} keys restored from the backup "
              f"of revision {backup.revision} (generation {record.generation})")
        return 0

    return await with_store(args, body)
