"""The ``hafo`` command: parse, load config, wire, run. Heavy imports happen per command, so
``hafo guard`` starts fast."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from hafo.commands.base import (
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    Parser,
    etcd_settings,
    load_config,
)
from hafo.commands.base import json_arg as _json_arg
from hafo.commands.base import load_yaml as _load_yaml
from hafo.commands.base import positive_int as _positive_int
from hafo.commands.base import print_json as _print_json
from hafo.commands.base import store_args as _store_args
from hafo.commands.base import watch_arg as _watch_arg
from hafo.commands.base import with_store as _with_store

__all__ = ["EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE",
           "CliError", "build_parser", "dispatch", "etcd_settings", "load_config", "main"]

#: Subcommands with a module of their own in hafo.commands (``register`` and ``run``).
COMMAND_MODULES = ("logs", "show", "dev", "completion", "events", "backup", "restore",
                   "recover")

#: Commands that keep running (and log what happens meanwhile at ``warning``); the others log
#: only errors unless ``$HAFO_LOG_LEVEL`` says otherwise (docs/contract.md, "Commands").
KEEPS_RUNNING = frozenset({"lb", "dev", "demo", "sim"})


def build_parser() -> Parser:
    """The argument parser of every subcommand."""
    from hafo.commands.wait import add_wait_args

    parser = Parser(prog="hafo", description="High-availability failover for GPU clusters.",
                    epilog="exit codes: 0 ok, 1 error, 2 bad input or usage, 3 etcd "
                           "unreachable, 4 no such node or workload, 5 refused, 6 timed out "
                           "(--wait), 130 interrupted")
    parser.add_argument("--version", action="version", version=f"hafo {_version()}",
                        help="print hafo's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, text in (("agent", "node daemon"), ("controller", "controller daemon")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", required=True, help="YAML config file")
        p.add_argument("--check", action="store_true",
                       help="validate the config file and exit (0: valid; 2: the error, "
                            "naming the field)")
    p = sub.add_parser("guard", help="(internal) parent and fence of one workload process")
    p.add_argument("instance_dir")
    p = sub.add_parser("submit", help="submit a workload; prints its id")
    p.add_argument("spec", help="workload spec YAML")
    p.add_argument("--allow-unknown-checks", action="store_true",
                   help="submit checks whose type is not installed here (only a warning; "
                        "the agents must have its plugin)")
    _store_args(p)
    _json_arg(p)
    add_wait_args(p, "it runs (or completed)")
    for name, text in (("status", "cluster summary"), ("nodes", "nodes and their GPUs"),
                       ("workloads", "workloads")):
        p = sub.add_parser(name, help=text)
        _store_args(p)
        _json_arg(p)
        _watch_arg(p)
        if name == "nodes":
            p.add_argument("node", nargs="?", metavar="NODE",
                           help="show this node in detail: every GPU, its workloads")
        if name == "workloads":
            p.add_argument("workload", nargs="?", metavar="WORKLOAD",
                           help="show this workload (name or id) in detail, its reason in "
                                "full")
    p = sub.add_parser("endpoints", help="where a workload's replicas serve, and which are "
                                          "ready")
    p.add_argument("workload", help="a workload's name or id")
    _store_args(p)
    _json_arg(p)
    p.add_argument("--watch", action="store_true",
                   help="print again on every change (until interrupted)")
    p = sub.add_parser("lb", help="drive a load balancer from a workload's endpoints")
    lb = p.add_subparsers(dest="lb_kind", required=True, parser_class=Parser)
    p = lb.add_parser("haproxy", help="keep an HAProxy backend's server slots in step with "
                                      "the ready replicas (through its runtime API)")
    p.add_argument("--workload", required=True, help="the workload's name or id")
    p.add_argument("--backend", required=True, help="the HAProxy backend (server-template)")
    p.add_argument("--socket", required=True,
                   help="HAProxy's admin socket: a path, or ipv4@HOST:PORT")
    p.add_argument("--port", dest="port_name", metavar="NAME",
                   help="which declared port to send traffic to (default: the only one)")
    _store_args(p)
    p = sub.add_parser("delete", help="stop and forget a workload")
    p.add_argument("workload")
    _store_args(p)
    p = sub.add_parser("drain", help="cordon a node and move its work off (with checkpoints)")
    p.add_argument("node")
    _store_args(p)
    _json_arg(p)
    add_wait_args(p, "the node is empty")
    p = sub.add_parser("migrate", help="planned move of a workload, with a fresh checkpoint")
    p.add_argument("workload")
    p.add_argument("--to", metavar="NODE", help="the node to move it to (default: any other)")
    p.add_argument("--from", dest="member_node", metavar="NODE",
                   help="for a gang: the node of the member that moves")
    _store_args(p)
    _json_arg(p)
    add_wait_args(p, "it runs on another node")
    for name, text in (("cordon", "allow no new work on a node"),
                       ("uncordon", "allow work on a node again")):
        p = sub.add_parser(name, help=text)
        p.add_argument("node")
        _store_args(p)
    p = sub.add_parser("sim", help="many simulated agents in one process (scale tests)")
    p.add_argument("--nodes", type=_positive_int, required=True, help="how many nodes")
    p.add_argument("--gpus-per-node", type=_positive_int, default=8)
    p.add_argument("--lease-ttl", type=_positive_int, default=3, help="seconds")
    p.add_argument("--heartbeat", type=float, default=1.0, help="seconds")
    p.add_argument("--kill-fraction", type=float, default=0.1,
                   help="share of nodes crashed by --kill-after or SIGUSR1 (default 0.1)")
    p.add_argument("--kill-after", type=float, help="crash --kill-fraction after S seconds")
    p.add_argument("--duration", type=float, help="stop after S seconds (default: run)")
    p.add_argument("--prefix", default="sim", help="node name prefix")
    _store_args(p)
    p = sub.add_parser("demo", help="embedded cluster that fails a workload over")
    p.add_argument("--keep", action="store_true", help="keep the temp directory")
    for module in _command_modules():
        module.register(sub)
    return parser


def _version() -> str:
    from hafo import __version__

    return __version__


def _command_modules() -> list[Any]:
    import importlib

    return [importlib.import_module(f"hafo.commands.{name}") for name in COMMAND_MODULES]


async def _store_problem(store: Any, keys: Any) -> str:
    """What the daemons said last about the store's identity, if it is that etcd is not
    the cluster they knew (their newest ``store-untrusted`` event, not followed by a
    ``store-trusted`` one), else ''."""
    from hafo.store import read_events

    said = [e for e in await read_events(store, keys, 500)
            if e.kind in ("store-untrusted", "store-trusted")]
    if said and said[-1].kind == "store-untrusted":
        return f"etcd is not the cluster its daemons knew: {said[-1].message}"
    return ""


async def _cmd_sim(args: argparse.Namespace) -> int:
    from hafo.sim.run import run_sim

    if not 0 <= args.kill_fraction <= 1:
        raise CliError("--kill-fraction: must be between 0 and 1", EXIT_USAGE)
    if args.heartbeat <= 0 or args.heartbeat * 2 > args.lease_ttl:
        raise CliError("--heartbeat: must be positive and at most half of --lease-ttl",
                       EXIT_USAGE)

    async def body(store: Any, keys: Any) -> int:
        return await run_sim(store, keys, args.nodes, args.gpus_per_node, args.lease_ttl,
                             args.heartbeat, args.kill_fraction, args.kill_after,
                             args.duration, args.prefix)

    return await _with_store(args, body)


def _run(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def _no_node(snapshot: Any, name: str) -> CliError:
    """``hafo nodes NAME`` for a node that is not registered: exit 4, naming a few that are."""
    known = sorted(snapshot.nodes)
    some = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return CliError(f"no node {name!r}" + (f" (nodes: {some})" if known else ""),
                    EXIT_NOT_FOUND)


async def _cmd_read(args: argparse.Namespace) -> int:
    import shutil

    from hafo import render
    from hafo.model import views
    from hafo.model.endpoints import resolve
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
        data: Any
        if args.command == "status":
            problem = await _store_problem(store, keys)
            if problem:
                raise CliError(problem, EXIT_UNAVAILABLE)
            data = views.status_view(snapshot)
            return data, render.render_status(data)
        node, workload = getattr(args, "node", None), getattr(args, "workload", None)
        if args.command == "nodes" and node is not None:
            if node not in snapshot.nodes:
                raise _no_node(snapshot, node)
            data = views.node_view(snapshot, node)
            here = [views.workload_view(snapshot, w) for w in data["workloads"]
                    if w in snapshot.workloads]
            return data, render.render_node(data, here)
        if args.command == "nodes":
            data = views.all_nodes(snapshot)
            return data, render.render_nodes(data) if data else "no nodes"
        if workload is not None:
            wid, why = resolve(snapshot, workload)
            if wid is None:
                raise CliError(why, EXIT_NOT_FOUND)
            data = views.workload_view(snapshot, wid)
            return data, render.render_workload(data)
        data = views.all_workloads(snapshot)
        return data, render.render_workloads(data, width) if data else "no workloads"

    async def body(store: Any, keys: Any) -> int:
        if getattr(args, "watch", None):
            return await _watch(args, lambda: once(store, keys))
        data, text = await once(store, keys)
        if args.json:
            _print_json(data)
        else:
            print(text)
        return 0

    return await _with_store(args, body)


async def _watch(args: argparse.Namespace,
                 read: Callable[[], Awaitable[tuple[Any, str]]]) -> int:
    """Redraw until SIGINT/SIGTERM (then exit 0): the screen is cleared between tables on a
    terminal; ``--json`` prints one compact document per line (for ``jq`` and friends)."""
    import time

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    clear = sys.stdout.isatty() and not args.json
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


async def _cmd_submit(args: argparse.Namespace) -> int:
    from hafo.commands.base import resolve_workdir
    from hafo.commands.wait import check_wait_args, wait_and_report
    from hafo.decisions.waiting import submit_goal
    from hafo.model import ValidationError, parse_spec
    from hafo.store import intents, read_snapshot

    check_wait_args(args)
    raw = resolve_workdir(_load_yaml(args.spec, "spec"), args.spec)
    if raw is None:
        raise CliError(f"{args.spec}: the file is empty (a workload spec is a mapping with "
                       "at least name and command)", EXIT_USAGE)
    try:
        spec = parse_spec(raw)
    except ValidationError as exc:
        raise CliError("\n".join(exc.lines(f"{args.spec}: ")), EXIT_USAGE) from None
    _check_types(args.spec, spec, args.allow_unknown_checks)

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

    return await _with_store(args, body)


def _check_types(path: str, spec: Any, allow_unknown: bool = False) -> None:
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


async def _cmd_endpoints(args: argparse.Namespace) -> int:
    from hafo import render
    from hafo.model.endpoints import endpoints_of, resolve
    from hafo.store import ClusterCache
    from hafo.tasks import wait_event

    async def body(store: Any, keys: Any) -> int:
        cache = ClusterCache(store, keys)
        await cache.load()
        follow = asyncio.ensure_future(cache.follow()) if args.watch else None
        stop = asyncio.Event()
        if args.watch:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        last: Any = None
        try:
            while True:
                cache.changed.clear()
                snapshot = cache.snapshot()
                wid, why = resolve(snapshot, args.workload)
                if wid is None:
                    raise CliError(why, EXIT_NOT_FOUND)
                data = endpoints_of(snapshot, wid).to_dict()
                if data != last:
                    if args.json:
                        print(json.dumps(data, sort_keys=True) if args.watch
                              else json.dumps(data, indent=2, sort_keys=True), flush=True)
                    else:
                        print(render.render_endpoints(data) + ("\n" if args.watch else ""),
                              flush=True)
                    last = data
                if not args.watch:
                    return 0
                waiter = asyncio.ensure_future(stop.wait())
                await wait_event(cache.changed, 5.0)
                waiter.cancel()
                if stop.is_set():
                    return 0
        finally:
            if follow is not None:
                follow.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await follow

    return await _with_store(args, body)


async def _cmd_lb(args: argparse.Namespace) -> int:
    from hafo.lb.haproxy import LbError, run_haproxy_lb

    async def body(store: Any, keys: Any) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await run_haproxy_lb(store, keys, args.workload, args.backend, args.socket,
                                        args.port_name, stop=stop)
        except LbError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None

    return await _with_store(args, body)


async def _cmd_change(args: argparse.Namespace) -> int:
    from hafo.commands.wait import check_wait_args, wait_and_report
    from hafo.decisions.waiting import drain_goal, migrate_goal
    from hafo.model.endpoints import move_target
    from hafo.store import intents, read_snapshot

    check_wait_args(args)

    async def body(store: Any, keys: Any) -> int:
        try:
            if args.command == "delete":
                wid = await intents.resolve_ref(store, keys, args.workload)
                await intents.delete(store, keys, wid)
                print(f"deleted {wid}" + (f" ({args.workload})" if wid != args.workload else ""))
            elif args.command == "migrate":
                snapshot = await read_snapshot(store, keys)
                target, member, why = move_target(
                    snapshot, await intents.resolve_ref(store, keys, args.workload, snapshot),
                    args.member_node)
                if target is None:
                    raise intents.NotFound(why)
                wid = target
                replica = snapshot.workloads[wid].service is not None
                refusal = await intents.migrate_refusal(store, keys, wid, args.to, member,
                                                        snapshot)
                if refusal is not None and refusal.not_found:
                    raise intents.NotFound(refusal.reason)
                if refusal is not None:
                    raise CliError(f"cannot move {args.workload}: {refusal.reason}",
                                   EXIT_REFUSED)
                await intents.migrate(store, keys, wid, args.to, node=member)
                if not args.json:
                    print(f"replacing {wid}, a replica of a service: its replacement starts "
                          "and is ready first; see `hafo events`" if replica else
                          f"moving {wid}" + (f" (its member on {member})" if member else "")
                          + (f" to {args.to}" if args.to else "")
                          + " (checkpoint, stop, resume); see `hafo events`", flush=True)
                return await wait_and_report(
                    store, keys, migrate_goal(snapshot, wid, member, args.to), args,
                    subject=wid, keeps="the move goes on", why_not="it is not placed",
                    data={"id": wid, "member_node": member, "to": args.to, "replica": replica})
            elif args.command == "drain":
                before = await read_snapshot(store, keys) if args.wait else None
                moved = await intents.drain(store, keys, args.node)
                if not args.json:
                    print(drain_summary(args.node, moved), flush=True)
                goal = drain_goal(before, args.node, moved) if before is not None else None
                return await wait_and_report(
                    store, keys, goal, args, subject=f"drain {args.node}",
                    keeps=f"{args.node} stays cordoned and its moves go on",
                    data={"node": args.node, "moving": moved})
            else:
                await intents.set_cordon(store, keys, args.node, args.command == "cordon")
                print(f"{args.command}ed {args.node}")
        except intents.NotFound as exc:
            raise CliError(str(exc), EXIT_NOT_FOUND) from None
        return 0

    return await _with_store(args, body)


def drain_summary(node: str, moving: list[str]) -> str:
    """What ``hafo drain`` did, said as such (the moves are requested, not done yet)."""
    if not moving:
        return f"cordoned {node}; nothing to move"
    plural = "move" if len(moving) == 1 else "moves"
    return f"cordoned {node}; {len(moving)} planned {plural} requested: {', '.join(moving)}"


async def _serve_until_signal(main: Coroutine[Any, Any, None], ready: asyncio.Event,
                              what: str) -> None:
    """Run a daemon until SIGTERM/SIGINT, telling systemd when it is ready, pinging the
    watchdog from this event loop, and saying when it stops."""
    from hafo.notify import Notifier

    notifier = Notifier()
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)

    async def tell_systemd() -> None:
        await ready.wait()
        notifier.ready(f"{what}: serving")
        await notifier.keep_watchdog()

    helper = asyncio.ensure_future(tell_systemd())
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        helper.cancel()
        notifier.stopping(f"{what}: stopping")


def _api_settings(config: Any) -> tuple[str | None, Any]:
    """The API's bearer token and TLS context from ``api.token_file`` / ``api.tls_*``."""
    from hafo.api.auth import load_token
    from hafo.api.server import server_tls
    from hafo.model import ValidationError

    try:
        token = load_token(config.api.token_file) if config.api.token_file else None
    except ValidationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    tls = None
    if config.api.tls_cert:
        try:
            tls = server_tls(config.api.tls_cert, config.api.tls_key)
        except (OSError, ValueError) as exc:
            raise CliError(f"api.tls_cert: cannot load {config.api.tls_cert} with "
                           f"{config.api.tls_key}: {exc}", EXIT_USAGE) from None
    return token, tls


