"""``--wait`` and ``--timeout`` of ``hafo submit``, ``hafo drain`` and ``hafo migrate``: follow
the cluster through etcd until the outcome (``hafo.decisions.wait_goals``), showing progress on
stderr: a live spinner with the current step on a terminal, one plain line per change
otherwise; the final line says the outcome. Exit codes: 0 done, 1 failed, 6 timed out, 130
interrupted (the request stays)."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from hafo.commands.base import EXIT_TIMEOUT, EXIT_USAGE, CliError
from hafo.stopping import on_signals

if TYPE_CHECKING:
    from hafo.decisions.wait_goals import WaitGoal, WaitOutcome
    from hafo.store import Keys, Store

#: Seconds ``--wait`` waits when no ``--timeout`` is given.
DEFAULT_TIMEOUT = 300.0
#: The longest ``--timeout`` (a day).
MAX_TIMEOUT = 86400.0
#: Seconds between two looks when etcd reports no change (elapsed time, time-based states).
TICK = 0.25

Result = Literal["done", "failed", "timeout", "interrupted"]
EXIT_CODES: dict[Result, int] = {"done": 0, "failed": 1, "timeout": EXIT_TIMEOUT,
                                 "interrupted": 130}


def timeout_seconds(text: str) -> float:
    """``--timeout``: a number of seconds, more than 0 and at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT:g}, "
                                         f"got {value:g}")
    return value


def add_wait_args(p: argparse.ArgumentParser, until: str) -> None:
    """Add ``--wait`` (block ``until`` the outcome) and ``--timeout SECONDS``."""
    p.add_argument("--wait", action="store_true",
                   help=f"block until {until}, showing progress on stderr (exit 0 done, 1 "
                        f"failed, 6 timed out, 130 interrupted: the request stays)")
    p.add_argument("--timeout", type=timeout_seconds, default=None, metavar="SECONDS",
                   help=f"with --wait: give up after SECONDS (default {DEFAULT_TIMEOUT:g})")


def check_wait_args(args: argparse.Namespace) -> None:
    """``--timeout`` means nothing without ``--wait``: a usage error (exit 2)."""
    if getattr(args, "timeout", None) is not None and not args.wait:
        raise CliError(f"hafo {args.command}: --timeout: only with --wait (see --help)",
                       EXIT_USAGE)


@dataclass(frozen=True)
class WaitResult:
    """How a wait ended: ``result``, the final ``line`` (for people), the outcome's own
    ``message``, ``seconds`` waited, and where the workload runs (``node``, ``epoch``) once
    done."""

    result: Result
    line: str
    message: str
    seconds: float
    node: str | None = None
    epoch: int | None = None

    @property
    def exit_code(self) -> int:
        """0 done, 1 failed, 6 timed out, 130 interrupted."""
        return EXIT_CODES[self.result]

    def to_dict(self) -> dict[str, Any]:
        """The ``outcome`` object of ``--json --wait`` (docs/reference/commands.md, "Waiting")."""
        return {"result": self.result, "message": self.message, "line": self.line,
                "seconds": round(self.seconds, 3), "node": self.node, "epoch": self.epoch}


def final_line(subject: str, result: Result, message: str, seconds: float,
               keeps: str) -> str:
    """The last line of a wait: e.g. ``w-1a2b3c: running on node-b (epoch 1234) after 2.1
    s``; a failure, a timeout and an interrupt say so first."""
    took = f"after {seconds:.1f} s"
    if result == "done":
        return f"{subject}: {message} {took}"
    if result == "failed":
        return f"{subject}: failed {took}: {message}"
    if result == "timeout":
        return f"{subject}: timed out {took}: {message}; {keeps}"
    return f"{subject}: interrupted {took}: {message}; {keeps}"


def plain(text: str) -> str:
    """``text`` without control characters (a line for a log or a pipe)."""
    return "".join(c if c.isprintable() else " " for c in text)


class Renderer(Protocol):
    """Shows a wait's progress."""

    def update(self, outcome: WaitOutcome, elapsed: float) -> None:
        """The state now (called often; show changes)."""

    def finish(self, result: WaitResult) -> None:
        """The end: the final line."""


class PlainRenderer:
    """One line per change of state, no escape codes: ``  1.2s  pending: ...``."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.last = ""

    def update(self, outcome: WaitOutcome, elapsed: float) -> None:
        """Print the outcome's message if it changed."""
        if outcome.message != self.last:
            self.last = outcome.message
            print(f"{elapsed:6.1f}s  {plain(outcome.message)}", file=self.out, flush=True)

    def finish(self, result: WaitResult) -> None:
        """Print the final line."""
        print(plain(result.line), file=self.out, flush=True)


