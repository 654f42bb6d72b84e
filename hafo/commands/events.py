"""``hafo events``: the event log, newest last, filtered by workload, node, kind and age;
``--watch`` follows it (each new event printed once, as it is written).

The filters are pure (``EventFilter``, ``parse_duration``); the command reads the events
prefix once, then (``--watch``) watches it from the revision read before, so that no event
written meanwhile is missed, and none is printed twice."""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from hafo.commands.base import EXIT_USAGE, CliError, json_arg, store_args
from hafo.stopping import stop_on_signals

#: ``--since`` units, in seconds.
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)")


def register(sub: Any) -> None:
    """Add the ``events`` subparser."""
    p = sub.add_parser("events", help="recent events (filter them; --watch follows them)")
    store_args(p)
    json_arg(p)
    p.add_argument("--limit", type=_limit, default=50, metavar="N",
                   help="the newest N matching events (default 50; 0: all)")
    p.add_argument("--workload", metavar="NAME_OR_ID",
                   help="only this workload's events (a service's: with its replicas')")
    p.add_argument("--node", metavar="NAME", help="only the events of this node")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only events of this kind (repeat for several)")
    p.add_argument("--since", type=_since, metavar="DURATION",
                   help="only events of the last DURATION (e.g. 90s, 10m, 2h, 1d)")
    p.add_argument("--watch", action="store_true",
                   help="then print each new event as it is written, until Ctrl-C "
                        "(--json: one JSON document per line)")


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more, got {value}")
    return value


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"`` in seconds; ValueError says what
    is accepted."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"must be a positive duration like 90s, 10m, 2h or 1d, got {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def _since(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class EventFilter:
    """Which events ``hafo events`` shows: of the workloads ``workloads`` (ids; a service's
    replicas ``<id>.<n>`` too) or, for a workload no longer known, of the name
    ``workload_name``; of ``node``; of one of ``kinds``; not older than ``since`` (a time
    stamp). None (or empty): no condition."""

    workloads: frozenset[str] = frozenset()
    workload_name: str | None = None
    node: str | None = None
    kinds: frozenset[str] = frozenset()
    since: float | None = None

    def matches(self, event: Any) -> bool:
        """Whether ``event`` (a ``hafo.model.cluster.Event``) passes every condition."""
        if self.kinds and event.kind not in self.kinds:
            return False
        if self.node is not None and event.node != self.node:
            return False
        if self.since is not None and event.ts < self.since:
            return False
        if self.workloads or self.workload_name is not None:
            return event.workload is not None and self._of_workload(event.workload)
        return True

    def _of_workload(self, wid: str) -> bool:
        base = wid.split(".", 1)[0]  # a replica's events belong to its service too
        if wid in self.workloads or base in self.workloads:
            return True
        name = self.workload_name
        return name is not None and base.rsplit("-", 1)[0] == name


def check_kinds(kinds: Sequence[str] | None, known: Iterable[str]) -> frozenset[str]:
    """The ``--kind`` values, each one known; CliError (exit 2) lists the kinds."""
    from hafo.model.errors import did_you_mean

    known = tuple(known)
    for kind in kinds or ():
        if kind not in known:
            hint = did_you_mean(kind, known)
            raise CliError(f"--kind: unknown kind {kind!r}{', ' + hint if hint else ''} "
                           f"(kinds: {', '.join(sorted(known))})", EXIT_USAGE)
    return frozenset(kinds or ())


def selected(events: Sequence[Any], which: EventFilter, limit: int) -> list[Any]:
    """The newest ``limit`` (0: all) of ``events`` (oldest first) that ``which`` passes."""
    kept = [e for e in events if which.matches(e)]
    return kept[-limit:] if limit else kept


def event_line(event: dict[str, Any]) -> str:
    """One event as a line (``--watch``): time, kind, workload, node, message."""
    import time

    ts = float(event["ts"])
    clock = time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d}"
    return (f"{clock}  {event['kind']:<20}  {event.get('workload') or '-'}  "
            f"{event.get('node') or '-'}  {event['message']}")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo events``."""
    return asyncio.run(_events(args))


async def _events(args: argparse.Namespace) -> int:
    from hafo.commands.base import with_store
    from hafo.store.events import EVENT_KINDS

    kinds = check_kinds(args.kind, EVENT_KINDS)

    async def body(store: Any, keys: Any) -> int:
        which = await _filter(store, keys, args, kinds)
        revision = await store.revision() if args.watch else 0
        filtered = bool(which.kinds or which.node or which.since is not None
                        or which.workloads or which.workload_name)
        kvs = await (store.get_newest(keys.events, args.limit) if args.limit and not filtered
                     else _all(store, keys.events))
        seen = {kv.key for kv in kvs}
        events = selected(_decoded(kvs), which, args.limit)
        if not args.watch:
            _print_all(events, args.json)
            return 0
        for event in events:
            _print_one(event.to_dict(), args.json)
        return await _follow(store, keys, which, revision, seen, args.json)

    return await with_store(args, body)


async def _filter(store: Any, keys: Any, args: argparse.Namespace,
                  kinds: frozenset[str]) -> EventFilter:
    import time

    from hafo.model.endpoints import resolve
    from hafo.model.names import WORKLOAD_NAME, is_workload_id
    from hafo.store import read_snapshot

    since = time.time() - args.since if args.since is not None else None
    if args.workload is None:
        return EventFilter(node=args.node, kinds=kinds, since=since)
    wid, why = resolve(await read_snapshot(store, keys), args.workload)
    if wid is not None:
        return EventFilter(frozenset({wid}), None, args.node, kinds, since)
    if is_workload_id(args.workload):  # deleted since: its events may still be kept
        return EventFilter(frozenset({args.workload}), None, args.node, kinds, since)
    if re.fullmatch(WORKLOAD_NAME, args.workload):
        return EventFilter(frozenset(), args.workload, args.node, kinds, since)
    raise CliError(f"--workload: {why}", EXIT_USAGE)


async def _all(store: Any, prefix: str) -> list[Any]:
    _revision, kvs = await store.get_prefix(prefix)
    return list(kvs)


def _decoded(kvs: Iterable[Any]) -> list[Any]:
    """The events hafo can read (a newer writer's are skipped, silently here)."""
    from hafo.store.state import decode_events

    return decode_events(kvs)[0]


def _print_all(events: list[Any], as_json: bool) -> None:
    from hafo import render
    from hafo.commands.base import print_json

    data = [e.to_dict() for e in events]
    if as_json:
        print_json(data)
    else:
        print(render.render_events(data) if data else "no events")


def _print_one(event: dict[str, Any], as_json: bool) -> None:
    import json

    print(json.dumps(event, sort_keys=True) if as_json else event_line(event), flush=True)


async def _follow(store: Any, keys: Any, which: EventFilter, revision: int, seen: set[str],
                  as_json: bool) -> int:
    """Print every new event that ``which`` passes, once, until SIGINT or SIGTERM (exit 0)."""
    from hafo.store.records import Resync

    async def follow() -> None:
        async for change in store.watch_prefix(keys.events, revision + 1):
            if isinstance(change, Resync):
                kvs = sorted(change.kvs, key=lambda kv: kv.key)
            elif change.kind == "put":
                kvs = [change.kv]
            else:
                continue  # an event expired with its lease
            for kv in kvs:
                if kv.key in seen:
                    continue
                seen.add(kv.key)
                for event in _decoded([kv]):
                    if which.matches(event):
                        _print_one(event.to_dict(), as_json)

    with stop_on_signals() as stop:  # SIGINT, SIGTERM
        task = asyncio.ensure_future(follow())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, stopped):
                pending.cancel()
            await asyncio.gather(task, stopped, return_exceptions=True)
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    return 0