def _check_state_dir(path: str, config: Any) -> None:
    """CliError (exit 2) naming ``node.state_dir`` if the agent could not use it."""
    from hafo.model.config import state_dir_problem

    problem = state_dir_problem(config.node.state_dir)
    if problem:
        raise CliError(f"{path}: node.state_dir: {problem}", EXIT_USAGE)


async def _cmd_agent(args: argparse.Namespace) -> int:
    from hafo import logs

    # First of all, before the config models are built: the lease of a crashed predecessor
    # renewed with the brief it left (hafo.agent.early_renewal); then one agent per state
    # directory, and the renewal from the config where there was no brief.
    from hafo.agent.early_renewal import renew_from_brief, renew_saved_lease

    left = await renew_from_brief(args.config) if args.config else None
    config = load_config(args.config, "agent")
    _check_state_dir(args.config, config)
    logs.configure(config.log_format, node=config.node.name)
    from hafo.agent.renewal_brief import write_brief
    from hafo.agent.statelock import hold_state_dir

    _lock = await hold_state_dir(Path(config.node.state_dir))
    if left is None:
        left = await renew_saved_lease(config)
    write_brief(Path(config.node.state_dir), config.etcd, config.timing.heartbeat,
                config.timing.fence_margin)
    if left is not None:
        import structlog

        structlog.get_logger("hafo.agent").info("saved lease renewed before start-up",
                                                node=config.node.name, fenced_in=round(left, 3))

    from hafo.agent.daemon import Agent
    from hafo.api import make_agent_app

    token, tls = _api_settings(config)
    agent = Agent(config)
    agent.api_address = config.api.listen
    runner = await _listen(make_agent_app(agent, token), config, tls)
    _announce("agent", config.node.name, config, runner, token)
    ready = asyncio.Event()
    try:
        await _serve_until_signal(agent.run(ready), ready, f"agent {config.node.name}")
    finally:
        await runner.cleanup()
        await agent.close()
    return 0


