"""The ``hafo`` command: dispatch only. Each subcommand is a module of ``hafo.commands``
(``register(sub)`` adds its parser, importing nothing heavy; ``run(args) -> int`` runs it),
the daemons' start-ups are ``hafo.agent.main`` and ``hafo.controller.main``. Heavy imports
happen per command, so ``hafo guard`` starts fast and ``hafo agent`` renews its lease early."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
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

__all__ = ["EXIT_NOT_FOUND", "EXIT_REFUSED", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE", "EXIT_USAGE",
           "CliError", "build_parser", "dispatch", "etcd_settings", "load_config", "main"]

#: The modules of hafo.commands, in the order ``hafo --help`` lists their subcommands.
COMMAND_MODULES = ("agent", "controller", "guard", "submit", "status", "nodes", "node",
                   "workloads", "endpoints", "lb", "delete", "drain", "migrate", "cordon",
                   "sim", "demo", "logs", "show", "dev", "completion", "events", "backup",
                   "restore", "recover", "queue", "queues", "demand")

#: Subcommands run by a module of another name.
MODULE_OF = {"uncordon": "cordon"}

#: Commands that keep running (and log what happens meanwhile at ``warning``); the others log
#: only errors unless ``$HAFO_LOG_LEVEL`` says otherwise (docs/reference/commands.md, "Commands").
KEEPS_RUNNING = frozenset({"lb", "dev", "demo", "sim"})

#: Commands that set up their logging themselves (the daemons, from their config; the guard).
OWN_LOGGING = frozenset({"agent", "controller", "guard"})


def build_parser() -> Parser:
    """The argument parser of every subcommand."""
    parser = Parser(prog="hafo", description="High-availability failover for GPU clusters.",
                    epilog="exit codes: 0 ok, 1 error, 2 bad input or usage, 3 etcd "
                           "unreachable, 4 no such node, workload or queue, 5 refused, 6 timed out "
                           "(--wait), 130 interrupted")
    parser.add_argument("--version", action="version", version=f"hafo {_version()}",
                        help="print hafo's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"hafo.commands.{name}").register(sub)
    return parser


def _version() -> str:
    from hafo import __version__

    return __version__


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command."""
    if args.command not in OWN_LOGGING:
        from hafo import logs

        # a one-shot command's failure is its one error line: the store's own warning
        # ("etcd unreachable") would say it twice; commands that keep running still warn
        quiet = "warning" if args.command in KEEPS_RUNNING else "error"
        logs.configure("console", level=os.environ.get("HAFO_LOG_LEVEL", quiet))
    module: Any = importlib.import_module(
        f"hafo.commands.{MODULE_OF.get(args.command, args.command)}")
    result: int = module.run(args)
    return result


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