class LiveRenderer:
    """On a terminal: each change of state as a line, under it a spinner with the current
    step, the steps done and the time; the final line in colour."""

    STYLES: dict[Result, str] = {"done": "green", "failed": "red", "timeout": "yellow",
                                 "interrupted": "yellow"}

    def __init__(self, out: IO[str], subject: str) -> None:
        from rich.console import Console

        self.console = Console(file=out, highlight=False)
        self.subject = subject
        self.last = ""
        self.status = self.console.status(f"{subject}: waiting", spinner="dots")
        self.status.start()

    def update(self, outcome: WaitOutcome, elapsed: float) -> None:
        """Redraw the spinner's line; a new state also leaves a line above it."""
        from rich.markup import escape

        if outcome.message != self.last:
            self.last = outcome.message
            self.console.print(f"[dim]{elapsed:6.1f}s[/dim]  {escape(outcome.message)}")
        steps = f" [{outcome.steps[0]}/{outcome.steps[1]}]" if outcome.steps else ""
        self.status.update(f"{escape(self.subject)}{steps}: {escape(outcome.message)} "
                           f"[dim]({elapsed:.1f}s)[/dim]")

    def finish(self, result: WaitResult) -> None:
        """Stop the spinner and print the final line."""
        from rich.markup import escape

        self.status.stop()
        self.console.print(f"[{self.STYLES[result.result]}]{escape(result.line)}[/]")


def renderer_for(out: IO[str], subject: str) -> Renderer:
    """A live display on a terminal, plain lines otherwise."""
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return LiveRenderer(out, subject)
    return PlainRenderer(out)


async def wait_for(store: Store, keys: Keys, goal: WaitGoal, *, subject: str, timeout: float,
                   keeps: str, out: IO[str] | None = None,
                   clock: Callable[[], float] = time.monotonic) -> WaitResult:
    """Follow the cluster (a watch on its state) until ``goal`` is done or failed, for at
    most ``timeout`` seconds, or until SIGINT; progress goes to ``out`` (stderr).
    ``keeps``: what stays after a timeout or an interrupt (e.g. "the workload stays
    submitted")."""
    from hafo.decisions.wait_goals import Held, settled, wait_outcome
    from hafo.store import ClusterCache, read_events
    from hafo.tasks import wait_event

    stream = out if out is not None else sys.stderr
    render = renderer_for(stream, subject)
    started, wall_started = clock(), time.time()
    cache = ClusterCache(store, keys)
    stop = asyncio.Event()

    def interrupt() -> None:
        stop.set()
        cache.changed.set()  # look once more now

    follow: asyncio.Future[None] | None = None
    outcome: WaitOutcome | None = None
    held: Held | None = None
    result: Result = "timeout"
    try:
        with on_signals(interrupt, (signal.SIGINT,)):  # Ctrl-C: "interrupted", exit 130
            await cache.load()
            follow = asyncio.ensure_future(cache.follow())
            while True:
                cache.changed.clear()
                now = time.time()
                outcome = wait_outcome(goal, cache.snapshot(), now)
                if outcome.state == "failed":  # the controller's reason is in its event
                    events = [e for e in await read_events(store, keys, 100)
                              if e.ts >= wall_started - 5]
                    outcome = wait_outcome(goal, cache.snapshot(), now, events)
                outcome, held = settled(outcome, held, clock())
                elapsed = clock() - started
                if not outcome.final:  # the final line says it
                    render.update(outcome, elapsed)
                if outcome.final:
                    result = "done" if outcome.state == "done" else "failed"
                    break
                if stop.is_set():
                    result = "interrupted"
                    break
                left = timeout - elapsed
                if left <= 0:
                    result = "timeout"
                    break
                await wait_event(cache.changed, min(TICK, left))
    finally:
        if follow is not None:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
        if outcome is None and isinstance(render, LiveRenderer):
            render.status.stop()  # etcd failed before the first look: no spinner left behind
    assert outcome is not None
    seconds = clock() - started
    message = outcome.message
    line = final_line(subject, result, message, seconds, keeps)
    done = WaitResult(result, line, message, seconds,
                      outcome.node if result == "done" else None,
                      outcome.epoch if result == "done" else None)
    render.finish(done)
    return done


async def wait_and_report(store: Store, keys: Keys, goal: WaitGoal | None,
                          args: argparse.Namespace, *, subject: str, keeps: str,
                          data: dict[str, Any] | None = None, why_not: str = "") -> int:
    """The end of a command with ``--wait``/``--json``: wait for ``goal`` if ``--wait``
    (``goal`` None: nothing to wait for, ``why_not`` says why: failed at once), then print
    ``data`` as JSON if ``--json`` (with the wait's ``outcome``); returns the exit code."""
    result: WaitResult | None = None
    if args.wait:
        if goal is None:
            result = WaitResult("failed", final_line(subject, "failed", why_not, 0.0, keeps),
                                why_not, 0.0)
            print(plain(result.line), file=sys.stderr)
        else:
            timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT
            result = await wait_for(store, keys, goal, subject=subject, timeout=timeout,
                                    keeps=keeps)
    if args.json and data is not None:
        body = dict(data)
        if result is not None:
            body["outcome"] = result.to_dict()
        print(json.dumps(body, indent=2, sort_keys=True), flush=True)
    return result.exit_code if result is not None else 0