async def _listen(app: Any, config: Any, tls: Any) -> Any:
    from hafo.api import serve

    try:
        return await serve(app, config.api.host, config.api.port, tls)
    except OSError as exc:
        raise CliError(f"api.listen: cannot listen on {config.api.listen}: "
                       f"{exc.strerror or exc}", EXIT_USAGE) from None


def _announce(role: Any, name: str, config: Any, runner: Any, token: str | None) -> None:
    """Log the daemon's one start-up line (once it listens: the port it got for port 0), and
    a warning when its API is open to other hosts without a token (hafo.model.exposure)."""
    import structlog

    from hafo.model.exposure import TOKEN_FIELD, api_url, open_api_warning, serving_line

    port = config.api.port or next(
        (a[1] for a in runner.addresses if isinstance(a, tuple) and len(a) > 1), 0)
    line = serving_line(role, name, api_url(config.api.scheme, config.api.host, port))
    log = structlog.get_logger(f"hafo.{role}")
    log.info(line.text, api=line.api, dashboard=line.dashboard, version=_version())
    warning = open_api_warning(role, config.api.listen, config.api.host, token is not None)
    if warning:
        log.warning(warning, field=TOKEN_FIELD, address=config.api.listen)


async def _cmd_controller(args: argparse.Namespace) -> int:
    from hafo import logs
    from hafo.api import make_controller_app
    from hafo.controller.daemon import Controller

    config = load_config(args.config, "controller")
    token, tls = _api_settings(config)
    logs.configure(config.log_format, controller=config.controller_name)
    controller = Controller(config, api_token=token)
    runner = await _listen(make_controller_app(controller, token, auth_refusal=lambda:
                                               controller.api_auth.refusal), config, tls)
    _announce("controller", config.controller_name, config, runner, token)
    ready = asyncio.Event()
    try:
        await _serve_until_signal(controller.run(ready), ready,
                                  f"controller {config.controller_name}")
    finally:
        await runner.cleanup()
        await controller.close()
    return 0


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command."""
    if args.command == "guard":
        from hafo.agent import guard

        return guard.main([args.instance_dir])
    if args.command in ("agent", "controller") and args.check:
        checked = load_config(args.config, args.command)
        if args.command == "agent":
            _check_state_dir(args.config, checked)
        print(f"{args.config}: a valid {args.command} config")
        return 0
    if args.command not in ("agent", "controller"):
        from hafo import logs

        # a one-shot command's failure is its one error line: the store's own warning
        # ("etcd unreachable") would say it twice; commands that keep running still warn
        quiet = "warning" if args.command in KEEPS_RUNNING else "error"
        logs.configure("console", level=os.environ.get("HAFO_LOG_LEVEL", quiet))
    if args.command == "demo":
        from hafo.demo import run_demo

        return run_demo(keep=args.keep)
    if args.command in COMMAND_MODULES:
        import importlib

        module = importlib.import_module(f"hafo.commands.{args.command}")
        result: int = module.run(args)
        return result
    handlers: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
        "agent": _cmd_agent, "controller": _cmd_controller, "submit": _cmd_submit,
        "sim": _cmd_sim,
        "status": _cmd_read, "nodes": _cmd_read, "workloads": _cmd_read,
        "delete": _cmd_change, "cordon": _cmd_change, "uncordon": _cmd_change,
        "drain": _cmd_change, "migrate": _cmd_change, "endpoints": _cmd_endpoints,
        "lb": _cmd_lb,
    }
    return _run(handlers[args.command](args))


#: The exit status when stdout's reader has gone (128 + SIGPIPE, as a shell reports a
#: program that SIGPIPE ended): ``set -o pipefail`` sees it as it would for ``cat``.
EXIT_BROKEN_PIPE = 141


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has closed it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP)
                   for _fd, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Console entry point: one clear line on stderr for any bad input, never a traceback."""
    try:
        parser = build_parser()
        if argv is None:
            from hafo.commands.completion import attach_name_completers, complete_if_asked

            if "_ARGCOMPLETE" in os.environ:
                attach_name_completers(parser)
            complete_if_asked(parser)
        args = parser.parse_args(argv)
        return dispatch(args)
    except CliError as exc:
        for line in str(exc).splitlines() or [""]:  # one line per error, each said as such
            print(line if line.startswith("hafo") else f"hafo: {line}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError as exc:
        if not _stdout_gone():
            print(f"hafo: {exc.strerror or exc}", file=sys.stderr)
            return 1
        # The reader left (``hafo events | head``): nothing to say, and no second error when
        # Python flushes stdout at exit (the Python docs' recipe, "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        print(f"hafo: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except Exception as exc:
        from hafo.store import TRANSIENT, StoreError

        if isinstance(exc, TRANSIENT):
            print("hafo: cannot reach etcd (check etcd.endpoints / --etcd)", file=sys.stderr)
            return EXIT_UNAVAILABLE
        if isinstance(exc, StoreError):
            print(f"hafo: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
