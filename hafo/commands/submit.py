"""``hafo submit SPEC``: submit a workload (``hafo.store.intents.submit``) and print its
id; ``--wait`` blocks until it runs (``hafo.commands.wait``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError, json_arg, store_args


def register(sub: Any) -> None:
    """Add the ``submit`` subparser."""
    from hafo.commands.wait import add_wait_args

    p = sub.add_parser("submit", help="submit a workload; prints its id")
    p.add_argument("spec", help="workload spec YAML")
    p.add_argument("--allow-unknown-checks", action="store_true",
                   help="submit checks whose type is not installed here (only a warning; "
                        "the agents must have its plugin)")
    store_args(p)
    json_arg(p)
    add_wait_args(p, "it runs (or completed)")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo submit``."""
    return asyncio.run(_submit(args))


async def _submit(args: argparse.Namespace) -> int:
    from hafo.commands.base import load_yaml, resolve_workdir, with_store
    from hafo.commands.wait import check_wait_args, wait_and_report
    from hafo.decisions.wait_goals import submit_goal
    from hafo.model import ValidationError, parse_spec
    from hafo.store import intents, read_snapshot

    check_wait_args(args)
    raw = resolve_workdir(load_yaml(args.spec, "spec"), args.spec)
    if raw is None:
        raise CliError(f"{args.spec}: the file is empty (a workload spec is a mapping with "
                       "at least name and command)", EXIT_USAGE)
    try:
        spec = parse_spec(raw)
    except ValidationError as exc:
        raise CliError("\n".join(exc.lines(f"{args.spec}: ")), EXIT_USAGE) from None
    check_types(args.spec, spec, args.allow_unknown_checks)

    async def body(store: Any, keys: Any) -> int:
        try:
            done = await intents.submit(store, keys, spec)
        except intents.Refused as exc:
            raise CliError(f"{args.spec}: {exc}", EXIT_USAGE) from None
        wid = done.submission.id
        if not args.json:
            print(wid, flush=True)
            if done.change == "unchanged":
                print(f"unchanged: {wid} ({spec.name}) already has this spec", file=sys.stderr)
            elif done.change == "updated":
                print(f"updated {wid} ({spec.name}): {done.how}", file=sys.stderr)
        goal = submit_goal(await read_snapshot(store, keys), wid, done.change) \
            if args.wait else None
        return await wait_and_report(
            store, keys, goal, args, subject=wid, keeps="the workload stays submitted",
            data={"id": wid, "name": spec.name, "change": done.change, "how": done.how})

    return await with_store(args, body)


def check_types(path: str, spec: Any, allow_unknown: bool = False) -> None:
    """Refuse a check type that is not installed here (exit 2, every such check named),
    unless ``allow_unknown`` (then only a warning: the agents may have the plugin); validate
    each check's options with its check type where that type is installed here."""
    from hafo.checks.api import CheckOptionError
    from hafo.checks.registry import CheckLoadError, available_types, load_check
    from hafo.model.spec import unknown_check_types

    types = available_types()
    unknown = unknown_check_types(spec, types, "--allow-unknown-checks")
    if unknown and not allow_unknown:
        raise CliError("\n".join(f"{path}: {e}" for e in unknown), EXIT_USAGE)
    for i, check in enumerate(spec.checks):
        if check.type not in types:
            print(f"warning: {path}: spec.checks[{i}].type: {check.type!r} is not installed "
                  f"here (known: {', '.join(sorted(types))}); the agents need its plugin",
                  file=sys.stderr)
            continue
        try:
            load_check(check.type, check.options)
        except CheckOptionError as exc:
            raise CliError(f"{path}: spec.checks[{i}].{exc.field}: {exc.message}",
                           EXIT_USAGE) from None
        except CheckLoadError as exc:
            print(f"warning: {path}: spec.checks[{i}]: {exc}", file=sys.stderr)
