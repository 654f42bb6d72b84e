"""``hafo queue set NAME --gpus N ...`` / ``hafo queue delete NAME``: declare a team's queue
(its GPU quota, per GPU model too with ``--model GLOB=N``, cohort, limits and weight) or
forget one (``hafo.store.intents.set_queue`` and ``delete_queue``, the calls ``PUT`` and
``DELETE /v1/queues/{name}`` make).

The flags are validated by ``hafo.model.queues.parse_queue``, as the API's body is: a bad
value is one line naming its flag (exit 2). ``set`` writes the whole declaration: a flag left
out is its default, not the value declared before.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from hafo.commands.base import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    Parser,
    store_args,
)

#: A field of the queue's declaration -> the flag (or argument) that gives it.
FLAGS = {"name": "NAME", "gpus": "--gpus", "cohort": "--cohort",
         "borrowing_limit": "--borrowing-limit", "lending_limit": "--lending-limit",
         "weight": "--weight", "models": "--model"}


def register(sub: Any) -> None:
    """Add the ``queue`` subparser and its actions ``set`` and ``delete``."""
    p = sub.add_parser("queue", help="declare or delete a queue (a team's GPU quota)")
    actions = p.add_subparsers(dest="queue_action", metavar="{set,delete}", required=True,
                               parser_class=Parser)
    p = actions.add_parser("set", help="declare a queue, or replace its declaration")
    p.add_argument("queue", metavar="NAME", help="the queue's name")
    p.add_argument("--gpus", metavar="N",
                   help="its nominal quota in GPUs (a MIG device: its fraction of a GPU; "
                        "default: no quota)")
    p.add_argument("--cohort", metavar="C",
                   help="the cohort whose queues lend each other their unused quota")
    p.add_argument("--borrowing-limit", metavar="N",
                   help="the most GPUs it borrows above its quota (default: no limit)")
    p.add_argument("--lending-limit", metavar="N",
                   help="the most of its unused quota it lends (default: all of it)")
    p.add_argument("--weight", metavar="W",
                   help="its fair-share weight among queues that borrow (default 1)")
    p.add_argument("--model", metavar="GLOB=N", action="append", default=[],
                   help="a part of its quota for GPUs whose model matches GLOB (a flavor; "
                        "repeatable, first match wins; GPUs of no named model share what "
                        "is left of --gpus)")
    store_args(p)
    p = actions.add_parser("delete", help="forget a queue (refused while workloads name it)")
    p.add_argument("queue", metavar="NAME", help="the queue's name")
    store_args(p)


def _number(text: str | None) -> Any:
    """A flag's value as the JSON number it stands for (the parser judges it; text that is
    no number is passed on as it is, and refused naming the flag)."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def models_from_args(values: list[str]) -> dict[str, Any]:
    """``--model GLOB=N`` flags as the ``models`` mapping (in the order given); CliError
    (exit 2) naming ``--model`` for one that is not GLOB=N or names a glob twice (the
    number itself is judged by ``parse_queue``)."""
    models: dict[str, Any] = {}
    for value in values:
        glob, sep, number = value.rpartition("=")
        if not sep or not glob or not number.strip():
            raise CliError(f"hafo queue set: --model: {value!r} is not GLOB=N (a GPU model "
                           "glob, '=', its quota in GPUs; e.g. --model '*H100*=4')", EXIT_USAGE)
        if glob in models:
            raise CliError(f"hafo queue set: --model: {glob!r} is given twice", EXIT_USAGE)
        models[glob] = _number(number.strip())
    return models


def queue_from_args(args: argparse.Namespace) -> Any:
    """The QueueSpec the flags declare; CliError (exit 2) naming each bad flag otherwise."""
    from hafo.model.errors import ValidationError
    from hafo.model.queues import parse_queue

    raw: dict[str, Any] = {"name": args.queue}
    for field, value in (("gpus", _number(args.gpus)), ("cohort", args.cohort),
                         ("borrowing_limit", _number(args.borrowing_limit)),
                         ("lending_limit", _number(args.lending_limit)),
                         ("weight", _number(args.weight))):
        if value is not None:
            raw[field] = value
    models = models_from_args(getattr(args, "model", None) or [])
    if models:
        raw["models"] = models
    try:
        return parse_queue(raw)
    except ValidationError as exc:
        lines = []
        for error in exc.errors:
            field = error.field.removeprefix("queue.")
            flag = FLAGS.get(field.split(".", 1)[0], field)
            lines.append(f"hafo queue set: {flag}: {error.message}")
        raise CliError("\n".join(lines), EXIT_USAGE) from None


def run(args: argparse.Namespace) -> int:
    """Run ``hafo queue set`` or ``hafo queue delete``."""
    if args.queue_action == "set":
        spec = queue_from_args(args)  # before etcd is asked anything
        return asyncio.run(_set(args, spec))
    return asyncio.run(_delete(args))


async def _set(args: argparse.Namespace, spec: Any) -> int:
    from hafo.commands.base import with_store
    from hafo.store import intents

    async def body(store: Any, keys: Any) -> int:
        change = await intents.set_queue(store, keys, spec)
        if change == "unchanged":
            print(f"unchanged: queue {spec.name} already has this declaration")
        else:
            quota = "no quota" if spec.gpus is None else f"{spec.gpus} GPU(s)"
            if spec.models:
                quota += ", " + ", ".join(f"{g}: {n}" for g, n in spec.models.items())
            print(f"{change} queue {spec.name} ({quota})")
        return 0

    return await with_store(args, body)


async def _delete(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store import intents

    async def body(store: Any, keys: Any) -> int:
        try:
            await intents.delete_queue(store, keys, args.queue)
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
        except intents.Refused as exc:
            raise CliError(f"cannot delete queue {args.queue}: {exc}", EXIT_REFUSED) from None
        print(f"deleted queue {args.queue}")
        return 0

    return await with_store(args, body)
